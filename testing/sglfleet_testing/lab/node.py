"""The lab's stand-in PVE node: a lab container for the `pve_hosts` role, never this machine's kernel.

Role pve_host loads the NVIDIA modules (modprobe), makes the device nodes (nvidia-modprobe) and starts
nvidia-persistenced. The node is lab container NODE_VMID (systemd as init, sshd on 127.0.0.1:2022) and
runs the REAL programs where Debian has them; only the kernel and the hardware beneath them are stood in
for. The lab never loads a module into this machine's kernel.

Real, from Debian's archive (`apt-get download` with a private apt configuration, cached in
<cache>/node-debs, installed with dpkg into the node's rootfs):

- kmod 30+20221128-1 (bookworm main): modprobe, rmmod, lsmod, depmod. Its module tree is the node's
  /lib/modules/$(uname -r) as `depmod` writes it with no module files, and /etc/modprobe.d/sglfleet-
  standin-nvidia.conf gives the nvidia modules `install` commands (modprobe.d(5): "install modulename
  command...: run this command instead of inserting the module in the kernel normally"), so the real
  modprobe resolves them, checks whether they are loaded (libkmod's kmod_module_get_initstate reads
  /sys/module/<name>/initstate) and runs the stand-in kernel's `load` in place of init_module(2). With
  no driver declared installed the file is absent and the real modprobe says "Module nvidia not found".
- nvidia-modprobe 570.133.07-1 (trixie contrib, Debian 13, what PVE 9 is built on). Debian 12's
  535.161.07 decides "loaded" from /proc/modules (NVIDIA/nvidia-modprobe 535.113.01
  modprobe-utils/nvidia-modprobe-utils.c:129-155; the 535.161.07 binary names "/proc/modules" and not
  "initstate"), which a kernel built without modules (this machine's) does not have and which no bind
  mount can add to procfs; from 560.28.03 on it reads /sys/module/<name>/initstate
  (is_kernel_module_loaded, nvidia-modprobe-utils.c:99-122 at 610.43.03), which the stand-in has.
  The -c/-u handling the role relies on is the same in both (nvidia-modprobe.c main(), 208-258).

What nvidia-modprobe reads and writes (610.43.03, modprobe-utils/), and what stands in for it here:

- /sys/module/<name>/initstate (is_kernel_module_loaded, :99-122): <state>/node/sys-module bind-mounted
  read-write over the node's /sys/module; `load` writes "live" into it, as the kernel's module sysfs does.
- /sys/bus/pci/devices/*/config, 48 bytes of config space: vendor at 0, class at 10-11 (pci-sysfs.c
  find_matches/pci_sysfs_read_cfg; modprobe_helper matches vendor 0x10DE, base class 0x03,
  nvidia-modprobe-utils.c:195-252, and loads nothing without a match): <state>/node/pci-devices, one
  directory per function with `config`, `vendor`, `device` and `class` (sysfs' own files), bind-mounted
  read-only over /sys/bus/pci/devices: 8 RTX PRO 6000 (10de:2bb5, class 0x030200) and a host bridge.
- /proc/sys/kernel/modprobe, else /sbin/modprobe (:254-299), spawned as `modprobe <name>` with
  PATH=/sbin (:186-187): the real kmod's modprobe (this kernel has no /proc/sys/kernel/modprobe).
- /proc/devices, "Character devices:" section, a line ending in "nvidia-uvm" (nvidia_get_chardev_major,
  :657-724): <state>/node/proc-devices, bind-mounted read-write over /proc/devices: this machine's list at
  each boot, to which `load` adds "195 nvidia" and "195 nvidiactl" (open-gpu-kernel-modules
  kernel-open/nvidia/nv.c nvidia_init_module: nv_register_chrdev(0, ..., "nvidia") then
  nv_register_chrdev(255, 1, ..., "nvidiactl"), both by register_chrdev_region; drivers before the open
  modules registered "nvidia-frontend", nv-frontend.c), "236 nvidia-caps" (dynamic; a name with "nvidia" in it
  that is not UVM's) and "511 nvidia-uvm" (dynamic, deliberately not 510, so code that hardcodes one shows).
- /proc/driver/nvidia/params, DeviceFileUID/GID/Mode and ModifyDeviceFiles (init_device_file_parameters,
  :367-414): written by `load` with the module's defaults (0, 0, 0666, 1); /proc/driver/nvidia/version in
  the real module's format. <state>/node/proc-driver is bind-mounted read-write over /proc/driver.
- mknod(2) in /dev (mknod_helper, :549-636) and a /dev/char/<major>:<minor> link (symlink_char_dev,
  :478-541; a failure there fails nvidia-modprobe). The node's /dev is LXC's autodev tmpfs, where LXC's
  common.conf allows mknod of any character device ("c *:* m"); /dev/char, which udev makes on a real
  host (its /dev/char/MAJ:MIN links), is a tmpfs the node's config mounts.

The stand-in kernel's `load` (/usr/local/lib/sglfleet-standin/load, run by the real modprobe) refuses
`nvidia` when no NVIDIA GPU is on the bus (the module's init finds no device: ENODEV, which modprobe
reports as "could not insert 'nvidia': No such device") and `nvidia_uvm` without `nvidia` (its symbols
come from nvidia.ko: "Unknown symbol in module"); the errors are worded as kmod's modprobe words them
("modprobe: ERROR: could not insert '%s': %s"). These two refusals are the lab's reading, not a quoted
driver line.

nvidia-persistenced: Debian's package needs the driver's libnvidia-cfg.so.1 and a driver behind
/dev/nvidiactl, so the node has a cited stand-in (NVIDIA/nvidia-persistenced 595.71.05
nvidia-persistenced.c): it forks (daemonize makes /var/run/nvidia-persistenced and writes and locks the
PID file, :838-990); the parent exits 0 once the child signals init_complete() (:1028), which it does only
after setup_nvidia_cfg_api, setup_devices and setup_rpc have succeeded (:1010-1031), and 1 with
"nvidia-persistenced failed to initialize. Check syslog for more details." (:269) when the child cannot
start: here, when the nvidia module is not loaded or /dev/nvidiactl is missing.

`reboot_node` is a boot: the container stops, "the kernel" forgets its modules and majors, /dev is
fresh, and it starts again, so only what the role set up for boot (its units) makes the device nodes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .container import NODE_VMID, LxcHost, Shape
from .driver import MODULE_LINE, check_version
from .settings import LabSettings
from .template import host_debian_mirror


@dataclass(frozen=True)
class Package:
    """A Debian package the node runs for real, pinned to the version the lab was checked against."""

    name: str
    version: str
    suite: str
    component: str

    @property
    def deb(self) -> str:
        return f"{self.name}_{self.version.split(':')[-1]}_amd64.deb"


NODE_PACKAGES = (
    Package("kmod", "30+20221128-1", "bookworm", "main"),
    Package("nvidia-modprobe", "570.133.07-1", "trixie", "contrib"),
)
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"

# The node's GPUs: 8 functions of vendor 0x10de, class 0x030200 (3D controller), as kpro6's, and a host
# bridge that is not a GPU.
GPU_DEVICE_ID = 0x2BB5
DEFAULT_GPUS = 8
NVIDIA_MAJOR = 195  # NV_MAJOR_DEVICE_NUMBER, fixed
CAPS_MAJOR = 236
UVM_MAJOR = 511  # dynamic on a real kernel; not 510, so hardcoding shows

STANDIN_DIR = "usr/local/lib/sglfleet-standin"
MODPROBE_CONF = "etc/modprobe.d/sglfleet-standin-nvidia.conf"

# The stand-in kernel's module loader, run by the real modprobe through the install commands below.
LOAD = r"""#!/usr/bin/python3
# The sglfleet lab's stand-in for init_module(2) of the NVIDIA modules on the stand-in PVE node: what the
# kernel makes visible when nvidia.ko / nvidia-uvm.ko initialise (testing/sglfleet_testing/lab/node.py).
import os, sys

