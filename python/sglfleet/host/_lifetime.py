"""A child process's lifetime tied to its parent's, written once: the launcher's server
(`sglfleet.launch`) and the merge's classification workers (`sglfleet.data._merge`) both use it."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """Call in a forked child: the child gets SIGKILL when `parent` dies, even by kill -9 (Linux
    prctl(PR_SET_PDEATHSIG)), and ends at once when `parent` already died before prctl took effect
    (it was reparented: its parent pid is no longer `parent`). Without it, a child of a process killed
    from outside is orphaned: a server keeps its GPU and port, a worker waits for work for ever."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(128 + signal.SIGKILL)
