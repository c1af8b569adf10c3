"""Proxmox VE: declare an LXC container and make PVE match it, exactly and idempotently.

- `config`: the desired container (`ContainerSpec`), PVE property strings parsed and normalised,
  and the difference between what is asked for and what PVE holds (`plan_update`).
- `client`: a small PVE client over proxmoxer: TLS, token or password login, PVE's own error
  messages, task waiting that reports a failed task with its log.
- `lxc`: `ensure(client, spec, state, check_mode)`: create / update / start / stop / destroy; waits
  for a locked CT, relays the warnings of tasks that end with `WARNINGS: N`.
"""

from typing import TYPE_CHECKING

from sglfleet._lazy import attach

# The public names, each written once: a name's submodule is imported when the name is first used
# (sglfleet._lazy reads this block; type checkers and readers see plain imports).
if TYPE_CHECKING:
    from sglfleet.pve._client import (
        CredentialProblem,
        Credentials,
        CtLocked,
        PveApiError,
        PveClient,
        TaskFailed,
        TaskTimeout,
        credential_problems,
        task_succeeded,
    )
    from sglfleet.pve._config import ContainerSpec, Plan, SpecError, parse_mib, plan_update, split_props
    from sglfleet.pve._lxc import STATES, EnsureResult, check_node_devices, ensure, run

__getattr__, __dir__, __all__ = attach(__name__, __file__)
