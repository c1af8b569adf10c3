"""The fleet's SGLang instances: what the configuration asks for, what runs, and what to do about it.

`layout()` turns a `FleetSpec` (the role's variables) into one `InstanceSpec` per instance: its GPUs,
port, model and server flags, and the environment file systemd starts it with. `observe()` looks at
the host without changing it: the `sglang@` units, the configuration digest each running process
carries in its environment, who listens on the fleet's ports, and the inputs that change what a
server runs without showing in its flags (the packages of the server's venv, the sglang role's
`common.env`, the model's files). `plan()` compares the two: which instances to start, which to roll
(restart one at a time: they run another configuration than the one asked for), which to retire,
and which ports another process holds. `write_env_files()` is the only function that writes.

The digest of an instance is a SHA-256 over everything that changes what its server runs: the unit
file, its environment file, the venv's installed distributions (a new SGLang or torch pin), the
common environment file, and the model directory's files. A running process whose digest differs
from the one planned is rolled.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sglfleet.fleet._backend import ATTENTION_BACKENDS

#: The line of the sglang role's common environment file that records its backend decision.
RECORDED_BACKEND_VARIABLE = "SGLANG_ATTENTION_BACKEND"
#: The environment variable that carries an instance's configuration digest into its process.
DIGEST_VARIABLE = "SGLANG_FLEET_DIGEST"
#: CUDA numbers devices FASTEST_FIRST unless told otherwise; nvidia-smi numbers them in PCI bus order.
#: Every instance gets PCI_BUS_ID, so that its CUDA_VISIBLE_DEVICES are nvidia-smi's indices (which the
#: GPU ids of the inventory, `sglfleet status` and phase training_resume read them as).
DEVICE_ORDER = "PCI_BUS_ID"
#: The GPU variables the fleet writes itself; sglang_fleet_environment may not set them.
GPU_VARIABLES = ("CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES")
#: systemd states in which an instance's server runs (or is about to answer).
RUNNING_STATES = frozenset({"active", "reloading"})

_UNIT_RE = re.compile(r"^sglang@(\d+)\.service$")
_ENV_FILE_RE = re.compile(r"^instance-(\d+)\.env$")
_CGROUP_UNIT_RE = re.compile(r"sglang@(\d+)\.service")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class InstanceModel(BaseModel):
    """The model one instance serves, where it differs from the fleet's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_path: str
    served_model_name: str = ""


class FleetSpec(BaseModel):
    """What the inventory asks for (the sglang_fleet role's variables, without the prefix)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    instances: int | None = None
    #: By instance: one GPU id, or a list of them (tensor parallel over those GPUs). [] = instance i on GPU i.
    gpu_ids: tuple[int | tuple[int, ...], ...] = ()
    #: By instance: None/absent = the fleet's model.
    instance_models: tuple[InstanceModel | None, ...] = ()
    check_gpus: bool = True
    host: str = "127.0.0.1"
    port_base: int = 30000
    model_path: str = ""
    served_model_name: str = ""
    #: "" = what the sglang phase recorded in the common environment file; None = no flag.
    attention_backend: str | None = ""
    mem_fraction_static: float | None = None
    context_length: int | None = None
    max_running_requests: int | None = None
    #: --watchdog-timeout: SGLang kills its own server when a forward batch stalls this long (a hung GPU),
    #: so that the unit's Restart=on-failure brings the instance back; None leaves SGLang's 300 s.
    watchdog_timeout: float | None = None
    enable_metrics: bool = True
    api_key: str = ""
    #: The environment variable a launcher reads the key from (then it is not in SGLANG_ARGS, so never
    #: on a command line); "" passes --api-key in SGLANG_ARGS.
    api_key_variable: str = ""
    extra_args: tuple[str, ...] = ()
    environment: Mapping[str, str] = Field(default_factory=dict)
    config_dir: str = "/etc/sglang"
    common_env_file: str = "/etc/sglang/common.env"
    venv: str = "/opt/sglang/venv"
    #: The unit file's text as it will be installed (part of every digest).
    unit_text: str = ""
    #: How messages name the host, and the prefix of the variable names they name.
    host_name: str = "this host"
    vars_prefix: str = ""

    def var(self, name: str) -> str:
        return f"{self.vars_prefix}{name}"

    @property
    def probe_host(self) -> str:
        """The address health probes use: a wildcard listener answers on loopback."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host


