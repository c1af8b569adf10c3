"""docs/your-inventory.md as a new user runs it: copy inventory/example, encrypt its vault.yml with a password
file, then the page's read-only commands (ansible-inventory --list, --syntax-check, --list-tasks) against the
vaulted copy, with the password the way the page says (ANSIBLE_VAULT_PASSWORD_FILE), per command
(--vault-password-file) and as a vault id (ANSIBLE_VAULT_IDENTITY_LIST). The commands come from the page's
own code blocks, so the page and the test cannot drift apart."""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO

ROOT = REPO
BIN = Path(sys.executable).parent
PAGE = ROOT / "docs" / "your-inventory.md"
VAULT = Path("group_vars/fleet/vault.yml")

pytestmark = pytest.mark.timeout(600)


def page_commands() -> list[str]:
    """The page's commands that change nothing outside the copy: the copy, the vault's setup, and the
    checks (a run with --check or for real needs the hosts)."""
    text = PAGE.read_text()
    lines = [
        line for block in re.findall(r"^```\n(.*?)^```", text, re.S | re.M) for line in block.splitlines()
    ]
    setup = re.compile(r"(cp|mkdir|\(umask|export|ansible-vault encrypt|ansible-inventory) ")
    check = re.compile(r"ansible-playbook .*(--syntax-check|--list-tasks)")
    return [line for line in lines if setup.match(line) or check.match(line)]


def env(home: Path, **extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return {
        **clean,
        "HOME": str(home),
        "PATH": f"{BIN}:{clean.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        **extra,
    }


def bash(script: str, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def vaulted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    """The page's commands, run as written (inventory/mysite a copy under tmp, ~ a home of its own):
    the vaulted copy, the password file, and the check commands."""
    tmp = tmp_path_factory.mktemp("vault")
    home, site = tmp / "home", tmp / "mysite"
    home.mkdir()
    commands = page_commands()
    assert any(c.startswith("ansible-vault encrypt") for c in commands), commands
    assert any("ANSIBLE_VAULT_PASSWORD_FILE" in c for c in commands), commands
    checks = [c for c in commands if c.startswith(("ansible-inventory", "ansible-playbook"))]
    assert {"--list", "--syntax-check", "--list-tasks"} <= {w for c in checks for w in c.split()}, checks
    script = "\n".join(commands).replace("inventory/mysite", str(site))
    done = bash(script, env(home))
    assert done.returncode == 0, f"{script}\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
    password = home / ".config" / "sglfleet" / "mysite.vault-pass"
    return site, password, [c.replace("inventory/mysite", str(site)) for c in checks]


def test_the_page_encrypts_the_secrets_with_a_private_password_file(vaulted: tuple[Path, Path, list]) -> None:
    site, password, _ = vaulted
    text = (site / VAULT).read_text()
    assert text.startswith("$ANSIBLE_VAULT;1.1;AES256"), text[:80]
    assert "REPLACE-ME" not in text
    assert stat.S_IMODE(password.stat().st_mode) == 0o600
    assert stat.S_IMODE(password.parent.stat().st_mode) == 0o700


def test_without_the_password_the_vaulted_inventory_is_refused(vaulted: tuple[Path, Path, list]) -> None:
    site, _, _ = vaulted
    done = bash(f"ansible-inventory -i {shlex.quote(str(site))} --list", env(site.parent / "home"))
    assert done.returncode != 0
    assert "vault" in done.stderr.lower(), done.stderr


@pytest.mark.parametrize("way", ["--vault-password-file", "ANSIBLE_VAULT_IDENTITY_LIST"])
def test_the_page_checks_pass_with_the_password_given_another_way(
    vaulted: tuple[Path, Path, list], way: str
) -> None:
    site, password, checks = vaulted
    home = site.parent / "home"
    if way == "--vault-password-file":
        script, environ = (
            "\n".join(f"{c} --vault-password-file {shlex.quote(str(password))}" for c in checks),
            env(home),
        )
    else:
        script, environ = "\n".join(checks), env(home, ANSIBLE_VAULT_IDENTITY_LIST=f"mysite@{password}")
    done = bash(script, environ)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "sglang_fleet : " in done.stdout  # --list-tasks --tags fleet lists phase fleet's tasks


def test_a_vault_id_encrypted_copy_reads_with_the_identity_list(
    vaulted: tuple[Path, Path, list], tmp_path: Path
) -> None:
    """The page's "several vaults" row: encrypt with --vault-id mysite@FILE, read with the identity list."""
    _, password, _ = vaulted
    copy = tmp_path / "other"
    subprocess.run(["cp", "-r", str(ROOT / "inventory" / "example"), str(copy)], check=True)
    environ = env(tmp_path, ANSIBLE_VAULT_IDENTITY_LIST=f"mysite@{password}")
    done = bash(
        f"ansible-vault encrypt --vault-id mysite@{shlex.quote(str(password))} {copy / VAULT}", env(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    assert (copy / VAULT).read_text().startswith("$ANSIBLE_VAULT;1.2;AES256;mysite")
    done = bash(f"ansible-inventory -i {shlex.quote(str(copy))} --host ct200", environ)
    assert done.returncode == 0, done.stderr
    assert "REPLACE-ME-a-long-random-string" in done.stdout  # decrypted: the placeholder API key is read
