"""The doctor's PVE row: whether the credentials the inventory gives proxmox_lxc can do what phase
provision asks of them, read from GET /access/permissions (changes nothing)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sglfleet.doctor._report import Row, Status
from sglfleet.pve._client import Credentials, PveApiError, PveClient, credential_problems

__all__ = ["ProvisionNeeds", "check_pve", "missing_privileges"]

# What phase provision calls, and what PVE checks for it (pve-container 6.1.10 src/PVE/API2/LXC.pm:
# create_vm :148-150 (VM.Allocate on /vms/{vmid}, Datastore.AllocateSpace on the storage), :273
# (Sys.Modify on / for a privileged CT), :295, :356; the API schema's permissions of
# PUT .../config (VM.Config.*), GET .../config and status/current (VM.Audit), status/start|shutdown
# (VM.PowerMgmt), GET /nodes/{node}/storage/{storage}/content (Datastore.Audit or AllocateSpace)).
VM_PRIVILEGES = (
    "VM.Allocate",
    "VM.Audit",
    "VM.Config.CPU",
    "VM.Config.Disk",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.Options",
    "VM.PowerMgmt",
)


@dataclass(frozen=True)
class ProvisionNeeds:
    node: str
    vmid: int
    storage: str
    template_storage: str
    unprivileged: bool = True
    gpu_count: int = 0  # devN passthrough: root@pam with its password only (PVE refuses tokens)


def _held(perms: Mapping[str, Mapping[str, Any]], path: str, privilege: str) -> bool:
    """True if `privilege` is held on `path` or propagated from an ancestor ACL path."""
    for granted, privileges in perms.items():
        if privilege not in privileges:
            continue
        propagates = bool(privileges[privilege]) or granted == path
        on_path = granted in (path, "/") or path.startswith(granted.rstrip("/") + "/")
        if on_path and propagates:
            return True
    return False


def missing_privileges(perms: Mapping[str, Mapping[str, Any]], needs: ProvisionNeeds) -> list[str]:
    wanted = [(f"/vms/{needs.vmid}", p) for p in VM_PRIVILEGES]
    wanted.append((f"/storage/{needs.storage}", "Datastore.AllocateSpace"))
    wanted.append((f"/storage/{needs.template_storage}", "Datastore.Audit"))
    if not needs.unprivileged:
        wanted.append(("/", "Sys.Modify"))
    return [f"{privilege} on {path}" for path, privilege in wanted if not _held(perms, path, privilege)]


def check_pve(host: str, creds: Credentials, needs: ProvisionNeeds) -> list[Row]:
    """One row: can these credentials provision `needs.vmid`? Connection and login failures are blockers."""
    check = "PVE privileges"
    who = f"{creds.user}!{creds.token_id}" if creds.uses_token else creds.user
    if needs.gpu_count and (creds.uses_token or creds.user != "root@pam" or not creds.password):
        return [
            Row(
                check,
                host,
                Status.BLOCKER,
                f"{who}: GPU passthrough (devN) is set by root@pam with its password only (no token)",
                "set proxmox_lxc_api_user: root@pam and proxmox_lxc_api_password (vaulted), "
                "and leave proxmox_lxc_api_token_id empty",
            )
        ]
    problems = credential_problems(creds)
    if problems:
        # Before any call: a full token id, a secret that is no UUID, a CA path that is no file.
        return [Row(check, host, Status.BLOCKER, p.found, p.fix) for p in problems]
    try:
        perms = PveClient.connect(creds, needs.node).permissions()
    except PveApiError as error:
        return [
            Row(
                check,
                host,
                Status.BLOCKER,
                str(error),
                "check proxmox_lxc_api_host/port, the credentials and proxmox_lxc_ca_cert",
            )
        ]
    missing = missing_privileges(perms, needs)
    if missing:
        return [
            Row(
                check,
                host,
                Status.BLOCKER,
                f"{who} lacks " + ", ".join(missing),
                "grant them (pveum acl modify PATH --roles ROLE --tokens USER!TOKEN, or --users), "
                "or use root@pam",
            )
        ]
    return [Row(check, host, Status.OK, f"{who} may create, configure and start CT {needs.vmid}")]
