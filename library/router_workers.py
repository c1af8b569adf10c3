#!/usr/bin/python
# Copyright: sglfleet contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module router_workers: a thin adapter over sglfleet.fleet._router."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: router_workers
short_description: Take SGLang instances out of SGLang's router, or put them back
description:
  - Uses the C(/workers) API of C(sglang-router) 0.3.2 (C(GET /workers), C(DELETE /workers/{id}),
    C(POST /workers)); see C(sglfleet.fleet._router) for what each answers.
  - With I(state=absent) it removes each of I(urls) the router lists and waits until the router lists
    none of them, so that no new request is sent there (requests in flight finish); then the caller may
    stop the instance. With I(state=present) it registers each of I(urls) not yet listed (with
    I(api_key)) and waits until the router lists every one as healthy.
  - C(changed) is true exactly when a worker was (check mode - would be) removed or added.
  - Needs the C(sglfleet) Python package on the host the module runs on.
version_added: "0.4.0"
author:
  - sglfleet maintainers (@sglfleet)
options:
  router_url:
    description: The router's base URL, e.g. C(http://10.0.0.5:30100).
    type: str
    required: true
  urls:
    description: The workers' base URLs exactly as the router was given them (e.g. C(http://10.0.0.7:30000)).
    type: list
    elements: str
    required: true
  state:
    description: C(absent) takes them out, C(present) puts them back.
    type: str
    choices: [absent, present]
    default: absent
  api_key:
    description: The router's (and the instances') API key.
    type: str
  wait:
    description: Seconds to wait for the router to list the change.
    type: float
    default: 30
extends_documentation_fragment:
  - attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Take sglang@1 out of the router before it stops (sglfleet.ops.router_workers)
  sglfleet.ops.router_workers:
    router_url: http://10.0.0.5:30100
    urls: [http://10.0.0.7:30001]
    state: absent

- name: Put it back once its health gate passed
  sglfleet.ops.router_workers:
    router_url: http://10.0.0.5:30100
    urls: [http://10.0.0.7:30001]
    state: present
"""

RETURN = r"""
removed:
  description: The workers taken out (check mode - that would be).
  returned: always
  type: list
  elements: str
added:
  description: The workers put back (check mode - that would be).
  returned: always
  type: list
  elements: str
workers:
  description: The router's workers afterwards (C(url), C(healthy)).
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglfleet_deps import SGLFLEET

with SGLFLEET:
    from sglfleet.fleet import RouterError, RouterWorkers


def _norm(url):
    return url.strip().rstrip("/").lower()


def main():
    module = AnsibleModule(
        argument_spec={
            "router_url": {"type": "str", "required": True},
            "urls": {"type": "list", "elements": "str", "required": True},
            "state": {"type": "str", "choices": ["absent", "present"], "default": "absent"},
            "api_key": {"type": "str", "no_log": True},
            "wait": {"type": "float", "default": 30.0},
        },
        supports_check_mode=True,
    )
    SGLFLEET.require(module)
    p = module.params
    router = RouterWorkers(p["router_url"], api_key=p["api_key"] or None)
    removed, added = [], []
    try:
        if module.check_mode:
            listed = {_norm(w.url) for w in router.list()}
            if p["state"] == "absent":
                removed = [u for u in p["urls"] if _norm(u) in listed]
            else:
                added = [u for u in p["urls"] if _norm(u) not in listed]
        elif p["state"] == "absent":
            removed = router.remove(p["urls"], wait_s=p["wait"])
        else:
            added = router.add(p["urls"], wait_s=p["wait"])
        workers = [{"url": w.url, "healthy": w.healthy} for w in router.list()]
    except RouterError as exc:
        module.fail_json(msg=str(exc), removed=removed, added=added)
    module.exit_json(changed=bool(removed or added), removed=removed, added=added, workers=workers)


if __name__ == "__main__":
    main()
