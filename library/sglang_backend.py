#!/usr/bin/python
# Copyright: sglfleet contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module sglang_backend: a thin adapter over sglfleet.fleet._backend."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_backend
short_description: Decide the attention backend and torch's CUDA runtime for a host's GPUs
description:
  - Decides what the sglang phase writes into the fleet's common EnvironmentFile, from the inventory and
    what the host shows, in C(sglfleet.fleet._backend.decide).
  - "The compute capability: I(compute_capability), else the GPUs' (C(nvidia-smi), as C(gpu_facts) reads
    them), else I(default_compute_capability)."
  - "The attention backend: I(attention_backend), else by compute capability (9.0 C(fa3), 10.x
    C(trtllm_mha), 12.x C(flashinfer), others C(flashinfer)). A name SGLang 0.5.12 does not know, a
    backend these GPUs refuse (C(fa3) on SM120) and GPUs of several capabilities without an override fail
    the task, naming the variable."
  - "torch's CUDA runtime: I(torch_cuda_version), else the C(nvidia-cuda-runtime) wheel in I(venv), else
    the C(cuNNN) suffix of I(torch_index_url), else the toolchain's."
  - With I(env_file), also returns that EnvironmentFile as systemd units read it (I(env)).
  - Changes nothing; C(changed) is always false.
  - Needs the C(sglfleet) Python package on the target, in the interpreter Ansible runs modules with.
version_added: "0.1.0"
author:
  - sglfleet maintainers (@sglfleet)
options:
  compute_capability:
    description: The GPUs' compute capability, e.g. C(12.0); empty asks the GPUs.
    type: str
    default: ""
  default_compute_capability:
    description: The compute capability of a host without GPUs.
    type: str
    default: "12.0"
  attention_backend:
    description: An SGLang C(--attention-backend) over the table's; empty chooses by compute capability.
    type: str
    default: ""
  nvidia_smi:
    description: The nvidia-smi command that finds the GPUs (only without I(compute_capability)).
    type: str
    default: nvidia-smi
  venv:
    description: The engine's venv, whose C(nvidia-cuda-runtime) wheel is torch's CUDA runtime.
    type: path
  torch_cuda_version:
    description: torch's CUDA runtime, C(major.minor); empty reads it from I(venv) or I(torch_index_url).
    type: str
    default: ""
  torch_index_url:
    description: The index torch comes from; its C(cuNNN) suffix names the runtime (C(cu130) is 13.0).
    type: str
    default: ""
  toolchain_version:
    description: The CUDA toolchain release JIT builds use, e.g. C(13.2.2).
    type: str
    required: true
  env_file:
    description: An EnvironmentFile to read back (C(KEY=VALUE), quotes removed, comments skipped).
    type: path
extends_documentation_fragment:
  - attributes
  - attributes.read_only
notes:
  - The backend table and the SGLang source lines it follows are in C(python/sglfleet/fleet/_backend.py).
"""

EXAMPLES = r"""
- name: Decide from the GPUs
  sglfleet.ops.sglang_backend:
    venv: /opt/sglang/venv
    torch_index_url: https://download.pytorch.org/whl/cu130
    toolchain_version: "13.2.2"
  register: backend

- name: Decide for H100s, whatever this host shows, and read the fleet's EnvironmentFile
  sglfleet.ops.sglang_backend:
    compute_capability: "9.0"
    toolchain_version: "13.2.2"
    env_file: /etc/sglang/common.env
"""

RETURN = r"""
compute_capabilities:
  description: The compute capabilities decided for (one unless the inventory overrides the backend).
  returned: always
  type: list
  elements: str
  sample: ["12.0"]
capability_source:
  description: Where they come from.
  returned: always
  type: str
  sample: the GPUs (nvidia-smi)
sm:
  description: The first capability as CUDA arch digits.
  returned: always
  type: str
  sample: "120"
flashinfer_cuda_arch_list:
  description: FLASHINFER_CUDA_ARCH_LIST (space separated).
  returned: always
  type: str
  sample: "12.0"
