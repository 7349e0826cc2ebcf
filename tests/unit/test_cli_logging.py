"""The command line's log formats: JSON lines with a job's fields, and --log-config files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from sepp._cli._logging import JsonFormatter
from sepp._cli._main import main
from sepp.testing import job_context


def record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("sepp.worker", logging.INFO, __file__, 1, msg, args, None)
    rec.__dict__.update(extra)
    return rec


def test_a_job_line_carries_its_fields() -> None:
    ctx = job_context("send", queue="emails", attempt=2)
    line = JsonFormatter().format(
        record("sepp: %s finished: %s", ctx, "ack", sepp_outcome="ack", sepp_duration_s=0.25)
    )
    out = json.loads(line)
    assert "\n" not in line
    assert out["message"] == f"sepp: {ctx} finished: ack"
    assert (out["job_id"], out["job_type"], out["queue"], out["attempt"]) == (
        ctx.id,
        "send",
        "emails",
        2,
    )
    assert (out["outcome"], out["duration_s"], out["level"]) == ("ack", 0.25, "INFO")
    assert out["time"].endswith("+00:00")


def test_other_lines_and_tracebacks_stay_one_line() -> None:
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        import sys

        rec = record("failed: %d", 3)
        rec.exc_info = sys.exc_info()
    line = JsonFormatter().format(rec)
    out = json.loads(line)
    assert "\n" not in line and "job_id" not in out and out["message"] == "failed: 3"
    assert "ValueError: bad\nthing" in out["exception"]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "JSONDecodeError"),
        ('{"version": 1, "handlers": {"h": {"class": "no.such.Handler"}}}', "ValueError"),
    ],
)
def test_a_bad_log_config_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, fragment: str
) -> None:
    path = tmp_path / "logging.json"
    path.write_text(content)
    assert main(["--log-config", str(path), "info"]) == 2
    err = capsys.readouterr().err
    assert f"--log-config {path}: {fragment}" in err and len(err.splitlines()) == 1


def test_log_config_and_log_format_exclude_each_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--log-config", str(tmp_path / "x.json"), "--log-format", "json", "info"]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_a_missing_log_config_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--log-config", str(tmp_path / "absent.ini"), "info"]) == 2
    assert "absent.ini" in capsys.readouterr().err
