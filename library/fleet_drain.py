#!/usr/bin/python
"""Ansible module fleet_drain: a thin adapter over sglfleet.fleet._resume (the fleet's scale-down plan)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_drain
short_description: Plan which SGLang instances to stop so that the training gets its GPUs back
description:
  - Finds the host's C(sglang@<i>) instances (units and C(<config_dir>/instance-<i>.env) files), which
    run and which are enabled, and plans to stop and disable every one but I(keep).
  - Refuses (C(refused) says why) while a generation job still runs on the host - an active
    C(sglfleet-gen-*.service) unit or a C(sglfleet generate) process - unless I(allow_running_jobs).
  - With I(gpus), also says in C(not_free) what still holds the GPUs the stopped instances used - a
    compute process, or more memory used than I(max_used_mib); the GPUs of the kept instances are left out.
  - Changes nothing; the caller stops the units (systemd sends SIGTERM and SGLang drains).
  - Needs the C(sglfleet) Python package on the target.
version_added: "0.3.0"
author:
  - sglfleet maintainers (@sglfleet)
options:
  config_dir:
    description: The fleet's environment files (role sglang_fleet's C(sglang_fleet_config_dir)).
    type: path
    default: /etc/sglang
  keep:
    description: The instances that keep serving (indices).
    type: list
    elements: int
    default: []
  allow_running_jobs:
    description: Stop instances even while a generation job runs on the host.
    type: bool
    default: false
  gpus:
    description: Also look at the GPUs with nvidia-smi.
    type: bool
    default: false
  nvidia_smi:
    description: The nvidia-smi command.
    type: str
    default: nvidia-smi
  max_used_mib:
    description: Memory a free GPU may still show as used (MiB).
    type: int
    default: 1024
extends_documentation_fragment:
  - attributes
  - attributes.read_only
"""

EXAMPLES = r"""
- name: Plan the scale-down to instance 0
  sglfleet.ops.fleet_drain:
    keep: [0]
  register: drain
"""

RETURN = r"""
instances:
  description: Every instance found.
  returned: always
  type: list
  elements: int
running:
  description: The instances systemd runs.
  returned: always
  type: list
  elements: int
keep:
  description: The instances kept.
  returned: always
  type: list
  elements: int
stopped:
  description: Every instance but the kept ones (stopped once the plan is carried out).
  returned: always
  type: list
  elements: int
stopped_ports:
  description:
    - The ports of the stopped instances (C(SGLANG_FLEET_PORT) of their environment files), for the
      router's worker URLs.
  returned: always
  type: list
  elements: int
to_stop:
  description: Running instances to stop.
  returned: always
  type: list
  elements: int
to_disable:
  description: Enabled instances to disable.
  returned: always
  type: list
  elements: int
units_to_stop:
  description: Their unit names.
  returned: always
  type: list
  elements: str
kept_gpus:
  description: The GPUs the kept instances hold.
  returned: always
  type: list
  elements: int
generation_jobs:
  description: Generation jobs running on the host.
  returned: always
  type: list
  elements: str
refused:
  description: Why the stop is refused (empty when it is not).
  returned: always
  type: str
nvidia_smi_found:
  description: Whether nvidia-smi was found (with I(gpus)).
  returned: with I(gpus)
  type: bool
not_free:
  description: What still holds a GPU that should be free (with I(gpus)).
  returned: with I(gpus)
  type: list
  elements: str
  sample: ["GPU 3: compute process 4242 (python3)", "GPU 5: 2048 MiB used (more than 1024 MiB)"]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglfleet_deps import SGLFLEET

with SGLFLEET:
    from sglfleet.fleet import GpuQueryError, ResumeError, fleet_plan, gpus_not_free, query_gpus


def main():
    module = AnsibleModule(
        argument_spec={
            "config_dir": {"type": "path", "default": "/etc/sglang"},
            "keep": {"type": "list", "elements": "int", "default": []},
            "allow_running_jobs": {"type": "bool", "default": False},
            "gpus": {"type": "bool", "default": False},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "max_used_mib": {"type": "int", "default": 1024},
        },
        supports_check_mode=True,
    )
    SGLFLEET.require(module)
    p = module.params
    try:
        plan = fleet_plan(p["config_dir"], p["keep"], allow_running_jobs=p["allow_running_jobs"])
        out = plan.as_dict()
        if p["gpus"]:
            facts = query_gpus(p["nvidia_smi"])
            out["nvidia_smi_found"] = facts.nvidia_smi_found
            out["not_free"] = gpus_not_free(facts, plan.kept_gpus, p["max_used_mib"])
    except (ResumeError, GpuQueryError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **out)


if __name__ == "__main__":
    main()
