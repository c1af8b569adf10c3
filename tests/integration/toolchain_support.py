"""Targets for the cuda_toolchain and sglang role tests, and a reader of ansible-playbook's output.

Two targets, the same tests:
- `LabTarget` (the default): CT 200 of the lab over SSH (inventory/lab), prepared by the shared fixture
  `prepared_ct` (the sglfleet runtime /opt/sglfleet/venv, the interpreter the sglfleet modules run with). The
  tests' paths live under /opt/sglfleet-test in the container, removed at the start of a session.
- `LocalTarget` (SGLFLEET_ROLE_TESTS_TARGET=local): this machine with ansible_connection=local, every
  path under a temporary directory; the modules run with this venv's python.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TARGET_ENV = "SGLFLEET_ROLE_TESTS_TARGET"
LAB_ROOT = "/opt/sglfleet-test"
LAB_MODULE_PYTHON = "/opt/sglfleet/venv/bin/python"

_TASK = re.compile(r"^TASK \[(?P<name>.+?)\] \*+$")
_RESULT = re.compile(r"^(?P<status>ok|changed|skipping|fatal|failed|included): \[(?P<host>[^\]]+)\]")
_RECAP = re.compile(
    r"^(?P<host>\S+)\s+: ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=\d+\s+failed=(?P<failed>\d+)"
)


@dataclass
class PlaybookRun:
    """One ansible-playbook run: its exit code, output, and the statuses each task reported."""

    rc: int
    output: str
    tasks: dict[str, list[str]] = field(default_factory=dict)
    recap: dict[str, dict[str, int]] = field(default_factory=dict)

    def changed_tasks(self) -> list[str]:
        return [name for name, statuses in self.tasks.items() if "changed" in statuses]

    def status(self, task: str) -> list[str]:
        return self.tasks.get(task, [])

    def total(self, key: str) -> int:
        return sum(counts[key] for counts in self.recap.values())

    def explain(self) -> str:
        return f"rc={self.rc}\n{self.output[-6000:]}"


def parse(output: str) -> tuple[dict[str, list[str]], dict[str, dict[str, int]]]:
    """The statuses each task printed (per host line) and the PLAY RECAP counts, from default output."""
    tasks: dict[str, list[str]] = {}
    recap: dict[str, dict[str, int]] = {}
    current = None
    in_recap = False
    for line in output.splitlines():
        if line.startswith("PLAY RECAP"):
            in_recap = True
            continue
        if in_recap:
            if m := _RECAP.match(line):
                recap[m["host"]] = {k: int(m[k]) for k in ("ok", "changed", "failed")}
            continue
        if m := _TASK.match(line):
            current = m["name"]
            tasks.setdefault(current, [])
        elif current and (m := _RESULT.match(line)):
            tasks[current].append(m["status"])
    return tasks, recap


def run_playbook(playbook: str, inventory: Path, *extra: str, timeout: float = 1200) -> PlaybookRun:
    """Run playbooks/<playbook> against `inventory` with the project's ansible.cfg."""
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
    }
    cmd = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(ROOT / "playbooks" / playbook), *extra]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    output = proc.stdout + proc.stderr
    tasks, recap = parse(output)
    return PlaybookRun(proc.returncode, output, tasks, recap)


class Target:
    """Where the roles run; paths are the target's. Subclasses say how to reach it."""

    inventory: Path
    root: str
    work: Path  # controller-side directory for vars files
    module_python: str

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    @property
    def prefix(self) -> str:
        return self.path("cuda-13.2")

    def base_vars(self) -> dict:
        return {
            "cuda_toolchain_prefix": self.prefix,
            "cuda_toolchain_env_file": self.path("etc", "cuda-toolchain.env"),
            "cuda_toolchain_profile_path": self.path("etc", "profile.d", "cuda-toolchain.sh"),
            "cuda_toolchain_ledger_path": self.path("ledger.json"),
            "cuda_toolchain_modules_python": self.module_python,
            "sglang_install_engine": False,  # the lab's setting: the stand-in, no torch/sglang
            "sglang_cuda_home": self.prefix,
            "sglang_venv": self.path("sglang", "venv"),
            "sglang_env_file": self.path("etc", "sglang", "common.env"),
            "sglang_jit_cache_dir": self.path("cache", "sglang"),
            "sglang_sglfleet_wheel_dir": self.path("sglang", "wheels"),
            "sglang_ledger_path": self.path("ledger.json"),
        }

    def vars_file(self, name: str, overrides: dict | None = None) -> Path:
        path = self.work / name
        path.write_text(yaml.safe_dump({**self.base_vars(), **(overrides or {})}))
        return path

    def play(self, playbook: str, *extra: str, overrides: dict | None = None) -> PlaybookRun:
        name = f"vars-{abs(hash(json.dumps(overrides or {}, sort_keys=True)))}.yml"
        return run_playbook(playbook, self.inventory, "-e", f"@{self.vars_file(name, overrides)}", *extra)

    def sh(self, script: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def ok(self, script: str) -> str:
        proc = self.sh(script)
        assert proc.returncode == 0, f"{script!r} -> rc {proc.returncode}\n{proc.stdout}{proc.stderr}"
        return proc.stdout

    def read_json(self, path: str) -> dict:
        return json.loads(self.ok(f"cat {shlex.quote(path)}"))

    def ledger_phase(self, phase: str) -> dict:
        return self.read_json(self.path("ledger.json"))["phases"][phase]

    def reset(self) -> None:
        self.ok(f"rm -rf {shlex.quote(self.root)} && mkdir -p {shlex.quote(self.root)}")


class LocalTarget(Target):
    def __init__(self, work: Path) -> None:
        self.work = work
        self.root = str(work / "target")
        self.module_python = sys.executable
        self.inventory = work / "hosts.ini"
        self.inventory.write_text(
            f"[fleet]\nlocalhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"
        )

    def sh(self, script: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, timeout=timeout, check=False
        )


class LabTarget(Target):
    def __init__(self, work: Path, container) -> None:  # container: ansible_lab.Container
        self.work = work
        self.root = LAB_ROOT
        self.module_python = LAB_MODULE_PYTHON
        self.inventory = ROOT / "inventory" / "lab"
        self.container = container

    def sh(self, script: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return self.container.run(f"bash -c {shlex.quote(script)}", check=False, timeout=timeout)


def make_target(request, work: Path) -> Target:
    """The lab's CT 200 (prepared by the shared fixture), or this machine when asked for."""
    if os.environ.get(TARGET_ENV, "lab") == "local":
        target: Target = LocalTarget(work)
    else:
        target = LabTarget(work, request.getfixturevalue("prepared_ct"))
    target.reset()
    return target
