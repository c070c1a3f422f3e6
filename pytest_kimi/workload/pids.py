"""Whether a process still lives on this machine: the shared cluster clock drops the bounds of
dead processes, and the mock's GPU state its dead holders."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists on this machine (another user's process counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """A zombie is dead (its parent has not reaped it yet). Read only from a /proc that shows
    our own pid namespace (in a container /proc may be the host's)."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return False
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]
