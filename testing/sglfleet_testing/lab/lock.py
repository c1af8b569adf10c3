"""The lab lock: one machine-wide flock that whoever uses the lab holds (tests, playbooks, `lab up|down`).

The lab (fakepve on 127.0.0.1:8006, the CTs, their sshd ports) is one resource per machine. Shell users
take the lock with `flock /tmp/sglfleet-lab.lock <command>`; Python users (the pytest sessions of
tests/lab and tests/integration) with `hold()`, which is a no-op when an ancestor process is that
`flock` (the lock is then already ours, and taking it again would wait for ourselves).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

LAB_LOCK = Path("/tmp/sglfleet-lab.lock")
# How often a waiter retries: short next to a test session, long next to a flock() call.
POLL_S = 0.2


class LabLockTimeout(TimeoutError):
    """Someone else held the lab lock for longer than we were willing to wait."""


def held_by_ancestor(lock: Path = LAB_LOCK) -> bool:
    """Whether this process runs under `flock <lock> ...` (then the lock is already ours)."""
    pid = os.getppid()
    while pid > 1:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        if cmdline and Path(cmdline[0].decode()).name == "flock" and str(lock).encode() in cmdline:
            return True
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False


@contextlib.contextmanager
def hold(
    lock: Path = LAB_LOCK, *, timeout: float = 1800, say: Callable[[str], None] = print
) -> Iterator[None]:
    """Hold the lab lock for the block, waiting up to `timeout` seconds for whoever holds it now."""
    if held_by_ancestor(lock):
        yield
        return
    with lock.open("a") as handle:
        start = time.monotonic()
        waiting = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waiting:
                    say(f"waiting for the lab lock {lock} (held by another run)")
                    waiting = True
                if time.monotonic() - start > timeout:
                    raise LabLockTimeout(f"the lab lock {lock} stayed taken for {timeout:.0f} s") from None
                time.sleep(POLL_S)
        if waiting:
            say(f"lab lock taken after {time.monotonic() - start:.1f} s")
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
