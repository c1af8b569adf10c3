"""The lab's own tests use the lab's pytest plugin (tests/support/lab.py): the lab lock, the lab up, `pve`,
`root_pve`, `new_ct` (a CT the test makes through the API)."""

pytest_plugins = ["support.lab"]
