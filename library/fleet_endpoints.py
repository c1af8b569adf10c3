#!/usr/bin/python
# Copyright: sglfleet contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module fleet_endpoints: a thin adapter over sglfleet.fleet._endpoints."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_endpoints
short_description: The endpoints of every SGLang instance of the fleet, from what phase fleet recorded
description:
  - Turns the ledgers of the fleet hosts (as C(fleet_ledger) with C(state=read) returns them) into the base
    URLs of their SGLang instances, C(http://<address>:<port>) for every port phase C(fleet) recorded
    (C(evidence.ports)), in C(sglfleet.fleet._endpoints.from_ledgers). A host with 4 GPUs gives 4 endpoints
    and one with 8 gives 8.
  - Fails, naming the hosts, when a host's ledger records no ports for phase C(fleet) or records it as not
    done; nothing is sent then. The endpoints are what C(generation_job) sends to.
  - Changes nothing; C(changed) is always false.
  - Needs the C(sglfleet) Python package on the target, in the interpreter Ansible runs modules with.
version_added: "0.1.0"
author:
  - sglfleet maintainers (@sglfleet)
options:
  ledgers:
    description: Each fleet host's ledger, by host name, in the order the endpoints are listed.
    type: dict
    required: true
  addresses:
    description: The address each host's instances answer at, by host name; a host not listed is its name.
    type: dict
    default: {}
  ledger_path:
    description: Where the ledgers are, named in the error.
    type: str
    default: /var/lib/sglfleet/ledger.json
extends_documentation_fragment:
  - attributes
  - attributes.read_only
"""

EXAMPLES = r"""
- name: Read the ledger of every fleet host
  sglfleet.ops.fleet_ledger:
    state: read
  loop: "{{ groups['fleet'] }}"
  delegate_to: "{{ item }}"
  register: ledgers

- name: Find the endpoints
  sglfleet.ops.fleet_endpoints:
    ledgers: "{{ ledgers.results | items2dict(key_name='item', value_name='ledger') }}"
    addresses: {ct200: 10.0.0.5}
  register: fleet
"""

RETURN = r"""
endpoints:
  description: The base URLs, host by host.
  returned: success
  type: list
  elements: str
  sample: ["http://10.0.0.5:30000", "http://10.0.0.5:30001"]
model:
  description: The model the first host's fleet serves (C(evidence.model)), empty when it recorded none.
  returned: success
  type: str
  sample: /models/target
hosts:
  description: The endpoints of each host.
  returned: success
  type: dict
  sample: {"ct200": ["http://10.0.0.5:30000", "http://10.0.0.5:30001"]}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglfleet_deps import SGLFLEET

with SGLFLEET:
    from pydantic import ValidationError

    from sglfleet.fleet import EndpointError, endpoints_from_ledgers


def main():
    module = AnsibleModule(
        argument_spec={
            "ledgers": {"type": "dict", "required": True},
            "addresses": {"type": "dict", "default": {}},
            "ledger_path": {"type": "str", "default": "/var/lib/sglfleet/ledger.json"},
        },
        supports_check_mode=True,
    )
    SGLFLEET.require(module)
    p = module.params
    try:
        found = endpoints_from_ledgers(
            p["ledgers"],
            {host: str(address) for host, address in p["addresses"].items()},
            ledger_path=p["ledger_path"],
        )
    except EndpointError as exc:
        module.fail_json(msg=str(exc))
    except ValidationError as exc:
        module.fail_json(msg=f"ledgers: not the ledgers fleet_ledger state=read returns: {exc}")
    module.exit_json(
        changed=False,
        endpoints=list(found.urls),
        model=found.model,
        hosts={host: list(urls) for host, urls in found.hosts.items()},
    )


if __name__ == "__main__":
    main()
