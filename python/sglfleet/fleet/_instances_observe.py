"""The fleet's SGLang instances as they run: what `observe()` sees on the host, changing nothing.

The `sglang@` units systemd knows (or that have an environment file), each one's state and the
configuration digest its running process carries in its environment, who listens on the fleet's
ports, and the inputs that change what a server runs without showing in its flags (the packages of
the server's venv, the sglang role's `common.env`, the model's files).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from sglfleet import host
from sglfleet.fleet._instances import (
    DIGEST_VARIABLE,
    RECORDED_BACKEND_VARIABLE,
    FleetSpec,
    GpuInventory,
    instance_count,
)

__all__ = ["Observed", "existing_instances", "observe", "unit_states"]

UNIT_RE = re.compile(r"^sglang@(\d+)\.service$")
_ENV_FILE_RE = re.compile(r"^instance-(\d+)\.env$")


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
        return bool(self.holders) and all(UNIT_RE.match(h) for h in self.holders)

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


def existing_instances(
    config_dir: Path,
    systemctl: host.Systemctl = host.query,
    etc_systemd: Path = Path("/etc/systemd/system"),
) -> list[int]:
    """Instances systemd knows, that are enabled, or that have an environment file."""
    found: set[int] = set()
    names = host.list_units("sglang@*.service", systemctl=systemctl)
    with contextlib.suppress(OSError):
        names += os.listdir(etc_systemd / "multi-user.target.wants")
    for name in names:
        if m := UNIT_RE.match(name):
            found.add(int(m.group(1)))
    with contextlib.suppress(OSError):
        for name in os.listdir(config_dir):
            if m := _ENV_FILE_RE.match(name):
                found.add(int(m.group(1)))
    return sorted(found)


def unit_states(
    indices: Iterable[int], systemctl: host.Systemctl = host.query, proc: Path = host.PROC
) -> dict[int, UnitState]:
    """systemd's ActiveState, MainPID and UnitFileState of each instance, and its process's digest."""
    indices = list(indices)
    shown = host.show(
        [f"sglang@{i}.service" for i in indices], ("Id", "ActiveState", "MainPID", "UnitFileState"), systemctl
    )
    states = {}
    for i, props in zip(indices, shown, strict=True):
        pid = int(props.get("MainPID") or 0)
        states[i] = UnitState(
            index=i,
            active=props.get("ActiveState", "inactive"),
            pid=pid,
            enabled=props.get("UnitFileState", ""),
            digest=host.environ(pid, proc).get(DIGEST_VARIABLE, "") if pid else "",
        )
    return states


def listeners(ports: Iterable[int], proc: Path = host.PROC) -> list[Listener]:
    """Who listens on each of `ports` (TCP, IPv4 and IPv6): an instance's unit, or another process.

    A socket in this network namespace that no process of this PID namespace holds belongs to the
    host or to another container sharing the namespace: it is listed without holders.
    """
    return [
        Listener(port=port, holders=tuple(dict.fromkeys(_holder(pid, proc) for pid in pids)))
        for port, pids in host.listeners(ports, proc).items()
    ]


def _holder(pid: int, proc: Path) -> str:
    if UNIT_RE.match(unit := host.process_unit(pid, proc)):
        return unit
    cmdline = host.cmdline(pid, proc)
    return f"pid {pid} ({(cmdline.strip() if cmdline is not None else '?')[:80]})"


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
        recorded_backend=host.parse_env_file(common).values.get(RECORDED_BACKEND_VARIABLE, ""),
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


def observe(spec: FleetSpec, gpus: GpuInventory, systemctl: host.Systemctl = host.query) -> Observed:
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
