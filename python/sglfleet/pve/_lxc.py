"""Make a PVE container match its spec: create, update, start, stop, destroy; check mode writes nothing."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sglfleet.pve._client import Credentials, PveApiError, PveClient, TaskFailed
from sglfleet.pve._config import ContainerSpec, Plan, SpecError, plan_update

__all__ = ["STATES", "EnsureResult", "check_node_devices", "ensure", "run"]

T = TypeVar("T")

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
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "changed": self.changed,
            "vmid": self.vmid,
            "config": self.config,
            "restart_required": self.restart_required,
            "actions": self.actions,
            "status": self.status,
            "task_warnings": self.warnings,
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
    """Refuse, before any request, what PVE refuses: devN and bind mounts set by anyone but root@pam
    with a password (pve-container src/PVE/LXC.pm check_ct_modify_config_perm: `return 1 if $authuser
    eq 'root@pam'`; a token's authuser is root@pam!ID, so "configuring device passthrough is only
    allowed for root@pam" and "mount point type bind is only allowed for root@pam")."""
    for what, keys in (
        ("device passthrough", list(spec.device_keys())),
        ("bind mounts of host directories", spec.bind_mounts()),
    ):
        if keys:
            _need_root_password(spec, creds, what, ", ".join(keys))


def _need_root_password(spec: ContainerSpec, creds: Credentials, what: str, keys: str) -> None:
    argument = "devices" if keys.startswith("dev") else "mounts"
    if creds.uses_token:
        raise SpecError(
            argument,
            f"{what} ({keys}) can only be configured by root@pam logged in with its password; "
            f"PVE refuses it for API tokens, even root's ({creds.user}!{creds.token_id}). "
            "Set api_user: root@pam and api_password (vault it), and leave api_token_id/api_token_secret "
            f"unset; or drop {argument} and run `pct set {spec.vmid} ...` on the PVE host",
        )
    if creds.user != "root@pam":
        raise SpecError(
            argument,
            f"{what} ({keys}) can only be configured by root@pam, not {creds.user}; "
            "set api_user: root@pam with its api_password",
        )


def check_node_devices(spec: ContainerSpec, node: str, present: Iterable[str] | None) -> None:
    """Refuse devN paths the node lacks, before any change: PVE stats every devN path when the config
    is written and at each start (pve-container src/PVE/LXC/Config.pm update_pct_config ->
    src/PVE/LXC/Tools.pm get_device_mode_and_rdev: "Device $path does not exist")."""
    if present is None or not spec.devices:
        return
    have = set(present)
    missing = [f"{key}={dev['path']}" for key, dev in spec.device_keys().items() if dev["path"] not in have]
    if missing:
        raise SpecError(
            "devices",
            f"node {node!r} has no {', '.join(missing)}: PVE refuses a devN whose path does not exist on the "
            "node. Load the NVIDIA modules and make the device nodes there first (role pve_host: "
            "`modprobe nvidia nvidia_uvm`, `nvidia-modprobe -c 0 .. -c N-1 -c 255` and "
            "`nvidia-modprobe -u -c 0`), or drop those devices",
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
    """Make CT spec.vmid match spec and state. In check mode, the same answer with no write at all.

    A CT locked by a backup or migration is waited for (up to `timeout`) before the first write, and
    named in a CtLocked error if it stays locked; tasks that end with `WARNINGS: N` succeed and their
    warning lines are in result.warnings.
    """
    if state not in STATES:
        raise SpecError("state", f"{state!r} is not one of {', '.join(STATES)}")
    run = _Ensure(client, spec, check_mode, timeout, EnsureResult(vmid=spec.vmid))
    exists = client.exists(spec.vmid)
    try:
        if state == "absent":
            run.destroy(exists)
        elif run.converge(exists, state):
            run.power(state, exists)
    finally:
        run.result.warnings = list(client.warnings)
    return run.result


@dataclass
class _Ensure:
    """One ensure() run: the steps share the client, the spec, the mode and the result."""

    client: PveClient
    spec: ContainerSpec
    check_mode: bool
    timeout: float
    result: EnsureResult

    @property
    def vmid(self) -> int:
        return self.spec.vmid

    def retry_locked(self, write: Callable[[], T], again: Callable[[], T] | None = None) -> T:
        """Run a write; when PVE refuses it because the CT is locked (a backup started between our read
        and our write), wait for the lock to go and retry once (with `again` when given)."""
        try:
            return write()
        except (PveApiError, TaskFailed) as e:
            if e.lock is None:
                raise
        self.client.wait_unlocked(self.vmid, self.timeout)
        return (again or write)()

    def unlocked_config(self) -> dict[str, Any]:
        """The config; a real run first waits for a lock to go, check mode says it would."""
        if not self.check_mode:
            return self.client.wait_unlocked(self.vmid, self.timeout)
        config = self.client.config(self.vmid)
        if config.get("lock"):
            self.client.warnings.append(
                f"CT {self.vmid} is locked ({config['lock']}): a real run waits up to {self.timeout:g} s "
                "for it to end"
            )
        return config

    def destroy(self, exists: bool) -> None:
        client, vmid, timeout = self.client, self.vmid, self.timeout
        self.result.status = "absent"
        if not exists:
            return
        self.result.before = {k: str(v) for k, v in _clean(self.unlocked_config()).items()}
        self.result.changed = True
        self.result.actions.append("destroy")
        if self.check_mode:
            return
        if client.status(vmid) == "running":
            self.retry_locked(lambda: client.power(vmid, "stop", timeout))
        self.retry_locked(lambda: client.destroy(vmid, timeout))

    def converge(self, exists: bool, state: str) -> bool:
        """Create or update; False when check mode stops here (a CT that does not exist yet)."""
        if not exists:
            return self.create(state)
        client, spec, result = self.client, self.spec, self.result
        current = self.unlocked_config()
        plan = plan_update(spec, current)
        if plan.changed and not self.check_mode:
            plan = self.retry_locked(
                lambda: _apply(client, spec, current, self.timeout),
                lambda: _apply(client, spec, client.config(spec.vmid), self.timeout),
            )
        result.before, result.after = plan.before, plan.after
        result.config = _clean(current)
        if plan.changed:
            result.changed = True
            result.actions.append("update " + ",".join(plan.keys()))
            # Check mode predicts what a real run leaves pending (a new devN is hot-plugged, not
            # pending); a real run reads PVE's own pending list after the start step.
            result.restart_required = self.check_mode and plan.needs_restart()
        return True

    def create(self, state: str) -> bool:
        client, spec, result = self.client, self.spec, self.result
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
        if self.check_mode:
            if state == "started":
                result.actions.append("start")
            result.status = "absent"
            return False
        client.create(params, self.timeout)
        return True

    def power(self, state: str, exists: bool) -> None:
        client, vmid, timeout, result = self.client, self.vmid, self.timeout, self.result
        status = client.status(vmid)
        if state == "started" and status != "running":
            result.changed = True
            result.actions.append("start")
            if not self.check_mode:
                self.retry_locked(lambda: client.power(vmid, "start", timeout))
                status = "running"
        elif state == "stopped" and status == "running":
            result.changed = True
            result.actions.append("shutdown")
            if not self.check_mode:
                stop_in = max(1, int(timeout) - 5)
                self.retry_locked(
                    lambda: client.power(vmid, "shutdown", timeout, timeout=stop_in, forceStop=1)
                )
                status = "stopped"
        result.status = status
        predicted = self.check_mode and exists and result.restart_required
        result.restart_required = status == "running" and (predicted or _has_pending(client, vmid))
        if not self.check_mode:
            result.config = _clean(client.config(vmid))


def run(
    creds: Credentials,
    node: str,
    spec: ContainerSpec,
    *,
    state: str = "started",
    check_mode: bool = False,
    timeout: float = 300,
    node_devices: Iterable[str] | None = None,
) -> EnsureResult:
    """check_credentials, check_node_devices, connect, ensure: what the Ansible module calls."""
    check_credentials(spec, creds)
    check_node_devices(spec, node, node_devices)
    client = PveClient.connect(creds, node)
    return ensure(client, spec, state=state, check_mode=check_mode, timeout=timeout)
