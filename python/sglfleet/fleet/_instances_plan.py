"""What to do about the fleet's SGLang instances, and the one write: their environment files.

`plan()` compares the layout (`_instances`) with what runs (`_instances_observe`): which instances to
start, which to roll (restart one at a time: they run another configuration than the one asked for),
which to retire, and which ports another process holds. `write_env_files()` is the only function
that writes.

The digest of an instance is a SHA-256 over everything that changes what its server runs: the unit
file, its environment file, the venv's installed distributions (a new SGLang or torch pin), the
common environment file, and the model directory's files. A running process whose digest differs
from the one planned is rolled.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from sglfleet import atomicio
from sglfleet.fleet._instances import RUNNING_STATES, FleetSpec, GpuInventory, InstanceSpec, layout
from sglfleet.fleet._instances_observe import Observed, RuntimeInputs, UnitState

__all__ = ["Plan", "plan", "write_env_files"]

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
            # 0600 from the temporary file's birth: a secret is never readable by others, not even briefly.
            atomicio.write_text(path, text, mode=mode)
        changes.append(change)
    return [c for c in changes if c.changed]
