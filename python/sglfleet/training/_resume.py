"""Back to training: hand the merged set over, drain the fleet, free the GPUs, start the training again.

Phase training_resume closes the loop phase training_stop opened. Each step is observe → plan here,
and the role acts on the plan with builtin tasks (systemctl, copy, systemd-run):

- `dataset_state` / `install_dataset`: the merged set goes where the training reads it. A file already
  there with other content is kept aside (renamed ``<name>.kept-<UTC time>-<sha256[:12]>``), never
  overwritten; the new file is moved in by a rename in the same directory (atomic).
- `fleet_plan`: which `sglang@<i>` instances to stop (all but the ones the user keeps), which GPUs the
  kept ones hold, and whether a generation job still runs on the host (then the stop is refused unless
  the user allows it). The stop itself is systemd's: the unit's KillSignal=SIGTERM makes SGLang drain.
- `gpus_not_free`: what still holds the GPUs that should be free (a compute process, memory above a
  threshold), as phase training_stop waits for.
- `launch_plan`: how the training starts again: a drop-in ``Environment=`` for each unit phase
  training_stop stopped, or a command template with ``{dataset}`` and ``{checkpoint}`` run as a
  transient unit (``systemd-run``) for a job that was a bare process. An ``EnvironmentFile=`` of the unit
  overrides ``Environment=`` (systemd.exec(5)), so the plan refuses when one of the unit's environment
  files sets a name the drop-in sets. The command is not run by a shell: systemd splits it and expands
  ``$VAR``/``${VAR}`` from the unit's environment, so a ``$`` in the filled-in paths is written ``$$``.
  The transient unit gets ``KillMode=mixed``: SIGTERM (systemd's default KillSignal) goes to the main
  process (torchrun) alone, which forwards it to its ranks, rather than to every process at once.
- `loaded_rows` / `look`: whether the job runs, holds GPU memory, and what its log says it loaded.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import re
import shlex
import string
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from sglfleet import fleet, host
from sglfleet.atomicio import move_into_place
from sglfleet.training import _training as training_mod

__all__ = [
    "DROPIN_NAME",
    "OLD_DROPIN_NAMES",
    "ResumeError",
    "dataset_state",
    "environment_problems",
    "file_digest",
    "fleet_plan",
    "gpus_not_free",
    "install_dataset",
    "launch_plan",
    "loaded_rows",
    "look",
]

#: Where a file that was in the dataset's place goes: ``<name>.kept-<time>-<hash>``.
KEPT_INFIX = ".kept-"
#: The transient unit's default name (systemd-run --unit).
DEFAULT_TRANSIENT_UNIT = "sglfleet-training.service"
#: A generation job: the transient units phase generate starts, or `sglfleet generate` by hand.
GENERATION_UNIT_GLOB = "sglfleet-gen-*.service"
GENERATION_PATTERN = r"(^|[ /])sglfleet(\.__main__)? generate( |$)"
#: The placeholders a command or environment template may use.
PLACEHOLDERS = frozenset({"dataset", "checkpoint"})
#: The drop-in that hands the set and the checkpoint over. Drop-ins apply in the lexicographic order of
#: their file names, whatever their directory (systemd.unit(5)): "zz-" sorts after override.conf (what
#: `systemctl edit` writes) and the usual NN- names, so its Environment= is the one in effect.
DROPIN_NAME = "zz-sglfleet-training-resume.conf"
#: The names older versions used; the role removes them (a 50- file would lose to override.conf).
OLD_DROPIN_NAMES = ("50-sglfleet-training-resume.conf",)


class ResumeError(ValueError):
    """Bad input for the phase; the message names the variable or file at fault."""


# --- the dataset ----------------------------------------------------------------------------------


class DatasetState(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str
    exists: bool
    sha256: str | None = None
    rows: int | None = None
    matches: bool = False
    kept_aside: tuple[str, ...] = ()


def file_digest(path: Path) -> tuple[str, int]:
    """sha256 and row count (non-empty lines) of a JSONL file, in one pass."""
    sha = hashlib.sha256()
    rows = 0
    pending = b""
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            sha.update(chunk)
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            rows += sum(1 for line in lines if line.strip())
    rows += 1 if pending.strip() else 0
    return sha.hexdigest(), rows


def kept_aside(path: Path) -> tuple[str, ...]:
    """The files earlier hand-overs kept aside next to `path`, oldest first."""
    with contextlib.suppress(OSError):
        names = sorted(n for n in os.listdir(path.parent) if n.startswith(path.name + KEPT_INFIX))
        return tuple(str(path.parent / n) for n in names)
    return ()


def dataset_state(path: str | Path, expected_sha256: str | None = None) -> DatasetState:
    path = Path(path)
    if not path.is_file():
        if path.exists():
            raise ResumeError(f"{path}: is not a regular file (the training set goes there)")
        return DatasetState(path=str(path), exists=False, kept_aside=kept_aside(path))
    sha, rows = file_digest(path)
    return DatasetState(
        path=str(path),
        exists=True,
        sha256=sha,
        rows=rows,
        matches=expected_sha256 is not None and sha == expected_sha256.lower(),
        kept_aside=kept_aside(path),
    )


def aside_name(path: Path, sha256: str, now: datetime | None = None) -> Path:
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return path.with_name(f"{path.name}{KEPT_INFIX}{stamp}-{sha256[:12]}")


class InstallResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    changed: bool
    state: DatasetState
    moved_aside: str | None = None


def install_dataset(
    staged: str | Path,
    path: str | Path,
    expected_sha256: str,
    *,
    check_mode: bool = False,
    now: datetime | None = None,
) -> InstallResult:
    """Move `staged` (a copy next to `path`) to `path`; what was there with other content is kept aside.

    Refuses a staged file whose sha256 is not `expected_sha256` (a transfer went wrong) and leaves
    everything as it was.
    """
    staged, path = Path(staged), Path(path)
    before = dataset_state(path, expected_sha256)
    if before.matches:
        if not check_mode:
            with contextlib.suppress(FileNotFoundError):
                staged.unlink()
        return InstallResult(changed=False, state=before)
    moved = aside_name(path, before.sha256 or "", now) if before.exists else None
    if check_mode:
        return InstallResult(changed=True, state=before, moved_aside=str(moved) if moved else None)
    if staged.parent.resolve() != path.parent.resolve():
        raise ResumeError(f"{staged}: the staged copy must be in {path.parent} (a rename moves it in)")
    sha, _rows = file_digest(staged)
    if sha != expected_sha256.lower():
        raise ResumeError(
            f"{staged}: sha256 {sha} is not the merged set's {expected_sha256}: the copy is incomplete "
            f"or the source changed; {path} was left as it was"
        )
    if moved is not None:
        os.link(path, moved)  # the old content stays reachable under its new name before anything moves
    move_into_place(staged, path)
    return InstallResult(
        changed=True, state=dataset_state(path, expected_sha256), moved_aside=str(moved) if moved else None
    )


# --- the fleet ------------------------------------------------------------------------------------


class FleetPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    instances: tuple[int, ...]
    running: tuple[int, ...]
    enabled: tuple[int, ...]
    keep: tuple[int, ...]
    to_stop: tuple[int, ...]
    to_disable: tuple[int, ...]
    kept_gpus: tuple[int, ...]
    generation_jobs: tuple[str, ...]
    refused: str = ""
    # each instance's port (SGLANG_FLEET_PORT of its environment file), for the router's worker URLs
    ports: dict[int, int] = {}

    def as_dict(self) -> dict[str, Any]:
        data = self.model_dump()
        data["stopped"] = [i for i in self.instances if i not in self.keep]
        data["stopped_ports"] = [self.ports[i] for i in data["stopped"] if i in self.ports]
        del data["ports"]
        data["units_to_stop"] = [f"sglang@{i}.service" for i in self.to_stop]
        return data


def _active_generation_units(systemctl: host.Systemctl) -> list[str]:
    return host.list_units(
        GENERATION_UNIT_GLOB, states=("active", "activating", "reloading"), systemctl=systemctl
    )


def instance_gpus(config_dir: Path, indices: Sequence[int]) -> list[int]:
    """The GPUs (CUDA_VISIBLE_DEVICES) the instances' environment files give them: nvidia-smi's indices,
    since those files also set CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    gpus: set[int] = set()
    for i in indices:
        try:
            values = host.read_env_file(config_dir / f"instance-{i}.env").values
        except OSError:
            continue
        except host.EnvFileError as exc:
            raise ResumeError(f"instance {i} cannot start: {exc}") from None
        for word in values.get("CUDA_VISIBLE_DEVICES", "").split(","):
            if word.strip().isdigit():
                gpus.add(int(word))
    return sorted(gpus)


