"""What runs on a fleet host and touches its OS, written once.

- `_systemd`: `systemctl` queries (`query`, `show`, `list_units`), unit names, and systemd's
  EnvironmentFile= format (`parse_env_file`, `read_env_file`, `quote`), parsed as systemd parses it.
- `_procfs`: a process's command line, environment and systemd unit (its cgroup), whether it is
  alive, its ancestors, and who listens on a TCP port.
- `_lifetime`: `die_with_parent`, a forked child's end tied to its parent's (the launcher's server, the
  merge's classification workers).

The fleet's modules (`sglfleet.fleet._instances*`, `_training`, `_resume`, `_status`) and the generation
job's unit (`sglfleet.gen._unit`), the launcher and the merge use these; nothing here decides anything.
"""

from typing import TYPE_CHECKING

from sglfleet._lazy import attach

# The public names, each written once: a name's submodule is imported when the name is first used
# (sglfleet._lazy reads this block; type checkers and readers see plain imports).
if TYPE_CHECKING:
    from sglfleet.host._lifetime import die_with_parent
    from sglfleet.host._procfs import alive as process_alive
    from sglfleet.host._systemd import EnvFile, EnvFileError, parse_env_file, read_env_file

__getattr__, __dir__, __all__ = attach(__name__, __file__)
