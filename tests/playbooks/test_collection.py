"""The collection sglfleet.ops works installed from its tarball, without this checkout: its playbooks parse
when called by name (`ansible-playbook sglfleet.ops.<phase>`), the short names of their modules and roles
resolving inside the collection, and role sglfleet_runtime installs from the wheel the collection carries.

Runs from a directory outside the checkout with none of its settings (no ansible.cfg: nothing resolves from
library/ or roles/ here); the role runs in check mode on the controller itself (local connection), so it
needs no lab CT. tests/unit/test_collection.py checks the tarball's content."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