def instance_ports(config_dir: Path, indices: Sequence[int]) -> dict[int, int]:
    """Each instance's port, as its environment file gives it (SGLANG_FLEET_PORT); instances without a
    readable file or port are left out."""
    ports: dict[int, int] = {}
    for i in indices:
        try:
            values = host.read_env_file(config_dir / f"instance-{i}.env").values
        except (OSError, host.EnvFileError):
            continue
        value = values.get("SGLANG_FLEET_PORT", "").strip()
        if value.isdigit():
            ports[i] = int(value)
    return ports


def fleet_plan(
    config_dir: str | Path,
    keep: Sequence[int],
    *,
    allow_running_jobs: bool = False,
    systemctl: host.Systemctl = host.query,
    proc: Path = host.PROC,
) -> FleetPlan:
    """Stop every instance but `keep`; refuse while a generation job runs, unless allowed."""
    config_dir = Path(config_dir)
    bad = [k for k in keep if not isinstance(k, int) or k < 0]
    if bad:
        raise ResumeError(f"training_resume_keep_instances: {bad} are not instance indices (0, 1, ...)")
    instances = fleet.existing_instances(config_dir, systemctl)
    states = fleet.unit_states(instances, systemctl, proc)
    running = [i for i in instances if states[i].active in training_mod.RUNNING_STATES]
    enabled = [i for i in instances if states[i].enabled == "enabled"]
    missing = sorted(set(keep) - set(instances))
    if missing:
        raise ResumeError(
            f"training_resume_keep_instances: {missing} are not instances of this host "
            f"(it has {instances or 'none'}, from sglang@*.service and {config_dir}/instance-*.env)"
        )
    to_stop = [i for i in running if i not in keep]
    jobs = _active_generation_units(systemctl) + [
        f"process {p.pid} ({p.cmdline[:120]})"
        for p in training_mod.matching_processes([GENERATION_PATTERN], proc)
        if not p.unit.startswith("sglfleet-gen-")
    ]
    refused = ""
    if jobs and to_stop and not allow_running_jobs:
        refused = (
            f"a generation job is still running on the fleet ({'; '.join(jobs)}): stopping instances "
            f"{to_stop} would cut it off. Wait until it ends (sglfleet job status), stop it, or set "
            "training_resume_allow_running_jobs=true"
        )
    return FleetPlan(
        instances=tuple(instances),
        running=tuple(running),
        enabled=tuple(enabled),
        keep=tuple(sorted(set(keep))),
        to_stop=tuple(to_stop),
        to_disable=tuple(i for i in enabled if i not in keep),
        kept_gpus=tuple(instance_gpus(config_dir, sorted(set(keep)))),
        generation_jobs=tuple(jobs),
        refused=refused,
        ports=instance_ports(config_dir, instances),
    )


