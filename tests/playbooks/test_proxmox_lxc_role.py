"""The proxmox_lxc role through ansible-playbook against fakepve (no lab: state present, no SSH steps).

The lab test (tests/integration/test_provision.py) runs the whole role, SSH included, on a real
container; these runs check the role's own logic fast: preflight messages, idempotence, check mode.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.paths import REPO

ROOT = REPO
PLAYBOOK = ROOT / "playbooks" / "provision.yml"
TEMPLATE = "debian-12-standard_12.7-1_amd64.tar.zst"

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def playbook(fakepve, fakepve_cafile, tmp_path):
    """play(*args, **hostvars) -> (rc, output): provision.yml on a one-host inventory aimed at fakepve."""
    fakepve.store_file("local", TEMPLATE, 100 * 1024**2, content="vztmpl")
    fakepve.apitokens["root@pam!ci"] = "tok"
    env = dict(
        os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0"
    )
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"

    def play(*args, **hostvars):
        host = {
            "ansible_host": "127.0.0.1",
            "proxmox_lxc_api_host": "127.0.0.1",
            "proxmox_lxc_api_port": fakepve.port,
            "proxmox_lxc_api_password": "secret",
            "proxmox_lxc_ca_cert": fakepve_cafile,
            "proxmox_lxc_node": "pve1",
            "proxmox_lxc_vmid": 200,
            "proxmox_lxc_ostemplate": f"local:vztmpl/{TEMPLATE}",
            "proxmox_lxc_state": "present",
            "proxmox_lxc_record": False,
        }
        host.update(hostvars)
        inventory = tmp_path / "hosts.yml"
        inventory.write_text(yaml.safe_dump({"fleet": {"hosts": {"ct200": host}}}))
        proc = subprocess.run(
            [
                str(Path(sys.executable).parent / "ansible-playbook"),
                "-i",
                str(inventory),
                str(PLAYBOOK),
                *args,
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=150,
            check=False,
        )
        return proc.returncode, proc.stdout + proc.stderr

    return play


def recap(output):
    m = re.search(r"ct200\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", output)
    assert m, output
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, m.groups()), strict=True))


def test_create_idempotent_and_check_diff(fakepve, playbook):
    rc, out = playbook("--diff", proxmox_lxc_gpu_count=2)
    assert rc == 0, out
    assert recap(out)["changed"] == 1
    config = fakepve.ct(200).config
    assert [config[f"dev{i}"] for i in range(5)] == [
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    assert "dev5" not in config

    rc, out = playbook("--diff", proxmox_lxc_gpu_count=2)
    assert rc == 0, out
    assert recap(out)["changed"] == 0

    digest, tasks = fakepve.ct(200).digest(), len(fakepve.tasklog)
    rc, out = playbook("--check", "--diff", "-e", "proxmox_lxc_cores=12", proxmox_lxc_gpu_count=2)
    assert rc == 0, out
    assert recap(out)["changed"] == 1
    assert "-cores: 4" in out and "+cores: 12" in out
    assert fakepve.ct(200).digest() == digest and len(fakepve.tasklog) == tasks
    assert not [r for r in fakepve.requests if r[0] in ("PUT", "DELETE")]


def test_devices_with_a_token_stop_in_preflight(fakepve, playbook):
    rc, out = playbook(
        proxmox_lxc_api_password="",
        proxmox_lxc_api_token_id="ci",
        proxmox_lxc_api_token_secret="tok",
        proxmox_lxc_gpu_count=8,
    )
    assert rc != 0
    assert "11 devices are to be passed through" in out and "refuses API tokens" in out
    assert fakepve.requests == []


def test_missing_template_fails_listing_the_ones_there(fakepve, playbook):
    rc, out = playbook(proxmox_lxc_ostemplate="local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst")
    assert rc != 0
    assert f"templates there: local:vztmpl/{TEMPLATE}" in out
    assert "Check PVE, the node and the template" in out
    assert fakepve.ct(200) is None


def test_secrets_stay_out_of_the_output(fakepve, playbook):
    rc, out = playbook("-v", "--diff", proxmox_lxc_api_password="secret")
    assert rc == 0, out
    assert "secret" not in out.replace("api_token_secret", "")


def test_a_device_or_mount_source_the_node_lacks_stops_before_any_change(fakepve, playbook, tmp_path):
    """The node is probed over its connection (here: this machine, as `localhost`) before any write."""
    rc, out = playbook(
        proxmox_lxc_pve_host="localhost",
        proxmox_lxc_devices=["/dev/null", {"path": "/dev/nvidia-uvm", "mode": "0666"}],
    )
    assert rc != 0
    assert "node 'pve1' has no dev1=/dev/nvidia-uvm" in out and "nvidia-modprobe -u -c 0" in out
    assert not [r for r in fakepve.requests if r[0] != "GET" and not r[1].endswith("/access/ticket")]
    assert fakepve.ct(200) is None

    nowhere = {"mp0": "/srv/nowhere,mp=/models"}
    rc, out = playbook(proxmox_lxc_pve_host="localhost", proxmox_lxc_mounts=nowhere)
    assert rc != 0
    assert "bind-mounts /srv/nowhere, which node localhost does not have as a directory" in out
    assert fakepve.ct(200) is None

    models = tmp_path / "models"
    models.mkdir()
    rc, out = playbook(
        proxmox_lxc_pve_host="localhost",
        proxmox_lxc_devices=["/dev/null"],
        proxmox_lxc_mounts={"mp0": f"{models},mp=/srv/models,ro=1"},
    )
    assert rc == 0, out
    assert fakepve.ct(200).config["dev0"] == "/dev/null"
    assert fakepve.ct(200).config["mp0"] == f"{models},mp=/srv/models,ro=1"


def test_bind_mounts_with_a_token_stop_in_preflight(fakepve, playbook):
    rc, out = playbook(
        proxmox_lxc_api_password="",
        proxmox_lxc_api_token_id="ci",
        proxmox_lxc_api_token_secret="tok",
        proxmox_lxc_mounts={"mp0": "/srv/models,mp=/srv/models"},
    )
    assert rc != 0
    assert "mount point type bind is only allowed for root@pam" in out
    assert fakepve.requests == []


def failure_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(("failed:", "fatal:"))]


def test_a_missing_node_is_named_alone(fakepve, playbook):
    """The preflight names only the variable that is wrong, not every requirement of the role."""
    rc, out = playbook(proxmox_lxc_node="")
    assert rc != 0
    (failed,) = failure_lines(out)
    assert "(item=proxmox_lxc_node)" in failed, out
    (error,) = [line for line in out.splitlines() if line.startswith("[ERROR]")]
    assert "ct200: proxmox_lxc_node is empty; set it to the PVE node" in error, out
    assert "proxmox_lxc_vmid" not in error and "proxmox_lxc_ostemplate" not in error, error
    assert fakepve.requests == []


def test_a_vmid_that_is_no_number_gets_one_short_line(fakepve, playbook):
    """proxmox_lxc_vmid=ct200 stops in preflight, in one line that names it, not the argument spec's dump."""
    rc, out = playbook("-e", "proxmox_lxc_vmid=ct200")
    assert rc != 0
    (failed,) = failure_lines(out)
    assert "(item=proxmox_lxc_vmid)" in failed, out
    (error,) = [line for line in out.splitlines() if line.startswith("[ERROR]")]
    assert "ct200: proxmox_lxc_vmid is 'ct200'; set it to the container's numeric id" in error, out
    assert "argument_spec_data" not in out and len(out.splitlines()) < 60, out
    assert fakepve.requests == []
