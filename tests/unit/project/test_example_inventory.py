"""inventory/example runs as shipped, secrets and site data aside: Ansible reads it without a warning,
every playbook passes --syntax-check against it, its variables pass every role's argument_specs, the
files/ it names are shipped or listed as the site's own, and its mix config is one `sglfleet mix` takes."""

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
    assert hostvars["ct201"]["proxmox_lxc_ca_cert"].endswith("files/pve-root-ca-kpro7.pem")


@pytest.mark.parametrize("playbook", sorted(p.name for p in (ROOT / "playbooks").glob("*.yml")))
def test_every_playbook_passes_syntax_check(playbook: str) -> None:
    done = run("ansible-playbook", "--syntax-check", "-i", str(EXAMPLE), f"playbooks/{playbook}")
    assert done.returncode == 0, done.stdout + done.stderr


def _checkable(spec: dict) -> dict:
    """An option's spec without its default and description: the inventory's values are checked, not
    the role's own defaults (templates that the role renders at run time)."""
    kept = {k: v for k, v in spec.items() if k in ("type", "elements", "choices", "required")}
    if "options" in spec:
        kept["options"] = {name: _checkable(sub) for name, sub in spec["options"].items()}
    return kept


def test_its_variables_pass_every_roles_argument_specs(tmp_path: Path) -> None:
    tasks = []
    for role in ROLES:
        specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
        options = specs["argument_specs"]["main"].get("options") or {}
        tasks.append(
            {
                "name": f"Validate the variables of role {role}",
                "ansible.builtin.validate_argument_spec": {
                    "argument_spec": {name: _checkable(spec) for name, spec in options.items()}
                },
            }
        )
    play = [
        {
            "name": "Validate the inventory's variables against each role's argument_specs",
            "hosts": "fleet",
            "gather_facts": False,
            "tasks": tasks,
        }
    ]
    (tmp_path / "validate.yml").write_text(json.dumps(play))
    done = run(
        "ansible-playbook",
        "-i",
        str(EXAMPLE),
        str(tmp_path / "validate.yml"),
        "-e",
        "ansible_connection=local",
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    for ct in ("ct200", "ct201"):
        assert re.search(rf"^{ct}\s*:\s*ok={len(ROLES)}\s.*failed=0", done.stdout, re.MULTILINE), done.stdout[
            -3000:
        ]


def test_the_files_it_names_are_shipped_or_listed_as_the_sites_own() -> None:
    named: set[str] = set()
    for path in (EXAMPLE / "group_vars").rglob("*.yml"):
        named |= set(re.findall(r"\{\{ inventory_dir \}\}/files/([^\"' ]+)", path.read_text()))
    mix = EXAMPLE / "files" / "mix.yaml"
    config = yaml.safe_load(mix.read_text())
    named |= {f"data/{Path(s['path']).name}" for s in config["sources"]} | {"data/existing-train.jsonl"}
    assert {"mix.yaml", "pve-root-ca.pem", "data/existing-train.jsonl"} <= named
    readme = (EXAMPLE / "files" / "README.md").read_text()
    for name in sorted(named):
        listed = f"`{name}`" in readme or (name.startswith("data/") and "`data/*.json*`" in readme)
        assert (EXAMPLE / "files" / name).is_file() or listed, name


def test_its_mix_config_is_one_sglfleet_mix_takes() -> None:
    mix = EXAMPLE / "files" / "mix.yaml"
    config = parse_config(yaml.safe_load(mix.read_text()), str(mix), mix.parent)
    assert config.total == 193000
    assert all(str(s.path).startswith(str(mix.parent / "data")) for s in config.sources)
