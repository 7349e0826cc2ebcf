"""The sepp-py peer driver (tests/peers/seppy_driver.py) speaks its JSON-lines
protocol under the sepp-py virtualenv.

No server is needed. This test deliberately *fails* (never skips) when the
venv cannot be created: interop tests and benchmarks depend on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENSURE = REPO / "scripts" / "ensure-seppy-venv.sh"
DRIVER = REPO / "tests" / "peers" / "seppy_driver.py"


@pytest.fixture(scope="module")
def seppy_python() -> str:
    proc = subprocess.run(
        ["bash", str(ENSURE)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"scripts/ensure-seppy-venv.sh failed (rc={proc.returncode}):\n"
            f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}",
            pytrace=False,
        )
    lines = proc.stdout.strip().splitlines()
    assert lines, "ensure-seppy-venv.sh printed nothing on stdout"
    python = lines[-1]
    assert os.access(python, os.X_OK), f"not an executable: {python!r}"
    # Compare environments, not binaries (venv pythons are symlinks).
    assert Path(python).absolute().parent.parent != Path(sys.prefix).absolute(), (
        "the sepp-py venv must not be this project's environment"
    )
    return python


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # Point PYTHONPATH at this repo's src/ on purpose: the driver must still
    # import sepp-py's `sepp`, not ours.
    env["PYTHONPATH"] = str(REPO / "src")
    return env


def test_ping_and_protocol(seppy_python: str) -> None:
    requests = [
        {"op": "ping"},
        {"op": "ping", "id": 7},
        {"op": "no_such_op", "id": "x"},
        {"op": "enqueue", "id": 8, "queue": "q", "job_type": "t"},
        {"op": "shutdown", "id": 9},
    ]
    stdin = "".join(json.dumps(r) + "\n" for r in requests) + "this is not json\n"
    proc = subprocess.run(
        [seppy_python, str(DRIVER)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    replies = [json.loads(line) for line in proc.stdout.splitlines()]
    # The driver stops reading after "shutdown": the trailing garbage is unread.
    assert len(replies) == 5, proc.stdout

    first, second, unknown, not_connected, bye = replies
    assert first["id"] is None
    assert first["ok"] is True
    result = first["result"]
    assert result["pong"] is True
    assert result["sepp_py_version"] == "0.1.0"
    assert "site-packages" in result["sepp_module"], result["sepp_module"]
    assert not result["sepp_module"].startswith(str(REPO / "src"))
    assert result["connected"] is False

    assert second == {"id": 7, "ok": True, "result": second["result"]}
    assert second["result"]["pong"] is True

    assert unknown["id"] == "x"
    assert unknown["ok"] is False
    assert unknown["error"]["type"] == "UnknownOp"

    assert not_connected["ok"] is False
    assert not_connected["error"]["type"] == "NotConnected"

    assert bye == {"id": 9, "ok": True, "result": {}}


def test_bad_json_line_gets_an_error_reply(seppy_python: str) -> None:
    proc = subprocess.run(
        [seppy_python, str(DRIVER)],
        input='{"op": "ping"\n',
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    (reply,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert reply["ok"] is False
    assert reply["id"] is None
    assert reply["error"]["type"] == "JSONDecodeError"


def test_import_time_mode(seppy_python: str) -> None:
    proc = subprocess.run(
        [seppy_python, str(DRIVER), "--import-time"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    seconds = float(proc.stdout.strip().splitlines()[-1])
    assert 0.0 < seconds < 30.0
