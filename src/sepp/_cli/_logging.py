"""Logging for the command line: text or one JSON object per line on stderr, or the user's own
configuration from a file (logging.config: dictConfig from JSON, else fileConfig's INI; TOML
would need Python 3.11's tomllib, and JSON says the same)."""

from __future__ import annotations

import argparse
import json
import logging
import logging.config
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .._model.types import JobContext
from ._failures import UsageError

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FORMATS = ("text", "json")
# What the worker passes as `extra` on its per-job line, under the JSON keys used for them.
_EXTRA_FIELDS = {
    "sepp_outcome": "outcome",
    "sepp_duration_s": "duration_s",
    "sepp_wait_s": "wait_s",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message; a job's id, type, queue and
    attempt when the message is about one (a JobContext among its arguments), its outcome and
    duration on the worker's per-job line; the traceback as `exception`."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        args = record.args if isinstance(record.args, tuple) else ()
        ctx = next((arg for arg in args if isinstance(arg, JobContext)), None)
        if ctx is not None:
            out.update(job_id=ctx.id, job_type=ctx.job_type, queue=ctx.queue, attempt=ctx.attempt)
        for attribute, key in _EXTRA_FIELDS.items():
            value = record.__dict__.get(attribute)
            if value is not None:
                out[key] = round(value, 6) if isinstance(value, float) else value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


class NotHandledOnTheWay(logging.Filter):
    """Lets through only the records no handler of the application's met on their way up to
    the root: a target whose settings configure a `sepp` logger (Django's LOGGING, say)
    already prints those, and the command's own handler on the root would print them twice."""

    def filter(self, record: logging.LogRecord) -> bool:
        logger: logging.Logger | None = logging.getLogger(record.name)
        root = logging.getLogger()
        while logger is not None and logger is not root:
            if any(not isinstance(h, logging.NullHandler) for h in logger.handlers):
                return False
            if not logger.propagate:
                return True  # it never reaches the root anyway
            logger = logger.parent
        return True


def setup_logging(args: argparse.Namespace) -> None:
    """Logging as the flags say: --log-config FILE, else --log-format on stderr at
    --log-level (default: the command's)."""
    level = (args.log_level or getattr(args, "default_log_level", "warning")).upper()
    if args.log_config is not None:
        if args.log_format is not None:
            raise UsageError("--log-format and --log-config exclude each other")
        _configure_from_file(Path(args.log_config))
        if args.log_level:  # given explicitly: it also applies over the file's
            logging.getLogger().setLevel(level)
        return
    handler = logging.StreamHandler(sys.stderr)
    if args.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    handler.addFilter(NotHandledOnTheWay())
    logging.basicConfig(level=level, handlers=[handler])


def _configure_from_file(path: Path) -> None:
    try:
        if path.suffix == ".json":
            config = json.loads(path.read_text(encoding="utf-8"))
            # Our loggers exist before the file is read: not disabled unless it says so.
            if isinstance(config, dict):
                config.setdefault("disable_existing_loggers", False)
            logging.config.dictConfig(config)
        else:
            logging.config.fileConfig(path, disable_existing_loggers=False)
    except OSError as exc:
        raise UsageError(f"--log-config {path}: {exc.strerror or exc}") from None
    except Exception as exc:  # json, toml, configparser and dictConfig errors alike
        raise UsageError(f"--log-config {path}: {type(exc).__name__}: {exc}") from None
