"""The linters run as plain commands with the repository's own config files (.yamllint, .ansible-lint,
ansible.cfg), as `make lint` and CONTRIBUTING.md run them: no environment variable to remember, and a site's
vaulted vault.yml in an inventory of the checkout (docs/your-inventory.md, "The vault") fails neither.
That ansible-lint's syntax checks pass without an inventory: tests/playbooks/test_example_playbooks.py."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.paths import REPO

ROOT = REPO
BIN = Path(sys.executable).parent
VAULT = "inventory/mysite/group_vars/fleet/vault.yml"

pytestmark = pytest.mark.timeout(120)


def lint_recipe() -> list[str]:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("\nlint:") :].split("\n\n", 1)[0]
    return [line.strip() for line in recipe.splitlines()[1:] if not line.strip().startswith("@#")]


def test_make_lint_runs_the_plain_commands() -> None:
    recipe = "\n".join(lint_recipe())
    assert "ANSIBLE_" not in recipe, recipe
    assert re.search(r"\$\(BIN\)/ansible-lint --offline$", recipe, re.M), recipe
    assert re.search(r"\$\(BIN\)/yamllint --strict \.$", recipe, re.M), recipe


def test_contributing_shows_the_same_plain_commands() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    assert ".venv/bin/ansible-lint --offline\n" in text and ".venv/bin/yamllint --strict .\n" in text
    assert "ANSIBLE_INVENTORY" not in text


def test_yamllint_skips_a_vaulted_site_vault_but_checks_the_examples(tmp_path: Path) -> None:
    """`yamllint --strict .` in a checkout where the vault workflow ran: the encrypted vault.yml is skipped
    (it is not YAML), the example's placeholder one is still checked."""
    shutil.copy(ROOT / ".yamllint", tmp_path / ".yamllint")
    example = tmp_path / "inventory/example/group_vars/fleet/vault.yml"
    example.parent.mkdir(parents=True)
    shutil.copy(ROOT / "inventory/example/group_vars/fleet/vault.yml", example)
    site = tmp_path / VAULT
    site.parent.mkdir(parents=True)
    shutil.copy(example, site)
    password = tmp_path / "pass"
    password.write_text("not-a-real-one\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    encrypt = [str(BIN / "ansible-vault"), "encrypt", "--vault-password-file", str(password), str(site)]
    subprocess.run(encrypt, env=env, capture_output=True, check=True, timeout=60)
    assert site.read_text().startswith("$ANSIBLE_VAULT;")

    def yamllint() -> subprocess.CompletedProcess[str]:
        argv = [str(BIN / "yamllint"), "--strict", "."]
        return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)

    done = yamllint()
    assert done.returncode == 0, done.stdout + done.stderr
    example.write_text(example.read_text() + "broken:  spacing\n")
    done = yamllint()
    assert done.returncode != 0 and "inventory/example/group_vars/fleet/vault.yml" in done.stdout, done.stdout


def test_yamllint_skips_what_the_readme_try_leaves_in_the_checkout(tmp_path: Path) -> None:
    """README's "Try it" makes `.try/` (a venv: markdown_it ships a port.yaml with no `---`) and `try/` in
    the checkout; `yamllint --strict .` afterwards still passes, and a file of ours beside them is checked."""
    shutil.copy(ROOT / ".yamllint", tmp_path / ".yamllint")
    for name in (".try/lib/python3.11/site-packages/markdown_it/port.yaml", "try/notes.yaml", "ours.yml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("- a: 1\n")  # no document start: --strict fails it where it is read
    argv = [str(BIN / "yamllint"), "--strict", "."]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0, done.stdout
    assert "ours.yml" in done.stdout, done.stdout
    assert ".try/" not in done.stdout and "try/notes" not in done.stdout, done.stdout


def test_ansible_lint_excludes_a_sites_vault_as_it_matches_paths() -> None:
    """ansible-lint excludes a path that fnmatch-es an exclude_paths entry (runner.is_excluded)."""
    excluded = yaml.safe_load((ROOT / ".ansible-lint").read_text())["exclude_paths"]
    assert any(fnmatch.fnmatch(VAULT, pattern) for pattern in excluded), excluded
    assert not any(fnmatch.fnmatch("inventory/example/group_vars/fleet/proxmox_lxc.yml", p) for p in excluded)
    assert yaml.safe_load((ROOT / ".ansible-lint").read_text())["profile"] == "production"