class GpuInventory(BaseModel):
    """What gpu_facts found: how many GPUs, and whether there was an nvidia-smi to ask."""

    model_config = ConfigDict(frozen=True)

    gpu_count: int = 0
    nvidia_smi_found: bool = False


class InstanceSpec(BaseModel):
    """One instance as configured: everything its environment file says."""

    model_config = ConfigDict(frozen=True)

    index: int
    gpus: tuple[int, ...]
    port: int
    model_path: str
    served_model_name: str
    args: tuple[str, ...]
    environment: tuple[tuple[str, str], ...]
    #: (variable, key) when a launcher hands the API key to the server in-process.
    api_key_env: tuple[str, str] | None = None

    @property
    def unit(self) -> str:
        return f"sglang@{self.index}.service"

    @property
    def expected_model(self) -> str:
        return self.served_model_name or self.model_path

    def env_body(self) -> str:
        """The environment file without its header and digest (systemd EnvironmentFile syntax)."""
        lines = [
            f"CUDA_DEVICE_ORDER={DEVICE_ORDER}",
            f"CUDA_VISIBLE_DEVICES={','.join(map(str, self.gpus))}",
            f"PROMETHEUS_MULTIPROC_DIR=/run/sglang/instance-{self.index}",
            f"SGLANG_FLEET_INSTANCE={self.index}",
            f"SGLANG_FLEET_PORT={self.port}",
        ]
        lines += [f"{name}={_quote(value)}" for name, value in self.environment]
        lines.append(f"SGLANG_ARGS={_quote(' '.join(self.args))}")
        if self.api_key_env:
            lines.append(f"{self.api_key_env[0]}={_quote(self.api_key_env[1])}")
        return "\n".join(lines) + "\n"

    def env_text(self, digest: str) -> str:
        return (
            f"# Managed by Ansible (role sglang_fleet): SGLang instance {self.index}"
            f" (unit {self.unit}).\n{self.env_body()}{DIGEST_VARIABLE}={digest}\n"
        )


class UnitState(BaseModel):
    """What systemd says of one sglang@ instance, and the digest its running process carries."""

    model_config = ConfigDict(frozen=True)

    index: int
    active: str = "inactive"
    pid: int = 0
    enabled: str = ""
    digest: str = ""


class Listener(BaseModel):
    """A TCP socket listening on one of the fleet's ports, and who holds it."""

    model_config = ConfigDict(frozen=True)

    port: int
    #: "sglang@3.service" for an instance, "pid 42 (cmdline...)" for another process we can see.
    holders: tuple[str, ...] = ()

    @property
    def ours(self) -> bool:
        return bool(self.holders) and all(_UNIT_RE.match(h) for h in self.holders)

    def describe(self) -> str:
        who = " ".join(self.holders) or "a process this host cannot see (the host or another container)"
        return f"{self.port}: {who}"


class RuntimeInputs(BaseModel):
    """What a server runs that its flags do not show; each entry goes into every digest."""

    model_config = ConfigDict(frozen=True)

    #: sha256 over the venv's installed distributions (their RECORD files: names, versions, content).
    venv: str = ""
    distributions: tuple[str, ...] = ()
    common_env: str = ""
    common_env_exists: bool = False
    #: The backend the sglang phase recorded in the common environment file ("" = none).
    recorded_backend: str = ""
    #: model path -> sha256 over its files' names, sizes and modification times ("" = not a directory).
    models: Mapping[str, str] = Field(default_factory=dict)

    def version_of(self, name: str) -> str | None:
        prefix = f"{name.lower().replace('-', '_')}=="
        return next((d.split("==", 1)[1] for d in self.distributions if d.lower().startswith(prefix)), None)


