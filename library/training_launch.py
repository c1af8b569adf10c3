#!/usr/bin/python
"""Ansible module training_launch: a thin adapter over sglfleet.fleet._resume (the training's start)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: training_launch
short_description: Plan how the training job starts again on the new set and its checkpoint
description:
  - With I(units) (the units phase training_stop stopped), plans a drop-in for each unit that sets
    I(environment) (C(Environment=) lines; C({dataset}) and C({checkpoint}) filled in) and says which
    units do not run.
  - Refuses when an C(EnvironmentFile=) of a unit sets a name of I(environment) (such a file overrides
    C(Environment=), systemd.exec(5)); the error names the file, line and variable.
  - Without units, renders I(command) (C({dataset}) and C({checkpoint}) filled in, quoted, with C($) written
    C($$)) into a C(systemd-run) command line that runs it as the transient unit I(transient_unit). The
    command is not run by a shell; systemd expands C($VAR) in it from the unit's environment, which
    includes I(environment).
  - The transient unit gets C(KillSignal=SIGTERM) (systemd's default, said explicitly) so that phase
    training_stop can stop it gracefully next time, and C(KillMode=mixed) so that the SIGTERM goes to the
    main process (torchrun) alone, which forwards it to its ranks, not to every process at once.
  - With neither units nor I(command), there is nothing to start (C(mode=none)).
  - With I(state=look), looks at the job instead of planning - whether its units run, their main
    processes, the GPU memory their processes hold (nvidia-smi), and the row count the journal of the
    units' current run gives through I(pattern).
  - Changes nothing; the caller writes the drop-ins, starts the units or runs the command.
  - Needs the C(sglfleet) Python package on the target.
version_added: "0.3.0"
author:
  - sglfleet maintainers (@sglfleet)
options:
  units:
    description: The training units (C(.service) may be left off); each must exist.
    type: list
    elements: str
    default: []
  environment:
    description: "Environment variables for the job: name to template, e.g. C({TRAIN_DATA: '{dataset}'})."
    type: dict
    default: {}
  command:
    description: The command that resumes a job that was a bare process (used when I(units) is empty).
    type: str
    default: ""
  dataset:
    description: The training set's path on the target.
    type: str
    required: true
  checkpoint:
    description: The checkpoint to resume from (a path on the target).
    type: str
    default: ""
  transient_unit:
    description: The name of the transient unit the command runs as.
    type: str
    default: sglfleet-training.service
  dropin_name:
    description: The drop-in's file name under C(/etc/systemd/system/<unit>.d/).
    type: str
    default: zz-sglfleet-training-resume.conf
  state:
    description:
      - C(planned) plans the start; C(look) looks at the running job.
      - C(effective) (after a daemon-reload) checks with C(systemctl show) that each unit's C(Environment=) in
        effect has the values planned, and fails naming the unit, the values in effect and its drop-ins when a
        drop-in whose file name sorts after I(dropin_name) sets them again (systemd.unit(5)).
    type: str
    choices: [planned, look, effective]
    default: planned
  pattern:
    description: With I(state=look), a regular expression whose first group is the row count the job logged.
    type: str
    default: ""
  nvidia_smi:
    description: With I(state=look), the nvidia-smi command.
    type: str
    default: nvidia-smi
extends_documentation_fragment:
  - attributes
  - attributes.read_only
"""

EXAMPLES = r"""
- name: Plan the restart of the unit training_stop stopped
  sglfleet.ops.training_launch:
    units: [train.service]
    environment: {TRAIN_DATA: "{dataset}", RESUME_FROM: "{checkpoint}"}
    dataset: /data/train/drafter.jsonl
    checkpoint: /data/ckpt/latest
  register: launch
"""

RETURN = r"""
mode:
  description: "C(unit), C(command), or C(none) - no unit and no command, nothing to start."
  returned: always
  type: str
units:
  description: The units (their full names).
  returned: always
  type: list
  elements: str
dropin_name:
  description: The drop-in's file name (C(unit) mode).
  returned: always
  type: str
dropin_content:
  description: The drop-in's text (C(unit) mode).
  returned: always
  type: str
environment:
  description: The environment, filled in.
  returned: always
  type: dict
transient_unit:
  description: The transient unit (C(command) mode).
  returned: always
  type: str
argv:
  description: The systemd-run command line (C(command) mode).
  returned: always
  type: list
  elements: str
command:
  description: The command, filled in.
  returned: always
  type: str
units_running:
  description: The units that run now.
  returned: always
  type: list
  elements: str
to_start:
  description: The units that do not run.
  returned: always
  type: list
  elements: str
running:
  description: Whether every unit of the job is active (I(state=look)).
  returned: with I(state=look)
  type: bool
main_pids:
  description: Each unit's main process (I(state=look)).
  returned: with I(state=look)
  type: dict
gpu_memory_mib:
  description: GPU memory the job's processes hold (I(state=look)).
  returned: with I(state=look)
  type: int
nvidia_smi_found:
  description: Whether nvidia-smi was found (I(state=look)).
  returned: with I(state=look)
  type: bool
loaded_rows:
  description:
    - The row count the last log line matching I(pattern) gives.
    - -1 when the line has no number, null when no line matches.
  returned: with I(state=look)
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglfleet_deps import SGLFLEET

with SGLFLEET:
    from sglfleet.fleet import (
        GpuQueryError,
        ResumeError,
        environment_problems,
        launch_plan,
        look_training,
        query_gpus,
    )


def main():
    module = AnsibleModule(
        argument_spec={
            "units": {"type": "list", "elements": "str", "default": []},
            "environment": {"type": "dict", "default": {}},
            "command": {"type": "str", "default": ""},
            "dataset": {"type": "str", "required": True},
            "checkpoint": {"type": "str", "default": ""},
            "transient_unit": {"type": "str", "default": "sglfleet-training.service"},
            "dropin_name": {"type": "str", "default": "zz-sglfleet-training-resume.conf"},
            "state": {"type": "str", "choices": ["planned", "look", "effective"], "default": "planned"},
            "pattern": {"type": "str", "default": ""},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
        },
        supports_check_mode=True,
    )
    SGLFLEET.require(module)
    p = module.params
    try:
        plan = launch_plan(
            units=p["units"],
            environment={k: str(v) for k, v in p["environment"].items()},
            command=p["command"],
            dataset=p["dataset"],
            checkpoint=p["checkpoint"],
            transient_unit=p["transient_unit"],
            dropin_name=p["dropin_name"],
        )
        out = plan.as_dict()
        if p["state"] == "effective" and plan.mode == "unit":
            problems = environment_problems(list(plan.units), plan.environment)
            if problems:
                module.fail_json(
                    msg="systemd would not start the training units with the environment planned: "
                    + "; ".join(problems)
                    + f". A drop-in whose file name sorts after {p['dropin_name']} sets these again "
                    "(systemd.unit(5)): remove them from it",
                    problems=problems,
                    **out,
                )
        if p["state"] == "look":
            names = list(plan.units) if plan.mode == "unit" else [plan.transient_unit]
            seen = look_training(names, pattern=p["pattern"], gpu_facts=query_gpus(p["nvidia_smi"]))
            out.update(seen.model_dump(exclude={"units"}))
    except (ResumeError, GpuQueryError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **out)


if __name__ == "__main__":
    main()