name = sys.argv[1].replace("-", "_")
root = os.environ.get("SGLFLEET_STANDIN_ROOT", "")  # "" on the node; a directory in the lab's unit tests
sysmod = f"{root}/sys/module"
pci = f"{root}/sys/bus/pci/devices"


def loaded(module):
    return os.access(f"{sysmod}/{module}/initstate", os.R_OK)


def add_majors(*entries):
    # /proc/devices, "Character devices:" section, sorted by major, "%3d %s" (fs/char_dev.c chrdev_show)
    with open(f"{root}/proc/devices", "r+") as f:
        text = f.read()
        chars, sep, rest = text.partition("\n\n")
        head, *lines = chars.split("\n")
        have = {line.split(None, 1)[1] for line in lines if line.strip()}
        lines += [f"{major:3d} {label}" for major, label in entries if label not in have]
        lines.sort(key=lambda line: int(line.split()[0]))
        f.seek(0)
        f.write("\n".join([head, *lines]) + sep + rest)
        f.truncate()


def live(module):
    os.makedirs(f"{sysmod}/{module}", exist_ok=True)
    with open(f"{sysmod}/{module}/initstate", "w") as f:
        f.write("live\n")


if loaded(name):
    sys.exit(0)
if name == "nvidia":
    version = open(f"{root}/etc/sglfleet-standin/driver").read().strip()
    gpus = 0
    for dev in os.listdir(pci):
        with open(f"{pci}/{dev}/config", "rb") as f:
            config = f.read(48)
        if config[0:2] == b"\xde\x10" and config[11] == 0x03:
            gpus += 1
    if not gpus:
        print("modprobe: ERROR: could not insert 'nvidia': No such device", file=sys.stderr)
        sys.exit(1)
    os.makedirs(f"{root}/proc/driver/nvidia", exist_ok=True)
    with open(f"{root}/proc/driver/nvidia/version", "w") as f:
        f.write(@MODULE_LINE@.format(version=version))
    with open(f"{root}/proc/driver/nvidia/params", "w") as f:
        f.write("ModifyDeviceFiles: 1\nDeviceFileUID: 0\nDeviceFileGID: 0\nDeviceFileMode: 438\n")
    add_majors((@NVIDIA_MAJOR@, "nvidia"), (@NVIDIA_MAJOR@, "nvidiactl"), (@CAPS_MAJOR@, "nvidia-caps"))
    live("nvidia")
