"""The integration tests use the lab's pytest plugin (tests/support/lab.py): the lab lock, `ansible`, the
prepared lab CTs `ct` (the session's own) and `fleet_ct` (CT 200), `fake_nvidia_smi`, `role_target`; the
harness is tests/support/ansible_lab.py."""

pytest_plugins = ["support.lab"]
