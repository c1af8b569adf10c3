#!/usr/bin/python
# Copyright: sglfleet contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module gpu_facts: a thin adapter over sglfleet.fleet._gpus."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather the NVIDIA GPUs of a host and the compute processes on them
description:
  - Runs C(nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total,compute_cap,driver_version)
    and C(nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory,process_name) (CSV, no header, no
    units) and returns one entry per GPU with the compute processes on it.
  - A host without C(nvidia-smi), or where it finds no device, has C(gpu_count=0) and
    C(nvidia_smi_found) says which; that fails the task only with I(required=true).
  - Fields nvidia-smi cannot fill (C([N/A]), C([Not Supported])) are returned as null.
  - Changes nothing; C(changed) is always false.
  - Needs the C(sglfleet) Python package on the target, in the interpreter Ansible runs modules with.
version_added: "0.1.0"
author:
  - sglfleet maintainers (@sglfleet)
options:
  nvidia_smi:
    description: The nvidia-smi command, a name looked up in C(PATH) or a path.
    type: str
    default: nvidia-smi
  required:
    description:
      - Fail when there is no nvidia-smi, when it finds no GPU, or when it answers with an error.
      - Without it these give C(gpu_count=0) (and a warning for an error).
    type: bool
    default: false
  timeout:
    description: Seconds to wait for each nvidia-smi query.
    type: int
    default: 30
extends_documentation_fragment:
  - attributes
  - attributes.read_only
  - attributes.facts
attributes:
  facts:
    support: full
    details:
      - Sets C(ansible_facts.sglfleet_gpu_facts) to the whole result.
notes:
  - Memory figures are MiB, as nvidia-smi reports them with C(nounits).
  - Inside an LXC container nvidia-smi may not see the processes of the host; I(processes) lists what
    it sees.
"""

EXAMPLES = r"""
- name: Find the GPUs and what runs on them
  sglfleet.ops.gpu_facts:
  register: gpus

- name: Fail unless this host has GPUs
  sglfleet.ops.gpu_facts:
    required: true

- name: Use another nvidia-smi
  sglfleet.ops.gpu_facts:
    nvidia_smi: /usr/lib/nvidia/bin/nvidia-smi
    timeout: 10
"""

RETURN = r"""
nvidia_smi_found:
  description: Whether nvidia-smi was found.
  returned: always
  type: bool
  sample: true
nvidia_smi_path:
  description: The nvidia-smi that ran (null when none was found).
  returned: always
  type: str
  sample: /usr/bin/nvidia-smi
gpu_count:
  description: The number of GPUs nvidia-smi lists (0 without nvidia-smi).
  returned: always
  type: int
  sample: 8
driver_version:
  description: The driver version when every GPU reports the same one.
  returned: always
  type: str
  sample: "580.95.05"
busy_gpus:
  description: Indexes of the GPUs some compute process holds.
  returned: always
  type: list
  elements: int
  sample: [0, 1, 2, 3, 4, 5, 6, 7]
gpus:
  description: One entry per GPU, by index.
  returned: always
  type: list
  elements: dict
  contains:
    index: {description: nvidia-smi index, type: int}
    uuid: {description: GPU UUID, type: str}
    name: {description: product name, type: str}
    memory_used_mib: {description: memory used (null when unknown), type: int}
    memory_total_mib: {description: memory total (null when unknown), type: int}
    compute_cap: {description: "compute capability, e.g. 12.0", type: str}
    sm: {description: "compute capability as CUDA arch digits, e.g. 120", type: str}
    driver_version: {description: driver version, type: str}
    busy: {description: whether a compute process holds it, type: bool}
    processes: {description: the compute processes on it (as in I(processes)), type: list}
  sample:
    - index: 0
      uuid: GPU-3f0a2c1e-5d7b-4e43-9a61-0c2d8e7f9b10
      name: NVIDIA RTX PRO 6000 Blackwell Server Edition
      memory_used_mib: 91532
      memory_total_mib: 97887
      compute_cap: "12.0"
      sm: "120"
      driver_version: "580.95.05"
      busy: true
      processes: [{"pid": 4242, "gpu_uuid": "GPU-3f0a2c1e-5d7b-4e43-9a61-0c2d8e7f9b10", "gpu_index": 0,
                   "used_memory_mib": 91000, "process_name": "/usr/bin/python3"}]
processes:
  description: Every compute process nvidia-smi lists, with the index of its GPU.
  returned: always
  type: list
  elements: dict
  sample:
    - {"pid": 4242, "gpu_uuid": "GPU-3f0a2c1e-5d7b-4e43-9a61-0c2d8e7f9b10", "gpu_index": 0,
       "used_memory_mib": 91000, "process_name": "/usr/bin/python3"}
error:
  description: Why nvidia-smi's answer could not be used (only without I(required)).
  returned: when nvidia-smi failed
  type: str
ansible_facts:
  description: The same result under C(sglfleet_gpu_facts).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglfleet_deps import SGLFLEET

with SGLFLEET:
    from sglfleet.fleet import GpuFacts, GpuQueryError, find_nvidia_smi, query_gpus


def main():
    module = AnsibleModule(
        argument_spec={
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "required": {"type": "bool", "default": False},
            "timeout": {"type": "int", "default": 30},
        },
        supports_check_mode=True,
    )
    SGLFLEET.require(module)
    params = module.params
    if params["timeout"] <= 0:
        module.fail_json(msg=f"timeout must be a positive number of seconds, got {params['timeout']}")
    error = None
    try:
        facts = query_gpus(params["nvidia_smi"], timeout=params["timeout"])
    except GpuQueryError as exc:
        if params["required"]:
            module.fail_json(msg=str(exc))
        module.warn(f"nvidia-smi answered with an error, reporting no GPUs: {exc}")
        error = str(exc)
        facts = GpuFacts(
            nvidia_smi_found=True, nvidia_smi_path=find_nvidia_smi(params["nvidia_smi"]), gpu_count=0
        )
    result = facts.as_dict()
    if error is not None:
        result["error"] = error
    if params["required"] and facts.gpu_count == 0:
        if not facts.nvidia_smi_found:
            msg = f"no GPU: {params['nvidia_smi']} not found (install the NVIDIA driver, or set nvidia_smi)"
        else:
            msg = f"no GPU: {facts.nvidia_smi_path} lists no device"
        module.fail_json(msg=msg, **result)
    module.exit_json(changed=False, ansible_facts={"sglfleet_gpu_facts": result}, **result)


if __name__ == "__main__":
    main()
