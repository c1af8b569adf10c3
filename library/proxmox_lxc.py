#!/usr/bin/python
# Copyright: sglfleet contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module proxmox_lxc: a thin adapter over sglfleet.pve (the logic and its tests live there)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: proxmox_lxc
short_description: Declare a Proxmox VE LXC container, GPU passthrough included, and make PVE match it exactly
description:
  - Creates the container if it is absent (waiting for the create task; a failed task fails the module
    with the last lines of its log), otherwise compares the full declared config with PVE's after
    normalising both (property strings parsed into key/value sets, booleans, sizes such as C(8G)/C(8192))
    and PUTs only what differs, with the C(digest) it read. A stale digest is re-read and retried once.
  - Options removed from C(features) or from a C(netN), and C(devN) or C(netN) entries no longer declared,
    are changes too. Keys left unset (null) are not managed.
  - Check mode computes the same answer without a single write; diff mode shows before/after of the
    managed keys. C(restart_required) says when a running container only takes the change at its next start.
  - C(devN) passthrough can only be set by C(root@pam) logged in with its password (PVE refuses API tokens,
    even root's), so asking for O(devices) with a token fails before any request.
  - PVE's errors reach the user with PVE's own message and the parameter it names.
  - A task whose exit status is C(WARNINGS) with a count succeeded; its warning lines are relayed as
    Ansible warnings and in RV(task_warnings).
  - A container locked by a backup or migration (C(lock) in its config) is waited for up to O(timeout)
    before the first write, then named in the error.
  - Adding a C(devN) or C(mpN) to a running container hot-plugs it (as pve-container does), so no restart
    is predicted for it; changing or removing one is applied at the next start.
  - Runs where C(sglfleet) is installed, the controller (C(delegate_to=localhost)).
version_added: "0.1.0"
author:
  - sglfleet maintainers (@sglfleet)
options:
  api_host:
    description: PVE host name or address.
    type: str
    required: true
  api_port:
    description: PVE API port.
    type: int
    default: 8006
  api_user:
    description: PVE user, e.g. C(root@pam). With O(api_token_id), the token's owner.
    type: str
    required: true
  api_token_id:
    description: API token id (the part after C(!)); mutually exclusive with O(api_password).
    type: str
  api_token_secret:
    description: API token secret (a UUID).
    type: str
  api_password:
    description: Password of O(api_user); needed for O(devices).
    type: str
  validate_certs:
    description: Verify the PVE TLS certificate.
    type: bool
    default: true
  ca_cert:
    description: CA certificate file to verify PVE with (e.g. a copy of C(/etc/pve/pve-root-ca.pem)).
    type: path
  node:
    description: PVE node the container lives on.
    type: str
    required: true
  vmid:
    description: Container id.
    type: int
    required: true
  hostname:
    description: Container host name.
    type: str
  ostemplate:
    description:
      - Template volume to create from, e.g. C(local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst).
      - Needed only to create; it must be on its storage, else the module fails listing the templates there.
    type: str
  storage:
    description: Storage for the root disk when O(rootfs) gives only a size.
    type: str
  cores:
    description: CPU cores.
    type: int
  memory:
    description: Memory, in MiB as a number or with a unit (C(8G), C(512M)).
    type: raw
  swap:
    description: Swap, in MiB as a number or with a unit.
    type: raw
  rootfs:
    description:
      - Root disk as C(STORAGE:GiB[,option=value...]) or a size (C(32), C(32G)) on O(storage).
      - On an existing container a larger size grows the disk; a smaller one or another storage is an error.
    type: str
  netif:
    description:
      - Network interfaces, C({net0 => "name=eth0,bridge=vmbr0,ip=dhcp"}). Every netN is managed when given.
      - A generated C(hwaddr) is kept when the interface changes, unless one is declared.
    type: dict
  features:
    description:
      - Feature flags, e.g. C([nesting=1, keyctl=1]).
      - The whole set is managed when given (C([]) removes all).
    type: list
    elements: str
  unprivileged:
    description: Unprivileged container. PVE cannot change it later; a mismatch is an error.
    type: bool
  onboot:
    description: Start at PVE boot.
    type: bool
  ssh_public_keys:
    description: Public keys for root's authorized_keys, used only when the container is created.
    type: str
  devices:
    description:
      - Device passthrough, in order C(dev0..devN).
      - Each a C(/dev/...) path or a dict C({path, gid, uid, mode}).
      - Every devN is managed when given. Needs O(api_user=root@pam) with O(api_password).
    type: list
    elements: raw
  mounts:
    description:
      - Bind mounts of directories on the PVE host, C({mp0 => "/srv/models,mp=/models,ro=1"}) or
        a dict C({volume => /srv/models, mp => /models, ro => true}) per mpN.
      - Every mpN is managed when given. Like O(devices), only C(root@pam) with its password may set them.
      - A new mpN on a running container is hot-plugged; a changed one waits for the next start.
    type: dict
  node_devices:
    description:
      - The C(/dev) paths the PVE node has (the role gathers them on the node over SSH).
      - When given, a declared device the node lacks fails the module before any change, naming it
        (PVE itself refuses such a devN with C(Device /dev/... does not exist)).
    type: list
    elements: str
  state:
    description:
      - C(present) exists with the config; C(started) also running; C(stopped) also stopped.
      - C(absent) stops and destroys it.
    type: str
    choices: [present, started, stopped, absent]
    default: started
  timeout:
    description:
      - Seconds to wait for each PVE task (create, start, shutdown, destroy).
      - Also how long a container locked by a backup, migration or snapshot is waited for before the
        module fails naming the lock.
    type: int
    default: 300
requirements:
  - sglfleet (with proxmoxer) on the host the module runs on
extends_documentation_fragment:
  - attributes
attributes:
  check_mode:
    support: full
    details:
      - Reads the container's state and config and reports what it would change, with no write.
  diff_mode:
    support: full
    details:
      - Shows the managed config keys and the status before and after.
"""

EXAMPLES = r"""
# proxmox_lxc_api_password: the inventory's vaulted root@pam password (inventory/example, group_vars/fleet/)
- name: CT 200 with 8 GPUs, started
  sglfleet.ops.proxmox_lxc:
    api_host: kpro6.example.net
    api_user: root@pam
    api_password: "{{ proxmox_lxc_api_password }}"
    ca_cert: /etc/sglfleet/pve-root-ca.pem
    node: kpro6
    vmid: 200
    hostname: sgl
    ostemplate: local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst
    rootfs: local-lvm:200
    cores: 64
    memory: 512G
    swap: 0
    netif:
      net0: name=eth0,bridge=vmbr0,ip=dhcp
    features: [nesting=1, keyctl=1]
    unprivileged: true
    onboot: true
    devices: [/dev/nvidia0, /dev/nvidiactl, {path: /dev/nvidia-uvm, mode: "0666"}]
    state: started
  delegate_to: localhost
  no_log: true
"""

RETURN = r"""
vmid:
  description: The container id.
  returned: always
  type: int
  sample: 200
config:
  description:
    - The container config as PVE holds it after the run (pending changes included).
    - C({}) when absent.
  returned: always
  type: dict
  sample: {cores: 64, memory: 524288, features: "keyctl=1,nesting=1"}
restart_required:
  description: True when the container runs and PVE holds changes it only applies at the next start.
  returned: always
  type: bool
actions:
  description: What was (or in check mode would be) done, in order.
  returned: always
  type: list
  elements: str
  sample: [update cores,features, start]
status:
  description: Container status after the run (running, stopped, absent).
  returned: always
  type: str
task_warnings:
  description: Warning lines of PVE tasks whose exit status was C(WARNINGS) with a count, after their action.
  returned: always
  type: list
  elements: str
  sample: ["start CT 200 - WARN - ..."]
locked:
  description: On failure because the container stayed locked, the lock's name (backup, migrate, ...).
  returned: when the container stayed locked past the timeout
  type: str
diff:
  description: Before/after of the managed keys.
  returned: in diff mode
  type: dict
pve_errors:
  description: On failure, PVE's per-parameter messages ({parameter => message}).
  returned: when PVE refused a request naming parameters
  type: dict
task_log:
  description: On a failed or timed-out task, its last log lines.
  returned: when a task failed
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglfleet_deps import SGLFLEET

with SGLFLEET:
    from sglfleet.pve import (
        STATES,
        ContainerSpec,
        Credentials,
        CtLocked,
        PveApiError,
        SpecError,
        TaskFailed,
        TaskTimeout,
        run,
    )

# The package's own list. Without the package (ansible-test sanity, ansible-doc tooling) the documented
# one; tests/unit/modules/test_module_docs.py keeps the two equal.
STATE_CHOICES = list(STATES) if SGLFLEET.ok else ["present", "started", "stopped", "absent"]

SPEC_KEYS = (
    "hostname",
    "ostemplate",
    "storage",
    "cores",
    "memory",
    "swap",
    "rootfs",
    "netif",
    "features",
    "unprivileged",
    "onboot",
    "ssh_public_keys",
    "devices",
    "mounts",
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "api_host": {"type": "str", "required": True},
            "api_port": {"type": "int", "default": 8006},
            "api_user": {"type": "str", "required": True},
            "api_token_id": {"type": "str"},
            "api_token_secret": {"type": "str", "no_log": True},
            "api_password": {"type": "str", "no_log": True},
            "validate_certs": {"type": "bool", "default": True},
            "ca_cert": {"type": "path"},
            "node": {"type": "str", "required": True},
            "vmid": {"type": "int", "required": True},
            "hostname": {"type": "str"},
            "ostemplate": {"type": "str"},
            "storage": {"type": "str"},
            "cores": {"type": "int"},
            "memory": {"type": "raw"},
            "swap": {"type": "raw"},
            "rootfs": {"type": "str"},
            "netif": {"type": "dict"},
            "features": {"type": "list", "elements": "str"},
            "unprivileged": {"type": "bool"},
            "onboot": {"type": "bool"},
            "ssh_public_keys": {"type": "str"},
            "devices": {"type": "list", "elements": "raw"},
            "mounts": {"type": "dict"},
            "node_devices": {"type": "list", "elements": "str"},
            "state": {"type": "str", "default": "started", "choices": STATE_CHOICES},
            "timeout": {"type": "int", "default": 300},
        },
        required_one_of=[("api_password", "api_token_id")],
        mutually_exclusive=[("api_password", "api_token_id")],
        required_together=[("api_token_id", "api_token_secret")],
        supports_check_mode=True,
    )
    SGLFLEET.require(module)
    p = module.params
    creds = Credentials(
        host=p["api_host"],
        port=p["api_port"],
        user=p["api_user"],
        token_id=p["api_token_id"],
        token_secret=p["api_token_secret"],
        password=p["api_password"],
        validate_certs=p["validate_certs"],
        ca_cert=p["ca_cert"],
    )
    try:
        spec = ContainerSpec.from_args(vmid=p["vmid"], **{k: p[k] for k in SPEC_KEYS})
        result = run(
            creds,
            p["node"],
            spec,
            state=p["state"],
            check_mode=module.check_mode,
            timeout=p["timeout"],
            node_devices=p["node_devices"],
        )
    except SpecError as e:
        module.fail_json(msg=str(e), vmid=p["vmid"], argument=e.field)
    except PveApiError as e:
        module.fail_json(msg=str(e), vmid=p["vmid"], pve_errors=e.errors, pve_status=e.status)
    except CtLocked as e:
        module.fail_json(msg=str(e), vmid=p["vmid"], locked=e.lock)
    except (TaskFailed, TaskTimeout) as e:
        module.fail_json(msg=str(e), vmid=p["vmid"], task_log=e.log, upid=e.upid)
    for line in result.warnings:
        module.warn(line)
    out = result.as_dict()
    if module._diff:
        out["diff"] = result.diff()
    module.exit_json(**out)


if __name__ == "__main__":
    main()
