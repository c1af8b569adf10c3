"""The lab tiers' harness: ansible-playbook runs of this checkout, commands in a lab CT, the role-test
targets, and polling. support/lab.py (the lab's pytest plugin) turns it into fixtures; tests import the
names they need from here.

- `Ansible.playbook()` runs a playbook against inventory/lab (or another inventory) and returns a
  `PlaybookRun`: exit status, output, time, CT 200's PLAY RECAP (`recap`), every host's (`recaps`), and
  what each task reported (`status()`, `changed_tasks()`, `total()`); `Ansible.start()` runs one in the
  background, so that a test can act while it runs (`RunningPlaybook.wait_for()`, then `finish()`).
- `Container` is a lab CT: commands over its sshd, on one multiplexed SSH connection per CT, and
  playbooks through the inventory that reaches it (`playbook()`).
- `Target` and its two kinds (`LabTarget`: the session's CT under /opt/sglfleet-test; `LocalTarget`: this
  machine, SGLFLEET_ROLE_TESTS_TARGET=local) are where the role tests (cuda_toolchain, sglang) converge.
- `wait_until()` polls a condition: no test sleeps a fixed time to let something happen.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from sglfleet_testing.lab.driver import module_steady

from support import polling

REPO = ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
INVENTORY = REPO / "inventory" / "lab"
LAB_STATE = Path("/var/lib/sglfleet-lab")
SSH_KEY = LAB_STATE / "id_ed25519"
CT_HOST = "ct200"
CT_VMID = 200
CT_SSH_PORT = 2222

# The interpreter CT 200 runs modules with in these tests: the venv with sglfleet in it.
MODULE_PYTHON = "/opt/sglfleet/venv/bin/python"
# The venv prepared_ct installs the stand-in into (sglfleet-testing is not in the runtime venv).
STANDIN_PYTHON = "/opt/sglang/venv/bin/python"
# Where the fake_nvidia_smi fixture puts tests/integration/files/nvidia-smi in CT 200.
FAKE_NVIDIA_SMI = "/usr/local/lib/sglfleet-test/nvidia-smi"

# Where the role tests (cuda_toolchain, sglang) converge, every path under LAB_ROOT: `lab` (the session's
# own CT, below; the default) or `local` (this machine).
TARGET_ENV = "SGLFLEET_ROLE_TESTS_TARGET"
# The lab CT of the modules that can run on a CT of their own (the role tests, test_host_phase, test_site):
# CT 200 unless this names another (`make test-integration` runs sessions on 201 and 202 beside CT 200's).
OWN_CT_ENV = "SGLFLEET_TEST_CT"
LAB_ROOT = "/opt/sglfleet-test"
LAB_MODULE_PYTHON = MODULE_PYTHON


# A lab condition runs a command in a CT: polled every 0.1 s, not every 0.02 s as support.polling's default.
wait_until = functools.partial(polling.wait_until, interval=0.1)


# -- ansible-playbook --------------------------------------------------------------------------------

_TASK = re.compile(r"^TASK \[(?P<name>.+?)\] \*+$")
_RESULT = re.compile(r"^(?P<status>ok|changed|skipping|fatal|failed|included): \[(?P<host>[^\]]+)\]")
_RECAP = re.compile(r"^(?P<host>\S+)\s+: (?P<counts>ok=\d+.*)$")


def parse(output: str) -> tuple[dict[str, list[str]], dict[str, dict[str, int]]]:
    """The statuses each task printed (one per host line) and every host's PLAY RECAP counts."""
    tasks: dict[str, list[str]] = {}
    recaps: dict[str, dict[str, int]] = {}
    current = None
    in_recap = False
    for line in output.splitlines():
        if line.startswith("PLAY RECAP"):
            in_recap = True
            continue
        if in_recap:
            if m := _RECAP.match(line):
                recaps[m["host"]] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m["counts"])}
            continue
        if m := _TASK.match(line):
            current = m["name"]
            tasks.setdefault(current, [])
        elif current and (m := _RESULT.match(line)):
            tasks[current].append(m["status"])
    return tasks, recaps


