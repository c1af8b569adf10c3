"""Helpers of the integration tests: run playbooks of this checkout, run commands in CT 200."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAB_LOCK = Path("/tmp/sglfleet-lab.lock")
LAB_STATE = Path("/var/lib/sglfleet-lab")
SSH_KEY = LAB_STATE / "id_ed25519"
CT_HOST = "ct200"
CT_SSH_PORT = 2222


# The interpreter CT 200 runs modules with in these tests: the venv with sglfleet in it.
MODULE_PYTHON = "/opt/sglang/venv/bin/python"


def ancestor_holds_lab_lock() -> bool:
    """Whether pytest runs under `flock /tmp/sglfleet-lab.lock ...` (then the lock is already ours)."""
    pid = os.getppid()
    while pid > 1:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        if cmdline and Path(cmdline[0].decode()).name == "flock" and str(LAB_LOCK).encode() in cmdline:
            return True
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False


@dataclass
class PlaybookRun:
    """What one ansible-playbook run did: exit status, output, and the PLAY RECAP of CT 200."""

    args: list[str]
    rc: int
    output: str
    seconds: float

    @property
    def recap(self) -> dict[str, int]:
        match = re.search(rf"^{CT_HOST}\s*:\s*(.*)$", self.output, re.MULTILINE)
        if not match:
            return {}
        return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))}

    def explain(self) -> str:
        return f"ansible-playbook {shlex.join(self.args)} -> rc {self.rc}\n{self.output[-6000:]}"


class Ansible:
    """Runs playbooks of this checkout against inventory/lab."""

    def __init__(self, extra_env: dict[str, str] | None = None) -> None:
        self.env = {
            **os.environ,
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_NOCOLOR": "1",
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            **(extra_env or {}),
        }

    def playbook(self, playbook: str, *args: str, timeout: float = 600) -> PlaybookRun:
        argv = ["ansible-playbook", "-i", str(REPO / "inventory/lab"), str(REPO / playbook), *args]
        start = time.monotonic()
        proc = subprocess.run(
            argv,
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
        return PlaybookRun(argv[1:], proc.returncode, proc.stdout, time.monotonic() - start)


class Container:
    """Commands in CT 200 over its sshd (127.0.0.1:2222), as the inventory reaches it."""

    def ssh_argv(self, command: str) -> list[str]:
        return [
            "ssh",
            "-i",
            str(SSH_KEY),
            "-p",
            str(CT_SSH_PORT),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            "root@127.0.0.1",
            command,
        ]

    def run(
        self, command: str, *, check: bool = True, stdin: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.ssh_argv(command),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"in CT 200: {command!r} -> rc {proc.returncode}\n{proc.stdout}{proc.stderr}"
            )
        return proc

    def out(self, command: str) -> str:
        return self.run(command).stdout.strip()

    def put(self, path: str, text: str, mode: str = "0644") -> None:
        quoted, tmp = shlex.quote(path), shlex.quote(f"{path}.tmp")
        self.run(
            f"mkdir -p $(dirname {quoted}) && cat > {tmp} && chmod {mode} {tmp} && mv {tmp} {quoted}",
            stdin=text,
        )

    def reachable(self) -> bool:
        try:
            return self.run("true", check=False, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def unit_props(self, unit: str, props: Sequence[str]) -> dict[str, str]:
        out = self.out(f"systemctl show {shlex.quote(unit)} " + " ".join(f"--property={p}" for p in props))
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
