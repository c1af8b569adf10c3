"""inventory/example runs as shipped, secrets and site data aside: Ansible reads it without a warning, the
with no setting of this checkout's too (as a user of the installed collection reads it), the .files/ it names
are shipped or listed as the site's own, and its mix config is one `sglfleet mix` takes.
Its playbook runs (--syntax-check, the roles' argument_specs): tests/playbooks/test_example_playbooks.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.paths import REPO

from sglfleet.data import parse_config

pytestmark = pytest.mark.timeout(300)

ROOT = REPO
EXAMPLE = ROOT / "inventory" / "example"
BIN = Path(sys.executable).parent
ENV = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
ROLES = sorted(p.parent.parent.name for p in (ROOT / "roles").glob("*/meta/argument_specs.yml"))


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_ansible_reads_the_inventory_without_a_warning() -> None:
    done = run("ansible-inventory", "-i", str(EXAMPLE), "--list")
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    inventory = json.loads(done.stdout)
    assert "ct200" in inventory["_meta"]["hostvars"]
    ct200 = inventory["_meta"]["hostvars"]["ct200"]
    # one address: the container's static IP is the one Ansible connects to
    assert "ip=dhcp" not in json.dumps(ct200)
    assert "{{ ansible_host }}" in ct200["proxmox_lxc_netif"]["net0"]


def test_ansible_reads_it_without_a_warning_with_no_setting_of_this_checkout(tmp_path: Path) -> None:
    """Outside this checkout (no ansible.cfg, as with the installed collection) nothing in the inventory
    directory is read as a host: its site files are in .files/, which Ansible skips with no setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")} | {"ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run(
        [str(BIN / "ansible-inventory"), "-i", str(EXAMPLE), "--list"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    hostvars = json.loads(done.stdout)["_meta"]["hostvars"]
    assert set(hostvars) == {"kpro6", "kpro7", "ct200", "ct201"}
    assert hostvars["ct200"]["prompt_mix_config"] == "{{ inventory_dir }}/.files/mix.yaml"


def test_a_second_proxmox_host_is_a_group_of_its_own() -> None:
    done = run("ansible-inventory", "-i", str(EXAMPLE), "--list")
    assert done.returncode == 0, done.stderr
    inventory = json.loads(done.stdout)
    hostvars = inventory["_meta"]["hostvars"]
    assert set(inventory["pve_hosts"]["hosts"]) == {"kpro6", "kpro7"}
    assert set(inventory["fleet"]["children"]) == {"pve_kpro6", "pve_kpro7"}
    nodes = {
        ct: (hostvars[ct]["proxmox_lxc_node"], hostvars[ct]["proxmox_lxc_pve_host"])
        for ct in ("ct200", "ct201")
    }
    assert nodes == {"ct200": ("kpro6", "kpro6"), "ct201": ("kpro7", "kpro7")}
    # each container on its own node's API, with its own CT id, the fleet's settings shared
    assert hostvars["ct201"]["proxmox_lxc_api_host"] == "kpro7.example.net"
    assert hostvars["ct200"]["proxmox_lxc_vmid"] != hostvars["ct201"]["proxmox_lxc_vmid"]
    assert hostvars["ct201"]["proxmox_lxc_gpu_count"] == hostvars["ct200"]["proxmox_lxc_gpu_count"]
    assert hostvars["ct201"]["proxmox_lxc_ca_cert"].endswith("/.files/pve-root-ca-kpro7.pem")


def test_the_files_it_names_are_shipped_or_listed_as_the_sites_own() -> None:
    named: set[str] = set()
    for path in (EXAMPLE / "group_vars").rglob("*.yml"):
        named |= set(re.findall(r"\{\{ inventory_dir \}\}/\.files/([^\"' ]+)", path.read_text()))
    mix = EXAMPLE / ".files" / "mix.yaml"
    config = yaml.safe_load(mix.read_text())
    named |= {f"data/{Path(s['path']).name}" for s in config["sources"]} | {"data/existing-train.jsonl"}
    assert {"mix.yaml", "pve-root-ca.pem", "data/existing-train.jsonl"} <= named
    readme = (EXAMPLE / ".files" / "README.md").read_text()
    for name in sorted(named):
        listed = f"`{name}`" in readme or (name.startswith("data/") and "`data/*.json*`" in readme)
        assert (EXAMPLE / ".files" / name).is_file() or listed, name


def test_its_mix_config_is_one_sglfleet_mix_takes() -> None:
    mix = EXAMPLE / ".files" / "mix.yaml"
    config = parse_config(yaml.safe_load(mix.read_text()), str(mix), mix.parent)
    assert config.total == 193000
    assert all(str(s.path).startswith(str(mix.parent / "data")) for s in config.sources)
