"""Why a global limit cannot work against this server."""

from __future__ import annotations

from .._model.errors import SeppError


class GlobalLimitError(SeppError):
    """A global limit cannot hold against this server: its permits' queue is refused (a
    strict server that does not declare it), or the server allows its permits too few
    attempts. Admissions through the limit raise it until the server is fixed."""
