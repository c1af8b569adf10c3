"""Real LXC containers for the lab: made from the template, sharing the host's network, systemd as init.

Every method blocks (it runs lxc-* tools); the PVE bridge calls them in a worker thread. A container
is named by its vmid and lives in settings.lxc_path/<vmid>/ (config, rootfs, console log).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from sglfleet_testing.router import write_model_dir

from .hostaccess import HostAccess
from .settings import LabSettings
from .template import mask_units

MIB = 1024 * 1024
# Stock PVE sizes, used when the config has none.
DEFAULT_MEMORY_MIB = 512
DEFAULT_SWAP_MIB = 512


class LxcError(RuntimeError):
    """An LXC operation failed; the message says which and why."""


@dataclass(frozen=True)
class Shape:
    """What the lab realises of a container's PVE config."""

    hostname: str
    cores: int | None = None
    memory: int = DEFAULT_MEMORY_MIB  # MiB
    swap: int = DEFAULT_SWAP_MIB  # MiB

    @classmethod
    def from_config(cls, vmid: int, config: dict) -> Shape:
        cores = config.get("cores")
        return cls(
            hostname=str(config.get("hostname") or f"CT{vmid}"),
            cores=int(cores) if cores not in (None, "") else None,
            memory=int(config.get("memory") or DEFAULT_MEMORY_MIB),
            swap=int(config.get("swap") if config.get("swap") not in (None, "") else DEFAULT_SWAP_MIB),
        )


@dataclass(frozen=True)
class State:
    """A container as LXC sees it."""

    vmid: int
    running: bool
    pid: int | None = None


# Lab container 0 is the stand-in PVE node (node.py), not a PVE guest; its sshd is on 127.0.0.1:2022.
NODE_VMID = 0