class Observed(BaseModel):
    """The host as it is: instances systemd knows or that have an environment file, and listeners."""

    model_config = ConfigDict(frozen=True)

    existing: tuple[int, ...] = ()
    units: Mapping[int, UnitState] = Field(default_factory=dict)
    listeners: tuple[Listener, ...] = ()
    runtime: RuntimeInputs = Field(default_factory=RuntimeInputs)
    unit_installed: bool = False


Action = Literal["start", "roll", "none"]


class PlannedInstance(BaseModel):
    model_config = ConfigDict(frozen=True)

    spec: InstanceSpec
    digest: str
    state: UnitState
    action: Action

    def as_dict(self, probe_host: str) -> dict[str, object]:
        return {
            "index": self.spec.index,
            "unit": self.spec.unit,
            "gpus": list(self.spec.gpus),
            "port": self.spec.port,
            "url": f"http://{probe_host}:{self.spec.port}",
            "model": self.spec.expected_model,
            "tp_size": len(self.spec.gpus),
            "digest": self.digest,
            "running_digest": self.state.digest,
            "active": self.state.active,
            "enabled": self.state.enabled,
            "action": self.action,
        }


class Plan(BaseModel):
    """What to do: start, roll (one at a time, each health-gated), retire; and what stands in the way."""

    model_config = ConfigDict(frozen=True)

    instances: tuple[PlannedInstance, ...] = ()
    to_retire: tuple[int, ...] = ()
    port_conflicts: tuple[str, ...] = ()
    attention_backend: str | None = None
    attention_backend_source: str = ""

    @property
    def to_start(self) -> list[int]:
        return [p.spec.index for p in self.instances if p.action == "start"]

    @property
    def to_roll(self) -> list[int]:
        return [p.spec.index for p in self.instances if p.action == "roll"]

    def as_dict(self, probe_host: str) -> dict[str, object]:
        models: dict[str, list[str]] = {}
        for p in self.instances:
            models.setdefault(p.spec.expected_model, []).append(f"http://{probe_host}:{p.spec.port}")
        return {
            "count": len(self.instances),
            "instances": [p.as_dict(probe_host) for p in self.instances],
            "gpus": [list(p.spec.gpus) for p in self.instances],
            "ports": [p.spec.port for p in self.instances],
            "urls": [f"http://{probe_host}:{p.spec.port}" for p in self.instances],
            "models": [{"model": m, "urls": urls} for m, urls in models.items()],
            "probe_host": probe_host,
            "to_start": self.to_start,
            "to_roll": self.to_roll,
            "to_retire": list(self.to_retire),
            "port_conflicts": list(self.port_conflicts),
            "attention_backend": self.attention_backend,
            "attention_backend_source": self.attention_backend_source,
        }


# --- the configuration -------------------------------------------------------------------------


def _gpu_sets(spec: FleetSpec, gpus: GpuInventory) -> list[tuple[int, ...]]:
    if spec.gpu_ids:
        return [(g,) if isinstance(g, int) else tuple(g) for g in spec.gpu_ids]
    count = instance_count(spec, gpus)
    return [(i,) for i in range(max(count, 0))]


def instance_count(spec: FleetSpec, gpus: GpuInventory) -> int:
    """sglang_fleet_instances, else one per entry of gpu_ids, else one per GPU found."""
    if spec.instances is not None:
        return spec.instances
    if spec.gpu_ids:
        return len(spec.gpu_ids)
    return gpus.gpu_count


