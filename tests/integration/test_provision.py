"""playbooks/provision.yml against the lab: a real LXC container made through the (fake) PVE API.

Needs the lab (make lab-up) and its lock:
    flock /tmp/sglfleet-lab.lock .venv/bin/pytest tests/integration/test_provision.py
The test brings its own state: it destroys CT 200 first, so the first run really creates it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from support.ansible_lab import CT_HOST, Container, parse, run_playbook

from sglfleet.pve import Credentials, PveClient

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "inventory" / "lab"
PLAYBOOK = ROOT / "playbooks" / "provision.yml"
LAB = yaml.safe_load((INVENTORY / "group_vars" / "all" / "lab.yml").read_text())
HOST = yaml.safe_load((INVENTORY / "hosts.yml").read_text())["fleet"]["hosts"]["ct200"]

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(not Path(LAB["pve_ca_cert"]).is_file(), reason="the lab is not up (make lab-up)"),
]


def playbook(*args: str) -> tuple[int, str]:
    run = run_playbook(PLAYBOOK, INVENTORY, *args, timeout=600)
    return run.rc, run.output


def recap(output: str) -> dict[str, int]:
    counts = parse(output)[1].get(CT_HOST)
    assert counts, output
    return counts


def pve() -> PveClient:
    creds = Credentials(
        host=LAB["pve_api_host"],
        port=int(LAB["pve_api_port"]),
        user=LAB["pve_api_user"],
        token_id=LAB["pve_api_token_id"],
        token_secret=LAB["pve_api_token_secret"],
        ca_cert=LAB["pve_ca_cert"],
    )
    return PveClient.connect(creds, LAB["pve_node"])


def ssh(command: str) -> subprocess.CompletedProcess[str]:
    return Container().ssh(command, timeout=60)


def test_provision_creates_a_container_and_check_diff_changes_nothing():
    vmid = int(LAB["pve_vmid"])
    rc, out = playbook("-e", "proxmox_lxc_state=absent")
    assert rc == 0, out
    assert not pve().exists(vmid)

    rc, out = playbook("--diff")
    assert rc == 0, out
    assert recap(out)["changed"] >= 1
    client = pve()
    assert client.exists(vmid) and client.status(vmid) == "running"
    config = client.config(vmid)
    assert config["cores"] == 2 and config["memory"] == 4096 and config["features"] == "nesting=1"
    answer = ssh("hostname && python3 -c 'print(42)'")
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.split() == ["ct200", "42"]

    # Its re-run at changed=0 is test_site's (site.yml's second run runs phase provision).
    digest = client.config(vmid)["digest"]
    rc, out = playbook("--check", "--diff", "-e", "proxmox_lxc_cores=1", "-e", '{"proxmox_lxc_features": []}')
    assert rc == 0, out
    assert recap(out)["changed"] >= 1
    assert "-cores: 2" in out and "+cores: 1" in out
    assert "-features: nesting=1" in out
    after = client.config(vmid)
    assert after["digest"] == digest and after["cores"] == 2 and after["features"] == "nesting=1"
