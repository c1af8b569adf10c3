#!/usr/bin/python
# Copyright: sglfleet contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module sglang_health: a thin adapter over sglfleet.fleet._health."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_health
short_description: Probe SGLang instances concurrently and optionally wait until all are healthy
description:
  - Probes every instance at once with C(GET /health_generate), C(/model_info), C(/v1/models) and
    C(/v1/loads), so that probing eight instances costs about one round trip.
  - "An instance is healthy when C(/health_generate) answers 200 and, with I(expected_model), it serves
    that model (by served name or model path). Otherwise its row says why in C(reason): C(refused),
    C(starting) (503), C(timeout), C(unexpected model), C(http <code>) or C(error: ...)."
  - With I(wait) it probes again every I(interval) seconds until all are healthy or I(wait) seconds
    have passed. With I(require_healthy) the task then fails unless all are healthy, naming each
    unhealthy instance and its reason (a health gate).
  - Give the instances either as I(urls) or as I(host) + I(port_base) + I(count) (instance i on port
    I(port_base)+i, GPU i).
  - Changes nothing; C(changed) is always false.
  - Needs the C(sglfleet) Python package on the host the module runs on.
version_added: "0.1.0"
author:
  - sglfleet maintainers (@sglfleet)
options:
  urls:
    description: Base URLs of the instances, for example C(http://127.0.0.1:30000). Excludes I(count).
    type: list
    elements: str
  host:
    description: Host of the instances with I(count).
    type: str
    default: 127.0.0.1
  port_base:
    description: Port of instance 0 with I(count).
    type: int
    default: 30000
  count:
    description: Number of instances (0..count-1) on I(host). Excludes I(urls).
    type: int
  gpu_ids:
    description:
      - With I(count), the GPU of each instance (one entry per instance), as the C(gpu) of its row.
      - Empty means instance i uses GPU i.
    type: list
    elements: int
    default: []
  api_key:
    description:
      - "The SGLang API key, sent as C(Authorization: Bearer) to every endpoint but the health one."
    type: str
  expected_model:
    description: The model every instance must serve (served name or model path).
    type: str
  timeout:
    description: Seconds each probe may take before it counts as C(timeout).
    type: float
    default: 10
  wait:
    description: Keep probing for up to this many seconds until all instances are healthy (0 probes once).
    type: float
    default: 0
  interval:
    description: Seconds between probes while waiting.
    type: float
    default: 2
  require_healthy:
    description: Fail unless every instance is healthy (after waiting).
    type: bool
    default: false
extends_documentation_fragment:
  - attributes
  - attributes.read_only
notes:
  - Probes go from the host the module runs on; run it on the fleet host (or delegate) when the
    instances listen on 127.0.0.1.
"""

EXAMPLES = r"""
- name: Wait up to 10 minutes until all 8 instances answer /health_generate
  sglfleet.ops.sglang_health:
    count: 8
    port_base: 30000
    wait: 600
    require_healthy: true

- name: Gate one instance during a rolling restart
  sglfleet.ops.sglang_health:
    urls: ["http://127.0.0.1:30003"]
    expected_model: Qwen/Qwen3-32B
    wait: 300
    require_healthy: true

- name: Probe once with the API key (health table for status)
  sglfleet.ops.sglang_health:
    count: 8
    api_key: "{{ sglang_fleet_api_key }}"
  register: fleet_health
  no_log: true
"""

RETURN = r"""
instances:
  description: One row per instance, in the order given.
  returned: always
  type: list
  elements: dict
  contains:
    url:
      description: Base URL.
      type: str
    port:
      description: Port.
      type: int
    gpu:
      description: GPU index when known (null with I(urls)).
      type: int
    healthy:
      description: Whether it is healthy.
      type: bool
    status_code:
      description: HTTP status of C(/health_generate) (null when no answer).
      type: int
    reason:
      description: "Why it is unhealthy: refused, starting, not ready (a router with no healthy worker),
        timeout, unexpected model, http N, error: ..."
      type: str
    model:
      description: Served model name (from C(/v1/models), else the model path).
      type: str
    model_path:
      description: Model path (from C(/model_info)).
      type: str
    running_requests:
      description: Running requests (from C(/v1/loads)).
      type: int
    waiting_requests:
      description: Waiting requests.
      type: int
    token_usage:
      description: KV cache token usage (0..1).
      type: float
    gen_throughput:
      description: Generation tokens per second.
      type: float
    latency_s:
      description: Seconds the probe took.
      type: float
    detail:
      description: "More on the reason (for example the model it serves, or a 401); for a router, its workers
        (C(router: 3/4 workers healthy))."
      type: str
    router:
      description: Whether it is an sglang-router (it answers C(/readiness)); healthy only when ready.
      type: bool
  sample:
    - {"url": "http://127.0.0.1:30000", "port": 30000, "gpu": 0, "healthy": true, "status_code": 200,
       "reason": null, "model": "Qwen/Qwen3-32B", "running_requests": 12, "waiting_requests": 0,
       "token_usage": 0.31, "gen_throughput": 1840.5, "latency_s": 0.012}
all_healthy:
  description: Whether every instance is healthy.
  returned: always
  type: bool
healthy_count:
  description: How many instances are healthy.
  returned: always
  type: int
waited_s:
  description: Seconds spent probing (and waiting).
  returned: always
  type: float
attempts:
  description: How many rounds of probes ran.
  returned: always
  type: int
summary:
  description: One line, e.g. C(all 8 instances healthy) or the unhealthy ones with their reasons.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglfleet_deps import SGLFLEET

with SGLFLEET:
    from sglfleet.fleet import check_fleet, endpoints_from_range, endpoints_from_urls


def main():
    module = AnsibleModule(
        argument_spec={
            "urls": {"type": "list", "elements": "str"},
            "host": {"type": "str", "default": "127.0.0.1"},
            "port_base": {"type": "int", "default": 30000},
            "count": {"type": "int"},
            "gpu_ids": {"type": "list", "elements": "int", "default": []},
            "api_key": {"type": "str", "no_log": True},
            "expected_model": {"type": "str"},
            "timeout": {"type": "float", "default": 10.0},
            "wait": {"type": "float", "default": 0.0},
            "interval": {"type": "float", "default": 2.0},
            "require_healthy": {"type": "bool", "default": False},
        },
        mutually_exclusive=[("urls", "count")],
        required_one_of=[("urls", "count")],
        supports_check_mode=True,
    )
    SGLFLEET.require(module)
    p = module.params
    try:
        if p["urls"] is not None:
            endpoints = endpoints_from_urls(p["urls"])
        else:
            endpoints = endpoints_from_range(p["host"], p["port_base"], p["count"], p["gpu_ids"])
        fleet = check_fleet(
            endpoints,
            api_key=p["api_key"],
            expected_model=p["expected_model"],
            timeout=p["timeout"],
            wait=p["wait"],
            interval=p["interval"],
        )
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    result = fleet.model_dump(mode="json")
    result["summary"] = fleet.summary()
    if p["require_healthy"] and not fleet.all_healthy:
        waited = f" after {fleet.waited_s:g} s" if p["wait"] else ""
        module.fail_json(msg=f"{fleet.summary()}{waited}", **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
