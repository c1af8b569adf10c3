"""What /proc says of processes: command line, environment, systemd unit, liveness, ancestors, listeners.

Every function takes `proc` (default `/proc`) so that tests can hand in a directory laid out like it.
A process that exits while it is read is treated as gone, never as an error.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = ["PROC", "alive", "ancestors", "cmdline", "environ", "listeners", "pids", "unit"]

PROC = Path("/proc")


def pids(proc: Path = PROC) -> Iterator[int]:
    """Every process this PID namespace shows, in ascending order."""
    return iter(sorted(int(p.name) for p in proc.iterdir() if p.name.isdigit()))


def cmdline(pid: int, proc: Path = PROC) -> str | None:
    """The arguments joined by spaces (what `pgrep --full` and `ps` show); "" for a kernel thread or a
    zombie, which have none; None when the process is gone or cannot be read."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")


def environ(pid: int, proc: Path = PROC) -> dict[str, str]:
    """The environment the process started with ({} when it is gone or not ours to read)."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").split("=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k: v for k, v in pairs}


#: src/basic/unit-name.c `unit_name_is_valid(name, UNIT_NAME_PLAIN|UNIT_NAME_INSTANCE)`: a prefix, an
#: optional non-empty instance after the first "@", and a unit type's suffix (src/basic/unit-def.c),
#: at most 255 characters of VALID_CHARS (letters, digits, ":-_.\\").
_UNIT_NAME_RE = re.compile(
    r"[A-Za-z0-9:_.\\-]+(@[A-Za-z0-9:_.\\@-]+)?"
    r"\.(service|socket|target|device|mount|automount|swap|timer|path|slice|scope)"
)


def _cgroup_path(pid: int | str, proc: Path) -> str | None:
    """The process's cgroup in systemd's hierarchy: the name=systemd line on cgroup v1 (hybrid too),
    else the unified "0::" line (src/basic/cgroup-util.c v252 `cg_pid_get_path`)."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    paths = dict(line.split(":", 2)[1:] for line in text.splitlines() if line.count(":") >= 2)
    return paths.get("name=systemd", paths.get(""))


def _unescape(name: str) -> str:
    """cgroup-util.c `cg_unescape`: systemd prefixes "_" to a cgroup name that could clash."""
    return name[1:] if name.startswith("_") else name


def _is_unit(name: str, *, slice_only: bool = False) -> bool:
    ok = len(name) <= 255 and _UNIT_NAME_RE.fullmatch(name) is not None
    # valid_slice_name (cgroup-util.c v252:1140-1160): UNIT_NAME_PLAIN, so no instance
    return ok and (not slice_only or (name.endswith(".slice") and "@" not in name))


def unit(pid: int, proc: Path = PROC) -> str:
    """The systemd unit whose cgroup holds the process ("" when none), as systemd names it
    (`systemctl status PID`, `ps -o unit`): cgroup-util.c v252 `cg_pid_get_unit` (:1202-1213), which
    shifts the path by PID 1's root (`cg_pid_get_path_shifted`, `cg_get_root_path` :1034-1113), skips
    the leading slices (`skip_slices` :1162-1178) and takes the next component if it is a unit name
    that is no slice (`cg_path_get_unit` :1180-1200, `cg_path_decode_unit` :1115-1138). A process of a
    user's service (`/user.slice/user-1000.slice/user@1000.service/app.slice/x.service`) is therefore
    in the system unit `user@1000.service`, not in a system `x.service`."""
    path = _cgroup_path(pid, proc)
    if path is None:
        return ""
    root = _cgroup_path(1, proc) or "/"
    for leaf in ("/init.scope", "/system.slice", "/system"):
        if root.endswith(leaf):
            root = root.removesuffix(leaf)
            break
    root = root.rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        path = path[len(root) :]
    parts = [p for p in path.split("/") if p]
    while parts and _is_unit(_unescape(parts[0]), slice_only=True):
        parts.pop(0)
    if not parts:
        return ""
    name = _unescape(parts[0])
    if len(parts[0]) < 3 or not _is_unit(name) or name.endswith(".slice"):
        return ""
    return name


def _stat_fields(pid: int, proc: Path) -> list[str] | None:
    """The fields of /proc/PID/stat after `pid (comm)`: comm may hold spaces and parentheses, so the
    line is split after its last ')'. [0] is the state, [1] the parent's pid."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def alive(pid: int, proc: Path = PROC) -> bool:
    """The process exists and is no zombie (a zombie has exited; only its parent has to reap it)."""
    fields = _stat_fields(pid, proc)
    return fields is not None and fields[0] != "Z"


def ancestors(pid: int, proc: Path = PROC) -> set[int]:
    """The process and its parents up to init (as far as they can be read)."""
    seen: set[int] = set()
    while pid > 0 and pid not in seen:
        seen.add(pid)
        fields = _stat_fields(pid, proc)
        if fields is None:
            break
        pid = int(fields[1])
    return seen


def listeners(ports: Iterable[int], proc: Path = PROC) -> dict[int, list[int]]:
    """Who listens on each of `ports` (TCP over IPv4 and IPv6): port -> the pids holding the socket.

    From /proc/net/tcp{,6} (the sockets in this network namespace, state 0A = LISTEN) and
    /proc/*/fd (which process holds each socket's inode). A socket that no process of this PID
    namespace holds (the host's, or another container's sharing the namespace) maps to [].
    """
    wanted = set(ports)
    inodes: dict[str, int] = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if len(fields) < 10 or fields[3] != "0A":
                continue
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if port in wanted:
                inodes[fields[9]] = port
    if not inodes:
        return {}
    holders: dict[int, dict[int, None]] = {port: {} for port in inodes.values()}
    targets = {f"socket:[{inode}]": port for inode, port in inodes.items()}
    for pid in pids(proc):
        try:
            fds = list((proc / str(pid) / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            port = None
            with contextlib.suppress(OSError):
                port = targets.get(os.readlink(fd))
            if port is not None:
                holders[port][pid] = None
    return {port: list(found) for port, found in sorted(holders.items())}