def problems(
    spec: FleetSpec, gpus: GpuInventory, *, path_exists: Callable[[str], bool] = os.path.exists
) -> list[str]:
    """Every reason the configuration cannot run on this host, each naming the variable to fix."""
    out: list[str] = []
    v = spec.var
    host = spec.host_name
    found = f"(nvidia-smi found: {gpus.nvidia_smi_found})"
    if spec.instances is None and not spec.gpu_ids and gpus.gpu_count == 0:
        return [
            f"{v('instances')} is not set and {host} has no GPU {found}, so there is no instance to run. "
            f"Set {v('instances')} in the inventory (one instance per GPU)."
        ]
    count = instance_count(spec, gpus)
    if count < 0:
        out.append(f"{v('instances')} ({count}) must not be negative.")
        return out
    if spec.port_base < 1024 or spec.port_base + count - 1 > 65535:
        out.append(
            f"{v('instances')} ({count}) and the ports {v('port_base')} ({spec.port_base}) .. +instances-1 "
            "must lie within 1024..65535."
        )
    sets = _gpu_sets(spec, gpus)
    if spec.check_gpus and not spec.gpu_ids and count > gpus.gpu_count:
        out.append(
            f"{v('instances')} is {count} but {host} has {gpus.gpu_count} GPU(s) {found}: run at most one "
            f"instance per GPU. Only a lab without GPUs may set {v('check_gpus')}: false."
        )
    out += _gpu_set_problems(spec, gpus, sets, count)
    if len(spec.instance_models) > count:
        out.append(f"{v('instance_models')} has {len(spec.instance_models)} entries for {count} instances.")
    if not spec.model_path and any(m is None for m in _models_by_instance(spec, count)):
        out.append(f"{v('model_path')} must be set (a directory on the target or a Hugging Face id).")
    named = [(v("model_path"), spec.model_path)] + [
        (f"{v('instance_models')}[{i}].model_path", m.model_path)
        for i, m in enumerate(spec.instance_models)
        if m is not None
    ]
    for name, path in dict.fromkeys(named):
        if path.startswith("/") and not path_exists(path):
            out.append(
                f"{name} {path} does not exist on {host}: download the model there first, or fix the path."
            )
    if re.search(r"\s", spec.api_key):
        out.append(f"{v('api_key')} must not contain whitespace.")
    bad_args = [a for a in spec.extra_args if not a or re.search(r"\s", a)]
    if bad_args:
        out.append(
            f"each of {v('extra_args')} {json.dumps(list(spec.extra_args))} must be one word without "
            f"whitespace (give a flag and its value as two items): {json.dumps(bad_args)}."
        )
    if spec.api_key_variable and not _ENV_NAME_RE.match(spec.api_key_variable):
        out.append(f"api_key_variable {spec.api_key_variable!r} is not a variable name.")
    bad_names = [k for k in spec.environment if not _ENV_NAME_RE.match(k)]
    if bad_names:
        out.append(f"{v('environment')} keys must be variable names: {json.dumps(bad_names)}.")
    if ours := [k for k in GPU_VARIABLES if k in spec.environment]:
        out.append(
            f"{v('environment')} sets {json.dumps(ours)}: the fleet writes these itself (the GPUs of "
            f"{v('gpu_ids')}, numbered as nvidia-smi numbers them: CUDA_DEVICE_ORDER={DEVICE_ORDER})."
        )
    if spec.attention_backend and spec.attention_backend not in ATTENTION_BACKENDS:
        out.append(
            f"{v('attention_backend')} '{spec.attention_backend}' is not an SGLang 0.5.12 "
            f"--attention-backend (known: {', '.join(ATTENTION_BACKENDS)}); "
            "leave it empty for the sglang phase's decision."
        )
    return out


def _gpu_set_problems(
    spec: FleetSpec, gpus: GpuInventory, sets: Sequence[tuple[int, ...]], count: int
) -> list[str]:
    v = spec.var
    shown = json.dumps([list(s) if len(s) != 1 else s[0] for s in sets])
    out: list[str] = []
    detail: list[str] = []
    if len(sets) != count:
        detail.append(f"{len(sets)} GPU sets for {count} instances;")
    owners: dict[int, list[int]] = {}
    for index, gpu_set in enumerate(sets):
        if not gpu_set:
            detail.append(f"instance {index} has no GPU;")
        if len(set(gpu_set)) != len(gpu_set):
            detail.append(f"instance {index} names a GPU twice;")
        for gpu in dict.fromkeys(gpu_set):
            owners.setdefault(gpu, []).append(index)
    for gpu, on in owners.items():
        if len(on) > 1:
            detail.append(f"two instances on one GPU: instances {' and '.join(map(str, on))} on GPU {gpu};")
    negative = sorted(g for g in owners if g < 0)
    if negative:
        detail.append(f"negative GPU ids {negative};")
    if detail:
        out.append(
            f"{v('gpu_ids')} {shown} must give each of the {count} instances GPUs of its own (none negative, "
            f"no GPU in two instances): {' '.join(detail)}"
        )
    if spec.check_gpus:
        missing = sorted(g for g in owners if g >= gpus.gpu_count)
        if spec.gpu_ids and missing:
            out.append(
                f"{v('gpu_ids')} {shown} names GPUs that {spec.host_name} does not have "
                f"(it has {gpus.gpu_count}): {missing}."
            )
    return out


