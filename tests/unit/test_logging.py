"""The library logs through logging.getLogger("sepp") and is silent until the app configures it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def test_warnings_are_silent_without_logging_configuration() -> None:
    script = (
        "import sepp; from sepp._util.log import Log; "
        "Log(None).warning('sepp: should not be printed'); print('done')"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(SRC)},
    )
    assert out.stdout.strip() == "done"
    assert "should not be printed" not in out.stderr


def test_custom_logger_objects_receive_messages() -> None:
    from sepp._util.log import Log

    seen: list[str] = []

    class Minimal:
        def warning(self, msg: str, *args: object) -> None:
            seen.append(msg % args)

        def error(self, msg: str, *args: object) -> None:
            seen.append(msg % args)

    log = Log(Minimal())
    log.debug("ignored %s", 1)  # optional methods may be absent
    log.warning("w %s", 2)
    log.error("e %s", 3)
    assert seen == ["w 2", "e 3"]
