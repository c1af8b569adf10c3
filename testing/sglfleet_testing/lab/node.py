"""The lab's stand-in PVE node: a second lab container for the `pve_hosts` role, never this machine's kernel.

Role pve_host loads the NVIDIA modules (modprobe), makes the device nodes (nvidia-modprobe -u -cN) and
reads /proc/modules and /proc/driver/nvidia/version. The lab has no NVIDIA hardware and must never load
a module into its own kernel, so the node is lab container NODE_VMID (systemd as init, sshd on
127.0.0.1:2022) whose kernel-facing parts are stand-ins:

- /proc/driver of the node is a directory of the lab (<state>/node/proc-driver), bind-mounted over the
  container's procfs; the loaded modules are listed in /run/sglfleet-standin/modules (/proc/modules'
  format; the lab's inventory points pve_host_proc_modules there: this machine's kernel may have no
  /proc/modules at all), which a boot empties as the kernel's list is;
- /usr/sbin/modprobe: loads `nvidia` (only when a driver is declared installed: <state>/node/driver
  holds its version) by adding its /proc/modules line and writing /proc/driver/nvidia/version in the
  real module's format; `nvidia_uvm` (and `nvidia_modeset`, `nvidia_drm`) load `nvidia` first, as their
  module dependencies do; anything else fails with modprobe's own "Module X not found";
- /usr/bin/nvidia-modprobe: `-c N` loads nvidia and makes /dev/nvidiaN (char 195:N) and /dev/nvidiactl
  (195:255); `-u` loads nvidia_uvm and makes /dev/nvidia-uvm (510:0) and /dev/nvidia-uvm-tools (510:1),
  as NVIDIA's nvidia-modprobe does (it mknods what udev would not).

`reboot_node` is a boot: the container stops, "the kernel" forgets its modules, and it starts again,
so only what the role set up for boot (its unit) makes the device nodes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .container import NODE_VMID, LxcHost, Shape
from .driver import check_version
from .settings import LabSettings

MODPROBE = r"""#!/bin/bash
# Stand-in modprobe of the sglfleet lab's PVE node: the "kernel" is /proc/modules and /proc/driver,
# files of the lab bind-mounted into this container.
state=/etc/sglfleet-standin
modules=/run/sglfleet-standin/modules
mkdir -p "$(dirname "$modules")" && touch "$modules"
loaded() { grep -q "^$1 " "$modules"; }
load_nvidia() {
  loaded nvidia && return 0
  if [ ! -s "$state/driver" ]; then
    echo "modprobe: FATAL: Module nvidia not found in directory /lib/modules/$(uname -r)" >&2
    return 1
  fi
  version=$(cat "$state/driver")
  echo "nvidia 104071168 0 - Live 0x0000000000000000 (POE)" >> "$modules"
  mkdir -p /proc/driver/nvidia
  {
    echo "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  $version  Release Build " \
      " (sglfleet-lab@stand-in)  Thu Jan  1 00:00:00 UTC 2026"
    echo "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)"
  } > /proc/driver/nvidia/version
}
for arg in "$@"; do
  case "$arg" in
    -*) continue ;;
    nvidia) load_nvidia || exit 1 ;;
    nvidia_uvm|nvidia-uvm|nvidia_modeset|nvidia_drm)
      load_nvidia || exit 1
      name=${arg//-/_}
      loaded "$name" || echo "$name 1933312 0 - Live 0x0000000000000000 (POE)" >> "$modules"
      ;;
    *) echo "modprobe: FATAL: Module $arg not found in directory /lib/modules/$(uname -r)" >&2; exit 1 ;;
  esac
done
"""

NVIDIA_MODPROBE = r"""#!/bin/bash
# Stand-in nvidia-modprobe of the sglfleet lab's PVE node: loads the modules through modprobe and makes
# the device nodes, as NVIDIA's does (-c N: /dev/nvidiaN and /dev/nvidiactl; -u: the nvidia-uvm nodes).
make() { [ -c "$1" ] || mknod -m 666 "$1" c "$2" "$3"; }
while [ $# -gt 0 ]; do
  case "$1" in
    -u|--unified-memory)
      /usr/sbin/modprobe nvidia_uvm || exit 1
      make /dev/nvidia-uvm 510 0 && make /dev/nvidia-uvm-tools 510 1 || exit 1
      ;;
    -c*)
      minor=${1#-c}
      if [ -z "$minor" ]; then shift; minor=$1; fi
      /usr/sbin/modprobe nvidia || exit 1
      make "/dev/nvidia$minor" 195 "$minor" && make /dev/nvidiactl 195 255 || exit 1
      ;;
    *) echo "nvidia-modprobe: unknown option $1" >&2; exit 1 ;;
  esac
  shift
done
"""


def node_dir(settings: LabSettings) -> Path:
    return settings.state_dir / "node"


def declare_node_driver(settings: LabSettings, version: str | None) -> None:
    """The driver installed on the node (its kernel module's version), or None for no driver."""
    etc = _etc(settings)
    etc.mkdir(parents=True, exist_ok=True)
    if version is None:
        (etc / "driver").unlink(missing_ok=True)
    else:
        (etc / "driver").write_text(check_version(version) + "\n")


def _etc(settings: LabSettings) -> Path:
    return LxcHost(settings).rootfs(NODE_VMID) / "etc/sglfleet-standin"


def _fresh_kernel(settings: LabSettings) -> None:
    """What a boot gives: no /proc/driver/nvidia (the module list is in /run, which the boot empties)."""
    base = node_dir(settings)
    shutil.rmtree(base / "proc-driver", ignore_errors=True)
    (base / "proc-driver").mkdir(parents=True)


def _install_stand_ins(rootfs: Path) -> None:
    for path, text in (("usr/sbin/modprobe", MODPROBE), ("usr/bin/nvidia-modprobe", NVIDIA_MODPROBE)):
        target = rootfs / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(0o755)


def ensure_node(settings: LabSettings, lxc: LxcHost, ssh_keys: str, driver: str | None = "580.95.05") -> bool:
    """Create (with `driver` installed) and start the stand-in node; True if anything was done."""
    did = False
    if not lxc.exists(NODE_VMID):
        _fresh_kernel(settings)
        lxc.create(NODE_VMID, settings.template_path, Shape(hostname=settings.node), ssh_keys)
        declare_node_driver(settings, driver)
        did = True
    _install_stand_ins(lxc.rootfs(NODE_VMID))
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
    lxc.configure(NODE_VMID, Shape(hostname=settings.node))
    lxc.start(NODE_VMID)