def _models_by_instance(spec: FleetSpec, count: int) -> list[InstanceModel | None]:
    return [spec.instance_models[i] if i < len(spec.instance_models) else None for i in range(count)]


def resolve_backend(spec: FleetSpec, runtime: RuntimeInputs) -> tuple[str | None, str]:
    """The --attention-backend every instance gets, and where it comes from.

    The inventory's value wins; "" takes what the sglang phase recorded (its decision from the GPUs'
    compute capability, in the common environment file); None, or nothing recorded, leaves the flag
    out and SGLang chooses.
    """
    if spec.attention_backend is None:
        return None, f"{spec.var('attention_backend')} is null: SGLang chooses"
    if spec.attention_backend:
        return spec.attention_backend, f"{spec.var('attention_backend')} (inventory)"
    if runtime.recorded_backend:
        return runtime.recorded_backend, f"the sglang phase's decision ({spec.common_env_file})"
    return None, f"nothing recorded in {spec.common_env_file}: SGLang chooses"


def layout(spec: FleetSpec, gpus: GpuInventory, backend: str | None) -> list[InstanceSpec]:
    """One InstanceSpec per instance (call after `problems()` found none)."""
    count = instance_count(spec, gpus)
    sets = _gpu_sets(spec, gpus)
    out = []
    for index, model in enumerate(_models_by_instance(spec, count)):
        model_path = model.model_path if model else spec.model_path
        served = (model.served_model_name if model else spec.served_model_name) or ""
        port = spec.port_base + index
        args = ["--model-path", model_path, "--host", spec.host, "--port", str(port)]
        if served:
            args += ["--served-model-name", served]
        if len(sets[index]) > 1:
            args += ["--tp-size", str(len(sets[index]))]
        if backend:
            args += ["--attention-backend", backend]
        for flag, value in (
            ("--mem-fraction-static", spec.mem_fraction_static),
            ("--context-length", spec.context_length),
            ("--max-running-requests", spec.max_running_requests),
            ("--watchdog-timeout", spec.watchdog_timeout),
        ):
            if value is not None:
                args += [flag, str(value)]
        if spec.enable_metrics:
            args.append("--enable-metrics")
        if spec.api_key and not spec.api_key_variable:
            args += ["--api-key", spec.api_key]
        args += list(spec.extra_args)
        out.append(
            InstanceSpec(
                index=index,
                gpus=sets[index],
                port=port,
                model_path=model_path,
                served_model_name=served,
                args=tuple(args),
                environment=tuple(sorted((k, str(val)) for k, val in spec.environment.items())),
                api_key_env=(spec.api_key_variable, spec.api_key)
                if spec.api_key and spec.api_key_variable
                else None,
            )
        )
    return out


