#!/usr/bin/python
# Copyright: sglfleet contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module sglfleet_doctor: a thin adapter over sglfleet.doctor."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglfleet_doctor
short_description: Judge what the PVE nodes and the fleet's containers show, in one table of every blocker
description:
  - The decision half of C(playbooks/doctor.yml), run on the controller. The play first runs
    C(python/sglfleet/doctor/_probe.py) on each node and container (read-only, with that host's own python3)
    and hands what each one showed to this module in I(hosts); I(pve) names the PVE credentials to check.
  - Runs every check on every host, whatever the others found, and returns one row per check and host
    (check, host, status C(ok)/C(BLOCKER)/C(warn)/C(skipped), what was found, the fix), the table
    rendered from them, and the number of blockers. It never fails on a blocker; the play does, after
    printing the table.
  - Changes nothing anywhere. The PVE check only reads C(GET /access/permissions).
  - Needs the C(sglfleet) Python package in the interpreter it runs with (the controller's).
version_added: "0.1.0"
author:
  - sglfleet maintainers (@sglfleet)
options:
  hosts:
    description: What each host showed, and what the inventory expects of it.
    type: list
    elements: dict
    default: []
    suboptions:
      host:
        description: The inventory hostname.
        type: str
        required: true
      role:
        description: C(node) (a PVE node, group pve_hosts) or C(ct) (a fleet container).
        type: str
        choices: [node, ct]
        required: true
      probe:
        description: The probe's JSON output; omitted when the host could not be probed.
        type: dict
      unreachable:
        description: Why the host could not be probed (Ansible's message).
        type: str
        default: ""
      gpus_expected:
        description: The inventory's C(sglfleet_gpus_expected); false skips the GPU checks, saying so.
        type: bool
        default: true
      gpu_count:
        description: GPUs the host should have (C(pve_host_gpu_count), C(proxmox_lxc_gpu_count)).
        type: int
      min_branch:
        description: The oldest driver branch that serves CUDA 13, sglfleet.doctor MIN_BRANCH.
        type: int
        default: 580
      full_driver:
        description:
          - The driver CUDA 13.2 lists (release notes, Table 3; sglfleet.doctor FULL_DRIVER). From
            I(min_branch) up to it the row is a WARN, CUDA 13.x minor-version compatibility (SASS runs, 13.2
            PTX does not JIT).
        type: str
        default: "595.58.03"
      disks:
        description: "Free space needed: C({path, need_gib, what}) each (the toolchain, the model, ...)."
        type: list
        elements: dict
        default: []
      ports:
        description: The fleet's ports; one held by anything but an C(sglang@N) unit is a blocker.
        type: list
        elements: int
        default: []
      model:
        description: "The model: C({source: mount|hf, dir, hf_repo, hf_revision}); reads its config.json."
        type: dict
      checksummed_versions:
        description: Driver versions with a checksum in C(nvidia_userspace_checksums) (containers).
        type: list
        elements: str
  pve:
    description: PVE credentials to check against what phase provision asks of them, one entry per container.
    type: list
    elements: dict
    default: []
    suboptions:
      host:
        description: The container's inventory hostname (the row's host).
        type: str
        required: true
      api_host:
        description: PVE API host.
        type: str
        required: true
      api_port:
        description: PVE API port.
        type: int
        default: 8006
      api_user:
        description: PVE user.
        type: str
        default: root@pam
      api_token_id:
        description: API token id (the part after C(!)); empty for a password login.
        type: str
        default: ""
      api_token_secret:
        description: API token secret.
        type: str
        default: ""
      api_password:
        description: Password of I(api_user).
        type: str
        default: ""
      validate_certs:
        description: Verify the API's TLS certificate.
        type: bool
        default: true
      ca_cert:
        description: CA bundle for the API's certificate.
        type: path
      node:
        description: The PVE node name.
        type: str
        required: true
      vmid:
        description: The container's id.
        type: int
        required: true
      storage:
        description: The rootfs storage.
        type: str
        required: true
      template_storage:
        description: The storage holding the OS template.
        type: str
        required: true
      unprivileged:
        description: Whether the container is unprivileged (a privileged one needs Sys.Modify on /).
        type: bool
        default: true
      gpu_count:
        description: GPUs passed through (devN needs root@pam with its password).
        type: int
        default: 0
extends_documentation_fragment:
  - attributes
  - attributes.read_only
"""

EXAMPLES = r"""
# The probe is the collection's playbooks/files/sglfleet_doctor_probe.py (copy it next to your playbook);
# sglfleet.ops.doctor runs it on every host and calls this module once with all of them.
- name: Probe the host (reads /proc, /dev and the given paths; changes nothing)
  ansible.builtin.script:
    cmd: sglfleet_doctor_probe.py --port=30000 --port=30001
    executable: python3
  register: probe_result
  changed_when: false

- name: Judge what every host showed
  sglfleet.ops.sglfleet_doctor:
    hosts:
      - host: ct200
        role: ct
        probe: "{{ probe_result.stdout | from_json }}"
        gpus_expected: true
        gpu_count: 8
        ports: [30000, 30001]
        model:
          source: hf
          dir: /srv/models/m
          hf_repo: org/m
          hf_revision: 0123456789abcdef0123456789abcdef01234567
  delegate_to: localhost
  register: doctor
"""

RETURN = r"""
rows:
  description: One row per check and host, in order.
  returned: always
  type: list
  elements: dict
  sample:
    - {check: ports, host: ct200, status: BLOCKER, found: "taken: 30000 by pid 812 python3", fix: "..."}
table:
  description: The rendered table, one line per row, then a summary line.
  returned: always
  type: list
  elements: str
blockers:
  description: How many rows are BLOCKER.
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglfleet_deps import SGLFLEET

with SGLFLEET:
    from sglfleet.doctor import DiskNeed, HostExpect, ModelSource, blockers, check_host
    from sglfleet.doctor import render as render_rows

HOST_OPTIONS = {
    "host": {"type": "str", "required": True},
    "role": {"type": "str", "choices": ["node", "ct"], "required": True},
    "probe": {"type": "dict"},
    "unreachable": {"type": "str", "default": ""},
    "gpus_expected": {"type": "bool", "default": True},
    "gpu_count": {"type": "int"},
    "min_branch": {"type": "int", "default": 580},
    "full_driver": {"type": "str", "default": "595.58.03"},
    "disks": {"type": "list", "elements": "dict", "default": []},
    "ports": {"type": "list", "elements": "int", "default": []},
    "model": {"type": "dict"},
    "checksummed_versions": {"type": "list", "elements": "str"},
}
PVE_OPTIONS = {
    "host": {"type": "str", "required": True},
    "api_host": {"type": "str", "required": True},
    "api_port": {"type": "int", "default": 8006},
    "api_user": {"type": "str", "default": "root@pam"},
    "api_token_id": {"type": "str", "default": ""},
    "api_token_secret": {"type": "str", "default": "", "no_log": True},
    "api_password": {"type": "str", "default": "", "no_log": True},
    "validate_certs": {"type": "bool", "default": True},
    "ca_cert": {"type": "path"},
    "node": {"type": "str", "required": True},
    "vmid": {"type": "int", "required": True},
    "storage": {"type": "str", "required": True},
    "template_storage": {"type": "str", "required": True},
    "unprivileged": {"type": "bool", "default": True},
    "gpu_count": {"type": "int", "default": 0},
}


def _expect(entry):
    model = entry["model"]
    return HostExpect(
        role=entry["role"],
        gpus_expected=entry["gpus_expected"],
        gpu_count=entry["gpu_count"],
        min_branch=entry["min_branch"],
        full_driver=entry["full_driver"],
        disks=[
            DiskNeed(str(d["path"]), float(d["need_gib"]), str(d.get("what") or d["path"]))
            for d in entry["disks"]
        ],
        ports=entry["ports"],
        model=ModelSource(
            source=str(model.get("source") or "mount"),
            dir=str(model.get("dir") or ""),
            hf_repo=str(model.get("hf_repo") or ""),
            hf_revision=str(model.get("hf_revision") or ""),
        )
        if model
        else None,
        checksummed_versions=entry["checksummed_versions"],
    )


def _pve_rows(entry):
    from sglfleet.doctor import ProvisionNeeds, check_pve
    from sglfleet.pve import Credentials

    creds = Credentials(
        host=entry["api_host"],
        port=entry["api_port"],
        user=entry["api_user"],
        token_id=entry["api_token_id"] or None,
        token_secret=entry["api_token_secret"] or None,
        password=entry["api_password"] or None,
        validate_certs=entry["validate_certs"],
        ca_cert=entry["ca_cert"],
    )
    needs = ProvisionNeeds(
        node=entry["node"],
        vmid=entry["vmid"],
        storage=entry["storage"],
        template_storage=entry["template_storage"],
        unprivileged=entry["unprivileged"],
        gpu_count=entry["gpu_count"],
    )
    return check_pve(entry["host"], creds, needs)


def main():
    module = AnsibleModule(
        argument_spec={
            "hosts": {"type": "list", "elements": "dict", "default": [], "options": HOST_OPTIONS},
            "pve": {"type": "list", "elements": "dict", "default": [], "options": PVE_OPTIONS},
        },
        supports_check_mode=True,
    )
    SGLFLEET.require(module)
    rows = []
    for entry in module.params["hosts"]:
        rows += check_host(entry["host"], _expect(entry), entry["probe"], entry["unreachable"])
    for entry in module.params["pve"]:
        rows += _pve_rows(entry)
    module.exit_json(
        changed=False,
        rows=[row.as_dict() for row in rows],
        table=render_rows(rows),
        blockers=len(blockers(rows)),
    )


if __name__ == "__main__":
    main()
