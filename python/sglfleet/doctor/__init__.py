"""First contact, read-only: every blocker on the PVE nodes and the fleet's containers, in one table.

- `_probe`: what a host shows (standard library only; playbooks/doctor.yml runs it on each host with
  that host's python3: /proc/devices, /dev/nvidia*, the driver version, kmod, free disk, listening
  ports, the model's config.json). It changes nothing.
- `driver`: the driver floors CUDA 13.2 needs (`MIN_BRANCH`, `FULL_DRIVER`, `driver_support`), defined
  once; the roles' defaults are checked against them.
- `checks`: `check_host(host, HostExpect, probe)`: the rows of one host, every check run whatever the
  others found; `node_table(gpu_count, majors, stat_lines)`: the device nodes a PVE node has against the
  ones it needs (role pve_host, module `device_nodes`), from the same `expected_nodes` the check uses.
- `pve`: `check_pve(host, Credentials, ProvisionNeeds)`: can the inventory's PVE credentials provision the CT
  (GET /access/permissions).
- `report`: `Row`, `Status`, `render(rows)` (the table a user pastes when asking for help), `blockers`.
"""

from typing import TYPE_CHECKING

from sglfleet._lazy import attach

# The public names, each written once: a name's submodule is imported when the name is first used
# (sglfleet._lazy reads this block; type checkers and readers see plain imports).
if TYPE_CHECKING:
    from sglfleet.doctor._checks import DiskNeed, HostExpect, ModelSource, NodeTable, check_host, node_table
    from sglfleet.doctor._driver import (
        COMPAT_FOUND,
        CUDA_TOOLKIT,
        FULL_DRIVER,
        GA_DRIVER,
        MIN_BRANCH,
        DriverSupport,
        driver_support,
    )
    from sglfleet.doctor._probe import char_majors
    from sglfleet.doctor._pve import ProvisionNeeds, check_pve, missing_privileges
    from sglfleet.doctor._report import Row, Status, blockers, render

__getattr__, __dir__, __all__ = attach(__name__, __file__)
