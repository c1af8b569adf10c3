"""ansible.cfg's defaults are safe for a production inventory: no default inventory, host keys checked; the
lab turns the check off for its own hosts only; every ansible command the docs and the Makefile show names
its inventory. That a run without -i fails before reaching any host: see
tests/playbooks/test_example_playbooks.py."""

from __future__ import annotations

import configparser
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.paths import REPO

ROOT = REPO
BIN = Path(sys.executable).parent
CFG = ROOT / "ansible.cfg"

pytestmark = pytest.mark.timeout(120)


def env() -> dict[str, str]:
    # Only this checkout's ansible.cfg speaks: no inventory or host key setting from the caller's environment.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return {**clean, "ANSIBLE_CONFIG": str(CFG), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_the_config_names_no_inventory_and_keeps_host_key_checking() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(CFG)
    # Its default inventory is the guard that names no host (a run without -i fails on it), never an
    # inventory (the lab).
    guard = yaml.safe_load((ROOT / cfg["defaults"]["inventory"]).read_text())
    assert guard == {"plugin": "sglfleet_no_inventory"}, "ansible.cfg must default to no inventory (the lab)"
    assert cfg["defaults"].get("host_key_checking", "True").lower() in ("true", "yes", "1")
    ssh_args = cfg["ssh_connection"].get("ssh_args", "")
    assert "StrictHostKeyChecking=no" not in ssh_args and "UserKnownHostsFile=/dev/null" not in ssh_args
    dumped = json.loads(run("ansible-config", "dump", "-t", "base", "--format", "json").stdout)
    settings = {item["name"]: item["value"] for item in dumped if "name" in item}
    assert settings["HOST_KEY_CHECKING"] is True
    assert settings["INVENTORY_UNPARSED_IS_FAILED"] is True


def host_vars(inventory: str, host: str) -> dict:
    done = run("ansible-inventory", "-i", inventory, "--host", host)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_only_the_lab_skips_the_host_key_check() -> None:
    for host in ("ct200", "kpro6"):
        lab = host_vars("inventory/lab", host)
        assert lab["ansible_host_key_checking"] is False
        assert "StrictHostKeyChecking=no" in lab["ansible_ssh_common_args"]
    example = ROOT / "inventory" / "example"
    text = "\n".join(p.read_text() for p in example.rglob("*.yml"))
    assert "host_key_checking" not in text and "StrictHostKeyChecking" not in text


# A command (not prose): `ansible-playbook ARG`, `ansible-inventory ARG`, `ansible GROUP -m ...`, up to the
# end of the line or of the inline code span.
COMMAND = re.compile(
    r"\b(ansible-playbook|ansible-inventory|ansible(?= +(?:fleet|all|pve_hosts|-m)\b))( [^`\n]*)"
)
DOCUMENTS = ["README.md", "CONTRIBUTING.md", "Makefile", "docs/*.md", "roles/*/README.md", "playbooks/*.yml"]


def test_every_command_shown_names_its_inventory() -> None:
    unnamed = []
    for pattern in DOCUMENTS:
        for path in sorted(ROOT.glob(pattern)):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                for match in COMMAND.finditer(line):
                    args = match.group(2)
                    if not re.match(r" +(-|\S+\.yml|playbooks/|fleet|all|pve_hosts|\$\()", args):
                        continue  # prose: "`ansible-playbook` with an inventory per host"
                    if not re.search(r"(^| )(-i|--inventory)([ =]|$)", args):  # `-i` may end a wrapped line
                        unnamed.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0).strip()}")
    assert not unnamed, "commands that name no inventory:\n" + "\n".join(unnamed)