def gpus_not_free(facts: fleet.GpuFacts, kept_gpus: Sequence[int], max_used_mib: int) -> list[str]:
    """What holds a GPU that should be free: a compute process on it, or memory used above `max_used_mib`."""
    problems = []
    for gpu in facts.gpus:
        if gpu.index in kept_gpus:
            continue
        for p in gpu.processes:
            problems.append(f"GPU {gpu.index}: compute process {p.pid} ({p.process_name or '?'})")
        if gpu.memory_used_mib is not None and gpu.memory_used_mib > max_used_mib:
            problems.append(f"GPU {gpu.index}: {gpu.memory_used_mib} MiB used (more than {max_used_mib} MiB)")
    return problems


# --- the training ---------------------------------------------------------------------------------


def _fields(template: str, what: str) -> set[str]:
    try:
        names = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as exc:
        raise ResumeError(f"{what}: {template!r} is not a valid template: {exc}") from None
    unknown = names - PLACEHOLDERS
    if unknown:
        raise ResumeError(
            f"{what}: {template!r} uses {sorted(unknown)}; only {{dataset}} and {{checkpoint}} "
            "are filled in (write {{ and }} for literal braces)"
        )
    return names


def render(template: str, values: Mapping[str, str], what: str) -> str:
    _fields(template, what)
    return template.format(**values)


