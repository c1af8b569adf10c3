"""Run ansible-playbook for the toolchain/sglang role tests and read what each task did.

The targets: the lab container (CT 200, SSH on 127.0.0.1:2222) when the lab inventory is usable, else
this machine with ansible_connection=local into temporary paths (see `Target`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

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


def run_playbook(
    playbook: str,
    inventory: Path,
    *extra: str,
    extra_vars: Path | None = None,
    timeout: float = 900,
) -> PlaybookRun:
    """Run playbooks/<playbook> against `inventory` with the project's ansible.cfg."""
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
    }
    cmd = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(ROOT / "playbooks" / playbook), *extra]
    if extra_vars:
        cmd += ["-e", f"@{extra_vars}"]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    output = proc.stdout + proc.stderr
    tasks, recap = parse(output)
    return PlaybookRun(proc.returncode, output, tasks, recap)
