"""What the doctor concludes from one host's probe (sglfleet.doctor._probe's JSON): one row per check,
every check run whatever the others found, so that the table lists every blocker at once."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sglfleet.doctor import _driver as drv
from sglfleet.doctor._report import Row, Status

__all__ = ["DiskNeed", "HostExpect", "ModelSource", "NodeTable", "check_host", "expected_nodes", "node_table"]

# The NVIDIA character major is fixed (NV_MAJOR_DEVICE_NUMBER, 195): /dev/nvidiaN is 195:N and
# /dev/nvidiactl 195:255; nvidia-uvm's major is dynamic, read from /proc/devices, its nodes :0 and :1
# (nvidia-modprobe 610.43.03 nvidia-modprobe-utils.c; the lab's node runs Debian's binary against them).
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
# The names /proc/devices gives the 195 region: nvidia.ko registers it as "nvidia" and "nvidiactl"
# (open-gpu-kernel-modules kernel-open/nvidia/nv.c nvidia_init_module: nv_register_chrdev(0, ..., "nvidia")
# and nv_register_chrdev(255, 1, ..., "nvidiactl")); drivers before the open modules as "nvidia-frontend"
# (nv-frontend.c). nvidia-uvm.ko takes a dynamic major named "nvidia-uvm" (nvidia-modprobe reads it the
# same way, nvidia_get_chardev_major).
NVIDIA_NAMES = ("nvidia", "nvidia-frontend")
UVM_NAME = "nvidia-uvm"
GIB = 1024**3
COMMIT = re.compile(r"^[0-9a-f]{40}$")
NO_GPU = "inventory declares no GPU (sglfleet_gpus_expected=false)"
# What needs which tool: the node loads modules and makes nodes; nvidia-installer (phase toolchain, in the
# CT) looks for modprobe, rmmod, lsmod and depmod even with --no-kernel-modules.
TOOLS = {"node": ("modprobe", "nvidia-modprobe"), "ct": ("modprobe", "rmmod", "lsmod", "depmod")}


@dataclass(frozen=True)
class DiskNeed:
    path: str
    need_gib: float
    what: str


@dataclass(frozen=True)
class ModelSource:
    source: str  # "mount" (a directory bind-mounted from the node) or "hf" (hf download of a revision)
    dir: str
    hf_repo: str = ""
    hf_revision: str = ""


@dataclass(frozen=True)
class HostExpect:
    role: str  # "node" or "ct"
    gpus_expected: bool
    gpu_count: int | None = None
    min_branch: int = drv.MIN_BRANCH
    full_driver: str = drv.FULL_DRIVER
    disks: Sequence[DiskNeed] = ()
    ports: Sequence[int] = ()
    model: ModelSource | None = None
    # ct: the driver versions the inventory has an installer checksum for (nvidia_userspace_checksums)
    checksummed_versions: Sequence[str] | None = None
    # ports held by these units are the fleet's own (a re-run of the doctor on a running fleet)
    own_units: str = r"^sglang@\d+\.service$"


def expected_nodes(
    gpu_count: int, uvm_major: int | None, nvidia_major: int | None = NVIDIA_MAJOR
) -> dict[str, tuple[int | None, int]]:
    """{name: (major, minor)} of the nodes a host with `gpu_count` GPUs needs (a major None: /proc/devices
    does not list the module's)."""
    nodes: dict[str, tuple[int | None, int]] = {f"nvidia{i}": (nvidia_major, i) for i in range(gpu_count)}
    nodes["nvidiactl"] = (nvidia_major, NVIDIACTL_MINOR)
    nodes["nvidia-uvm"] = (uvm_major, 0)
    nodes["nvidia-uvm-tools"] = (uvm_major, 1)
    return nodes


@dataclass(frozen=True)
class NodeTable:
    """A PVE node's device nodes as they are against what they must be (role pve_host's probe), each as
    `"<path> <major>:<minor>"`, a major /proc/devices does not list written `?`."""

    majors: dict[str, str]  # {"nvidia": "195", "nvidia-uvm": "511" or "?"}
    expected: list[str]
    found: list[str]  # the character devices among the paths stat looked at
    wrong: list[str]  # the paths missing, not character devices, or of another major:minor

    def as_dict(self) -> dict[str, Any]:
        return {"majors": self.majors, "expected": self.expected, "found": self.found, "wrong": self.wrong}


def node_table(gpu_count: int, majors: Mapping[str, int], stat_lines: Sequence[str]) -> NodeTable:
    """What role pve_host concludes from /proc/devices' character majors (`majors`, as `char_majors`
    reads them) and `stat -L --format='%n %Hr:%Lr %F'` of the node paths: the same `expected_nodes` the
    doctor checks against."""
    nvidia = next((majors[name] for name in NVIDIA_NAMES if name in majors), None)
    uvm = majors.get(UVM_NAME)
    expected = [
        f"/dev/{name} {'?' if major is None else major}:{minor}"
        for name, (major, minor) in expected_nodes(gpu_count, uvm, nvidia).items()
    ]
    suffix = " character special file"
    found = [line[: -len(suffix)] for line in stat_lines if line.endswith(suffix)]
    wrong = [want.split(" ")[0] for want in expected if want not in found]
    shown = {"nvidia": nvidia, UVM_NAME: uvm}
    return NodeTable({k: "?" if v is None else str(v) for k, v in shown.items()}, expected, found, wrong)


def _fix_gpu(role: str) -> str:
    if role == "node":
        return (
            "phase host (playbooks/host.yml): pve_host loads nvidia and nvidia_uvm and makes the nodes "
            "(nvidia-modprobe -c N per GPU, -c 255, then -u -c 0)"
        )
    return (
        "phase provision (playbooks/provision.yml) with proxmox_lxc_gpu_count: N passes /dev/nvidia0..N-1, "
        "/dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia-uvm-tools (the node must have them: phase host)"
    )


class _Rows:
    def __init__(self, host: str) -> None:
        self.host = host
        self.rows: list[Row] = []

    def add(self, check: str, status: Status, found: str, fix: str = "") -> None:
        self.rows.append(Row(check, self.host, status, found, fix if status is not Status.OK else ""))


def _driver(out: _Rows, probe: Mapping[str, Any], expect: HostExpect) -> None:
    version = probe.get("module_version")
    if not expect.gpus_expected:
        out.add("driver", Status.SKIPPED, NO_GPU)
    elif version is None:
        out.add(
            "driver",
            Status.BLOCKER,
            "no /proc/driver/nvidia/version: the nvidia kernel module is not loaded",
            "install an NVIDIA driver >= " + str(expect.min_branch) + " on the node, then phase host",
        )
    else:
        try:
            support = drv.driver_support(version, expect.min_branch, expect.full_driver)
        except ValueError as exc:
            out.add("driver", Status.BLOCKER, f"/proc/driver/nvidia/version: {exc}", "reinstall the driver")
            return
        branch = version.split(".")[0]
        upgrade = (
            f"CUDA {drv.CUDA_TOOLKIT} needs driver >= {expect.full_driver} (release notes, Table 3): "
            "upgrade the driver on the node (with its kernel module) and reboot, then phase toolchain"
        )
        if support is drv.DriverSupport.BLOCKED:
            out.add(
                "driver",
                Status.BLOCKER,
                f"kernel module {version}, branch {branch}: CUDA 13 does not start below branch "
                f"{expect.min_branch}",
                upgrade,
            )
        elif support is drv.DriverSupport.COMPAT:
            found = drv.COMPAT_FOUND.format(toolkit=drv.CUDA_TOOLKIT)
            out.add("driver", Status.WARN, f"kernel module {version}: {found}", upgrade)
        else:
            out.add(
                "driver", Status.OK, f"kernel module {version} (branch {branch}, CUDA {drv.CUDA_TOOLKIT})"
            )


def _device_nodes(out: _Rows, probe: Mapping[str, Any], expect: HostExpect) -> None:
    if not expect.gpus_expected:
        out.add("device nodes", Status.SKIPPED, NO_GPU)
        return
    majors: Mapping[str, int] = probe.get("proc_devices") or {}
    nodes: Mapping[str, Mapping[str, Any]] = probe.get("nodes") or {}
    problems = []
    nvidia_major = next((majors[name] for name in NVIDIA_NAMES if name in majors), None)
    if nvidia_major is None:
        problems.append("/proc/devices has no nvidia (195) entry")
    elif nvidia_major != NVIDIA_MAJOR:
        problems.append(f"/proc/devices gives nvidia major {nvidia_major}, not {NVIDIA_MAJOR}")
    uvm_major = majors.get(UVM_NAME)
    if uvm_major is None:
        problems.append("/proc/devices has no nvidia-uvm entry (nvidia_uvm not loaded)")
    count = expect.gpu_count if expect.gpu_count is not None else _count_gpu_nodes(nodes)
    missing, wrong = [], []
    for name, (major, minor) in expected_nodes(count, uvm_major).items():
        node = nodes.get(name)
        if node is None:
            missing.append(f"/dev/{name}")
        elif not node.get("char"):
            wrong.append(f"/dev/{name} is not a character device")
        elif major is not None and (node.get("major"), node.get("minor")) != (major, minor):
            is_now = f"{node.get('major')}:{node.get('minor')}"
            wrong.append(f"/dev/{name} is {is_now}, /proc/devices wants {major}:{minor}")
    if missing:
        problems.append("missing " + ", ".join(missing))
    problems += wrong
    if problems:
        out.add("device nodes", Status.BLOCKER, "; ".join(problems), _fix_gpu(expect.role))
    else:
        out.add(
            "device nodes",
            Status.OK,
            f"nvidia0..{count - 1} {NVIDIA_MAJOR}:0..{count - 1}, "
            f"nvidiactl {NVIDIA_MAJOR}:{NVIDIACTL_MINOR}, "
            f"nvidia-uvm {uvm_major}:0, nvidia-uvm-tools {uvm_major}:1",
        )


def _count_gpu_nodes(nodes: Mapping[str, Mapping[str, Any]]) -> int:
    return sum(1 for name, node in nodes.items() if name[6:].isdigit() and node.get("char"))


def _gpu_count(out: _Rows, probe: Mapping[str, Any], expect: HostExpect) -> None:
    if not expect.gpus_expected:
        out.add("GPU count", Status.SKIPPED, NO_GPU)
        return
    if expect.gpu_count is None:
        out.add("GPU count", Status.SKIPPED, "the inventory names no GPU count for this host")
        return
    if expect.role == "node":
        found, where = probe.get("proc_gpus"), "/proc/driver/nvidia/gpus"
        fix = "check the GPUs with nvidia-smi on the node, or set pve_host_gpu_count to what it has"
    else:
        found, where = _count_gpu_nodes(probe.get("nodes") or {}), "/dev/nvidiaN in the CT"
        fix = "set proxmox_lxc_gpu_count to the GPUs the CT should see, then phase provision"
    if found is None:
        out.add("GPU count", Status.BLOCKER, f"no {where}: the driver sees no GPU", fix)
    elif found < expect.gpu_count:
        out.add(
            "GPU count", Status.BLOCKER, f"{found} in {where}, the inventory expects {expect.gpu_count}", fix
        )
    elif found > expect.gpu_count:
        out.add("GPU count", Status.WARN, f"{found} in {where}, the inventory uses {expect.gpu_count}", fix)
    else:
        out.add("GPU count", Status.OK, f"{found} ({where}), as the inventory says")


def _tools(out: _Rows, probe: Mapping[str, Any], expect: HostExpect) -> None:
    tools: Mapping[str, str | None] = probe.get("tools") or {}
    wanted = TOOLS.get(expect.role, ())
    missing = [t for t in wanted if not tools.get(t)]
    if not missing:
        out.add("kmod", Status.OK, ", ".join(str(tools[t]) for t in wanted))
    elif expect.role == "ct":
        out.add(
            "kmod",
            Status.WARN,
            "no " + ", ".join(missing) + " (nvidia-installer looks for them even with --no-kernel-modules)",
            "apt-get install kmod in the CT (phase toolchain needs it before the driver installer runs)",
        )
    elif not expect.gpus_expected:
        out.add("kmod", Status.SKIPPED, NO_GPU + "; no " + ", ".join(missing))
    else:
        out.add(
            "kmod",
            Status.BLOCKER,
            "no " + ", ".join(missing) + " on the node",
            "apt-get install kmod nvidia-modprobe on the node (phase host then loads the modules)",
        )


def _disks(out: _Rows, probe: Mapping[str, Any], expect: HostExpect) -> None:
    seen = {d.get("path"): d for d in probe.get("disks") or []}
    for need in expect.disks:
        found = seen.get(need.path)
        check = f"disk: {need.what}"
        if found is None or found.get("free_bytes") is None:
            out.add(
                check, Status.WARN, f"could not read the free space for {need.path}", "check df on the host"
            )
            continue
        free = found["free_bytes"] / GIB
        where = f"{free:.1f} GiB free at {found.get('probed')} (for {need.path})"
        if free < need.need_gib:
            out.add(
                check,
                Status.BLOCKER,
                f"{where}, needs {need.need_gib:g} GiB",
                f"free space there or grow the CT's root disk (proxmox_lxc_rootfs), or move {need.path}",
            )
        else:
            out.add(check, Status.OK, f"{where}, needs {need.need_gib:g} GiB")


def _ports(out: _Rows, probe: Mapping[str, Any], expect: HostExpect) -> None:
    if not expect.ports:
        return
    held: Mapping[str, list[Mapping[str, Any]]] = probe.get("listeners") or {}
    own = re.compile(expect.own_units)
    taken, ours = [], []
    for port in expect.ports:
        owners = held.get(str(port))
        if owners is None:
            continue
        if owners and all(own.match(o.get("unit") or "") for o in owners):
            ours.append(f"{port} ({owners[0]['unit']})")
            continue
        who = (
            ", ".join(f"pid {o['pid']} {o['comm']} ({o.get('unit') or 'no unit'})" for o in owners)
            or "a process outside this host (a shared network namespace)"
        )
        taken.append(f"{port} by {who}")
    span = f"{min(expect.ports)}-{max(expect.ports)}" if len(expect.ports) > 1 else str(expect.ports[0])
    if taken:
        out.add(
            "ports",
            Status.BLOCKER,
            "taken: " + "; ".join(taken),
            "stop what holds them, or move the fleet's ports (sglang_fleet_port_base)",
        )
    else:
        suffix = f"; the fleet's own: {', '.join(ours)}" if ours else ""
        out.add("ports", Status.OK, f"{span} free{suffix}")


def _model(out: _Rows, probe: Mapping[str, Any], expect: HostExpect) -> None:
    source = expect.model
    if source is None:
        return
    seen: Mapping[str, Any] = probe.get("model") or {}
    config = seen.get("config")
    described = ""
    if config:
        described = ", ".join(
            f"{k} {v if not isinstance(v, list) else '/'.join(map(str, v))}" for k, v in config.items() if v
        )
    if source.source == "hf":
        if not source.hf_repo or not COMMIT.match(source.hf_revision or ""):
            out.add(
                "model source",
                Status.BLOCKER,
                f"hf repo {source.hf_repo or '(none)'!s} at revision {source.hf_revision or '(none)'!s}",
                "set model_weights_hf_repo and model_weights_hf_revision to the full 40-hex commit id",
            )
        elif config:
            pinned = f"{source.hf_repo}@{source.hf_revision[:12]}"
            out.add("model source", Status.OK, f"{pinned} in {source.dir}: {described}")
        else:
            out.add(
                "model source",
                Status.WARN,
                f"{source.hf_repo}@{source.hf_revision[:12]} not downloaded yet "
                f"({seen.get('error') or 'no config.json'})",
                "phase model (playbooks/model.yml) downloads it; the Hub is not contacted by this check",
            )
        return
    if config:
        out.add("model source", Status.OK, f"{source.dir}: {described}")
    else:
        out.add(
            "model source",
            Status.BLOCKER,
            f"{source.source}: {seen.get('error') or 'no config.json in ' + source.dir}",
            "bind-mount the model directory from the node (proxmox_lxc_mounts) at model_weights_dir, "
            "or use model_weights_source: hf with a pinned revision",
        )


def _checksum(out: _Rows, probe: Mapping[str, Any], expect: HostExpect) -> None:
    if expect.checksummed_versions is None:
        return
    version = probe.get("module_version")
    if not expect.gpus_expected and version is None:
        out.add("driver installer checksum", Status.SKIPPED, NO_GPU)
    elif version is None:
        out.add(
            "driver installer checksum", Status.SKIPPED, "no kernel module version to look up (see driver)"
        )
    elif version in expect.checksummed_versions:
        out.add("driver installer checksum", Status.OK, f"nvidia_userspace_checksums lists {version}")
    else:
        listed = ", ".join(sorted(expect.checksummed_versions)) or "none"
        out.add(
            "driver installer checksum",
            Status.BLOCKER,
            f"the module is {version}; nvidia_userspace_checksums lists {listed}",
            f'add "{version}": "sha256:<sha256sum of NVIDIA-Linux-x86_64-{version}.run>" to the inventory',
        )


def check_host(
    host: str, expect: HostExpect, probe: Mapping[str, Any] | None, unreachable: str = ""
) -> list[Row]:
    """Every check of one host. A host that could not be probed gets one BLOCKER row naming why."""
    out = _Rows(host)
    if probe is None:
        fix = "phase provision creates and starts the CT" if expect.role == "ct" else "check SSH to the node"
        out.add("reachable", Status.BLOCKER, unreachable or "no answer", fix)
        return out.rows
    for check in (_driver, _device_nodes, _gpu_count, _tools, _checksum, _disks, _ports, _model):
        check(out, probe, expect)
    return out.rows
