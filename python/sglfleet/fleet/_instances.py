"""The fleet's SGLang instances as configured: the layout, and every reason it cannot run on this host.

`layout()` turns a `FleetSpec` (the role's variables) into one `InstanceSpec` per instance: its GPUs,
port, model and server flags, and the environment file systemd starts it with. `problems()` says,
before anything is looked at or written, what in the configuration cannot run on this host, each
problem naming the variable to fix. What runs is observed in `_instances_observe`; what to do about
it is planned (and the environment files written) in `_instances_plan`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from sglfleet import host
from sglfleet.fleet._backend import ATTENTION_BACKENDS

__all__ = ["FleetSpec", "GpuInventory", "InstanceSpec", "problems"]

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
        lines += [f"{name}={host.quote(value)}" for name, value in self.environment]
        lines.append(f"SGLANG_ARGS={host.quote(' '.join(self.args))}")
        if self.api_key_env:
            lines.append(f"{self.api_key_env[0]}={host.quote(self.api_key_env[1])}")
        return "\n".join(lines) + "\n"

    def env_text(self, digest: str) -> str:
        return (
            f"# Managed by Ansible (role sglang_fleet): SGLang instance {self.index}"
            f" (unit {self.unit}).\n{self.env_body()}{DIGEST_VARIABLE}={digest}\n"
        )


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
    v = spec.var
    if spec.instances is None and not spec.gpu_ids and gpus.gpu_count == 0:
        return [
            f"{v('instances')} is not set and {spec.host_name} has no GPU {_smi_found(gpus)}, so there is no "
            f"instance to run. Set {v('instances')} in the inventory (one instance per GPU)."
        ]
    count = instance_count(spec, gpus)
    if count < 0:
        return [f"{v('instances')} ({count}) must not be negative."]
    return [
        *_port_problems(spec, count),
        *_gpu_count_problems(spec, gpus, count),
        *_gpu_set_problems(spec, gpus, _gpu_sets(spec, gpus), count),
        *_model_problems(spec, count, path_exists),
        *_argument_problems(spec),
        *_environment_problems(spec),
        *_backend_problems(spec),
    ]


def _smi_found(gpus: GpuInventory) -> str:
    return f"(nvidia-smi found: {gpus.nvidia_smi_found})"


def _port_problems(spec: FleetSpec, count: int) -> list[str]:
    """Every instance's port (port_base + index) is an unprivileged TCP port."""
    if spec.port_base >= 1024 and spec.port_base + count - 1 <= 65535:
        return []
    v = spec.var
    return [
        f"{v('instances')} ({count}) and the ports {v('port_base')} ({spec.port_base}) .. +instances-1 "
        "must lie within 1024..65535."
    ]


def _gpu_count_problems(spec: FleetSpec, gpus: GpuInventory, count: int) -> list[str]:
    """At most one instance per GPU found (unless gpu_ids says which GPUs, or the lab turns it off)."""
    if not spec.check_gpus or spec.gpu_ids or count <= gpus.gpu_count:
        return []
    v = spec.var
    return [
        f"{v('instances')} is {count} but {spec.host_name} has {gpus.gpu_count} GPU(s) {_smi_found(gpus)}: "
        f"run at most one instance per GPU. Only a lab without GPUs may set {v('check_gpus')}: false."
    ]


def _model_problems(spec: FleetSpec, count: int, path_exists: Callable[[str], bool]) -> list[str]:
    """Every instance has a model, and a model given as a path exists on the host."""
    v = spec.var
    out = []
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
                f"{name} {path} does not exist on {spec.host_name}: download the model there first, "
                "or fix the path."
            )
    return out


def _argument_problems(spec: FleetSpec) -> list[str]:
    """The API key and each extra argument are one word: SGLANG_ARGS is split on whitespace."""
    v = spec.var
    out = []
    if re.search(r"\s", spec.api_key):
        out.append(f"{v('api_key')} must not contain whitespace.")
    bad_args = [a for a in spec.extra_args if not a or re.search(r"\s", a)]
    if bad_args:
        out.append(
            f"each of {v('extra_args')} {json.dumps(list(spec.extra_args))} must be one word without "
            f"whitespace (give a flag and its value as two items): {json.dumps(bad_args)}."
        )
    return out


def _environment_problems(spec: FleetSpec) -> list[str]:
    """Variable names systemd accepts, and none of those the fleet writes itself."""
    v = spec.var
    out = []
    if spec.api_key_variable and not host.ENV_NAME_RE.match(spec.api_key_variable):
        out.append(f"api_key_variable {spec.api_key_variable!r} is not a variable name.")
    bad_names = [k for k in spec.environment if not host.ENV_NAME_RE.match(k)]
    if bad_names:
        out.append(f"{v('environment')} keys must be variable names: {json.dumps(bad_names)}.")
    if ours := [k for k in GPU_VARIABLES if k in spec.environment]:
        out.append(
            f"{v('environment')} sets {json.dumps(ours)}: the fleet writes these itself (the GPUs of "
            f"{v('gpu_ids')}, numbered as nvidia-smi numbers them: CUDA_DEVICE_ORDER={DEVICE_ORDER})."
        )
    return out


def _backend_problems(spec: FleetSpec) -> list[str]:
    """An attention backend the inventory names is one SGLang knows."""
    if not spec.attention_backend or spec.attention_backend in ATTENTION_BACKENDS:
        return []
    return [
        f"{spec.var('attention_backend')} '{spec.attention_backend}' is not an SGLang 0.5.12 "
        f"--attention-backend (known: {', '.join(ATTENTION_BACKENDS)}); "
        "leave it empty for the sglang phase's decision."
    ]


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
