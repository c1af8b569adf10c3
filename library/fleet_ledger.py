#!/usr/bin/python
# Copyright: sglfleet contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module fleet_ledger: a thin adapter over sglfleet.fleet._ledger."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_ledger
short_description: Record or read a phase's outcome in the sglfleet ledger
description:
  - Records the outcome of one sglfleet phase (status, time, evidence) in a JSON ledger file on the
    target, or reads the whole ledger back as a phase checklist.
  - Every sglfleet role records its phase as its last task; C(sglfleet status) and
    C(playbooks/status.yml) print the checklist from this file.
  - Recording the outcome a phase already has (same I(status), same I(evidence)) changes nothing,
    not even the recorded time, and reports C(changed=false). The time therefore says since when the
    phase has had its current outcome.
  - The file is written atomically (temporary file, fsync, rename) under an advisory lock
    (C(<path>.lock)).
  - Needs the C(sglfleet) Python package on the target, in the interpreter Ansible runs modules with.
version_added: "0.1.0"
author:
  - sglfleet maintainers (@sglfleet)
options:
  path:
    description: The ledger file. Its directory is created when missing.
    type: path
    default: /var/lib/sglfleet/ledger.json
  phase:
    description:
      - The phase to record or remove. Required unless I(state=read).
    type: str
    choices: [host, provision, training_stop, toolchain, sglang, model, fleet, router, prompts, generate,
              merge, training_resume]
  status:
    description: The phase's outcome (with I(state=present)).
    type: str
    choices: [done, failed, pending]
    default: done
  evidence:
    description:
      - "What proves the outcome (JSON data), for example C({gpu_count: 8, ports: [30000, 30001]})."
      - Keep secrets out of it; the ledger is world-readable (mode 0644).
    type: dict
    default: {}
  state:
    description:
      - C(present) records I(phase) with I(status) and I(evidence).
      - C(absent) forgets I(phase) (it reads as pending again).
      - C(read) changes nothing and returns the ledger and the checklist.
    type: str
    choices: [present, absent, read]
    default: present
extends_documentation_fragment:
  - attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports what would change and writes nothing.
  diff_mode:
    support: full
    details:
      - Shows the phase's record before and after.
notes:
  - A missing ledger file reads as an empty ledger (every phase pending); it is not an error.
  - An unreadable or malformed ledger fails the task with the file, line and field at fault.
"""

EXAMPLES = r"""
- name: Record the fleet phase as done, with its evidence
  sglfleet.ops.fleet_ledger:
    phase: fleet
    status: done
    evidence:
      instances: 8
      ports: [30000, 30001, 30002, 30003, 30004, 30005, 30006, 30007]

- name: Record a failure (then fail the play yourself)
  sglfleet.ops.fleet_ledger:
    phase: training_stop
    status: failed
    evidence:
      reason: "pid 4242 still holds GPU 3 after SIGKILL"

- name: Read the checklist
  sglfleet.ops.fleet_ledger:
    state: read
  register: ledger

- name: Forget a phase so that it reads as pending
  sglfleet.ops.fleet_ledger:
    phase: generate
    state: absent
"""

RETURN = r"""
path:
  description: The ledger file.
  returned: always
  type: str
  sample: /var/lib/sglfleet/ledger.json
phase:
  description: The phase recorded or removed.
  returned: when state is present or absent
  type: str
  sample: fleet
record:
  description: The phase's record after the task (null after state=absent).
  returned: when state is present or absent
  type: dict
  sample: {"status": "done", "time": "2026-12-02T18:20:21Z", "evidence": {"instances": 8}}
previous:
  description: The phase's record before the task (null when it had none).
  returned: when state is present or absent
  type: dict
  sample: {"status": "pending", "time": "2026-12-02T17:02:11Z", "evidence": {}}
ledger:
  description: The whole ledger after the task (in check mode, as it would be).
  returned: always
  type: dict
  sample:
    version: 1
    phases: {"fleet": {"status": "done", "time": "2026-12-02T18:20:21Z", "evidence": {}}}
checklist:
  description: Every phase in run order with its status; a phase never recorded is pending with a null time.
  returned: always
  type: list
  elements: dict
  sample:
    - {"phase": "provision", "status": "done", "time": "2026-12-02T18:20:21Z",
       "evidence": {}, "recorded": true}
exists:
  description: Whether the ledger file existed before the task.
  returned: always
  type: bool
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.yaml import HAS_YAML, yaml_load
from ansible.module_utils.sglfleet_deps import SGLFLEET

with SGLFLEET:
    from sglfleet.fleet import PHASES as LEDGER_PHASES
    from sglfleet.fleet import STATUSES as LEDGER_STATUSES
    from sglfleet.fleet import LedgerError, load_ledger, record_phase, remove_phase


def _documented_choices(option):
    """The choices DOCUMENTATION gives `option` (None without PyYAML too: the package's error comes first)."""
    return yaml_load(DOCUMENTATION)["options"][option]["choices"] if HAS_YAML else None


# The package's own lists (the phases are the `Phase` Literal of sglfleet.fleet._ledger). Without the
# package (ansible-test sanity, ansible-doc tooling) the documented ones, which
# tests/unit/modules/test_module_docs.py keeps equal to the package's.
PHASES = list(LEDGER_PHASES) if SGLFLEET.ok else _documented_choices("phase")
STATUSES = list(LEDGER_STATUSES) if SGLFLEET.ok else _documented_choices("status")


def _dump(model):
    return None if model is None else model.model_dump(mode="json")


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/var/lib/sglfleet/ledger.json"},
            "phase": {"type": "str", "choices": PHASES},
            "status": {"type": "str", "choices": STATUSES, "default": "done"},
            "evidence": {"type": "dict", "default": {}},
            "state": {"type": "str", "choices": ["present", "absent", "read"], "default": "present"},
        },
        required_if=[("state", "present", ["phase"]), ("state", "absent", ["phase"])],
        supports_check_mode=True,
    )
    SGLFLEET.require(module)
    params = module.params
    path = params["path"]
    exists = os.path.exists(path)
    try:
        if params["state"] == "read":
            ledger = load_ledger(path)
            module.exit_json(
                changed=False,
                path=path,
                exists=exists,
                ledger=ledger.model_dump(mode="json"),
                checklist=[row.model_dump(mode="json") for row in ledger.checklist()],
            )
        if params["state"] == "present":
            result = record_phase(
                path, params["phase"], params["status"], params["evidence"], check_mode=module.check_mode
            )
        else:
            result = remove_phase(path, params["phase"], check_mode=module.check_mode)
    except (LedgerError, ValueError) as exc:
        module.fail_json(msg=str(exc), path=path)

    out = {
        "changed": result.changed,
        "path": path,
        "exists": exists,
        "phase": result.phase,
        "record": _dump(result.after),
        "previous": _dump(result.before),
        "ledger": result.ledger.model_dump(mode="json"),
        "checklist": [row.model_dump(mode="json") for row in result.ledger.checklist()],
    }
    if module._diff and result.changed:
        header = f"{path} (phase {result.phase})"
        out["diff"] = {
            "before": _dump(result.before) or {},
            "after": _dump(result.after) or {},
            "before_header": header,
            "after_header": header,
        }
    module.exit_json(**out)


if __name__ == "__main__":
    main()
