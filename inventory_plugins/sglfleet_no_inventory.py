"""The inventory of a command that names none: ansible.cfg's default (inventory_plugins/none.yml).

A run without -i fails on it, naming what to do, before any host is reached; only `ansible-playbook
--syntax-check` reads it as an empty inventory, so that ansible-lint's syntax checks (which name no
inventory) pass with the project's own config. Not part of the collection: a checkout's guard only."""

from __future__ import annotations

from typing import Any

from ansible import context
from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin

DOCUMENTATION = r"""
name: sglfleet_no_inventory
short_description: The inventory of a command that names none
description:
  - This checkout's C(ansible.cfg) default inventory (C(inventory_plugins/none.yml)). A command that names no
    inventory with C(-i) fails on it, saying so, instead of running against the implicit localhost.
  - C(ansible-playbook --syntax-check) reads it as an empty inventory (no host to check against).
options:
  plugin:
    description: This plugin's name.
    required: true
    choices: [sglfleet_no_inventory]
"""


class InventoryModule(BaseInventoryPlugin):  # type: ignore[misc]
    NAME = "sglfleet_no_inventory"

    def verify_file(self, path: str) -> bool:
        return bool(super().verify_file(path)) and path.endswith((".yml", ".yaml"))

    def parse(self, inventory: Any, loader: Any, path: str, cache: bool = True) -> None:
        super().parse(inventory, loader, path, cache)
        if context.CLIARGS.get("syntax"):
            return  # a syntax check needs no host
        raise AnsibleParserError(
            "this command names no inventory: add -i inventory/<site> (ansible.cfg names none on purpose)"
        )