elif name == "nvidia_uvm":
    if not loaded("nvidia"):
        print("modprobe: ERROR: could not insert 'nvidia_uvm': Unknown symbol in module", file=sys.stderr)
        sys.exit(1)
    add_majors((@UVM_MAJOR@, "nvidia-uvm"))
    live("nvidia_uvm")
else:
    print(f"modprobe: ERROR: could not insert '{name}': Operation not permitted", file=sys.stderr)
    sys.exit(1)
"""

# The modules of the declared driver, for the real modprobe (modprobe.d(5) "install"); nvidia_uvm loads
# nvidia first, as its dependency on nvidia.ko (modules.dep) would.
MODPROBE_INSTALL = f"""# sglfleet lab: the stand-in kernel's NVIDIA modules (sglfleet_testing/lab/node.py)
install nvidia /{STANDIN_DIR}/load nvidia
install nvidia_uvm /sbin/modprobe nvidia && /{STANDIN_DIR}/load nvidia_uvm
"""

# nvidia-persistenced as NVIDIA/nvidia-persistenced 595.71.05 nvidia-persistenced.c starts: a forked child
# makes /var/run/nvidia-persistenced and writes its PID file; the parent exits 0 once the child is up
# (init_complete(), :1028, after setup_nvidia_cfg_api/setup_devices/setup_rpc, :1010-1031), 1 with the
# message of :269 otherwise.
PERSISTENCED = r"""#!/bin/bash
# Stand-in nvidia-persistenced of the sglfleet lab's PVE node (testing/sglfleet_testing/lab/node.py).
if [ ! -r /sys/module/nvidia/initstate ] || [ ! -c /dev/nvidiactl ]; then
  logger -t nvidia-persistenced "Failed to open /dev/nvidiactl: the nvidia module is not loaded" 2>/dev/null
  echo "nvidia-persistenced failed to initialize. Check syslog for more details." >&2
  exit 1
fi
mkdir -p /var/run/nvidia-persistenced
pid=/var/run/nvidia-persistenced/nvidia-persistenced.pid
( setsid bash -c 'echo $$ > "$0"; exec sleep infinity' "$pid" </dev/null >/dev/null 2>&1 & )
for _ in $(seq 50); do
  [ -s "$pid" ] && exit 0
  sleep 0.1
done
echo "nvidia-persistenced failed to initialize. Check syslog for more details." >&2
exit 1
"""


def loader_text() -> str:
    """The stand-in kernel's loader as installed on the node."""
    return (
        LOAD.replace("@MODULE_LINE@", repr(MODULE_LINE))
        .replace("@NVIDIA_MAJOR@", str(NVIDIA_MAJOR))
        .replace("@CAPS_MAJOR@", str(CAPS_MAJOR))
        .replace("@UVM_MAJOR@", str(UVM_MAJOR))
    )


