"""A small PVE API client over proxmoxer: login, container calls, task waiting, PVE's own errors."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import requests
from proxmoxer import AuthenticationError, ProxmoxAPI, ResourceException

__all__ = [
    "Credentials",
    "CtLocked",
    "PveApiError",
    "PveClient",
    "TaskFailed",
    "TaskTimeout",
    "task_succeeded",
]

# PVE's answer to a PUT whose digest no longer matches the config.
STALE_DIGEST = "detected modified configuration"
# pve-guest-common AbstractConfig::check_lock dies with "CT is locked (backup)"; API calls and task
# workers of pve-container call it before touching a locked config (src/PVE/API2/LXC/Config.pm:174,
# src/PVE/API2/LXC/Status.pm:195).
LOCKED = re.compile(r"\bCT is locked \((?P<lock>[^)]*)\)")
# pve-common PVE/RESTEnvironment.pm fork_worker: a worker that called log_warn N times and then
# returned ends with exit status "WARNINGS: N" (a success); its log holds the lines "WARN: ...".
WARNINGS = re.compile(r"^WARNINGS: (?P<count>\d+)$")
# How many lines of a failed task's log reach the error message.
LOG_TAIL = 15


class PveApiError(RuntimeError):
    """PVE refused a request. `message` and `errors` ({parameter: message}) are PVE's own."""

    def __init__(
        self, action: str, status: int | None, message: str, errors: Mapping[str, str] | None = None
    ) -> None:
        self.action = action
        self.status = status
        self.message = message
        self.errors = dict(errors or {})
        detail = "; ".join(f"{param}: {text}" for param, text in sorted(self.errors.items()))
        text = f"{action}: PVE answered {status}: {message}" if status else f"{action}: {message}"
        super().__init__(f"{text} ({detail})" if detail else text)

    @property
    def stale_digest(self) -> bool:
        return STALE_DIGEST in self.message

    @property
    def lock(self) -> str | None:
        """The lock PVE named when it refused because the CT is locked, else None."""
        found = LOCKED.search(self.message)
        return found.group("lock") if found else None


class TaskFailed(RuntimeError):
    """A PVE task ended with an exit status other than OK; `log` holds its last lines."""

    def __init__(self, action: str, upid: str, exitstatus: str, log: list[str]):
        self.action = action
        self.upid = upid
        self.exitstatus = exitstatus
        self.log = log
        found = LOCKED.search(exitstatus)
        self.lock = found.group("lock") if found else None
        lines = "\n".join(f"  {line}" for line in log)
        super().__init__(f"{action}: task {upid} failed: {exitstatus}\nlast lines of its log:\n{lines}")


class CtLocked(RuntimeError):
    """The container kept a PVE lock (backup, migrate, snapshot, ...) for longer than the timeout."""

    def __init__(self, vmid: int, lock: str, waited: float) -> None:
        self.vmid = vmid
        self.lock = lock
        self.waited = waited
        super().__init__(
            f"CT {vmid} is locked ({lock}) and stayed locked for {waited:g} s: a {lock} task holds it. "
            f"Wait for that task to end (Datacenter > Tasks on the node) and run again, raise the timeout, "
            f"or, if no {lock} is running any more (a stale lock), run `pct unlock {vmid}` on the node"
        )


def task_succeeded(exitstatus: str) -> bool:
    """PVE's rule: a stopped task succeeded when its exit status is OK or `WARNINGS: N`."""
    return exitstatus == "OK" or WARNINGS.match(exitstatus) is not None


class TaskTimeout(RuntimeError):
    """A PVE task still running after the timeout; `log` holds its last lines so far."""

    def __init__(self, action: str, upid: str, timeout: float, log: list[str]):
        self.action = action
        self.upid = upid
        self.log = log
        lines = "\n".join(f"  {line}" for line in log) or "  (empty)"
        super().__init__(f"{action}: task {upid} still running after {timeout:g} s; its log so far:\n{lines}")


