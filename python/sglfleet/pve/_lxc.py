"""Make a PVE container match its spec: create, update, start, stop, destroy; check mode writes nothing."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sglfleet.pve._client import Credentials, PveApiError, PveClient
from sglfleet.pve._config import ContainerSpec, Plan, SpecError, plan_update

__all__ = ["STATES", "EnsureResult", "check_credentials", "ensure", "run"]

STATES = ("present", "started", "stopped", "absent")


@dataclass
class EnsureResult:
    """What ensure() did (or, in check mode, would do)."""

    vmid: int
    changed: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    before: dict[str, str] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)
    restart_required: bool = False
    actions: list[str] = field(default_factory=list)
    status: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "changed": self.changed,
            "vmid": self.vmid,
            "config": self.config,
            "restart_required": self.restart_required,
            "actions": self.actions,
            "status": self.status,
        }

    def diff(self) -> dict[str, Any]:
        """Ansible's diff: before/after as `key: value` lines, keys in natural order (dev2 before dev10)."""
        return {
            "before": _lines(self.before),
            "after": _lines(self.after),
            "before_header": f"CT {self.vmid} (PVE now)",
            "after_header": f"CT {self.vmid} (declared)",
        }


def _natural(key: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", key)]


def _lines(values: dict[str, str]) -> str:
    return "".join(f"{key}: {values[key]}\n" for key in sorted(values, key=_natural))


def check_credentials(spec: ContainerSpec, creds: Credentials) -> None:
    """Refuse, before any request, what PVE refuses: devN set by anyone but root@pam with a password."""
    if not spec.devices:
        return
    keys = ", ".join(spec.device_keys())
    if creds.uses_token:
        raise SpecError(
            "devices",
            f"device passthrough ({keys}) can only be configured by root@pam logged in with its password; "
            f"PVE refuses it for API tokens, even root's ({creds.user}!{creds.token_id}). "
            "Set api_user: root@pam and api_password (vault it), and leave api_token_id/api_token_secret "
            f"unset; or drop devices and run `pct set {spec.vmid} -dev0 /dev/nvidia0 ...` on the PVE host",
        )
    if creds.user != "root@pam":
        raise SpecError(
            "devices",
            f"device passthrough ({keys}) can only be configured by root@pam, not {creds.user}; "
            "set api_user: root@pam with its api_password",
        )


def _clean(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != "digest"}


def _apply(client: PveClient, spec: ContainerSpec, current: dict[str, Any], timeout: float) -> Plan:
    """PUT the plan with the digest read; on a stale digest re-read, re-plan and retry once."""
    for attempt in (1, 2):
        plan = plan_update(spec, current)
        if not plan.changed:
            return plan
        try:
            if plan.set or plan.delete:
                client.update(spec.vmid, plan.set, plan.delete, current.get("digest"))
            if plan.resize:
                client.resize(spec.vmid, "rootfs", plan.resize, None, timeout)
            return plan
        except PveApiError as e:
            if not e.stale_digest or attempt == 2:
                raise
            current = client.config(spec.vmid)
    raise AssertionError("unreachable")


def _has_pending(client: PveClient, vmid: int) -> bool:
    return any("pending" in item or item.get("delete") for item in client.pending(vmid))


def ensure(
    client: PveClient,
    spec: ContainerSpec,
    *,
    state: str = "started",
    check_mode: bool = False,
    timeout: float = 300,
) -> EnsureResult:
    """Make CT spec.vmid match spec and state. In check mode, the same answer with no write at all."""
    if state not in STATES:
        raise SpecError("state", f"{state!r} is not one of {', '.join(STATES)}")
    vmid = spec.vmid
    result = EnsureResult(vmid=vmid)
    exists = client.exists(vmid)

    if state == "absent":
        if not exists:
            result.status = "absent"
            return result
        result.before = {k: str(v) for k, v in _clean(client.config(vmid)).items()}
        result.changed = True
        result.actions.append("destroy")
        running = client.status(vmid) == "running"
        if not check_mode:
            if running:
                client.power(vmid, "stop", timeout)
            client.destroy(vmid, timeout)
        result.status = "absent"
        return result

    if not exists:
        params = spec.create_params()
        storage = str(spec.ostemplate).split(":", 1)[0]
        templates = client.templates(storage)
        if spec.ostemplate not in templates:
            listing = ", ".join(templates) if templates else "none"
            raise SpecError(
                "ostemplate",
                f"{spec.ostemplate} is not on storage {storage!r} of node {client.node!r}; templates there: "
                f"{listing}. Download it first (`pveam download {storage} <template>`) or pick one of those",
            )
        result.changed = True
        result.actions.append("create")
        result.after = spec.expected_config()
        if check_mode:
            if state == "started":
                result.actions.append("start")
            result.status = "absent"
            return result
        client.create(params, timeout)
        current = client.config(vmid)
    else:
        current = client.config(vmid)
        plan = plan_update(spec, current)
        if plan.changed and not check_mode:
            plan = _apply(client, spec, current, timeout)
            if plan.changed:
                current = client.config(vmid)
        result.before, result.after = plan.before, plan.after
        if plan.changed:
            result.changed = True
            result.actions.append("update " + ",".join(plan.keys()))

    status = client.status(vmid)
    if state == "started" and status != "running":
        result.changed = True
        result.actions.append("start")
        if not check_mode:
            client.power(vmid, "start", timeout)
            status = "running"
    elif state == "stopped" and status == "running":
        result.changed = True
        result.actions.append("shutdown")
        if not check_mode:
            client.power(vmid, "shutdown", timeout, timeout=max(1, int(timeout) - 5), forceStop=1)
            status = "stopped"
    result.status = status

    if status == "running":
        predicted = check_mode and exists and plan_update(spec, current).needs_restart()
        result.restart_required = predicted or _has_pending(client, vmid)
    result.config = _clean(current)
    return result


def run(
    creds: Credentials,
    node: str,
    spec: ContainerSpec,
    *,
    state: str = "started",
    check_mode: bool = False,
    timeout: float = 300,
) -> EnsureResult:
    """check_credentials, connect, ensure: what the Ansible module calls."""
    check_credentials(spec, creds)
    client = PveClient.connect(creds, node)
    return ensure(client, spec, state=state, check_mode=check_mode, timeout=timeout)
