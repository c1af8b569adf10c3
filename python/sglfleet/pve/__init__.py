"""Proxmox VE: declare an LXC container and make PVE match it, exactly and idempotently.

- `config`: the desired container (`ContainerSpec`), PVE property strings parsed and normalised,
  and the difference between what is asked for and what PVE holds (`plan_update`).
- `client`: a small PVE client over proxmoxer: TLS, token or password login, PVE's own error
  messages, task waiting that reports a failed task with its log.
- `lxc`: `ensure(client, spec, state, check_mode)`: create / update / start / stop / destroy; waits
  for a locked CT, relays the warnings of tasks that end with `WARNINGS: N`.
"""

from typing import TYPE_CHECKING

from sglfleet._lazy import exports

if TYPE_CHECKING:
    from sglfleet.pve._client import CtLocked, PveApiError, PveClient, TaskFailed
    from sglfleet.pve._config import ContainerSpec, SpecError
    from sglfleet.pve._lxc import EnsureResult, check_node_devices, ensure

# Each name's submodule is imported when the name is first used (sglfleet._lazy).
_EXPORTS = {
    "CtLocked": "_client",
    "PveApiError": "_client",
    "PveClient": "_client",
    "TaskFailed": "_client",
    "ContainerSpec": "_config",
    "SpecError": "_config",
    "EnsureResult": "_lxc",
    "check_node_devices": "_lxc",
    "ensure": "_lxc",
}

__all__ = [
    "ContainerSpec",
    "CtLocked",
    "EnsureResult",
    "PveApiError",
    "PveClient",
    "SpecError",
    "TaskFailed",
    "check_node_devices",
    "ensure",
]

__getattr__ = exports(__name__, _EXPORTS)
