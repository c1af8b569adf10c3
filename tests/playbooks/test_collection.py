"""The collection sglfleet.ops works installed from its tarball, without this checkout: its playbooks parse
when called by name (`ansible-playbook sglfleet.ops.<phase>`), the short names of their modules and roles
resolving inside the collection, and role sglfleet_runtime installs from the wheel the collection carries.

Runs from a directory outside the checkout with none of its settings (no ansible.cfg: nothing resolves from
library/ or roles/ here); the role runs in check mode on the controller itself (local connection), so it
needs no lab CT. Every module's EXAMPLES, pasted into a play, parse there too. tests/unit/test_collection.py
checks the tarball's content."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jinja2
import jinja2.nodes
import pytest
import yaml

import sglfleet

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
WHEEL = f"sglfleet-{sglfleet.__version__}-py3-none-any.whl"
INVENTORY = """\
all:
  children:
    pve_hosts:
      hosts:
        node1: {ansible_connection: local}
    fleet:
      hosts:
        ct1:
          ansible_connection: local
          ansible_python_interpreter: "{{ ansible_playbook_python }}"
          proxmox_lxc_node: node1
"""


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A user's directory with an inventory, and the collection installed as a user installs it."""
    home = tmp_path_factory.mktemp("user")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env |= {"ANSIBLE_COLLECTIONS_PATH": str(home / "collections"), "ANSIBLE_NOCOLOR": "1"}
    built = subprocess.run(
        [str(ROOT / "scripts" / "build-collection"), "--output", str(home / "dist")],
        env=env | {"VENV_BIN": str(BIN)}, capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    (tarball,) = (home / "dist").glob("sglfleet-ops-*.tar.gz")
    galaxy = [str(BIN / "ansible-galaxy"), "collection", "install", "-p", str(home / "collections")]
    done = subprocess.run(
        [*galaxy, str(tarball)], cwd=home, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (home / "inventory.yml").write_text(INVENTORY)
    return home, env


def playbook(user: tuple[Path, dict[str, str]], *args: str) -> subprocess.CompletedProcess[str]:
    home, env = user
    argv = [str(BIN / "ansible-playbook"), "-i", "inventory.yml", *args]
    return subprocess.run(argv, cwd=home, env=env, capture_output=True, text=True, timeout=240, check=False)


def test_every_playbook_of_the_collection_parses_by_its_name(user: tuple[Path, dict[str, str]]) -> None:
    names = sorted(f"sglfleet.ops.{p.stem}" for p in (ROOT / "playbooks").glob("*.yml"))
    done = playbook(user, "--syntax-check", *names)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in names:
        assert f"ansible_collections/sglfleet/ops/playbooks/{name.rsplit('.', 1)[1]}.yml" in done.stdout, name


def test_the_runtime_role_installs_from_the_collections_wheel(user: tuple[Path, dict[str, str]]) -> None:
    home, _ = user
    (home / "runtime.yml").write_text(
        "- name: The sglfleet runtime from the collection\n"
        "  hosts: ct1\n"
        "  gather_facts: false\n"
        "  roles:\n"
        "    - role: sglfleet.ops.sglfleet_runtime\n"
        f"      sglfleet_runtime_venv: {home}/venv\n"
        f"      sglfleet_runtime_wheel_dir: {home}/wheels\n"
    )
    done = playbook(user, "runtime.yml", "--check", "--diff")
    assert done.returncode == 0, done.stdout + done.stderr
    # It would copy the collection's own wheel and make the venv; check mode makes nothing.
    assert f"changed: [ct1] => (item={WHEEL})" in done.stdout, done.stdout
    assert not (home / "venv").exists() and not (home / "wheels").exists()


# Names a task may use that no role or inventory defines: Ansible's own (magic variables, loop and lookup
# functions), https://docs.ansible.com/ansible/latest/reference_appendices/special_variables.html
ANSIBLE_NAMES = {"groups", "hostvars", "inventory_hostname", "item", "omit", "lookup", "query"}
# A condition is a bare expression, not a template.
CONDITIONS = {"when", "until", "changed_when", "failed_when"}


def module_examples() -> dict[str, list[dict[str, Any]]]:
    """Each module's EXAMPLES (library/<module>.py) as the tasks they are."""
    examples = {}
    for path in sorted((ROOT / "library").glob("*.py")):
        (value,) = [
            node.value.value
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "EXAMPLES"
        ]
        examples[path.stem] = yaml.safe_load(value)
    return examples


def project_variables() -> set[str]:
    """Every variable a role's defaults or the example inventory (hosts.yml, group_vars/) defines."""
    names: set[str] = set()
    for defaults in ROOT.glob("roles/*/defaults/main.yml"):
        names |= set(yaml.safe_load(defaults.read_text()) or {})
    inventory = ROOT / "inventory" / "example"
    for group_vars in (inventory / "group_vars").rglob("*.yml"):
        names |= set(yaml.safe_load(group_vars.read_text()) or {})

    def walk(group: dict[str, Any]) -> None:
        names.update(group.get("vars") or {})
        for host in (group.get("hosts") or {}).values():
            names.update(host or {})
        for child in (group.get("children") or {}).values():
            walk(child or {})

    for group in yaml.safe_load((inventory / "hosts.yml").read_text()).values():
        walk(group)
    return names


def template_names(value: Any, key: str = "") -> set[str]:
    """The variables the templates in value (a task, or any part of one) read."""
    if isinstance(value, dict):
        return {n for k, v in value.items() for n in template_names(v, k)}
    if isinstance(value, list):
        return {n for v in value for n in template_names(v, key)}
    if not isinstance(value, str) or (key not in CONDITIONS and "{{" not in value and "{%" not in value):
        return set()
    source = f"{{{{ {value} }}}}" if key in CONDITIONS else value
    # The names the template loads and never sets (jinja2.meta.find_undeclared_variables would compile it,
    # which needs Ansible's filters).
    tree = jinja2.Environment().parse(source)
    names = {(n.name, n.ctx) for n in tree.find_all(jinja2.nodes.Name)}
    return {name for name, ctx in names if ctx == "load"} - {name for name, ctx in names if ctx == "store"}


def test_module_examples_read_only_variables_the_project_defines() -> None:
    """A pasted example reads the variables an operator's inventory has (the real API key's name, ...), or
    what an earlier task of the same example registered: nothing the project never defines."""
    known = project_variables() | ANSIBLE_NAMES
    assert "sglang_fleet_api_key" in known and "proxmox_lxc_api_password" in known
    unknown = {}
    for module, tasks in module_examples().items():
        registered = {task["register"] for task in tasks if "register" in task}
        missing = {n for task in tasks for n in template_names(task)} - known - registered
        if missing:
            unknown[module] = sorted(missing)
    assert not unknown, f"EXAMPLES read variables no role, inventory or earlier task defines: {unknown}"


def test_every_module_example_parses_with_the_collection_alone(user: tuple[Path, dict[str, str]]) -> None:
    """Pasted into a play outside this checkout, with only the collection installed, every module's EXAMPLES
    parse: each module name resolves (by its sglfleet.ops name), each task's keywords are valid."""
    home, _ = user
    examples = module_examples()
    plays = [
        {"name": f"EXAMPLES of {module}", "hosts": "fleet", "gather_facts": False, "tasks": tasks}
        for module, tasks in examples.items()
    ]
    (home / "examples.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    done = playbook(user, "--syntax-check", "examples.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[WARNING]" not in done.stderr, done.stderr
    assert len(examples) == len(list((ROOT / "library").glob("*.py"))) >= 13
