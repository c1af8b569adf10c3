"""Find the training job that holds the GPUs: its systemd units and the processes matching patterns.

`discover()` asks systemd for each named unit and reads `/proc` for processes whose full command
line matches one of the patterns (what `pgrep --full` matches: the arguments joined by spaces; its
own process and ancestors are left out, as `pgrep --ignore-ancestors` does). A process that runs
inside one of the running units is stopped with its unit, so it is not listed on its own. Nothing
here changes the host.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

#: ActiveStates in which a unit still has a training job to stop.
RUNNING_STATES = frozenset({"active", "activating", "deactivating", "reloading"})


class TrainingUnit(BaseModel):
    """One of the named units as systemd sees it (property names as `systemctl show` prints them)."""

    model_config = ConfigDict(frozen=True)

    name: str
    Id: str
    LoadState: str = ""
    ActiveState: str = "inactive"
    MainPID: int = 0
    UnitFileState: str = ""

    @property
    def running(self) -> bool:
        return self.ActiveState in RUNNING_STATES

    @property
    def loaded(self) -> bool:
        return self.LoadState not in ("", "not-found")


class TrainingProcess(BaseModel):
    model_config = ConfigDict(frozen=True)

    pid: int
    cmdline: str
    pattern: str
    unit: str = ""


class TrainingJob(BaseModel):
    """What runs of the training job: running units, and matching processes outside them."""

    model_config = ConfigDict(frozen=True)

    units: tuple[TrainingUnit, ...] = ()
    processes: tuple[TrainingProcess, ...] = ()

    @property
    def running_units(self) -> list[TrainingUnit]:
        return [u for u in self.units if u.running]

    @property
    def targets(self) -> list[str]:
        return [f"unit {u.Id}" for u in self.running_units] + [f"process {p.pid}" for p in self.processes]

    def as_dict(self) -> dict[str, object]:
        return {
            "running_units": [u.model_dump(exclude={"name"}) for u in self.running_units],
            "processes": [p.model_dump() for p in self.processes],
            "loaded_units": [u.name for u in self.units if u.loaded],
            "targets": self.targets,
        }


class PatternError(ValueError):
    """A pattern is not a regular expression; the message names it."""


def unit_name(name: str) -> str:
    return name if "." in name.rsplit("@", 1)[-1] else f"{name}.service"


def _run(argv: Sequence[str]) -> str:
    """stdout of a read-only query; a host without the command (no systemd) answers nothing."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False).stdout
    except FileNotFoundError:
        return ""


def units(names: Sequence[str], systemctl: Callable[[Sequence[str]], str] = _run) -> list[TrainingUnit]:
    """`systemctl show` of each named unit; a name the host lacks comes back with LoadState not-found."""
    if not names:
        return []
    ids = [unit_name(n) for n in names]
    out = systemctl(["systemctl", "show", "--property=Id,LoadState,ActiveState,MainPID,UnitFileState", *ids])
    blocks = [
        dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        for block in out.strip().split("\n\n")
    ]
    result = []
    for i, (name, unit_id) in enumerate(zip(names, ids, strict=True)):
        props = blocks[i] if i < len(blocks) else {}
        result.append(
            TrainingUnit(
                name=name,
                Id=props.get("Id") or unit_id,
                LoadState=props.get("LoadState", ""),
                ActiveState=props.get("ActiveState", "inactive"),
                MainPID=int(props.get("MainPID") or 0),
                UnitFileState=props.get("UnitFileState", ""),
            )
        )
    return result


def compile_patterns(patterns: Sequence[str]) -> list[re.Pattern[str]]:
    out = []
    for i, pattern in enumerate(patterns):
        try:
            out.append(re.compile(pattern))
        except re.error as exc:
            raise PatternError(
                f"process pattern [{i}] {pattern!r} is not a regular expression: {exc}"
            ) from exc
    return out


def _ancestors(pid: int, proc: Path) -> set[int]:
    seen = set()
    while pid > 0 and pid not in seen:
        seen.add(pid)
        try:
            stat = (proc / str(pid) / "stat").read_text()
        except OSError:
            break
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'.
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return seen


def process_unit(pid: int, proc: Path = Path("/proc")) -> str:
    """The systemd unit (service or scope) whose cgroup holds the process ("" when none)."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        for part in reversed(line.rsplit(":", 1)[-1].split("/")):
            if part.endswith((".service", ".scope")):
                return part
    return ""


def matching_processes(
    patterns: Sequence[str], proc: Path = Path("/proc"), *, self_pid: int | None = None
) -> list[TrainingProcess]:
    """Processes whose command line matches a pattern, each once (the first pattern it matches)."""
    compiled = compile_patterns(patterns)
    if not compiled:
        return []
    skip = _ancestors(os.getpid() if self_pid is None else self_pid, proc)
    found = []
    for entry in sorted((p for p in proc.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        pid = int(entry.name)
        if pid in skip:
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if not raw:  # kernel threads and zombies have no command line
            continue
        cmdline = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
        for source, rx in zip(patterns, compiled, strict=True):
            if rx.search(cmdline):
                found.append(
                    TrainingProcess(pid=pid, cmdline=cmdline, pattern=source, unit=process_unit(pid, proc))
                )
                break
    return found


def process_alive(pid: int, proc: Path = Path("/proc")) -> bool:
    """The process exists and is no zombie (a zombie has exited; only its parent has to reap it)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def still_alive(
    unit_names: Sequence[str],
    pids: Sequence[int],
    *,
    systemctl: Callable[[Sequence[str]], str] = _run,
    proc: Path = Path("/proc"),
) -> list[str]:
    """What of a stopped training job is still alive: "unit NAME STATE" and "pid PID" entries.

    A unit whose main process exited and that waits to be restarted counts as gone (the stop cancels
    that restart); so does a zombie process.
    """
    out = [f"unit {u.Id} {u.ActiveState}" for u in units(unit_names, systemctl) if u.running]
    return out + [f"pid {pid}" for pid in pids if process_alive(pid, proc)]


def discover(
    unit_names: Sequence[str],
    patterns: Sequence[str],
    *,
    systemctl: Callable[[Sequence[str]], str] = _run,
    proc: Path = Path("/proc"),
) -> TrainingJob:
    """The running units and the matching processes that are not inside one of them."""
    found_units = units(unit_names, systemctl)
    running = {u.Id for u in found_units if u.running}
    processes = [p for p in matching_processes(patterns, proc) if p.unit not in running]
    return TrainingJob(units=tuple(found_units), processes=tuple(processes))
