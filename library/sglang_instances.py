#!/usr/bin/python
"""Ansible module sglang_instances: a thin adapter over sglfleet.fleet._instances (the layout),
_instances_observe (the host) and _instances_plan (the plan and the write)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_instances
short_description: Plan the SGLang instances of a host (start, roll, retire) and write their environment files
description:
  - Lays the fleet out (the GPUs, port, model and server flags of each instance C(sglang@<i>)), looks at
    the host (systemd's state of every C(sglang@) unit, the configuration digest each running process
    carries in its environment, who listens on the fleet's ports), and returns the plan - which
    instances to start, which to roll (they run another configuration), which to retire (beyond the
    count), and which ports another process holds.
  - The digest of an instance covers everything that changes what its server runs - the unit file, its
    environment file, the packages installed in I(venv) (a new SGLang or torch), I(common_env_file) and
    the model directory's files - so any of them changing rolls the instance.
  - With I(state=planned) it only reads. With I(state=present) it also writes
    C(<config_dir>/instance-<i>.env) for each instance (mode 0600 when I(api_key) is set) and reports
    C(changed) exactly when a file's content or mode differs.
  - Bad input (more instances than GPUs, GPU sets that overlap, a missing model directory, ...) fails
    the task before anything is written, naming the variable (I(vars_prefix) + option name).
  - Starting, rolling and retiring the units is left to the caller (the role C(sglang_fleet) gates each
    roll on C(/health_generate)).
  - Needs the C(sglfleet) Python package on the target.
version_added: "0.2.0"
author:
  - sglfleet maintainers (@sglfleet)
options:
  state:
    description: C(planned) only reads; C(present) also writes the environment files.
    type: str
    choices: [planned, present]
    default: planned
  instances:
    description: Number of instances; null means one per entry of I(gpu_ids), else one per GPU found.
    type: int
  gpu_ids:
    description:
      - By instance, a GPU id or a list of GPU ids (C(CUDA_VISIBLE_DEVICES); a list of N GPUs adds
        C(--tp-size N)). Empty means instance i uses GPU i.
    type: list
    elements: raw
    default: []
  instance_models:
    description:
      - By instance, C({model_path, served_model_name}) for an instance that serves another model than
        I(model_path); null or a missing entry means the fleet's model.
    type: list
    elements: raw
    default: []
  check_gpus:
    description: Refuse more GPUs than nvidia-smi finds (set false only in a lab without GPUs).
    type: bool
    default: true
  nvidia_smi:
    description: The nvidia-smi command that counts the GPUs.
    type: str
    default: nvidia-smi
  host:
    description: The address the instances listen on.
    type: str
    default: 127.0.0.1
  port_base:
    description: The port of instance 0; instance i listens on I(port_base) + i.
    type: int
    default: 30000
  model_path:
    description: The fleet's model, a directory on the target (it must exist) or a Hugging Face id.
    type: str
    default: ""
  served_model_name:
    description: The name the model is served as; empty means the model path.
    type: str
    default: ""
  attention_backend:
    description:
      - C(--attention-backend) for every instance, one of SGLang 0.5.12's choices
        (C(sglfleet.fleet.ATTENTION_BACKENDS)).
      - C(recorded) takes the decision the C(sglang) phase recorded (C(SGLANG_ATTENTION_BACKEND) in
        I(common_env_file)), and leaves the flag out when there is none; C(none) leaves it out.
    type: str
    default: recorded
  mem_fraction_static:
    description: C(--mem-fraction-static); null leaves it out.
    type: float
  context_length:
    description: C(--context-length); null leaves it out.
    type: int
  max_running_requests:
    description: C(--max-running-requests); null leaves it out.
    type: int
  watchdog_timeout:
    description:
      - C(--watchdog-timeout) in seconds; null leaves it out (SGLang's 300 s). SGLang kills its own server
        when a forward batch stalls this long, and the unit's C(Restart=on-failure) brings it back.
    type: float
  enable_metrics:
    description: C(--enable-metrics).
    type: bool
    default: true
  api_key:
    description: C(--api-key); only written to the 0600 environment files, never returned or logged.
    type: str
    default: ""
  api_key_variable:
    description:
      - The environment variable a launcher (the unit's C(ExecStart)) reads the API key from and hands to
        the server in-process; the key is then written there instead of as C(--api-key) in C(SGLANG_ARGS).
      - Empty passes C(--api-key) in C(SGLANG_ARGS).
    type: str
    default: ""
  extra_args:
    description: More server flags, one word each.
    type: list
    elements: str
    default: []
  environment:
    description: More environment variables for every instance.
    type: dict
    default: {}
  config_dir:
    description: The directory of the environment files.
    type: path
    default: /etc/sglang
  common_env_file:
    description: The sglang role's environment file (loaded by every instance; part of the digest).
    type: path
    default: /etc/sglang/common.env
  venv:
    description: The Python environment the servers run from (its packages are part of the digest).
    type: path
    default: /opt/sglang/venv
  unit_text:
    description: The text of the unit file as it is (or will be) installed; part of the digest.
    type: str
    default: ""
  host_name:
    description: How messages name this host (the inventory name).
    type: str
    default: this host
  vars_prefix:
    description: Prefix of the variable names messages use (the role passes C(sglang_fleet_)).
    type: str
    default: ""
extends_documentation_fragment:
  - attributes
attributes:
  check_mode:
    support: full
    details:
      - Plans and reports which environment files would change; writes nothing.
  diff_mode:
    support: full
    details:
      - Shows each environment file before and after, with the API key masked.
"""

