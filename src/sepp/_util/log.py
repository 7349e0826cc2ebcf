"""Logging through stdlib `logging.getLogger("sepp")` or any object with warning/error."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

# A library stays silent unless the application configures logging (no "last resort" output).
logging.getLogger("sepp").addHandler(logging.NullHandler())


class LoggerLike(Protocol):
    def warning(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...
    def error(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...


class Log:
    """Adapter giving every logger debug/info/warning/error (error may carry exc_info)."""

    __slots__ = ("_target",)

    def __init__(self, target: LoggerLike | None) -> None:
        self._target: Any = target if target is not None else logging.getLogger("sepp")

    def debug(self, msg: str, *args: object) -> None:
        fn = getattr(self._target, "debug", None)
        if fn is not None:
            fn(msg, *args)

    def info_enabled(self) -> bool:
        """Whether an `info` line would be logged (a stdlib logger below INFO says not): a
        caller with a line to build for each of many events asks first."""
        target = self._target
        return not isinstance(target, logging.Logger) or target.isEnabledFor(logging.INFO)

    def info(self, msg: str, *args: object, extra: Mapping[str, object] | None = None) -> None:
        """`extra` (fields for structured formatters) reaches stdlib loggers only."""
        if extra is not None and isinstance(self._target, logging.Logger):
            if self._target.isEnabledFor(logging.INFO):
                self._target.info(msg, *args, extra=extra)
            return
        fn = getattr(self._target, "info", None)
        if fn is not None:
            fn(msg, *args)

    def warning(self, msg: str, *args: object, exc_info: BaseException | None = None) -> None:
        if exc_info is not None and isinstance(self._target, logging.Logger):
            self._target.warning(msg, *args, exc_info=exc_info)
        else:
            self._target.warning(msg, *args)

    def error(
        self,
        msg: str,
        *args: object,
        exc_info: BaseException | None = None,
        extra: Mapping[str, object] | None = None,
    ) -> None:
        """`exc_info` and `extra` reach stdlib loggers only."""
        if isinstance(self._target, logging.Logger) and (exc_info is not None or extra is not None):
            self._target.error(msg, *args, exc_info=exc_info, extra=extra)
        else:
            self._target.error(msg, *args)