def node_dir(settings: LabSettings) -> Path:
    return settings.state_dir / "node"


def debs_dir(settings: LabSettings) -> Path:
    return settings.cache_dir / "node-debs"


def _etc(settings: LabSettings) -> Path:
    return LxcHost(settings).rootfs(NODE_VMID) / "etc/sglfleet-standin"


def declare_node_driver(settings: LabSettings, version: str | None) -> None:
    """The driver installed on the node (its kernel modules' version), or None for no driver: then the
    modules are unknown to modprobe."""
    etc = _etc(settings)
    etc.mkdir(parents=True, exist_ok=True)
    if version is None:
        (etc / "driver").unlink(missing_ok=True)
    else:
        (etc / "driver").write_text(check_version(version) + "\n")
    _sync_modules(LxcHost(settings).rootfs(NODE_VMID))


def _sync_modules(rootfs: Path) -> None:
    """The modprobe.d install commands exist exactly when a driver is declared installed."""
    conf = rootfs / MODPROBE_CONF
    if (rootfs / "etc/sglfleet-standin/driver").is_file():
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(MODPROBE_INSTALL)
    else:
        conf.unlink(missing_ok=True)


def declare_node_gpus(settings: LabSettings, count: int = DEFAULT_GPUS) -> None:
    """The NVIDIA GPUs on the node's PCI bus (takes effect at once: the directory is bind-mounted)."""
    pci = node_dir(settings) / "pci-devices"
    pci.mkdir(parents=True, exist_ok=True)
    for old in pci.iterdir():
        shutil.rmtree(old)
    functions = [("0000:00:00.0", 0x8086, 0x1237, 0x060000)]  # a host bridge, not a GPU
    functions += [(f"0000:{0x17 + 0x10 * i:02x}:00.0", 0x10DE, GPU_DEVICE_ID, 0x030200) for i in range(count)]
    for address, vendor, device, klass in functions:
        fn = pci / address
        fn.mkdir()
        config = bytearray(48)
        config[0:2] = vendor.to_bytes(2, "little")
        config[2:4] = device.to_bytes(2, "little")
        config[9:12] = klass.to_bytes(3, "little")  # prog-if, subclass, base class
        config[44:46] = vendor.to_bytes(2, "little")
        (fn / "config").write_bytes(bytes(config))
        (fn / "vendor").write_text(f"0x{vendor:04x}\n")
        (fn / "device").write_text(f"0x{device:04x}\n")
        (fn / "class").write_text(f"0x{klass:06x}\n")


def _fresh_kernel(settings: LabSettings) -> None:
    """What a boot gives: no module loaded, no NVIDIA major, no /proc/driver/nvidia."""
    base = node_dir(settings)
    for name in ("proc-driver", "sys-module"):
        shutil.rmtree(base / name, ignore_errors=True)
        (base / name).mkdir(parents=True)
    host = Path("/proc/devices").read_text()
    kept = [line for line in host.split("\n") if "nvidia" not in line]
    (base / "proc-devices").write_text("\n".join(kept))
    if not (base / "pci-devices").is_dir():
        declare_node_gpus(settings)


def fetch_node_debs(settings: LabSettings) -> list[Path]:
    """Debian's packages of NODE_PACKAGES, downloaded once into the lab's cache (apt-get download with a
    private apt configuration: the host's Debian mirror, the suites and components these need)."""
    out = debs_dir(settings)
    wanted = [out / package.deb for package in NODE_PACKAGES]
    if all(path.is_file() for path in wanted):
        return wanted
    out.mkdir(parents=True, exist_ok=True)
    # apt's state for one download (lists, locks) lives only as long as it: the cache keeps the packages.
    with tempfile.TemporaryDirectory(prefix="sglfleet-node-apt-") as tmp:
        _download_debs(settings, Path(tmp), out)
    missing = [path.name for path in wanted if not path.is_file()]
    if missing:
        raise RuntimeError(f"apt-get download left out {', '.join(missing)} in {out}")
    return wanted


