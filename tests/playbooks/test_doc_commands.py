"""Every command the docs show (README.md, CONTRIBUTING.md, docs/*.md: their code blocks) is accounted for:
run by a test (here, or by the test named), or skipped for a stated reason (it needs the lab, a real
Proxmox host, a fleet host or a GPU, or it is the test suite itself). A new command in the docs fails
test_every_command_is_run_or_skipped_for_a_reason until it is one or the other.

Run here, as written, from the page's own block: the role documentation commands of docs/phases.md and
`sglfleet mix` of docs/data.md (in a directory of their own)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO

ROOT = REPO
BIN = Path(sys.executable).parent
PAGES = ["README.md", "CONTRIBUTING.md", "docs/*.md"]
# A line of a code block is a command when it starts with one of these (or `$ ` and one of these).
PROGRAMS = re.compile(
    r"^(\$ )?(\(umask [0-7]+; |[A-Z_]+=\S+ )?(\.venv/bin/)?(ansible-playbook|ansible-inventory|ansible-doc"
    r"|ansible-galaxy|ansible-vault|sglfleet|make|pip|python3?|cp|mkdir|export|curl|ssh|nvidia-modprobe|flock"
    r"|kill|journalctl|grep|pytest|ruff|yamllint|ansible-lint)(?= |$)"
)

pytestmark = pytest.mark.timeout(300)

RUN_HERE = "run here"
# (page, regular expression a command matches, how it is covered). Order does not matter; each command
# matches exactly one entry.
COVERED: list[tuple[str, str, str]] = [
    # Run by this module.
    ("docs/phases.md", r"ansible-doc -t role -r roles ", RUN_HERE),
    ("docs/data.md", r"sglfleet mix --config examples/mix/lab-mix\.yaml ", RUN_HERE),
    # Run by another test, as written in its page.
    (
        "README.md",
        r"python3 -m venv \.try|pip install -c requirements\.txt|mkdir -p try$"
        r"|python -m sglfleet_testing\.standin --model-path demo/model"
        r"|sglfleet (health|generate -i examples/try|job status try/)|kill %1",
        "tests/unit/project/test_readme_try.py (the README's Try block, as written)",
    ),
    (
        "docs/your-inventory.md",
        r"cp -r inventory/example inventory/mysite|mkdir -p -m 0700|\(umask 077|export "
        r"ANSIBLE_VAULT_PASSWORD_FILE|ansible-vault encrypt|ansible-inventory -i inventory/mysite --list|"
        r"ansible-playbook -i inventory/mysite playbooks/site\.yml --(syntax-check|list-tasks)",
        "tests/playbooks/test_vault.py (the page's blocks, as written, on a vaulted copy)",
    ),
    (
        "README.md",
        r"export ANSIBLE_VAULT_PASSWORD_FILE",
        "tests/playbooks/test_vault.py (docs/your-inventory.md's)",
    ),
    (
        "docs/collection.md",
        r"ansible-galaxy collection install sglfleet-ops-",
        "tests/playbooks/test_collection.py (the user fixture installs the built tarball this way)",
    ),
    (
        "docs/collection.md",
        r"ansible-doc (-t role )?sglfleet\.ops\.",
        "tests/unit/package/test_collection.py (ansible-doc of every module and role through the collection)",
    ),
    (
        "CONTRIBUTING.md",
        r"\.venv/bin/(ruff|yamllint|ansible-lint)",
        "make lint runs these (tests/unit/project/test_lint_config.py: the same plain commands)",
    ),
    # Not run: what they need is not here, or they are the suite itself.
    (
        "docs/collection.md",
        r"pip install '<collections>",
        "installs into the controller's Ansible Python; test_collection's runtime role installs that wheel",
    ),
    (
        "docs/collection.md",
        r"ansible-playbook -i inventory/<site> sglfleet\.ops\.site",
        "a real site (test_collection syntax-checks every sglfleet.ops.<phase> by name)",
    ),
    (
        "docs/data.md",
        r"sglfleet generate \.\.\.|sglfleet merge --existing examples/mix",
        "needs generate's results: a server answering (the lab's demo, tests/integration/test_demo*)",
    ),
    ("docs/generate.md", r"", "a job sending to a fleet's endpoints (10.0.0.5, h:30000), and its status"),
    (
        "docs/standin.md",
        r"",
        "a server on port 30000 and a request to it: the README's Try runs the stand-in",
    ),
    ("docs/status.md", r"\$ sglfleet status", "on a fleet host (its ledger, its GPUs)"),
    (
        "docs/gpu-check.md",
        r"make gpu-check|\.venv/bin/python scripts/gpu-check --download",
        "a machine with an NVIDIA GPU (tests/unit/project/test_gpu_check.py runs gpu-check without one)",
    ),
    ("docs/status.md", r"ansible-playbook -i inventory/lab", "the lab (tests/integration/test_status.py)"),
    ("docs/doctor.md", r"", "a real inventory's hosts (the lab's: tests/integration/test_doctor.py)"),
    ("docs/fleet.md", r"", "a fleet host"),
    ("docs/training.md", r"", "a fleet host with a training job"),
    ("docs/your-host.md", r"", "a Proxmox host with NVIDIA GPUs"),
    ("docs/serving.md", r"", "a fleet host's processes and journal"),
    ("docs/lab.md", r"", "the lab (root, LXC)"),
    ("docs/troubleshooting.md", r"", "the role tests themselves (on the lab: its lock, root)"),
    ("docs/testing.md", r"", "the test suite itself"),
    (
        "CONTRIBUTING.md",
        r"make |\.venv/bin/pytest |SGLFLEET_TEST_CT=|flock ",
        "the test suite itself, or the lab",
    ),
    ("README.md", r"make (demo|test)", "the lab (root), or the test suite itself"),
    (
        "README.md",
        r"ansible-playbook -i inventory/mysite playbooks/(doctor|site|status)\.yml",
        "a real site's hosts (their syntax: tests/playbooks/test_vault.py on a copy of inventory/example)",
    ),
    (
        "docs/your-inventory.md",
        r"ansible-playbook -i inventory/mysite playbooks/(doctor|provision|status)\.yml|"
        r"ansible-playbook -i inventory/mysite playbooks/site\.yml( --check --diff)?$|ssh root@",
        "a real site's hosts",
    ),
]


def doc_commands() -> list[tuple[str, str]]:
    """(page, command) for every command line of every code block, continuation lines joined, comments off."""
    found = []
    for pattern in PAGES:
        for path in sorted(ROOT.glob(pattern)):
            page = str(path.relative_to(ROOT))
            for block in re.findall(r"^```(?:console|sh|bash|)\n(.*?)^```", path.read_text(), re.S | re.M):
                joined = re.sub(r"\\\n\s*", "", block)
                for line in joined.splitlines():
                    command = re.sub(r"\s+#\s.*$", "", line).strip()
                    if PROGRAMS.match(command):
                        found.append((page, command))
    return found


def coverage(page: str, command: str) -> list[str]:
    return [how for p, regex, how in COVERED if p == page and re.search(regex, command)]


def test_every_command_is_run_or_skipped_for_a_reason() -> None:
    commands = doc_commands()
    assert len(commands) > 60, commands
    unaccounted = [f"{page}: {command}" for page, command in commands if not coverage(page, command)]
    assert not unaccounted, "commands the docs show that no test runs and no reason skips:\n" + "\n".join(
        unaccounted
    )
    ambiguous = [f"{page}: {c}" for page, c in commands if len(coverage(page, c)) > 1]
    assert not ambiguous, "commands with more than one entry:\n" + "\n".join(ambiguous)


def run_here(page: str) -> list[str]:
    return [c for p, c in doc_commands() if p == page and coverage(p, c) == [RUN_HERE]]


def bash(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "SGLFLEET_", "VIRTUAL_ENV"))}
    env |= {
        "PATH": f"{BIN}:{env.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
    }
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip


def test_the_role_documentation_commands_of_phases_md() -> None:
    commands = run_here("docs/phases.md")
    assert len(commands) == 5, commands
    done = bash("\n".join(commands), ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[WARNING]" not in done.stderr and "[ERROR]" not in done.stderr, done.stderr
    for role in ("sglfleet", "prompt_mix", "generate", "merge"):
        assert f"> ROLE: *{role}*" in done.stdout or f"ROLE: {role}" in done.stdout, role


def test_the_mix_command_of_data_md(tmp_path: Path) -> None:
    (command,) = run_here("docs/data.md")
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    done = bash(command, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "prompts written to out/prompts.jsonl" in done.stdout + done.stderr
    assert (tmp_path / "out" / "prompts.jsonl").stat().st_size > 0 and (
        tmp_path / "out" / "mix-report.md"
    ).is_file()
