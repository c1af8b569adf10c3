#!/usr/bin/python
# Copyright: sglfleet contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module sglang_wheels: a thin adapter over sglfleet.fleet._wheels."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_wheels
short_description: Refuse an interpreter or C library the pinned SGLang wheels cannot install on
description:
  - Compares what the venv's interpreter reports (Python version, C library, machine, free-threaded build)
    with the tags of the wheels the pinned sglang and torch install (sglang, sglang-kernel, flashinfer-python,
    torch, triton; the table is in C(sglfleet.fleet._wheels)), and fails naming each wheel and what it needs.
  - Pins the table has not read are returned in I(unknown), not refused.
  - Needs the C(sglfleet) Python package in the interpreter Ansible runs modules with.
version_added: "0.1.0"
author:
  - sglfleet maintainers (@sglfleet)
options:
  python_version:
    description: The venv interpreter's C(major.minor), e.g. C(3.11).
    type: str
    required: true
  libc:
    description: What C(os.confstr("CS_GNU_LIBC_VERSION")) says there (C(glibc 2.36)); empty when not glibc.
    type: str
    default: ""
  machine:
    description: C(platform.machine()) there.
    type: str
    required: true
  free_threaded:
    description: The interpreter is a free-threaded build (C(sysconfig Py_GIL_DISABLED)).
    type: bool
    default: false
  interpreter:
    description: The interpreter's name in messages (C(sglang_python)'s value).
    type: str
    default: the interpreter
  sglang_version:
    description: The pinned sglang.
    type: str
    required: true
  torch_version:
    description: The pinned torch.
    type: str
    required: true
extends_documentation_fragment:
  - attributes
  - attributes.read_only
"""

EXAMPLES = r"""
- name: Check that the pinned wheels install on this interpreter
  sglfleet.ops.sglang_wheels:
    python_version: "3.11"
    libc: glibc 2.36
    machine: x86_64
    sglang_version: "0.5.12"
    torch_version: "2.11.0"
"""

RETURN = r"""
needs:
  description: >-
    The wheels checked, each C({name, version, python_min, python_max, glibc, free_threaded,
    example}).
  returned: always
  type: list
  elements: dict
unknown:
  description: Pins the table has not read (not checked).
  returned: always
  type: list
  elements: str
  sample: ["sglang 0.5.13"]
problems:
  description: Why pip could not install them here, one line per wheel (the task fails when there are any).
  returned: always
  type: list
  elements: str
  sample:
    - >-
      sglang 0.5.12 (sglang-0.5.12-cp313-cp313-manylinux_2_34_x86_64.whl) needs CPython 3.10 to 3.13;
      sglang_python /usr/bin/python3 is Python 3.14
"""

import dataclasses

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglfleet_deps import SGLFLEET

with SGLFLEET:
    from sglfleet.fleet import install_problems, wheel_needs


def main():
    module = AnsibleModule(
        argument_spec={
            "python_version": {"type": "str", "required": True},
            "libc": {"type": "str", "default": ""},
            "machine": {"type": "str", "required": True},
            "free_threaded": {"type": "bool", "default": False},
            "interpreter": {"type": "str", "default": "the interpreter"},
            "sglang_version": {"type": "str", "required": True},
            "torch_version": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    SGLFLEET.require(module)
    p = module.params
    needs, unknown = wheel_needs(p["sglang_version"], p["torch_version"])
    try:
        problems = install_problems(
            python=p["python_version"],
            libc=p["libc"],
            machine=p["machine"],
            free_threaded=p["free_threaded"],
            needs=needs,
            interpreter=p["interpreter"],
        )
    except ValueError as exc:
        module.fail_json(msg=f"python_version: {exc}")
    out = {"needs": [dataclasses.asdict(n) for n in needs], "unknown": unknown, "problems": problems}
    if problems:
        module.fail_json(
            msg="pip cannot install the pinned SGLang here: "
            + "; ".join(problems)
            + ". Point sglang_python at a CPython the wheels list, on a host whose glibc is new enough",
            **out,
        )
    module.exit_json(changed=False, **out)


if __name__ == "__main__":
    main()
