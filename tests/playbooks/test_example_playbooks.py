"""ansible-playbook with this checkout's ansible.cfg, no host reached: a run without -i fails with Ansible's
own message instead of reaching the lab; against inventory/example every playbook passes --syntax-check and
the inventory's variables pass every role's argument_specs (a local play). Moved from tests/unit (the unit
tier runs no ansible-playbook): test_ansible_cfg.py and test_example_inventory.py hold the rest."""

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

pytestmark = pytest.mark.timeout(300)

ROOT = REPO
EXAMPLE = ROOT / "inventory" / "example"
BIN = Path(sys.executable).parent
ROLES = sorted(p.parent.parent.name for p in (ROOT / "roles").glob("*/meta/argument_specs.yml"))


def env() -> dict[str, str]:
    # Only this checkout's ansible.cfg speaks: no inventory or host key setting from the caller's environment.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return {
        **clean,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
    }


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.mark.skipif(Path("/etc/ansible/hosts").exists(), reason="this machine has an inventory of its own")
def test_a_run_without_an_inventory_fails_before_reaching_any_host() -> None:
    done = run("ansible-playbook", "playbooks/status.yml")
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "No inventory was parsed" in out, out
    assert "this command names no inventory: add -i inventory/<site>" in out, out
    assert "ct200" not in out and "PLAY [" not in out, out


def test_a_syntax_check_without_an_inventory_passes_as_ansible_lint_runs_it() -> None:
    """ansible-lint's syntax checks name no inventory (and turn any_unparsed_is_failed off only, not
    unparsed_is_failed): ansible.cfg's guard reads as empty for them, so plain `ansible-lint` passes."""
    done = run("ansible-playbook", "--syntax-check", "-vv", "playbooks/site.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No inventory was parsed" not in done.stdout + done.stderr


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
