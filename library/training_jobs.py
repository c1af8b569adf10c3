#!/usr/bin/python
"""Ansible module training_jobs: a thin adapter over sglfleet.fleet._training."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: training_jobs
short_description: Find the training job on a host, by systemd unit names and command-line patterns
description:
  - Asks systemd for each unit in I(units) and reads C(/proc) for processes whose full command line
    (the arguments joined by spaces, as C(pgrep --full) matches) matches one of I(patterns); the
    module's own process and its ancestors are left out.
  - A matching process that runs inside one of the running units is not listed on its own (it is
    stopped with its unit).
  - Also says which of the running I(units) and of the I(pids) are still alive (C(alive), with C(units) and
    C(pids), both empty once the job is gone), which is what a caller waits on after it stopped the job.
  - Changes nothing; C(changed) is always false.
  - Needs the C(sglfleet) Python package on the target.
version_added: "0.2.0"
author:
  - sglfleet maintainers (@sglfleet)
options:
  units:
    description: Systemd unit names (C(.service) may be left off); missing units are reported not-found.
    type: list
    elements: str
    default: []
  patterns:
    description: Regular expressions (Python C(re), which accepts the usual extended regular expressions).
    type: list
    elements: str
    default: []
  pids:
    description: Processes to report in C(alive) when they still run (a zombie counts as gone).
    type: list
    elements: int
    default: []
  stop_signal:
    description:
      - With I(stop_timeout), check that systemd would stop each of the running I(units) with this signal
        (C(SIGTERM), C(TERM) or C(15)), I(stop_timeout) seconds and a final SIGKILL, as C(systemctl show)
        says; fail naming each unit, the settings in effect and its drop-ins when it would not (a drop-in
        whose name sorts later sets them again).
    type: str
  stop_timeout:
    description: The seconds I(stop_signal) is checked with (and I(checkpoint_seconds) against).
    type: int
  checkpoint_seconds:
    description:
      - How long the job takes to write its checkpoint after the stop signal; 0 checks nothing.
      - A warning says when it is longer than I(launcher) lets its ranks run after it forwards the signal
        (torchrun 2.11.0 SIGKILLs them 30 s later) or longer than I(stop_timeout).
    type: float
    default: 0
  launcher:
    description: What forwards the signal to the job's ranks (C(torchrun)) or C(none).
    type: str
    choices: [torchrun, none]
    default: torchrun
extends_documentation_fragment:
  - attributes
  - attributes.read_only
"""

EXAMPLES = r"""
- name: Find the training job
  sglfleet.ops.training_jobs:
    units: [train.service]
    patterns: ['torchrun .*train\.py']
  register: job

- name: Wait until the job that was stopped is gone
  sglfleet.ops.training_jobs:
    units: "{{ job.running_units | map(attribute='Id') | list }}"
    pids: "{{ job.processes | map(attribute='pid') | list }}"
  register: left
  until: left.alive.units | length == 0 and left.alive.pids | length == 0
  retries: 30
  delay: 2
"""

RETURN = r"""
checkpoint_warnings:
  description: Why the job's checkpoint (I(checkpoint_seconds)) would be cut off; each is also a warning.
  returned: always
  type: list
  elements: str
running_units:
  description: The named units that are active, activating, deactivating or reloading.
  returned: always
  type: list
  elements: dict
  sample: [{Id: train.service, LoadState: loaded, ActiveState: active, MainPID: 4242, UnitFileState: enabled}]
processes:
  description: Matching processes outside the running units, each with the first pattern it matched.
  returned: always
  type: list
  elements: dict
  sample: [{pid: 4343, cmdline: "torchrun --nproc-per-node 8 train.py", pattern: "torchrun .*train\\.py",
            unit: session-3.scope}]
loaded_units:
  description: The names from I(units) that exist on the host (whatever their state).
  returned: always
  type: list
  elements: str
targets:
  description: "What would be stopped, in words for messages: C(unit NAME) and C(process PID) entries."
  returned: always
  type: list
  elements: str
alive:
  description: What of I(units) and I(pids) is still alive; both lists are empty once the job is gone.
  returned: always
  type: dict
  contains:
    units:
      description: >-
        The units of I(units) that are still active, activating, deactivating or reloading (a unit that
        waits to be restarted counts as gone: a stop cancels that restart).
      type: list
      elements: dict
      sample: [{Id: train.service, LoadState: loaded, ActiveState: deactivating, MainPID: 4242,
                UnitFileState: enabled}]
    pids:
      description: The I(pids) whose process still runs (a zombie counts as gone).
      type: list
      elements: int
      sample: [4343]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglfleet_deps import SGLFLEET

with SGLFLEET:
    from sglfleet.fleet import (
        PatternError,
        checkpoint_time_warnings,
        discover,
        still_alive,
        stop_settings_problems,
    )


def main():
    module = AnsibleModule(
        argument_spec={
            "units": {"type": "list", "elements": "str", "default": []},
            "patterns": {"type": "list", "elements": "str", "default": []},
            "pids": {"type": "list", "elements": "int", "default": []},
            "stop_signal": {"type": "str"},
            "stop_timeout": {"type": "int"},
            "checkpoint_seconds": {"type": "float", "default": 0},
            "launcher": {"type": "str", "choices": ["torchrun", "none"], "default": "torchrun"},
        },
        required_by={"stop_signal": "stop_timeout"},
        supports_check_mode=True,
    )
    SGLFLEET.require(module)
    try:
        job = discover(module.params["units"], module.params["patterns"])
    except PatternError as exc:
        module.fail_json(msg=str(exc))
    alive = still_alive(module.params["units"], module.params["pids"])
    checkpoint_warnings = checkpoint_time_warnings(
        module.params["checkpoint_seconds"], module.params["launcher"], module.params["stop_timeout"]
    )
    for warning in checkpoint_warnings:
        module.warn(warning)
    if module.params["stop_signal"] is not None:
        running = [u.Id for u in alive.units]
        try:
            problems = stop_settings_problems(
                running, module.params["stop_signal"], module.params["stop_timeout"]
            )
        except ValueError as exc:
            module.fail_json(msg=f"stop_signal: {exc}")
        if problems:
            module.fail_json(
                msg="systemd would not stop the training units as asked: "
                + "; ".join(problems)
                + ". A drop-in whose file name sorts after ours sets these again (systemd.unit(5)): "
                "remove those settings from it while the job is stopped",
                problems=problems,
            )
    module.exit_json(
        changed=False, alive=alive.as_dict(), checkpoint_warnings=checkpoint_warnings, **job.as_dict()
    )


if __name__ == "__main__":
    main()