@dataclass(frozen=True)
class Credentials:
    """How to reach and log in to PVE. Either a token (token_id + token_secret) or a password."""

    host: str
    user: str
    port: int = 8006
    token_id: str | None = None
    token_secret: str | None = None
    password: str | None = None
    validate_certs: bool = True
    ca_cert: str | None = None
    timeout: float = 30.0

    @property
    def uses_token(self) -> bool:
        return self.token_id is not None

    def __repr__(self) -> str:  # never show the secrets
        how = f"token {self.user}!{self.token_id}" if self.uses_token else f"password of {self.user}"
        return f"Credentials({self.host}:{self.port}, {how})"


#: pve-access-control src/PVE/AccessControl.pm: `$token_subid_regex = $PVE::Auth::Plugin::realm_regex`,
#: and src/PVE/Auth/Plugin.pm `realm_regex = qr/[A-Za-z][A-Za-z0-9\.\-_]+/`: a token's name (the part
#: after "!" in `user@realm!name`).
TOKEN_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9.\-_]+$")
#: What `pveum user token add` prints as the token's value: a UUID.
TOKEN_SECRET_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
#: The inventory's variable for each Credentials field (role proxmox_lxc), named in messages.
VARIABLES = {
    "user": "proxmox_lxc_api_user",
    "token_id": "proxmox_lxc_api_token_id",
    "token_secret": "proxmox_lxc_api_token_secret",
    "password": "proxmox_lxc_api_password",
    "ca_cert": "proxmox_lxc_ca_cert",
}


@dataclass(frozen=True)
class CredentialProblem:
    variable: str
    found: str  # never the secret itself
    fix: str


def credential_problems(
    creds: Credentials, variables: Mapping[str, str] = VARIABLES
) -> list[CredentialProblem]:
    """What is wrong with `creds` before any call to PVE: a token id given as `user@realm!name` or
    not a token name, a secret that is not a UUID, a CA file that is not a file (requests would raise
    "Could not find a suitable TLS CA certificate bundle" at the first call)."""
    out = []
    token_id = creds.token_id
    if token_id is not None:
        if "!" in token_id:
            user, _, name = token_id.rpartition("!")
            var_id, var_user = variables["token_id"], variables["user"]
            out.append(
                CredentialProblem(
                    var_id,
                    f"{var_id} is '{token_id}', a full token id; the token's name alone is expected",
                    f"set {var_id}: '{name}' and {var_user}: '{user}' (now '{creds.user}')",
                )
            )
        elif not TOKEN_NAME_RE.match(token_id):
            out.append(
                CredentialProblem(
                    variables["token_id"],
                    f"{variables['token_id']} is '{token_id}', not a PVE token name (a letter, then letters, "
                    "digits, '.', '-' or '_')",
                    f"set {variables['token_id']} to the token's name, the part after '!' in "
                    f"{creds.user}!NAME (pveum user token list {creds.user})",
                )
            )
        secret = creds.token_secret or ""
        if not TOKEN_SECRET_RE.match(secret.strip()):
            out.append(
                CredentialProblem(
                    variables["token_secret"],
                    f"{variables['token_secret']} is not a UUID ({len(secret)} characters; a PVE token's "
                    "secret is xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                    f"set {variables['token_secret']} (vaulted) to the value `pveum user token add` printed "
                    "for the token",
                )
            )
    if creds.ca_cert and not os.path.isfile(creds.ca_cert):
        out.append(
            CredentialProblem(
                variables["ca_cert"],
                f"{variables['ca_cert']} is {creds.ca_cert}, which is not a file on the controller",
                f'copy the PVE host\'s /etc/pve/pve-root-ca.pem there, or set {variables["ca_cert"]}: "" '
                "to use the system CAs",
            )
        )
    return out