def digest(instance: InstanceSpec, unit_text: str, runtime: RuntimeInputs) -> str:
    """SHA-256 over every input that changes what the instance's server runs."""
    payload = {
        "unit": unit_text,
        "env": instance.env_body(),
        "venv": runtime.venv,
        "common_env": runtime.common_env,
        "model": runtime.models.get(instance.model_path, ""),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


# --- the host ----------------------------------------------------------------------------------


def _run(argv: Sequence[str]) -> str:
    """stdout of a read-only query; a host without the command (no systemd) answers nothing."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False).stdout
    except FileNotFoundError:
        return ""


def existing_instances(
    config_dir: Path,
    systemctl: Callable[[Sequence[str]], str] = _run,
    etc_systemd: Path = Path("/etc/systemd/system"),
) -> list[int]:
    """Instances systemd knows, that are enabled, or that have an environment file."""
    found: set[int] = set()
    listed = systemctl(
        ["systemctl", "list-units", "--all", "--plain", "--no-legend", "--full", "sglang@*.service"]
    )
    names = [line.split()[0] for line in listed.splitlines() if line.split()]
    with contextlib.suppress(OSError):
        names += os.listdir(etc_systemd / "multi-user.target.wants")
    for name in names:
        if m := _UNIT_RE.match(name):
            found.add(int(m.group(1)))
    with contextlib.suppress(OSError):
        for name in os.listdir(config_dir):
            if m := _ENV_FILE_RE.match(name):
                found.add(int(m.group(1)))
    return sorted(found)


def unit_states(
    indices: Iterable[int], systemctl: Callable[[Sequence[str]], str] = _run, proc: Path = Path("/proc")
) -> dict[int, UnitState]:
    """systemd's ActiveState, MainPID and UnitFileState of each instance, and its process's digest."""
    indices = list(indices)
    if not indices:
        return {}
    out = systemctl(
        ["systemctl", "show", "--property=Id,ActiveState,MainPID,UnitFileState"]
        + [f"sglang@{i}.service" for i in indices]
    )
    blocks: dict[str, dict[str, str]] = {}
    for block in out.strip().split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if "Id" in props:
            blocks[props["Id"]] = props
    states = {}
    for i in indices:
        props = blocks.get(f"sglang@{i}.service", {})
        pid = int(props.get("MainPID") or 0)
        states[i] = UnitState(
            index=i,
            active=props.get("ActiveState", "inactive"),
            pid=pid,
            enabled=props.get("UnitFileState", ""),
            digest=process_environ(pid, proc).get(DIGEST_VARIABLE, "") if pid else "",
        )
    return states


def process_environ(pid: int, proc: Path = Path("/proc")) -> dict[str, str]:
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").split("=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k: v for k, v in pairs}


def listeners(ports: Iterable[int], proc: Path = Path("/proc")) -> list[Listener]:
    """Who listens on each of `ports` (TCP, IPv4 and IPv6), from /proc/net/tcp{,6} and /proc/*/fd.

    A socket in this network namespace that no process of this PID namespace holds belongs to the
    host or to another container sharing the namespace: it is listed without holders.
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
        return []
    holders: dict[int, dict[str, None]] = {port: {} for port in inodes.values()}
    targets = {f"socket:[{inode}]": port for inode, port in inodes.items()}
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            fds = list((pid_dir / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                port = targets.get(os.readlink(fd))
            except OSError:
                continue
            if port is not None:
                holders[port][_holder(pid_dir)] = None
    return [Listener(port=port, holders=tuple(h)) for port, h in sorted(holders.items())]


def _holder(pid_dir: Path) -> str:
    with contextlib.suppress(OSError):
        if m := _CGROUP_UNIT_RE.search((pid_dir / "cgroup").read_text()):
            return f"sglang@{m.group(1)}.service"
    try:
        cmdline = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmdline = "?"
    return f"pid {pid_dir.name} ({cmdline[:80]})"


def runtime_inputs(venv: Path, common_env_file: Path, model_paths: Iterable[str]) -> RuntimeInputs:
    """The venv's distributions, the common environment file and the models' files, fingerprinted."""
    venv_hash = hashlib.sha256()
    dists = []
    for record in sorted(venv.glob("lib/python*/site-packages/*.dist-info/RECORD")):
        name, _, version = record.parent.name.removesuffix(".dist-info").partition("-")
        dists.append(f"{name}=={version}")
        venv_hash.update(record.parent.name.encode() + b"\0")
        with contextlib.suppress(OSError):
            venv_hash.update(hashlib.sha256(record.read_bytes()).digest())
    try:
        common = common_env_file.read_text()
        exists = True
    except OSError:
        common, exists = "", False
    return RuntimeInputs(
        venv=venv_hash.hexdigest() if dists else "",
        distributions=tuple(dists),
        common_env=common,
        common_env_exists=exists,
        recorded_backend=parse_env_file(common).get(RECORDED_BACKEND_VARIABLE, ""),
        models={path: model_fingerprint(Path(path)) for path in dict.fromkeys(model_paths)},
    )


def model_fingerprint(path: Path) -> str:
    """sha256 over the names, sizes and modification times of a model directory's files ("" otherwise).

    A new snapshot downloaded into the same directory changes it; reading the weights would take minutes.
    """
    if not path.is_absolute() or not path.is_dir():
        return ""
    h = hashlib.sha256()
    for entry in sorted(path.rglob("*")):
        with contextlib.suppress(OSError):
            st = entry.stat()
            if entry.is_file():
                h.update(f"{entry.relative_to(path)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def parse_env_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines of a systemd EnvironmentFile (quotes removed), comments and blanks skipped."""
    out = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, value = line.split("=", 1)
        with contextlib.suppress(ValueError):
            words = shlex.split(value)
            value = words[0] if len(words) == 1 else value
        out[key.strip()] = value
    return out


def observe(
    spec: FleetSpec, gpus: GpuInventory, systemctl: Callable[[Sequence[str]], str] = _run
) -> Observed:
    """Look at the host: units, running digests, listeners on the fleet's ports, the runtime inputs."""
    count = max(instance_count(spec, gpus), 0)
    existing = existing_instances(Path(spec.config_dir), systemctl)
    models = [spec.model_path] + [m.model_path for m in spec.instance_models if m is not None]
    return Observed(
        existing=tuple(existing),
        units=unit_states(sorted(set(range(count)) | set(existing)), systemctl),
        listeners=tuple(listeners(range(spec.port_base, spec.port_base + count))),
        runtime=runtime_inputs(Path(spec.venv), Path(spec.common_env_file), models),
        unit_installed=Path("/etc/systemd/system/sglang@.service").exists(),
    )


def plan(spec: FleetSpec, gpus: GpuInventory, observed: Observed) -> Plan:
    """Start what does not run, roll what runs another configuration, retire instances beyond the count."""
    backend, source = resolve_backend(spec, observed.runtime)
    planned = []
    for instance in layout(spec, gpus, backend):
        want = digest(instance, spec.unit_text, observed.runtime)
        state = observed.units.get(instance.index, UnitState(index=instance.index))
        if state.active not in RUNNING_STATES:
            action: Action = "start"
        elif state.digest != want:
            action = "roll"
        else:
            action = "none"
        planned.append(PlannedInstance(spec=instance, digest=want, state=state, action=action))
    count = len(planned)
    return Plan(
        instances=tuple(planned),
        to_retire=tuple(i for i in observed.existing if i >= count),
        port_conflicts=tuple(lst.describe() for lst in observed.listeners if not lst.ours),
        attention_backend=backend,
        attention_backend_source=source,
    )


# --- the one write -----------------------------------------------------------------------------


class EnvFileChange(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str
    before: str | None
    after: str
    mode_before: int | None
    mode: int

    @property
    def changed(self) -> bool:
        return self.before != self.after or self.mode_before != self.mode


def write_env_files(
    fleet: Plan, config_dir: Path, *, secret: bool, check_mode: bool = False
) -> list[EnvFileChange]:
    """Write each instance's environment file (0600 when it holds a secret); return what changed."""
    mode = 0o600 if secret else 0o644
    changes = []
    for p in fleet.instances:
        path = config_dir / f"instance-{p.spec.index}.env"
        text = p.spec.env_text(p.digest)
        try:
            before: str | None = path.read_text()
            mode_before: int | None = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            before, mode_before = None, None
        change = EnvFileChange(path=str(path), before=before, after=text, mode_before=mode_before, mode=mode)
        if change.changed and not check_mode:
            _write_private(path, text, mode)
        changes.append(change)
    return [c for c in changes if c.changed]


def _write_private(path: Path, text: str, mode: int) -> None:
    """Atomic write whose temporary file is 0600 from birth, so a secret is never world-readable."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _quote(value: str) -> str:
    """A double-quoted systemd EnvironmentFile value."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
