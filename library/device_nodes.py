#!/usr/bin/python
# Copyright: sglfleet contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module device_nodes: a thin adapter over sglfleet.doctor's node_table."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: device_nodes
short_description: Compare a PVE node's NVIDIA device nodes with the ones its GPUs need
description:
  - The decision half of role pve_host's device-node probe, in C(sglfleet.doctor.node_table), which
    C(sglfleet_doctor) checks against too. The role reads C(/proc/devices) and runs
    C(stat -L --format='%n %Hr:%Lr %F') on the node paths on the PVE node, then hands both here.
  - "The nodes a node with I(gpu_count) GPUs needs: C(/dev/nvidia0..N-1) and C(/dev/nvidiactl) on the
    nvidia module's major (C(nvidia), or C(nvidia-frontend) before the open modules, in /proc/devices'
    character devices; 195) with minors 0..N-1 and 255, C(/dev/nvidia-uvm) and C(/dev/nvidia-uvm-tools) on
    nvidia-uvm's dynamic major with minors 0 and 1."
  - Changes nothing; C(changed) is always false. Runs where the sglfleet package is (the role runs it on
    the controller, as a PVE node has no sglfleet).
version_added: "0.1.0"
author:
  - sglfleet maintainers (@sglfleet)
options:
  gpu_count:
    description: The GPUs the node has (role pve_host's C(pve_host_gpu_count)).
    type: int
    required: true
  proc_devices:
    description: The node's C(/proc/devices); empty when it could not be read.
    type: str
    default: ""
  stat_lines:
    description: The lines C(stat -L --format='%n %Hr:%Lr %F') printed for the node paths.
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
- name: Read the node's /proc/devices
  ansible.builtin.slurp:
    src: /proc/devices
  register: proc_devices

- name: Stat the NVIDIA device nodes (following links, as PVE does)
  ansible.builtin.command:
    argv: [stat, -L, "--format=%n %Hr:%Lr %F", /dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm]
  register: node_stat
  failed_when: false
  changed_when: false

- name: Note which device nodes are missing or wrong
  sglfleet.ops.device_nodes:
    gpu_count: 8
    proc_devices: "{{ proc_devices.content | b64decode }}"
    stat_lines: "{{ node_stat.stdout_lines }}"
  delegate_to: localhost
  register: nodes
"""

RETURN = r"""
majors:
  description: The majors /proc/devices gives nvidia and nvidia-uvm (C(?) for one it does not list).
  returned: always
  type: dict
  sample: {"nvidia": "195", "nvidia-uvm": "511"}
expected:
  description: Each node the GPUs need, as C(<path> <major>:<minor>).
  returned: always
  type: list
  elements: str
  sample: ["/dev/nvidia0 195:0", "/dev/nvidiactl 195:255", "/dev/nvidia-uvm 511:0",
           "/dev/nvidia-uvm-tools 511:1"]
found:
  description: The character devices among the paths stat looked at, as C(<path> <major>:<minor>).
  returned: always
  type: list
  elements: str
wrong:
  description: The paths missing, not a character device, or of another major:minor than I(expected).
  returned: always
  type: list
  elements: str
  sample: ["/dev/nvidia-uvm-tools"]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglfleet_deps import SGLFLEET

with SGLFLEET:
    from sglfleet.doctor import char_majors, node_table


def main():
    module = AnsibleModule(
        argument_spec={
            "gpu_count": {"type": "int", "required": True},
            "proc_devices": {"type": "str", "default": ""},
            "stat_lines": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    SGLFLEET.require(module)
    p = module.params
    if p["gpu_count"] < 0:
        module.fail_json(msg=f"gpu_count must be 0 or more, not {p['gpu_count']}")
    table = node_table(p["gpu_count"], char_majors(p["proc_devices"]), p["stat_lines"])
    module.exit_json(changed=False, **table.as_dict())


if __name__ == "__main__":
    main()
