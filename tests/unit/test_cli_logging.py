"""The command line's log formats: JSON lines with a job's fields, and --log-config files."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from sepp._cli._logging import JsonFormatter, setup_logging
from sepp._cli._main import main
from sepp.testing import job_context


def record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("sepp.worker", logging.INFO, __file__, 1, msg, args, None)
    rec.__dict__.update(extra)
    return rec


def test_a_job_line_carries_its_fields() -> None:
    ctx = job_context("send", queue="emails", attempt=2)
    line = JsonFormatter().format(
        record(
            "sepp: %s finished: %s",
            ctx,
            "ack",
            sepp_outcome="ack",
            sepp_duration_s=0.25,
            sepp_wait_s=1.5,
        )
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
    assert out["wait_s"] == 1.5
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


@pytest.fixture
def clean_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    loggers = [logging.getLogger(name) for name in ("sepp", "sepp.worker", "myapp.jobs")]
    saved_loggers = [(lg.handlers[:], lg.propagate, lg.level, lg.disabled) for lg in loggers]
    for lg in loggers:  # as a fresh process has them, whatever earlier tests did
        lg.handlers[:] = [h for h in lg.handlers if isinstance(h, logging.NullHandler)]
        lg.propagate, lg.disabled = True, False
        lg.setLevel(logging.NOTSET)
    try:
        yield
    finally:
        root.handlers[:], _ = saved[0], root.setLevel(saved[1])
        for lg, (handlers, propagate, level, disabled) in zip(loggers, saved_loggers, strict=True):
            lg.handlers[:], lg.propagate, lg.disabled = handlers, propagate, disabled
            lg.setLevel(level)


def test_a_line_the_applications_own_sepp_handler_prints_is_not_printed_again(
    clean_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # What a worker target's Django LOGGING = {"loggers": {"sepp": {"handlers": [...]}}} does
    # once the command has set up its own handler on the root (pytest's own handler goes, or
    # basicConfig would leave the root as it is).
    logging.getLogger().handlers.clear()
    setup_logging(argparse.Namespace(log_level="info", log_config=None, log_format=None))
    logging.getLogger("sepp.worker").info("before the application's logging")
    app_lines: list[str] = []

    class AppHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            app_lines.append(record.getMessage())

    logging.getLogger("sepp").addHandler(AppHandler())
    logging.getLogger("sepp.worker").info("a job line")
    logging.getLogger("myapp.jobs").warning("not sepp")
    stderr = capsys.readouterr().err
    assert app_lines == ["a job line"]
    assert "before the application's logging" in stderr
    assert "a job line" not in stderr  # printed once, by the application's handler
    assert "not sepp" in stderr
    # A logger that does not propagate never reached the root's handler anyway.
    logging.getLogger("sepp").propagate = False
    logging.getLogger("sepp.worker").info("kept to itself")
    assert "kept to itself" not in capsys.readouterr().err