def _systemd_dollar(value: str) -> str:
    """A filled-in value on an ExecStart= line: systemd expands ``$VAR``/``${VAR}`` there from the unit's
    environment (systemd.service(5), "Command lines"); ``$$`` is a literal ``$``."""
    return value.replace("$", "$$")


_ENV_FILE_SHOWN = re.compile(r"^(.*) \(ignore_errors=(yes|no)\)$")


def environment_file_overrides(unit: str, names: Sequence[str], systemctl: host.Systemctl) -> list[str]:
    """Which of `names` the unit's EnvironmentFile= files set ("<file> sets <NAME>"): those files override
    Environment= (systemd.exec(5)), so a drop-in's value for such a name would never reach the job."""
    found = []
    for shown in host.show_repeated(unit, "EnvironmentFiles", systemctl):
        match = _ENV_FILE_SHOWN.match(shown)
        if not match:
            continue
        paths = sorted(glob.glob(match[1])) if glob.has_magic(match[1]) else [match[1]]
        for path in paths:
            try:
                env_file = host.read_env_file(Path(path))
            except OSError:
                continue  # a file that is not there sets nothing (systemd fails the start itself unless "-")
            except host.EnvFileError as exc:
                raise ResumeError(f"{unit} cannot start: {exc}") from None
            found += [f"{path}:{a.line} sets {a.name}" for a in env_file.assignments if a.name in names]
    return found