class PveClient:
    """The PVE calls the container module needs; every failure is a PveApiError with PVE's words."""

    def __init__(self, api: ProxmoxAPI, node: str, poll: float = 0.5):
        self.api = api
        self.node = node
        self.poll = poll
        # "action: WARN: line" for every task that ended with `WARNINGS: N`, in order, for the caller
        # to relay (a CT start on PVE warns, e.g., about a device or a mount it could not set up).
        self.warnings: list[str] = []

    @classmethod
    def connect(cls, creds: Credentials, node: str) -> PveClient:
        verify: bool | str = creds.ca_cert if creds.ca_cert else creds.validate_certs
        auth: dict[str, Any]
        if creds.uses_token:
            auth = {"token_name": creds.token_id, "token_value": creds.token_secret}
        else:
            auth = {"password": creds.password}
        where = f"https://{creds.host}:{creds.port}"
        try:
            api = ProxmoxAPI(
                creds.host, port=creds.port, user=creds.user, verify_ssl=verify, timeout=creds.timeout, **auth
            )
        except AuthenticationError as e:
            raise PveApiError(f"log in to {where} as {creds.user}", 401, str(e)) from None
        except requests.exceptions.SSLError as e:
            raise PveApiError(
                f"connect to {where}",
                None,
                f"TLS verification failed ({e.__class__.__name__}); set ca_cert to the PVE CA "
                "(/etc/pve/pve-root-ca.pem) or validate_certs: false",
            ) from None
        except (requests.exceptions.RequestException, OSError) as e:
            # OSError: requests' "Could not find a suitable TLS CA certificate bundle, invalid path".
            raise PveApiError(f"connect to {where}", None, f"{e.__class__.__name__}: {e}") from None
        return cls(api, node)

    # ------------------------------------------------------------------ plumbing

    def _call(self, action: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except ResourceException as e:
            errors = e.errors if isinstance(e.errors, Mapping) else {}
            raise PveApiError(action, e.status_code, str(e.content), errors) from None
        except (requests.exceptions.RequestException, OSError) as e:
            raise PveApiError(action, None, f"{e.__class__.__name__}: {e}") from None

    def _lxc(self, vmid: int) -> Any:
        return self.api.nodes(self.node).lxc(vmid)

    # ------------------------------------------------------------------ reads

    def version(self) -> dict[str, Any]:
        return self._call("read the PVE version", self.api.version.get)

    def permissions(self) -> dict[str, dict[str, Any]]:
        """GET /access/permissions: {ACL path: {privilege: propagate}} of the logged-in user or token."""
        return self._call("read the permissions", self.api.access.permissions.get) or {}

    def exists(self, vmid: int) -> bool:
        """True if CT vmid is on this node (a VM or a container elsewhere with that id is an error)."""
        guests = self._call("list the cluster's guests", lambda: self.api.cluster.resources.get(type="vm"))
        for guest in guests or []:
            if int(guest.get("vmid", -1)) != vmid:
                continue
            if guest.get("type") != "lxc":
                kind = guest.get("type")
                raise PveApiError(f"look up CT {vmid}", None, f"{vmid} is a {kind} guest, not a container")
            if guest.get("node") != self.node:
                where = guest.get("node")
                raise PveApiError(
                    f"look up CT {vmid}", None, f"CT {vmid} is on node {where!r}, not {self.node!r}"
                )
            return True
        return False

    def config(self, vmid: int) -> dict[str, Any]:
        """The config with pending changes applied (what the container will run with), and its digest."""
        return self._call(f"read CT {vmid} config", self._lxc(vmid).config.get)

    def pending(self, vmid: int) -> list[dict[str, Any]]:
        return self._call(f"read CT {vmid} pending changes", self._lxc(vmid).pending.get)

    def status(self, vmid: int) -> str:
        data = self._call(f"read CT {vmid} status", self._lxc(vmid).status.current.get)
        return str(data.get("status"))

    def templates(self, storage: str) -> list[str]:
        """Volume ids of the container templates on a storage."""
        items = self._call(
            f"list templates on storage {storage!r} of node {self.node!r}",
            lambda: self.api.nodes(self.node).storage(storage).content.get(content="vztmpl"),
        )
        return sorted(str(item["volid"]) for item in items or [])

    # ------------------------------------------------------------------ writes

    def create(self, params: Mapping[str, Any], timeout: float) -> None:
        action = f"create CT {params.get('vmid')}"
        upid = self._call(action, lambda: self.api.nodes(self.node).lxc.post(**params))
        self.wait(action, upid, timeout)

    def update(self, vmid: int, values: Mapping[str, Any], delete: list[str], digest: str | None) -> None:
        body = dict(values)
        if delete:
            body["delete"] = ",".join(delete)
        if digest:
            body["digest"] = digest
        self._call(f"update CT {vmid} config", lambda: self._lxc(vmid).config.put(**body))

    def resize(self, vmid: int, disk: str, size: str, digest: str | None, timeout: float) -> None:
        action = f"resize CT {vmid} {disk} to {size}"
        body = {"disk": disk, "size": size}
        if digest:
            body["digest"] = digest
        upid = self._call(action, lambda: self._lxc(vmid).resize.put(**body))
        if isinstance(upid, str) and upid.startswith("UPID:"):
            self.wait(action, upid, timeout)

    def power(self, vmid: int, verb: str, timeout: float, **params: Any) -> None:
        """start, shutdown or stop, waiting for the task."""
        action = f"{verb} CT {vmid}"
        upid = self._call(action, lambda: getattr(self._lxc(vmid).status, verb).post(**params))
        self.wait(action, upid, timeout)

    def destroy(self, vmid: int, timeout: float) -> None:
        action = f"destroy CT {vmid}"
        upid = self._call(action, lambda: self._lxc(vmid).delete())
        self.wait(action, upid, timeout)

    # ------------------------------------------------------------------ tasks

    def task_log(self, upid: str, tail: int = LOG_TAIL) -> list[str]:
        try:
            lines = self.api.nodes(self.node).tasks(upid).log.get(limit=1000)
        except (ResourceException, requests.exceptions.RequestException) as e:
            return [f"(task log unavailable: {e})"]
        return [str(line.get("t", "")) for line in lines or []][-tail:]

    def _keep_warnings(self, action: str, upid: str, exitstatus: str) -> None:
        lines = [line for line in self.task_log(upid, tail=1000) if line.startswith("WARN")]
        lines = [line for line in lines if not line.startswith("WARNINGS")]
        if not lines:
            lines = [f"{exitstatus} (task {upid}; its log names none)"]
        self.warnings.extend(f"{action}: {line}" for line in lines)

    def wait_unlocked(self, vmid: int, timeout: float) -> dict[str, Any]:
        """The config once CT vmid holds no lock; CtLocked naming the lock after `timeout` seconds."""
        start = time.monotonic()
        delay = 0.1
        while True:
            config = self.config(vmid)
            lock = config.get("lock")
            if not lock:
                return config
            waited = time.monotonic() - start
            if waited >= timeout:
                raise CtLocked(vmid, str(lock), round(waited, 1))
            time.sleep(min(delay, max(0.0, timeout - waited)))
            delay = min(delay * 2, max(self.poll, 0.1) * 4)

    def wait(self, action: str, upid: str, timeout: float) -> None:
        """Wait for the task: done when status is 'stopped', a success if exitstatus is 'OK' or
        'WARNINGS: N' (whose warning lines go to self.warnings); otherwise TaskFailed with its log."""
        deadline = time.monotonic() + timeout
        delay = 0.1
        while True:
            status = self._call(
                f"{action}: read task status", self.api.nodes(self.node).tasks(upid).status.get
            )
            if status.get("status") == "stopped":
                exitstatus = str(status.get("exitstatus", ""))
                if not task_succeeded(exitstatus):
                    raise TaskFailed(action, upid, exitstatus, self.task_log(upid))
                if exitstatus != "OK":
                    self._keep_warnings(action, upid, exitstatus)
                return
            if time.monotonic() >= deadline:
                raise TaskTimeout(action, upid, timeout, self.task_log(upid))
            time.sleep(min(delay, self.poll, max(0.0, deadline - time.monotonic())))
            delay *= 2