@dataclass
class PlaybookRun:
    """What one ansible-playbook run did: exit status, output (stdout and stderr as printed), its duration."""

    args: list[str]
    rc: int
    output: str
    seconds: float = 0.0
    _parsed: tuple[dict[str, list[str]], dict[str, dict[str, int]]] | None = field(default=None, repr=False)

    def _parse(self) -> tuple[dict[str, list[str]], dict[str, dict[str, int]]]:
        if self._parsed is None:
            self._parsed = parse(self.output)
        return self._parsed

    @property
    def tasks(self) -> dict[str, list[str]]:
        """Task name -> the statuses it printed (ok, changed, skipping, failed, fatal, included)."""
        return self._parse()[0]

    @property
    def recaps(self) -> dict[str, dict[str, int]]:
        """Host -> its PLAY RECAP counts (ok, changed, unreachable, failed, skipped, rescued, ignored)."""
        return self._parse()[1]

    @property
    def recap(self) -> dict[str, int]:
        """CT 200's PLAY RECAP counts ({} when it was not in the play)."""
        return self.recaps.get(CT_HOST, {})

    def total(self, key: str) -> int:
        """`key` (changed, failed, ...) summed over every host of the recap."""
        return sum(counts.get(key, 0) for counts in self.recaps.values())

    def changed_tasks(self) -> list[str]:
        return [name for name, statuses in self.tasks.items() if "changed" in statuses]

    def status(self, task: str) -> list[str]:
        return self.tasks.get(task, [])

    def explain(self) -> str:
        return f"ansible-playbook {shlex.join(self.args)} -> rc {self.rc}\n{self.output[-6000:]}"


def ansible_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every ansible-* command of the tests runs in: this checkout's ansible.cfg, no color."""
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        **(extra or {}),
    }


