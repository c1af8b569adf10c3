#!/usr/bin/python
"""Ansible module training_dataset: a thin adapter over sglfleet.fleet._resume (the dataset hand-over)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: training_dataset
short_description: Put the merged training set where the training reads it, keeping aside what was there
description:
  - With I(state=observed), says whether I(path) holds the set whose sha256 is I(sha256), and its
    row count (non-empty lines). Changes nothing.
  - With I(state=present), moves I(staged) (a copy of the set in the same directory) to I(path) by a
    rename. A file already at I(path) with other content is kept aside first, as
    C(<path>.kept-<UTC time>-<sha256[:12]>); it is never overwritten. A staged copy whose sha256 is not
    I(sha256) is refused and nothing changes.
  - Needs the C(sglfleet) Python package on the target.
version_added: "0.3.0"
author:
  - sglfleet maintainers (@sglfleet)
options:
  path:
    description: Where the training reads its set (a file on the target).
    type: path
    required: true
  sha256:
    description: The sha256 of the merged set (hex).
    type: str
    required: true
  staged:
    description: The copy to move in (I(state=present)); it must be in the directory of I(path).
    type: path
  state:
    description: C(observed) only reads; C(present) moves I(staged) in.
    type: str
    choices: [observed, present]
    default: observed
extends_documentation_fragment:
  - attributes
attributes:
  check_mode:
    support: full
    details:
      - Says whether the set would be moved in and what would be kept aside; moves nothing.
  diff_mode:
    support: full
    details:
      - The sha256 and row count before and after.
"""

EXAMPLES = r"""
- name: Find the merged set's sha256 on the controller
  ansible.builtin.stat:
    path: out/merged.jsonl
    checksum_algorithm: sha256
  delegate_to: localhost
  register: merged

- name: Is the merged set in place?
  sglfleet.ops.training_dataset:
    path: /data/train/drafter.jsonl
    sha256: "{{ merged.stat.checksum }}"
  register: dataset

- name: Move the staged copy in
  sglfleet.ops.training_dataset:
    path: /data/train/drafter.jsonl
    sha256: "{{ merged.stat.checksum }}"
    staged: /data/train/drafter.jsonl.sglfleet-incoming
    state: present
"""

RETURN = r"""
path:
  description: The dataset path.
  returned: always
  type: str
exists:
  description: Whether a file is at I(path) (after the move, with I(state=present)).
  returned: always
  type: bool
sha256:
  description: Its sha256 (null when absent).
  returned: always
  type: str
rows:
  description: Its non-empty lines (null when absent).
  returned: always
  type: int
  sample: 1093722
matches:
  description: Whether it is the set of I(sha256).
  returned: always
  type: bool
kept_aside:
  description: The files earlier hand-overs kept aside next to I(path).
  returned: always
  type: list
  elements: str
moved_aside:
  description: Where the file that was at I(path) went (would go, in check mode); null when none.
  returned: with I(state=present)
  type: str
  sample: /data/train/drafter.jsonl.kept-20261203T160102Z-3f0a2c1e5d7b
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglfleet_deps import SGLFLEET

with SGLFLEET:
    from sglfleet.fleet import ResumeError, dataset_state, install_dataset


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "sha256": {"type": "str", "required": True},
            "staged": {"type": "path"},
            "state": {"type": "str", "choices": ["observed", "present"], "default": "observed"},
        },
        required_if=[("state", "present", ["staged"])],
        supports_check_mode=True,
    )
    SGLFLEET.require(module)
    p = module.params
    try:
        if p["state"] == "observed":
            state = dataset_state(p["path"], p["sha256"])
            module.exit_json(changed=False, **state.model_dump())
        result = install_dataset(p["staged"], p["path"], p["sha256"], check_mode=module.check_mode)
    except (ResumeError, OSError) as exc:
        module.fail_json(msg=str(exc), path=p["path"])
    out = {"changed": result.changed, "moved_aside": result.moved_aside, **result.state.model_dump()}
    if module._diff and result.changed:
        before = {"sha256": result.state.sha256, "rows": result.state.rows} if module.check_mode else {}
        out["diff"] = {
            "before": before,
            "after": {"sha256": p["sha256"]},
            "before_header": p["path"],
            "after_header": p["path"],
        }
    module.exit_json(**out)


if __name__ == "__main__":
    main()