EXAMPLES = r"""
- name: Plan the instances (read only)
  sglfleet.ops.sglang_instances:
    instances: 4
    model_path: /srv/models/Qwen3-32B
    served_model_name: qwen3-32b
    unit_text: "{{ lookup('ansible.builtin.template', 'sglang@.service.j2') }}"
  register: fleet_plan

- name: Two instances with two GPUs each (--tp-size 2), the second with another model
  sglfleet.ops.sglang_instances:
    state: present
    gpu_ids: [[0, 1], [2, 3]]
    instance_models: [null, {model_path: /srv/models/drafter, served_model_name: drafter}]
    model_path: /srv/models/Qwen3-32B
    api_key: "{{ sglang_fleet_api_key }}"
"""

RETURN = r"""
count:
  description: The number of instances.
  returned: always
  type: int
  sample: 8
instances:
  description: One entry per instance, with its plan.
  returned: always
  type: list
  elements: dict
  sample:
    - {index: 0, unit: sglang@0.service, gpus: [0], port: 30000, url: "http://127.0.0.1:30000",
       model: qwen3-32b, tp_size: 1, digest: 3f1e..., running_digest: 3f1e..., active: active,
       enabled: enabled, action: none}
gpus:
  description: The GPU set of each instance.
  returned: always
  type: list
  elements: list
ports:
  description: The port of each instance.
  returned: always
  type: list
  elements: int
urls:
  description: The base URL health probes use for each instance.
  returned: always
  type: list
  elements: str
models:
  description: The instances' base URLs grouped by the model they serve.
  returned: always
  type: list
  elements: dict
  sample: [{model: qwen3-32b, urls: ["http://127.0.0.1:30000"]}]
probe_host:
  description: The address health probes use (loopback for a wildcard I(host)).
  returned: always
  type: str
to_start:
  description: Instances not running now (inactive, failed, waiting to restart).
  returned: always
  type: list
  elements: int
to_roll:
  description: Running instances whose digest differs from the planned one, to restart one at a time.
  returned: always
  type: list
  elements: int
to_retire:
  description: Instances that exist (unit, enablement or environment file) beyond the count.
  returned: always
  type: list
  elements: int
port_conflicts:
  description: "C(PORT: holder) for each fleet port another process than an C(sglang@) unit listens on."
  returned: always
  type: list
  elements: str
  sample: ["30008: pid 4242 (python3 -m http.server 30008)"]
attention_backend:
  description: The C(--attention-backend) the instances get (null when left out).
  returned: always
  type: str
attention_backend_source:
  description: Where it comes from (the inventory, the sglang phase's decision, or none).
  returned: always
  type: str
runtime:
  description: What the digest covers besides the flags.
  returned: always
  type: dict
  sample: {distributions: 212, sglang: 0.5.12, torch: 2.11.0, common_env_file_exists: true}
unit_installed:
  description: Whether C(/etc/systemd/system/sglang@.service) exists.
  returned: always
  type: bool
written:
  description: The environment files written (or, in check mode, that would be).
  returned: when state is present
  type: list
  elements: str
"""

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglfleet_deps import SGLFLEET

with SGLFLEET:
    from sglfleet.fleet import FleetSpec, GpuInventory, GpuQueryError, query_gpus, write_env_files
    from sglfleet.fleet import observe as observe_fleet
    from sglfleet.fleet import plan as plan_fleet
    from sglfleet.fleet import problems as fleet_problems

_MASK = "********"
# The module's words for "the sglang phase's decision" and "no flag" -> FleetSpec's "" and None.
_BACKEND_WORDS = {"recorded": "", "none": None}


