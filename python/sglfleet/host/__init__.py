"""What runs on a fleet host and touches its OS, written once.

- `_systemd`: `systemctl` queries (`query`, `show`, `show_checked`, `show_repeated`, `list_units`: every
  `systemctl show` of the package runs here), unit names, and systemd's EnvironmentFile= format
  (`parse_env_file`, `read_env_file`, `quote`), parsed as systemd parses it.
- `_procfs`: a process's command line, environment and systemd unit (its cgroup), whether it is
  alive, its ancestors, and who listens on a TCP port.
- `_lifetime`: `die_with_parent`, a forked child's end tied to its parent's (the launcher's server, the
  merge's classification workers).

The fleet's modules (`sglfleet.fleet._instances*`, `_status`), the training's (`sglfleet.training`) and the
generation job's unit (`sglfleet.gen._unit`) use these through this face (`from sglfleet import host`);
nothing here decides anything. `procfs.alive` and `procfs.unit` are `process_alive` and `process_unit`
here (beside `unit_name`, a systemd unit's name). The launcher and the merge take `die_with_parent`.
"""

from typing import TYPE_CHECKING

from sglfleet._lazy import attach

# The public names, each written once: a name's submodule is imported when the name is first used
# (sglfleet._lazy reads this block; type checkers and readers see plain imports).
if TYPE_CHECKING:
    from sglfleet.host._lifetime import die_with_parent
    from sglfleet.host._procfs import PROC, ancestors, cmdline, environ, listeners, pids
    from sglfleet.host._procfs import alive as process_alive
    from sglfleet.host._procfs import unit as process_unit
    from sglfleet.host._systemd import (
        ENV_NAME_RE,
        NO_EQUALS,
        EnvFile,
        EnvFileError,
        Runner,
        Systemctl,
        list_units,
        parse_env_file,
        parse_show,
        parse_timespan,
        query,
        quote,
        read_env_file,
        run,
        show,
        show_checked,
        show_repeated,
        split_shown_list,
        unit_name,
    )

__getattr__, __dir__, __all__ = attach(__name__, __file__)
