"""Find the training job that holds the GPUs: its systemd units and the processes matching patterns.

`discover()` asks systemd for each named unit and reads `/proc` for processes whose full command
line matches one of the patterns (what `pgrep --full` matches: the arguments joined by spaces; its
own process and ancestors are left out, as `pgrep --ignore-ancestors` does). A process that runs
inside one of the running units is stopped with its unit, so it is not listed on its own.
`still_alive()` says what of a stopped job still runs (its units and pids, as data). Nothing here
changes the host; systemd and /proc are read through `sglfleet.host`.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from sglfleet.host import _procfs as procfs
from sglfleet.host import _systemd as systemd

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


class Alive(BaseModel):
    """What of a stopped training job still runs (nothing once it is gone)."""

    model_config = ConfigDict(frozen=True)

    units: tuple[TrainingUnit, ...] = ()
    pids: tuple[int, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {"units": [u.model_dump(exclude={"name"}) for u in self.units], "pids": list(self.pids)}


class PatternError(ValueError):
    """A pattern is not a regular expression; the message names it."""


#: The properties of a training unit that `units()` reads.
UNIT_PROPERTIES = ("Id", "LoadState", "ActiveState", "MainPID", "UnitFileState")


def units(names: Sequence[str], systemctl: systemd.Systemctl = systemd.query) -> list[TrainingUnit]:
    """`systemctl show` of each named unit; a name the host lacks comes back with LoadState not-found."""
    ids = [systemd.unit_name(n) for n in names]
    return [
        TrainingUnit(
            name=name,
            Id=props.get("Id") or unit_id,
            LoadState=props.get("LoadState", ""),
            ActiveState=props.get("ActiveState", "inactive"),
            MainPID=int(props.get("MainPID") or 0),
            UnitFileState=props.get("UnitFileState", ""),
        )
        for name, unit_id, props in zip(
            names, ids, systemd.show(ids, UNIT_PROPERTIES, systemctl), strict=True
        )
    ]


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


def matching_processes(
    patterns: Sequence[str], proc: Path = procfs.PROC, *, self_pid: int | None = None
) -> list[TrainingProcess]:
    """Processes whose command line matches a pattern, each once (the first pattern it matches)."""
    compiled = compile_patterns(patterns)
    if not compiled:
        return []
    skip = procfs.ancestors(os.getpid() if self_pid is None else self_pid, proc)
    found = []
    for pid in procfs.pids(proc):
        if pid in skip:
            continue
        cmdline = procfs.cmdline(pid, proc)
        if not cmdline:  # gone, or a kernel thread or zombie: no command line
            continue
        for source, rx in zip(patterns, compiled, strict=True):
            if rx.search(cmdline):
                found.append(
                    TrainingProcess(pid=pid, cmdline=cmdline, pattern=source, unit=procfs.unit(pid, proc))
                )
                break
    return found


def still_alive(
    unit_names: Sequence[str],
    pids: Sequence[int],
    *,
    systemctl: systemd.Systemctl = systemd.query,
    proc: Path = procfs.PROC,
) -> Alive:
    """What of a stopped training job is still alive: its running units and its live processes.

    A unit whose main process exited and that waits to be restarted counts as gone (the stop cancels
    that restart); so does a zombie process.
    """
    return Alive(
        units=tuple(u for u in units(unit_names, systemctl) if u.running),
        pids=tuple(pid for pid in pids if procfs.alive(pid, proc)),
    )


def discover(
    unit_names: Sequence[str],
    patterns: Sequence[str],
    *,
    systemctl: systemd.Systemctl = systemd.query,
    proc: Path = procfs.PROC,
) -> TrainingJob:
    """The running units and the matching processes that are not inside one of them."""
    found_units = units(unit_names, systemctl)
    running = {u.Id for u in found_units if u.running}
    processes = [p for p in matching_processes(patterns, proc) if p.unit not in running]
    return TrainingJob(units=tuple(found_units), processes=tuple(processes))


#: What `stop_settings_problems` reads back (DropInPaths names the files that may have overridden ours).
STOP_PROPERTIES = ("Id", "KillSignal", "TimeoutStopUSec", "SendSIGKILL", "DropInPaths")


def signal_number(name: str) -> int:
    """`SIGTERM`, `TERM` or `15` -> 15, as systemd's `signal_from_string` and `kill -s` read it;
    ValueError for a name that is no signal."""
    if name.strip().isdigit():
        return int(name)
    upper = name.strip().upper()
    try:
        return signal.Signals[upper if upper.startswith("SIG") else f"SIG{upper}"].value
    except KeyError:
        raise ValueError(f"{name!r} is not a signal name") from None


def stop_settings_problems(
    unit_names: Sequence[str],
    signal_name: str,
    timeout_s: int,
    systemctl: systemd.Systemctl = systemd.query,
) -> list[str]:
    """Which of the units systemd would not stop with `signal_name`, `timeout_s` and a final SIGKILL (what
    the training_stop drop-in asks for): a drop-in that sorts after it (systemd.unit(5): drop-ins apply in
    the lexicographic order of their file names, whatever directory they are in) may set them again.
    `systemctl show` prints KillSignal as a number and TimeoutStopUSec as a time span."""
    want_signal = signal_number(signal_name)
    want_usec = timeout_s * 1_000_000
    names = [systemd.unit_name(u) for u in unit_names]
    problems = []
    for name, shown in zip(names, systemd.show(names, STOP_PROPERTIES, systemctl), strict=True):
        wrong = []
        if shown.get("KillSignal") != str(want_signal):
            wrong.append(
                f"KillSignal={shown.get('KillSignal', '?')} (asked for {signal_name}, {want_signal})"
            )
        if systemd.parse_timespan(shown.get("TimeoutStopUSec", "")) != want_usec:
            wrong.append(f"TimeoutStopUSec={shown.get('TimeoutStopUSec', '?')} (asked for {timeout_s}s)")
        if shown.get("SendSIGKILL") != "yes":
            wrong.append(f"SendSIGKILL={shown.get('SendSIGKILL', '?')} (asked for yes)")
        if wrong:
            problems.append(f"{name}: {', '.join(wrong)}; drop-ins: {shown.get('DropInPaths') or 'none'}")
    return problems


#: How long each launcher lets its ranks checkpoint after it forwards the stop signal, then SIGKILLs them.
#: torchrun (torch 2.11.0): its agent's handler turns SIGTERM/SIGINT/SIGHUP/SIGQUIT into SignalException
#: (torch/distributed/elastic/multiprocessing/api.py:76,546), `run` catches it and calls
#: `self._shutdown(e.sigval)` (elastic/agent/server/api.py:738-740), whose `self._pcontext.close(death_sig)`
#: (elastic/agent/server/local_elastic_agent.py:408,416) takes `close`'s default `timeout: int = 30`
#: (multiprocessing/api.py:649); SubprocessContext._close sends the signal to each rank's process group,
#: waits until 30 s after it (:1007-1025) and SIGKILLs every rank still alive (:1026-1035). Nothing in
#: torchrun's arguments changes the 30.
LAUNCHER_KILL_AFTER_S: dict[str, int | None] = {"torchrun": 30, "none": None}


def checkpoint_time_warnings(checkpoint_s: float, launcher: str, stop_timeout_s: int | None) -> list[str]:
    """Why a job that needs `checkpoint_s` seconds to write its checkpoint after the stop signal would
    be killed before it is done: by its launcher (torchrun's 30 s), or by systemd at `stop_timeout_s`."""
    if launcher not in LAUNCHER_KILL_AFTER_S:
        raise ValueError(f"{launcher!r} is not one of {sorted(LAUNCHER_KILL_AFTER_S)}")
    out = []
    takes = (
        f"the job takes {checkpoint_s:g} s to checkpoint after the signal (training_stop_checkpoint_seconds)"
    )
    kill_after = LAUNCHER_KILL_AFTER_S[launcher]
    if checkpoint_s > 0 and kill_after is not None and checkpoint_s > kill_after:
        out.append(
            f"{takes}, but {launcher} SIGKILLs its ranks {kill_after} s after it forwards SIGTERM "
            "(torch 2.11.0 elastic/multiprocessing/api.py:649 close(timeout=30), called without a timeout by "
            "local_elastic_agent.py:416): the checkpoint would be cut off. Make the ranks checkpoint within "
            f"{kill_after} s, or signal the ranks themselves (training_stop_process_patterns matching them)"
        )
    if checkpoint_s > 0 and stop_timeout_s is not None and checkpoint_s > stop_timeout_s:
        out.append(
            f"{takes}, longer than training_stop_timeout ({stop_timeout_s} s), "
            "when the role SIGKILLs what is left"
        )
    return out