torch_cuda_arch_list:
  description: TORCH_CUDA_ARCH_LIST (C(;) separated).
  returned: always
  type: str
  sample: "12.0"
gpu_count:
  description: The GPUs nvidia-smi lists (0 when I(compute_capability) is given or there is no nvidia-smi).
  returned: always
  type: int
  sample: 8
attention_backend:
  description: The C(--attention-backend) every instance gets.
  returned: always
  type: str
  sample: flashinfer
backend_source:
  description: Where the backend comes from.
  returned: always
  type: str
  sample: compute capability 12.x
torch_cuda:
  description: torch's CUDA runtime, C(major.minor).
  returned: always
  type: str
  sample: "13.0"
torch_cuda_source:
  description: Where it comes from.
  returned: always
  type: str
toolchain_cuda:
  description: The toolchain's release, C(major.minor).
  returned: always
  type: str
  sample: "13.2"
cccl_override:
  description: torch's runtime and the toolchain differ in minor (NVCC_APPEND_FLAGS turns CCCL's check off).
  returned: always
  type: bool
  sample: true
env:
  description: I(env_file) as the units read it (empty when it does not exist).
  returned: when I(env_file) is given
  type: dict
  sample: {"CUDA_HOME": "/opt/cuda-13.2", "SGLANG_ATTENTION_BACKEND": "flashinfer"}
env_exists:
  description: Whether I(env_file) exists.
  returned: when I(env_file) is given
  type: bool
"""

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglfleet_deps import SGLFLEET

with SGLFLEET:
    from sglfleet.fleet import BackendError, GpuQueryError, decide_backend, observe_torch_cuda, query_gpus
    from sglfleet.host import EnvFileError, read_env_file


def main():
    module = AnsibleModule(
        argument_spec={
            "compute_capability": {"type": "str", "default": ""},
            "default_compute_capability": {"type": "str", "default": "12.0"},
            "attention_backend": {"type": "str", "default": ""},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "venv": {"type": "path"},
            "torch_cuda_version": {"type": "str", "default": ""},
            "torch_index_url": {"type": "str", "default": ""},
            "toolchain_version": {"type": "str", "required": True},
            "env_file": {"type": "path"},
        },
        supports_check_mode=True,
    )
    SGLFLEET.require(module)
    p = module.params
    gpu_count, found = 0, []
    if not p["compute_capability"]:
        try:
            facts = query_gpus(p["nvidia_smi"])
        except GpuQueryError as exc:
            module.warn(f"nvidia-smi answered with an error, deciding as for no GPU: {exc}")
        else:
            gpu_count, found = facts.gpu_count, [gpu.compute_cap for gpu in facts.gpus]
    runtime = None
    if not p["torch_cuda_version"] and p["venv"]:
        runtime = observe_torch_cuda(Path(p["venv"]))
    try:
        decision = decide_backend(
            capability=p["compute_capability"],
            gpu_capabilities=found,
            default_capability=p["default_compute_capability"],
            attention_backend=p["attention_backend"],
            torch_cuda_version=p["torch_cuda_version"],
            runtime_version=runtime,
            torch_index_url=p["torch_index_url"],
            toolchain_version=p["toolchain_version"],
        )
    except BackendError as exc:
        module.fail_json(
            msg=str(exc), gpu_count=gpu_count, compute_capabilities=sorted({c for c in found if c})
        )
    result = {"changed": False, "gpu_count": gpu_count, **decision.as_dict()}
    if p["env_file"]:
        path = Path(p["env_file"])
        try:
            result.update(env=read_env_file(path).values, env_exists=True)
        except FileNotFoundError:
            result.update(env={}, env_exists=False)
        except EnvFileError as exc:
            module.fail_json(msg=f"cannot read the EnvironmentFile: {exc}")
        except OSError as exc:
            module.fail_json(msg=f"{path}: cannot read the EnvironmentFile: {exc.strerror or exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
