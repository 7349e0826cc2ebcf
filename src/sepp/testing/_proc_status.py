"""Whether a process catches SIGTERM, read from Linux's /proc (the server installs its
handler a moment after it logs that it listens)."""

from __future__ import annotations

import signal


def catches_sigterm(pid: int) -> bool | None:
    """Whether process ``pid`` has a SIGTERM handler (``None``: cannot tell here)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except (OSError, ValueError, IndexError):
        return None
    return None