@dataclass
class LxcHost:
    """The lab's containers on this machine."""

    settings: LabSettings
    access: HostAccess = field(default_factory=HostAccess.from_host)
    # cgroup v2 only (a unified hierarchy at /sys/fs/cgroup) or v1 / hybrid, as this host has.
    cgroup_v2: bool = field(default_factory=lambda: Path("/sys/fs/cgroup/cgroup.controllers").is_file())

    # ------------------------------------------------------------ paths

    def path(self, vmid: int) -> Path:
        return self.settings.lxc_path / str(vmid)

    def rootfs(self, vmid: int) -> Path:
        return self.path(vmid) / "rootfs"

    def exists(self, vmid: int) -> bool:
        return (self.path(vmid) / "config").is_file()

    def vmids(self) -> list[int]:
        """The containers the lab holds, by vmid."""
        if not self.settings.lxc_path.is_dir():
            return []
        return sorted(int(p.name) for p in self.settings.lxc_path.iterdir() if p.name.isdigit())

    # ------------------------------------------------------------ lifecycle

    def create(
        self, vmid: int, template: Path, shape: Shape, ssh_keys: str = "", password: str | None = None
    ) -> None:
        """Unpack the template into a new container and prepare it for its first boot."""
        port = self.settings.ssh_port(vmid)
        if not 0 < port < 65536:
            raise LxcError(
                f"vmid {vmid}: its sshd port would be {port}; the lab takes vmids up to "
                f"{65535 - self.settings.ssh_port_base}"
            )
        if self.exists(vmid):
            raise LxcError(f"container {vmid} already exists in {self.path(vmid)}")
        if not template.is_file():
            raise LxcError(f"template {template} is missing: run `python -m sglfleet_testing.lab up`")
        rootfs = self.rootfs(vmid)
        rootfs.mkdir(parents=True)
        try:
            unpack(template, rootfs)
            self._prepare(vmid, shape, ssh_keys, password)
            self.write_config(vmid, shape)
        except BaseException:
            shutil.rmtree(self.path(vmid), ignore_errors=True)
            raise

    def _prepare(self, vmid: int, shape: Shape, ssh_keys: str, password: str | None) -> None:
        rootfs = self.rootfs(vmid)
        mask_units(rootfs)
        self.access.install(rootfs)
        set_hostname(rootfs, shape.hostname)
        put_model_store(rootfs)
        sshd = rootfs / "etc/ssh/sshd_config.d"
        sshd.mkdir(parents=True, exist_ok=True)
        (sshd / "sglfleet-lab.conf").write_text(
            "# The lab container shares the host's network: listen on loopback, on its own port.\n"
            f"Port {self.settings.ssh_port(vmid)}\nListenAddress 127.0.0.1\n"
            "PermitRootLogin prohibit-password\n"
        )
        _run(["ssh-keygen", "-A", "-f", str(rootfs)], f"making sshd host keys of {vmid}")
        if ssh_keys.strip():
            dot_ssh = rootfs / "root/.ssh"
            dot_ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
            keys = dot_ssh / "authorized_keys"
            keys.write_text(ssh_keys.strip() + "\n")
            keys.chmod(0o600)
        if password:
            _run(
                ["chroot", str(rootfs), "chpasswd"],
                f"setting root's password in {vmid}",
                stdin=f"root:{password}\n",
            )

    def config_text(self, vmid: int, shape: Shape) -> str:
        """The LXC config of the container: privileged, systemd as init, the host's network namespace."""
        rootfs = self.rootfs(vmid)
        lines = [
            "# Written by the sglfleet lab (python -m sglfleet_testing.lab); rewritten on every change.",
            "lxc.include = /usr/share/lxc/config/common.conf",
            "lxc.arch = amd64",
            f"lxc.uts.name = {shape.hostname}",
            f"lxc.rootfs.path = dir:{rootfs}",
            # No network of its own: the host's namespace, whose interfaces the container never configures.
            "lxc.net.0.type = none",
            # ... and cannot: without CAP_NET_ADMIN, root in the container cannot change links, addresses or
            # routes (/proc/sys is read-only too: proc:mixed).
            "lxc.cap.drop = net_admin",
            # systemd boots as init with these, on a host without AppArmor and with cgroup v1 or v2.
            "lxc.apparmor.profile = unconfined",
            "lxc.mount.auto = proc:mixed sys:ro cgroup:mixed",
            "lxc.init.cmd = /sbin/init",
            "lxc.autodev = 1",
            "lxc.tty.max = 2",
            "lxc.pty.max = 64",
            f"lxc.console.logfile = {self.path(vmid) / 'console.log'}",
            "lxc.environment = container=lxc",
        ]
        lines += [f"{key} = {value}" for key, value in self.limits(shape)]
        lines += [f"lxc.mount.entry = {entry}" for entry in self.access.mount_entries()]
        # The host's /proc/driver as a CT on a GPU node sees it (the declared nvidia module version,
        # driver.py): mounted after proc (lxc.mount.auto comes first), read-only as the real one is.
        if vmid == NODE_VMID:
            # The stand-in PVE node (node.py): its kernel's files are the lab's, read-write for the
            # stand-in kernel's loader (the PCI functions read-only, as sysfs' are); /dev/char, which
            # udev makes on a real host, is a tmpfs in its /dev.
            node = self.settings.state_dir / "node"
            lines += [
                f"lxc.mount.entry = {node / 'proc-driver'} proc/driver none bind 0 0",
                f"lxc.mount.entry = {node / 'proc-devices'} proc/devices none bind 0 0",
                f"lxc.mount.entry = {node / 'sys-module'} sys/module none bind 0 0",
                f"lxc.mount.entry = {node / 'pci-devices'} sys/bus/pci/devices none ro,bind 0 0",
                "lxc.mount.entry = tmpfs dev/char tmpfs rw,nosuid,noexec,mode=0755,create=dir 0 0",
            ]
            return "\n".join(lines) + "\n"
        proc_driver = self.settings.state_dir / "proc-driver"
        if proc_driver.is_dir():
            lines.append(f"lxc.mount.entry = {proc_driver} proc/driver none ro,bind 0 0")
        return "\n".join(lines) + "\n"

    def limits(self, shape: Shape, live: bool = False) -> list[tuple[str, str]]:
        """The cgroup settings of a shape as LXC config keys: memory, and cores as a CPU quota
        (live: also the "no quota" value a running container needs when cores are dropped)."""
        quota = shape.cores * 100000 if shape.cores else None
        if self.cgroup_v2:
            out = [("lxc.cgroup2.memory.max", str(shape.memory * MIB))]
            if quota or live:
                out.append(("lxc.cgroup2.cpu.max", f"{quota or 'max'} 100000"))
            return out
        out = [("lxc.cgroup.memory.limit_in_bytes", str(shape.memory * MIB))]
        if quota:
            out.append(("lxc.cgroup.cpu.cfs_period_us", "100000"))
        if quota or live:
            out.append(("lxc.cgroup.cpu.cfs_quota_us", str(quota or -1)))
        return out

    def write_config(self, vmid: int, shape: Shape) -> None:
        config = self.path(vmid) / "config"
        partial = config.with_name("config.partial")
        partial.write_text(self.config_text(vmid, shape))
        partial.rename(config)

    def configure(self, vmid: int, shape: Shape) -> None:
        """Apply a changed shape: the config for the next start, and now what a running container can take."""
        self.write_config(vmid, shape)
        set_hostname(self.rootfs(vmid), shape.hostname)
        if not self.state(vmid).running:
            return
        for key, value in self.limits(shape, live=True):
            self._lxc("lxc-cgroup", vmid, key.split(".", 2)[2], value)
        self._lxc("lxc-attach", vmid, "--", "hostname", shape.hostname)

    def start(self, vmid: int, timeout: float = 30) -> State:
        """Start the container (systemd as init); returns once LXC says it runs."""
        if self.state(vmid).running:
            raise LxcError(f"container {vmid} is already running")
        self._lxc("lxc-start", vmid, "-d", "-o", str(self.path(vmid) / "lxc.log"), "-l", "NOTICE")
        self._lxc("lxc-wait", vmid, "-s", "RUNNING", "-t", str(int(timeout)))
        return self.state(vmid)

    def shutdown(self, vmid: int, timeout: float) -> bool:
        """Ask init to power off; True once it stopped within timeout, False if it still runs."""
        if not self.state(vmid).running:
            return True
        subprocess.run(
            [
                "lxc-stop",
                "-P",
                str(self.settings.lxc_path),
                "-n",
                str(vmid),
                "-t",
                str(max(1, int(timeout))),
                "--nokill",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        return not self.state(vmid).running

    def stop(self, vmid: int) -> None:
        """Kill the container at once (PVE's stop)."""
        if self.state(vmid).running:
            self._lxc("lxc-stop", vmid, "-k")
        deadline = time.monotonic() + 10
        while self.state(vmid).running and time.monotonic() < deadline:
            time.sleep(0.1)

    def destroy(self, vmid: int) -> None:
        """Kill it if it runs, then remove it and everything LXC made for it."""
        if not self.path(vmid).exists():
            return
        if self.exists(vmid):
            self.stop(vmid)
            subprocess.run(
                ["lxc-destroy", "-P", str(self.settings.lxc_path), "-n", str(vmid), "-f"],
                capture_output=True,
                text=True,
                check=False,
            )
        if self.path(vmid).exists():
            shutil.rmtree(self.path(vmid))

    def state(self, vmid: int) -> State:
        if not self.exists(vmid):
            return State(vmid, running=False)
        done = subprocess.run(
            ["lxc-info", "-P", str(self.settings.lxc_path), "-n", str(vmid), "-s", "-p"],
            capture_output=True,
            text=True,
            check=False,
        )
        info = dict(line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
        running = info.get("State", "").strip() == "RUNNING"
        pid_text = info.get("PID", "").strip()
        pid = int(pid_text) if running and pid_text.isdigit() else None
        return State(vmid, running=running, pid=pid)

    def ssh_port(self, vmid: int) -> int:
        return self.settings.ssh_port(vmid)

    def _lxc(self, tool: str, vmid: int, *args: str) -> str:
        return _run([tool, "-P", str(self.settings.lxc_path), "-n", str(vmid), *args], f"{tool} {vmid}")


def set_hostname(rootfs: Path, hostname: str) -> None:
    """/etc/hostname and the 127.0.1.1 line of /etc/hosts, as PVE writes them."""
    (rootfs / "etc/hostname").write_text(hostname + "\n")
    hosts = rootfs / "etc/hosts"
    lines = [
        line
        for line in (hosts.read_text().splitlines() if hosts.exists() else [])
        if not line.startswith("127.0.1.1")
    ]
    if not any(line.split()[:1] == ["127.0.0.1"] for line in lines):
        lines.insert(0, "127.0.0.1\tlocalhost")
    lines.append(f"127.0.1.1\t{hostname}")
    hosts.write_text("\n".join(lines) + "\n")


# What a real CT gets from a mount point of the host's model storage: the stand-in's "weights".
LAB_MODEL_DIR = "srv/models/standin-7b"


def put_model_store(rootfs: Path) -> None:
    model = rootfs / LAB_MODEL_DIR
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text('{"architectures": ["StandinForCausalLM"], "model_type": "standin"}\n')
    # What the real SGLang router loads (sglang_router's tokenizer registry reads the model dir)
    write_model_dir(model)


def unpack(template: Path, rootfs: Path) -> None:
    """Unpack a .tar.zst template into rootfs, owners and modes as stored."""
    zstd = subprocess.Popen(["zstd", "-dc", str(template)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tar = subprocess.run(
        ["tar", "--numeric-owner", "--xattrs", "--acls", "-C", str(rootfs), "-xf", "-"],
        stdin=zstd.stdout,
        capture_output=True,
        text=True,
        check=False,
    )
    assert zstd.stdout is not None and zstd.stderr is not None
    zstd.stdout.close()
    zstd_err = zstd.stderr.read().decode(errors="replace")
    if zstd.wait() != 0 or tar.returncode != 0:
        raise LxcError(f"unpacking {template} failed: {(zstd_err + tar.stderr).strip()[-800:]}")


def _run(cmd: list[str], what: str, stdin: str | None = None, timeout: float = 120) -> str:
    try:
        done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise LxcError(f"{what}: {cmd[0]} did not finish in {timeout:.0f} s") from e
    if done.returncode != 0:
        raise LxcError(
            f"{what} failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-800:]}"
        )
    return done.stdout