def _download_debs(settings: LabSettings, apt: Path, out: Path) -> None:
    for sub in ("lists/partial", "archives/partial"):
        (apt / sub).mkdir(parents=True, exist_ok=True)
    mirror = host_debian_mirror(release=settings.release)
    (apt / "sources.list").write_text(
        "".join(
            f"deb [signed-by={DEBIAN_KEYRING}] {mirror} {suite} {component}\n"
            for suite, component in sorted({(p.suite, p.component) for p in NODE_PACKAGES})
        )
    )
    options = [
        f"-oDir::Etc::SourceList={apt / 'sources.list'}",
        "-oDir::Etc::SourceParts=/nonexistent",
        f"-oDir::State::Lists={apt / 'lists'}",
        f"-oDir::Cache={apt}",
        "-oAPT::Sandbox::User=root",
    ]
    _run(["apt-get", *options, "-q", "update"], "apt-get update (the node's packages)")
    pins = [f"{package.name}={package.version}" for package in NODE_PACKAGES]
    _run(["apt-get", *options, "-q", "download", *pins], "apt-get download (the node's packages)", cwd=out)


def _install_tools(settings: LabSettings, rootfs: Path) -> None:
    """Debian's kmod and nvidia-modprobe (dpkg in the node's rootfs, again whenever a file of theirs was
    changed), the stand-in kernel's loader and the stand-in nvidia-persistenced."""
    debs = fetch_node_debs(settings)
    names = [package.name for package in NODE_PACKAGES]
    want = {package.name: package.version for package in NODE_PACKAGES}
    query = _chroot(rootfs, ["dpkg-query", "-W", "-f", "${Package} ${Version}\\n", *names], check=False)
    have = dict(line.split(" ", 1) for line in query.stdout.splitlines() if " " in line)
    intact = _chroot(rootfs, ["dpkg", "--verify", *names], check=False)
    if have != want or intact.returncode != 0 or intact.stdout.strip():
        staging = rootfs / "var/cache/sglfleet-standin"
        staging.mkdir(parents=True, exist_ok=True)
        for deb in debs:
            shutil.copy2(deb, staging / deb.name)
        _chroot(rootfs, ["dpkg", "-i", *[f"/var/cache/sglfleet-standin/{deb.name}" for deb in debs]])
    kernel = os.uname().release
    (rootfs / "lib/modules" / kernel).mkdir(parents=True, exist_ok=True)
    _chroot(rootfs, ["depmod", "-a", kernel])  # the real depmod: an empty module tree
    tools = {f"{STANDIN_DIR}/load": loader_text(), "usr/bin/nvidia-persistenced": PERSISTENCED}
    for path, text in tools.items():
        target = rootfs / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(0o755)
    _sync_modules(rootfs)


def ensure_node(settings: LabSettings, lxc: LxcHost, ssh_keys: str, driver: str | None = "580.95.05") -> bool:
    """Create (with `driver` installed) and start the stand-in node; True if anything was done."""
    did = False
    if not lxc.exists(NODE_VMID):
        _fresh_kernel(settings)
        lxc.create(NODE_VMID, settings.template_path, Shape(hostname=settings.node), ssh_keys)
        declare_node_driver(settings, driver)
        did = True
    _install_tools(settings, lxc.rootfs(NODE_VMID))
    if not lxc.state(NODE_VMID).running:
        _fresh_kernel(settings)
        lxc.configure(NODE_VMID, Shape(hostname=settings.node))
        lxc.start(NODE_VMID)
        did = True
    return did


def reboot_node(settings: LabSettings, lxc: LxcHost, timeout: float = 60) -> None:
    """Power the node off and boot it again with a kernel that has loaded nothing."""
    if not lxc.shutdown(NODE_VMID, timeout):
        lxc.stop(NODE_VMID)
    _fresh_kernel(settings)
    _install_tools(settings, lxc.rootfs(NODE_VMID))
    lxc.configure(NODE_VMID, Shape(hostname=settings.node))
    lxc.start(NODE_VMID)


def _chroot(rootfs: Path, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
    done = subprocess.run(
        ["chroot", str(rootfs), *argv], capture_output=True, text=True, env=env, check=False
    )
    if check and done.returncode != 0:
        why = (done.stderr or done.stdout).strip()[-800:]
        raise RuntimeError(f"{' '.join(argv)} in {rootfs} failed: {why}")
    return done


def _run(argv: list[str], what: str, cwd: Path | None = None) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, check=False, timeout=600)
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip()[-800:]
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {why}")
