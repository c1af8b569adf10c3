#!/usr/bin/python
# Copyright: sglfleet contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module toolchain_verdict: a thin adapter over sglfleet.toolchain."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: toolchain_verdict
short_description: Judge what role cuda_toolchain's verification checks printed
description:
  - The decision half of role cuda_toolchain's verify step, in C(sglfleet.toolchain). The role runs each
    check on the host (nvcc, PTX, ptxas, the C(-cudart shared) link, the CCCL host compile, flashinfer's and
    Triton's JIT lines, a kernel on GPU 0) without failing on it, and hands the registered results here.
  - Returns, for each check that ran, whether it passed and the message that names the cause (quoting the
    tool's own error) and the task that repairs it; and the wheels that drifted from the release's pins.
  - Changes nothing; C(changed) is always false. It fails only on arguments it cannot read; the role's
    asserts fail on the verdicts.
  - Needs the C(sglfleet) Python package on the target, in the interpreter Ansible runs modules with.
version_added: "0.1.0"
author:
  - sglfleet maintainers (@sglfleet)
options:
  facts:
    description:
      - "What the messages name: C(version) (the release), C(release) (component to pinned version, with
        C(nvcc) and C(ptx_isa)), C(wheels) (component to wheel name), C(prefix), C(venv), C(sm),
        C(jit_python), C(host)."
    type: dict
    required: true
  results:
    description:
      - The registered results of the checks by name (C(nvcc), C(ptx), C(ptxas), C(cudart), C(host_cccl),
        C(flashinfer), C(triton), C(gpu)); a check that was skipped or left out gets no verdict.
    type: dict
    default: {}
  installed:
    description: The registered result of the wheel-version probe (its stdout is JSON, wheel to version).
    type: dict
    default: {}
  ptx_text:
    description: The PTX file the ptx check wrote (its C(.version) and C(.target) lines are read).
    type: str
    default: ""
  requirements:
    description: The pinned requirements (C(wheel==version)), the pins check's success message.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - attributes
attributes:
  check_mode:
    support: full
    details:
      - Changes nothing in any mode.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Run nvcc --version
  ansible.builtin.command:
    argv: [/opt/cuda-13.2/bin/nvcc, --version]
  register: nvcc_result
  changed_when: false
  failed_when: false

- name: Probe the installed wheel versions (JSON, wheel to version)
  ansible.builtin.command:
    argv:
      - /opt/cuda-13.2/venv/bin/python
      - -c
      - import importlib.metadata as m, json; print(json.dumps({"nvidia-nvvm": m.version("nvidia-nvvm")}))
  register: installed_result
  changed_when: false

- name: Judge the checks
  sglfleet.ops.toolchain_verdict:
    facts:
      version: "13.2.2"
      release: {nvcc: "13.2.86", nvvm: "13.2.86", ptx_isa: "9.2"}
      wheels: {nvvm: nvidia-nvvm}
      prefix: /opt/cuda-13.2
      venv: /opt/cuda-13.2/venv
      sm: "120"
      jit_python: /opt/sglang/venv/bin/python
      host: ct200
    results:
      nvcc: "{{ nvcc_result }}"
    installed: "{{ installed_result }}"
  register: verdict  # then: assert that verdict.checks.nvcc.ok, fail_msg verdict.checks.nvcc.msg
"""

RETURN = r"""
checks:
  description: Each check's verdict by name, in the order the role asserts them.
  returned: always
  type: dict
  sample:
    nvcc: {"ok": true, "msg": "", "success_msg": "Cuda compilation tools, release 13.2, V13.2.86"}
    cudart: {"ok": false, "msg": "Linking with -cudart shared failed: ld: cannot find -lcudart ...",
             "success_msg": ""}
drift:
  description: Each wheel not at the release's pin (C(<wheel> is <found or missing>, release R pins V)).
  returned: always
  type: list
  elements: str
  sample: ["nvidia-nvvm is 13.5.37, release 13.2.2 pins 13.2.86"]
first_failed:
  description: The first check that did not pass (the one the role's asserts fail at), or null.
  returned: always
  type: str
  sample: cudart
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglfleet_deps import SGLFLEET

with SGLFLEET:
    from sglfleet.toolchain import ToolchainFacts, toolchain_verdicts


def main():
    module = AnsibleModule(
        argument_spec={
            "facts": {"type": "dict", "required": True},
            "results": {"type": "dict", "default": {}},
            "installed": {"type": "dict", "default": {}},
            "ptx_text": {"type": "str", "default": ""},
            "requirements": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    SGLFLEET.require(module)
    p = module.params
    f = p["facts"]
    try:
        facts = ToolchainFacts(
            version=str(f["version"]),
            release={k: str(v) for k, v in f["release"].items()},
            wheels={k: str(v) for k, v in f["wheels"].items()},
            prefix=str(f["prefix"]),
            venv=str(f["venv"]),
            sm=str(f["sm"]),
            jit_python=str(f["jit_python"]),
            host=str(f["host"]),
        )
    except (KeyError, AttributeError) as exc:
        module.fail_json(msg=f"facts: {exc} is missing (version, release, wheels, prefix, venv, sm, ...)")
    installed = None
    if p["installed"].get("rc") == 0:
        try:
            installed = json.loads(p["installed"].get("stdout") or "")
        except ValueError:
            installed = None
    checks, drift = toolchain_verdicts(facts, p["results"], installed, p["ptx_text"], p["requirements"])
    first = next((name for name, check in checks.items() if not check.ok), None)
    module.exit_json(
        changed=False, checks={n: c.as_dict() for n, c in checks.items()}, drift=drift, first_failed=first
    )


if __name__ == "__main__":
    main()