def _spec(module, params):
    gpu_ids = [tuple(item) if isinstance(item, list) else item for item in params["gpu_ids"]]
    try:
        return FleetSpec(
            instances=params["instances"],
            gpu_ids=tuple(gpu_ids),
            instance_models=tuple(params["instance_models"]),
            check_gpus=params["check_gpus"],
            host=params["host"],
            port_base=params["port_base"],
            model_path=params["model_path"],
            served_model_name=params["served_model_name"],
            attention_backend=_BACKEND_WORDS.get(params["attention_backend"], params["attention_backend"]),
            mem_fraction_static=params["mem_fraction_static"],
            context_length=params["context_length"],
            max_running_requests=params["max_running_requests"],
            watchdog_timeout=params["watchdog_timeout"],
            enable_metrics=params["enable_metrics"],
            api_key=params["api_key"] or "",
            api_key_variable=params["api_key_variable"],
            extra_args=tuple(params["extra_args"]),
            environment={k: str(v) for k, v in params["environment"].items()},
            config_dir=params["config_dir"],
            common_env_file=params["common_env_file"],
            venv=params["venv"],
            unit_text=params["unit_text"],
            host_name=params["host_name"],
            vars_prefix=params["vars_prefix"],
        )
    except ValueError as exc:  # pydantic: a GPU id that is no integer, a model entry without model_path
        prefix = params["vars_prefix"]
        module.fail_json(msg=f"{prefix}gpu_ids / {prefix}instance_models: {exc}")


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["planned", "present"], "default": "planned"},
            "instances": {"type": "int"},
            "gpu_ids": {"type": "list", "elements": "raw", "default": []},
            "instance_models": {"type": "list", "elements": "raw", "default": []},
            "check_gpus": {"type": "bool", "default": True},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "host": {"type": "str", "default": "127.0.0.1"},
            "port_base": {"type": "int", "default": 30000},
            "model_path": {"type": "str", "default": ""},
            "served_model_name": {"type": "str", "default": ""},
            "attention_backend": {"type": "str", "default": "recorded"},
            "mem_fraction_static": {"type": "float"},
            "context_length": {"type": "int"},
            "max_running_requests": {"type": "int"},
            "watchdog_timeout": {"type": "float"},
            "enable_metrics": {"type": "bool", "default": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "api_key_variable": {"type": "str", "default": "", "no_log": False},
            "extra_args": {"type": "list", "elements": "str", "default": []},
            "environment": {"type": "dict", "default": {}},
            "config_dir": {"type": "path", "default": "/etc/sglang"},
            "common_env_file": {"type": "path", "default": "/etc/sglang/common.env"},
            "venv": {"type": "path", "default": "/opt/sglang/venv"},
            "unit_text": {"type": "str", "default": ""},
            "host_name": {"type": "str", "default": "this host"},
            "vars_prefix": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    SGLFLEET.require(module)
    params = module.params
    spec = _spec(module, params)
    facts = None
    if params["check_gpus"] or (params["instances"] is None and not params["gpu_ids"]):
        try:
            facts = query_gpus(params["nvidia_smi"])
        except GpuQueryError as exc:
            module.fail_json(msg=f"cannot count the GPUs: {exc}")
    gpus = GpuInventory(
        gpu_count=facts.gpu_count if facts else 0, nvidia_smi_found=facts.nvidia_smi_found if facts else False
    )
    problems = fleet_problems(spec, gpus)
    if problems:
        module.fail_json(msg=" ".join(problems), problems=problems)
    observed = observe_fleet(spec, gpus)
    plan = plan_fleet(spec, gpus, observed)
    runtime = observed.runtime
    result = {
        "changed": False,
        **plan.as_dict(spec.probe_host),
        "runtime": {
            "distributions": len(runtime.distributions),
            "sglang": runtime.version_of("sglang"),
            "torch": runtime.version_of("torch"),
            "common_env_file_exists": runtime.common_env_exists,
        },
        "unit_installed": observed.unit_installed,
    }
    if params["state"] == "present":
        try:
            changes = write_env_files(
                plan, Path(spec.config_dir), secret=bool(spec.api_key), check_mode=module.check_mode
            )
        except OSError as exc:
            module.fail_json(msg=f"cannot write the environment files in {spec.config_dir}: {exc}", **result)
        result["changed"] = bool(changes)
        result["written"] = [c.path for c in changes]
        if module._diff and changes:
            result["diff"] = [_diff(c, spec.api_key) for c in changes]
    module.exit_json(**result)


def _mask(text, secret):
    return text.replace(secret, _MASK) if (text and secret) else text


def _diff(change, secret):
    before = _mask(change.before, secret) or ""
    after = _mask(change.after, secret)
    if change.mode_before is not None and change.mode_before != change.mode:
        before += f"# mode {change.mode_before:04o}\n"
        after += f"# mode {change.mode:04o}\n"
    return {
        "before": before,
        "after": after,
        "before_header": change.path if change.before is not None else "(absent)",
        "after_header": change.path,
    }


if __name__ == "__main__":
    main()
