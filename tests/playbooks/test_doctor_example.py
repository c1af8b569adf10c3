"""playbooks/doctor.yml, the documented first step, on a fresh copy of inventory/example: it must not crash.
No host is reached: every host's address is 127.0.0.1 port 9 (nothing listens; the probe is unreachable
at once), and the PVE rows are decided before any call (the CA file, the token's shape)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_example_playbooks import EXAMPLE, run

pytestmark = pytest.mark.timeout(300)

NOWHERE = ("-e", "ansible_host=127.0.0.1", "-e", "ansible_port=9", "-e", "ansible_ssh_timeout=5")


def doctor(inventory: Path, *extra: str) -> str:
    done = run("ansible-playbook", "-i", str(inventory), "playbooks/doctor.yml", *NOWHERE, *extra)
    out = done.stdout + done.stderr
    # The play fails after the table when a row is a BLOCKER; it never crashes before it.
    assert done.returncode == 2, out
    assert "Traceback" not in out and "MODULE FAILURE" not in out, out
    assert "Could not find a suitable TLS CA certificate bundle" not in out, out
    assert "BLOCKER row(s) above" in out, out
    return out


def test_a_fresh_example_lists_the_missing_ca_as_a_blocker_and_goes_on(tmp_path: Path) -> None:
    inventory = tmp_path / "example"
    shutil.copytree(EXAMPLE, inventory)
    out = doctor(inventory)
    for ca in ("pve-root-ca.pem", "pve-root-ca-kpro7.pem"):
        assert (
            f"proxmox_lxc_ca_cert is {inventory}/.files/{ca}, which is not a file on the controller" in out
        ), out
    assert "copy the PVE host's /etc/pve/pve-root-ca.pem there" in out, out
    # The other rows are there too: every host's, unreachable.
    for host in ("kpro6", "kpro7", "ct200", "ct201"):
        assert f"\n{host} " in out or f" {host} " in out, out


def test_a_token_of_the_wrong_shape_is_named_before_the_api_is_called(tmp_path: Path) -> None:
    inventory = tmp_path / "example"
    shutil.copytree(EXAMPLE, inventory)
    for ca in ("pve-root-ca.pem", "pve-root-ca-kpro7.pem"):
        (inventory / ".files" / ca).write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    token = (
        "-e",
        "proxmox_lxc_api_token_id=root@pam!sglfleet",
        "-e",
        "proxmox_lxc_api_token_secret=not-a-uuid",
    )
    out = doctor(inventory, *token, "-e", "proxmox_lxc_api_password=", "-e", "proxmox_lxc_gpu_count=0")
    assert "proxmox_lxc_api_token_id is 'root@pam!sglfleet', a full token id" in out, out
    assert "proxmox_lxc_api_token_secret is not a UUID" in out, out
    assert "not-a-uuid" not in out.replace("proxmox_lxc_api_token_secret=not-a-uuid", ""), out