def run_playbook(
    playbook: str | Path,
    inventory: Path = INVENTORY,
    *args: str,
    timeout: float = 1200,
    env: dict[str, str] | None = None,
) -> PlaybookRun:
    """ansible-playbook -i inventory playbook args; `playbook` is absolute, or relative to playbooks/ or
    to the checkout."""
    argv = _playbook_argv(playbook, inventory, args)
    start = time.monotonic()
    proc = subprocess.run(
        argv,
        cwd=REPO,
        env=env or ansible_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    return PlaybookRun(argv[1:], proc.returncode, proc.stdout, time.monotonic() - start)


def _playbook_argv(playbook: str | Path, inventory: Path, args: Sequence[str]) -> list[str]:
    path = Path(playbook)
    if not path.is_absolute():
        path = REPO / "playbooks" / path if (REPO / "playbooks" / path).is_file() else REPO / path
    return [str(BIN / "ansible-playbook"), "-i", str(inventory), str(path), *args]


class RunningPlaybook:
    """An ansible-playbook run in the background: a test waits for a line of its output (`wait_for`), acts
    while the play goes on, then takes its `PlaybookRun` (`finish`)."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        self._start = time.monotonic()
        # Unbuffered: Ansible writes its lines without a flush, and the test waits for them as they come.
        self._proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.append(line)

    def output(self) -> str:
        return "".join(self._lines)

    def wait_for(self, text: str, timeout: float = 300) -> None:
        """Return once `text` is in the output; fail (with the output) if the run ends without it."""
        wait_until(
            lambda: text in self.output() or self._proc.poll() is not None,
            timeout=timeout,
            what=f"ansible-playbook prints {text!r}",
        )
        if self._proc.poll() is not None:
            self._reader.join(timeout=5)  # the last lines
        assert text in self.output(), f"the run ended without printing {text!r}\n{self.output()[-6000:]}"

    def finish(self, timeout: float = 600) -> PlaybookRun:
        """Wait for the run to end; what it did."""
        try:
            rc = self._proc.wait(timeout)
        finally:
            if self._proc.poll() is None:
                self._proc.kill()
        self._reader.join(timeout=10)
        return PlaybookRun(self.argv[1:], rc, self.output(), time.monotonic() - self._start)


class Ansible:
    """Runs playbooks of this checkout against inventory/lab (or the inventory given)."""

    def __init__(self, extra_env: dict[str, str] | None = None, inventory: Path = INVENTORY) -> None:
        self.env = ansible_env(extra_env)
        self.inventory = inventory

    def playbook(
        self, playbook: str | Path, *args: str, timeout: float = 600, inventory: Path | None = None
    ) -> PlaybookRun:
        return run_playbook(playbook, inventory or self.inventory, *args, timeout=timeout, env=self.env)

    def start(self, playbook: str | Path, *args: str) -> RunningPlaybook:
        """The same run in the background (see RunningPlaybook)."""
        return RunningPlaybook(_playbook_argv(playbook, self.inventory, args), self.env)


def _lab_host(port: int, **host_vars: object) -> dict:
    """How the inventory reaches a lab CT: its sshd on 127.0.0.1, as root with the lab's key, without the
    host key check that ansible.cfg leaves on (a lab CT's keys are new at every create), as inventory/lab
    says for its own hosts."""
    return {
        "ansible_host": "127.0.0.1",
        "ansible_port": port,
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(SSH_KEY),
        "ansible_host_key_checking": lab_vars()["ansible_host_key_checking"],
        "ansible_ssh_common_args": lab_vars()["ansible_ssh_common_args"],
        **host_vars,
    }


def host_inventory(path: Path, *, name: str = CT_HOST, python: str = MODULE_PYTHON) -> Path:
    """An inventory of CT 200 alone (group fleet, no group_vars): its connection and its python."""
    host = _lab_host(CT_SSH_PORT, ansible_python_interpreter=python)
    path.write_text(yaml.safe_dump({"fleet": {"hosts": {name: host}}}))
    return path


def lab_inventory(
    directory: Path,
    *,
    vmid: int,
    port: int,
    host_vars: dict | None = None,
    more: dict[int, tuple[int, dict]] | None = None,
) -> Path:
    """inventory/lab with lab CT `vmid` in place of CT 200: the same group_vars and PVE node, that CT
    in group fleet, with `host_vars`; `more` adds other lab CTs to the group after it (vmid: (sshd port,
    host_vars)), the first host staying the router's (playbooks/router.yml: fleet[0])."""
    directory.mkdir(parents=True, exist_ok=True)
    node = yaml.safe_load((INVENTORY / "hosts.yml").read_text())["pve_hosts"]
    fleet = {"hosts": {f"ct{vmid}": _lab_host(port, **(host_vars or {}))}}
    for other, (other_port, other_vars) in (more or {}).items():
        fleet["hosts"][f"ct{other}"] = _lab_host(other_port, **other_vars)
    (directory / "hosts.yml").write_text(yaml.safe_dump({"fleet": fleet, "pve_hosts": node}))
    (directory / "group_vars").symlink_to(INVENTORY / "group_vars", target_is_directory=True)
    return directory


# -- a lab container over SSH --------------------------------------------------------------------------

# One master connection per CT, kept for a while: a test's many short commands skip the SSH handshake.
_CONTROL_DIR = Path(tempfile.gettempdir()) / f"sglfleet-itest-ssh-{os.getuid()}"


class Container:
    """A lab CT: commands over its sshd (CT 200: 127.0.0.1:2222), and playbooks through `inventory`, which
    reaches it as host `ct{vmid}` (its instances listen from `port_base` on; the CTs share the host's
    network)."""

    def __init__(
        self,
        vmid: int = CT_VMID,
        *,
        port: int = CT_SSH_PORT,
        inventory: Path = INVENTORY,
        port_base: int = 30000,
        key: Path = SSH_KEY,
    ) -> None:
        self.vmid, self.port, self.inventory, self.port_base, self.key = vmid, port, inventory, port_base, key
        self.name = f"CT {vmid}"
        self.host = f"ct{vmid}"

    def playbook(self, playbook: str | Path, *args: str, timeout: float = 600) -> PlaybookRun:
        """ansible-playbook through this CT's inventory (see Ansible.playbook)."""
        return run_playbook(playbook, self.inventory, *args, timeout=timeout)

    def _ssh_options(self) -> list[str]:
        _CONTROL_DIR.mkdir(mode=0o700, exist_ok=True)
        options = {
            "StrictHostKeyChecking": "no",
            "UserKnownHostsFile": "/dev/null",
            "LogLevel": "ERROR",
            "BatchMode": "yes",
            "ConnectTimeout": "5",
            "ControlMaster": "auto",
            "ControlPath": str(_CONTROL_DIR / f"{self.port}"),
            "ControlPersist": "60",
        }
        return ["-i", str(self.key), *[arg for k, v in options.items() for arg in ("-o", f"{k}={v}")]]

    def ssh_argv(self, command: str) -> list[str]:
        return ["ssh", "-p", str(self.port), *self._ssh_options(), "root@127.0.0.1", command]

    def run(
        self, command: str, *, check: bool = True, stdin: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.ssh_argv(command), input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"in {self.name}: {command!r} -> rc {proc.returncode}\n{proc.stdout}{proc.stderr}"
            )
        return proc

    def ssh(
        self, command: str, timeout: float = 300, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """run() without the check: the caller looks at returncode, stdout and stderr."""
        return self.run(command, check=False, stdin=stdin, timeout=timeout)

    def out(self, command: str) -> str:
        return self.run(command).stdout.strip()

    def put(self, path: str, text: str, mode: str = "0644") -> None:
        quoted, tmp = shlex.quote(path), shlex.quote(f"{path}.tmp")
        self.run(
            f"mkdir -p $(dirname {quoted}) && cat > {tmp} && chmod {mode} {tmp} && mv {tmp} {quoted}",
            stdin=text,
        )

    def copy(self, local: Path, path: str) -> None:
        """A file of this machine to `path` in the CT, over the same connection."""
        argv = ["scp", "-q", "-P", str(self.port), *self._ssh_options(), str(local), f"root@127.0.0.1:{path}"]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)

    def reachable(self) -> bool:
        try:
            return self.run("true", check=False, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def wait_reachable(self, timeout: float = 60) -> None:
        wait_until(self.reachable, timeout=timeout, what=f"{self.name} answers SSH on 127.0.0.1:{self.port}")

    def disconnect(self) -> None:
        """Close the master connection (when the CT goes away, or at the end of the session)."""
        subprocess.run(
            ["ssh", "-p", str(self.port), *self._ssh_options(), "-O", "exit", "root@127.0.0.1"],
            capture_output=True,
            timeout=10,
            check=False,
        )

    def unit_props(self, unit: str, props: Sequence[str]) -> dict[str, str]:
        out = self.out(f"systemctl show {shlex.quote(unit)} " + " ".join(f"--property={p}" for p in props))
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


# -- where the role tests converge -------------------------------------------------------------------


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
            "sglfleet_gpus_expected": False,  # as inventory/lab declares (LocalTarget has no group_vars)
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
    """A lab CT, reached through its own inventory."""

    def __init__(self, work: Path, container: Container) -> None:
        self.work = work
        self.root = LAB_ROOT
        self.module_python = LAB_MODULE_PYTHON
        self.inventory = container.inventory
        self.container = container

    def play(self, playbook: str, *extra: str, overrides: dict | None = None) -> PlaybookRun:
        # toolchain.yml installs the driver userspace for the module the lab declares; test_host_phase,
        # maybe running beside these in the other session, changes that declaration for a while.
        with module_steady():
            return super().play(playbook, *extra, overrides=overrides)

    def sh(self, script: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return self.container.run(f"bash -c {shlex.quote(script)}", check=False, timeout=timeout)


@functools.cache
def lab_vars() -> dict:
    """inventory/lab/group_vars/all/lab.yml: the lab's PVE API, node, CT and CA."""
    return yaml.safe_load((INVENTORY / "group_vars" / "all" / "lab.yml").read_text())
