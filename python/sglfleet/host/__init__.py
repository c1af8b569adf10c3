"""What runs on a fleet host and touches its OS, written once.

- `_systemd`: `systemctl` queries (`query`, `show`, `list_units`), unit names, and systemd's
  EnvironmentFile= format (`parse_env_file`, `read_env_file`, `quote`), parsed as systemd parses it.
- `_procfs`: a process's command line, environment and systemd unit (its cgroup), whether it is
  alive, its ancestors, and who listens on a TCP port.

The fleet's modules (`sglfleet.fleet._instances*`, `_training`, `_resume`, `_status`) and the generation
job's unit (`sglfleet.gen._job`) use these; nothing here decides anything.
"""