def _systemd_quote(value: str) -> str:
    """A value for ``Environment="NAME=value"`` (systemd.syntax: quotes and backslashes escaped, no %)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")


def environment_problems(
    unit_names: Sequence[str], environment: Mapping[str, str], systemctl: host.Systemctl = host.query
) -> list[str]:
    """Which of the units would not start with `environment` (after a daemon-reload): the
    ``Environment=`` in effect, as `systemctl show` reads it back, lacks a name or has another value
    for it; a drop-in whose file name sorts after ours (systemd.unit(5)) set it again."""
    names = [host.unit_name(u) for u in unit_names]
    problems = []
    shown_all = host.show(names, ("Id", "Environment", "DropInPaths"), systemctl)
    for name, shown in zip(names, shown_all, strict=True):
        in_effect: dict[str, str] = {}
        for word in host.split_shown_list(shown.get("Environment", "")):
            key, sep, value = word.partition("=")
            if sep:
                in_effect[key] = value  # a later assignment of the same name wins (systemd.exec(5))
        wrong = [
            f"{key}={in_effect[key]!r} (asked for {want!r})" if key in in_effect else f"{key} unset"
            for key, want in sorted(environment.items())
            if in_effect.get(key) != want
        ]
        if wrong:
            problems.append(f"{name}: {', '.join(wrong)}; drop-ins: {shown.get('DropInPaths') or 'none'}")
    return problems


def dropin_text(environment: Mapping[str, str]) -> str:
    lines = [
        "# Written by the sglfleet training_resume role: the set and checkpoint this unit resumes with.",
        "[Service]",
    ]
    lines += [f'Environment="{_systemd_quote(f"{k}={v}")}"' for k, v in sorted(environment.items())]
    return "\n".join(lines) + "\n"


class LaunchPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    mode: Literal["unit", "command", "none"]
    units: tuple[str, ...] = ()
    dropin_name: str = ""
    dropin_content: str = ""
    environment: dict[str, str] = {}
    transient_unit: str = ""
    argv: tuple[str, ...] = ()
    command: str = ""
    units_running: tuple[str, ...] = ()
    units_loaded: tuple[str, ...] = ()

    @property
    def to_start(self) -> list[str]:
        if self.mode == "none":
            return []
        names = self.units if self.mode == "unit" else (self.transient_unit,)
        return [u for u in names if u not in self.units_running]

    def as_dict(self) -> dict[str, Any]:
        return {**self.model_dump(), "to_start": self.to_start}


def launch_plan(
    *,
    units: Sequence[str],
    environment: Mapping[str, str],
    command: str,
    dataset: str,
    checkpoint: str,
    transient_unit: str = DEFAULT_TRANSIENT_UNIT,
    dropin_name: str = DROPIN_NAME,
    systemctl: host.Systemctl = host.query,
) -> LaunchPlan:
    """Units (with a drop-in Environment=) when there are any; else the command as a transient unit;
    neither (phase training_stop stopped no job, and no command is given): nothing to start."""
    values = {"dataset": dataset, "checkpoint": checkpoint}
    env = {}
    for name, template in environment.items():
        if not host.ENV_NAME_RE.match(name):
            raise ResumeError(f"training_resume_environment: {name!r} is not an environment variable name")
        env[name] = render(str(template), values, f"training_resume_environment.{name}")
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in env[name]):
            # A newline would end the drop-in's Environment= line; `systemctl show` prints any control
            # character C-escaped (shell_maybe_quote -> cescape_char, src/basic/escape.c), so the check
            # that reads the value back could not compare it either.
            raise ResumeError(
                f"training_resume_environment.{name}: the value {env[name]!r} has a control character "
                "(newline, tab, ...); give it without one"
            )
    if units:
        found = training_mod.units(list(units), systemctl)
        missing = [u.name for u in found if not u.loaded]
        if missing:
            raise ResumeError(
                f"training units {missing} do not exist on this host (phase training_stop recorded them; "
                "set training_resume_units to the units to start)"
            )
        if not env:
            raise ResumeError(
                "training_resume_environment is empty: say how the units get the dataset and checkpoint, "
                'e.g. {TRAIN_DATA: "{dataset}", RESUME_FROM: "{checkpoint}"}'
            )
        overrides = [
            f"{u.Id}: {where}"
            for u in found
            for where in environment_file_overrides(u.Id, sorted(env), systemctl)
        ]
        if overrides:
            raise ResumeError(
                f"training_resume_environment: {'; '.join(overrides)}, and a unit's EnvironmentFile= "
                "overrides the drop-in's Environment= (systemd.exec(5)), so the job would not get the value "
                "planned. Use another variable name, or remove it from that file"
            )
        return LaunchPlan(
            mode="unit",
            units=tuple(u.Id for u in found),
            dropin_name=dropin_name,
            dropin_content=dropin_text(env),
            environment=env,
            units_running=tuple(u.Id for u in found if u.running),
            units_loaded=tuple(u.Id for u in found),
        )
    if not command.strip():
        return LaunchPlan(mode="none", environment=env)
    # Not a shell: systemd-run's command line is split by systemd, which expands $VAR from the unit's
    # environment; a $ in a path is kept by writing it $$.
    quoted = {k: shlex.quote(_systemd_dollar(v)) for k, v in values.items()}
    rendered = render(command, quoted, "training_resume_command")
    try:
        words = shlex.split(rendered)
    except ValueError as exc:
        raise ResumeError(f"training_resume_command: {exc}: {command!r}") from None
    transient = host.unit_name(transient_unit)
    state = training_mod.units([transient], systemctl)[0]
    # KillSignal=SIGTERM is systemd's default, said explicitly; KillMode=mixed sends it to the main process
    # (torchrun) alone, which forwards it to its ranks, instead of to every process of the unit at once.
    argv = [
        "systemd-run", f"--unit={transient}", "--property=KillSignal=SIGTERM", "--property=KillMode=mixed",
        "--collect",
    ]  # fmt: skip
    argv += [f"--setenv={k}={v}" for k, v in sorted(env.items())]
    argv += ["--", *words]
    return LaunchPlan(
        mode="command",
        environment=env,
        transient_unit=transient,
        argv=tuple(argv),
        command=rendered,
        units_running=(transient,) if state.running else (),
        units_loaded=(transient,) if state.loaded else (),
    )


def loaded_rows(log: str, pattern: str) -> int | None:
    """The row count the last line matching `pattern` (its first group) gives; None when no line matches."""
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise ResumeError(f"training_resume_loaded_pattern: {pattern!r}: {exc}") from None
    found = None
    for line in log.splitlines():
        if m := rx.search(line):
            found = m
    if found is None:
        return None
    if not rx.groups:
        return -1
    digits = re.sub(r"[^0-9]", "", found.group(1) or "")
    return int(digits) if digits else -1


# --- the look after the start ---------------------------------------------------------------------


class JobLook(BaseModel):
    """The resumed job as it runs now: its units, their main processes, GPU memory, what its log says."""

    model_config = ConfigDict(frozen=True)

    units: dict[str, dict[str, str]]
    running: bool
    main_pids: dict[str, int]
    gpu_processes: tuple[int, ...] = ()
    gpu_memory_mib: int = 0
    nvidia_smi_found: bool = False
    loaded_rows: int | None = None
    log_lines: int = 0


#: What `look` reads of each unit of the resumed job.
_LOOK_PROPERTIES = (
    "Id",
    "ActiveState",
    "MainPID",
    "NRestarts",
    "ActiveEnterTimestampMonotonic",
    "InvocationID",
)


def look(
    units: Sequence[str],
    *,
    pattern: str = "",
    gpu_facts: fleet.GpuFacts | None = None,
    systemctl: host.Systemctl = host.query,
    journal: host.Systemctl = host.query,
    proc: Path = host.PROC,
) -> JobLook:
    """The units' state, the GPU memory their processes hold, and the rows the log of this run says."""
    names = [host.unit_name(u) for u in units]
    shown = dict(zip(names, host.show(names, _LOOK_PROPERTIES, systemctl), strict=True))
    running = bool(shown) and all(p.get("ActiveState") in ("active", "reloading") for p in shown.values())
    ids = set(shown)
    gpu_pids: list[int] = []
    memory = 0
    if gpu_facts is not None:
        for p in gpu_facts.processes:
            if host.process_unit(p.pid, proc) in ids:
                gpu_pids.append(p.pid)
                memory += p.used_memory_mib or 0
    rows = None
    count = 0
    if pattern:
        texts = []
        for unit, props in shown.items():
            # This run's lines only: the journal of the unit's current invocation.
            invocation = props.get("InvocationID", "")
            match = f"_SYSTEMD_INVOCATION_ID={invocation}" if invocation else f"--unit={unit}"
            argv = ["journalctl", "--no-pager", "--output=cat", match]
            texts.append(journal(argv))
        text = "\n".join(texts)
        count = len(text.splitlines())
        rows = loaded_rows(text, pattern)
    return JobLook(
        units=shown,
        running=running,
        main_pids={u: int(p.get("MainPID") or 0) for u, p in shown.items()},
        gpu_processes=tuple(gpu_pids),
        gpu_memory_mib=memory,
        nvidia_smi_found=bool(gpu_facts and gpu_facts.nvidia_smi_found),
        loaded_rows=rows,
        log_lines=count,
    )
