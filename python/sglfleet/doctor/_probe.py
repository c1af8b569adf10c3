"""Read-only first look at a PVE node or a fleet container, for playbooks/doctor.yml.

Runs on the target with its own python3 (``ansible.builtin.script``), standard library only: the node has
no sglfleet, and a container on first contact may not have it yet. It changes nothing: it reads /proc,
stats /dev and the given paths, and prints one JSON object of what it saw. sglfleet.doctor decides what
that means (on the controller).

    python3 _probe.py [--port N]... [--path P]... [--model-dir D]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import stat
import sys
from typing import Any

__all__ = ["char_majors"]

# nv.c writes "NVRM version: NVIDIA UNIX ... Kernel Module  580.95.05  ..." into /proc/driver/nvidia/version.
MODULE_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)\s")
TOOLS = ("modprobe", "rmmod", "lsmod", "depmod", "nvidia-modprobe", "nvidia-smi")
TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# /proc/net/tcp{,6}: "sl local_address rem_address st ... inode"; st 0A is TCP_LISTEN
# (the kernel's include/net/tcp_states.h).
TCP_LISTEN = "0A"


def char_majors(text: str) -> dict[str, int]:
    """The "Character devices:" section of /proc/devices as {name: major}."""
    majors: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        if line.strip() == "Character devices:":
            in_char = True
        elif line.strip().endswith("devices:"):
            in_char = False
        elif in_char and line.strip():
            number, _, name = line.strip().partition(" ")
            if number.isdigit():
                majors.setdefault(name.strip(), int(number))
    return majors


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def device_nodes(dev: str = "/dev") -> dict[str, dict[str, Any]]:
    nodes = {}
    try:
        names = sorted(n for n in os.listdir(dev) if n.startswith("nvidia"))
    except OSError:
        names = []
    for name in names:
        try:
            # stat, not lstat: PVE (PVE/Tools.pm stat) and nvidia-modprobe follow links to the node
            st = os.stat(os.path.join(dev, name))
        except OSError:
            continue
        is_char = stat.S_ISCHR(st.st_mode)
        nodes[name] = {
            "char": is_char,
            "major": os.major(st.st_rdev) if is_char else None,
            "minor": os.minor(st.st_rdev) if is_char else None,
        }
    return nodes


def _existing_ancestor(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and path != "/":
        path = os.path.dirname(path)
    return path


def disks(paths: list[str]) -> list[dict[str, Any]]:
    out = []
    for path in paths:
        probed = _existing_ancestor(path)
        try:
            free = shutil.disk_usage(probed).free
        except OSError:
            free = None
        out.append({"path": path, "probed": probed, "free_bytes": free})
    return out


def _listening_inodes(ports: set[int]) -> dict[int, set[str]]:
    found: dict[int, set[str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (_read(table) or "").splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != TCP_LISTEN:
                continue
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if port in ports:
                found.setdefault(port, set()).add(fields[9])
    return found


def _unit_of(pid: str) -> str | None:
    for line in (_read(f"/proc/{pid}/cgroup") or "").splitlines():
        for part in reversed(line.rsplit(":", 1)[-1].split("/")):
            if part.endswith((".service", ".scope")):
                return part
    return None


def listeners(ports: list[int]) -> dict[str, list[dict[str, Any]]]:
    """{port: [{pid, comm, unit}]} of the wanted ports that something listens on; an empty list when the
    socket's owner is not a process of this host (another container on a shared network namespace)."""
    inodes = _listening_inodes(set(ports))
    wanted = {f"socket:[{inode}]": port for port, found in inodes.items() for inode in found}
    owners: dict[int, list[dict[str, Any]]] = {port: [] for port in inodes}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target in wanted:
                comm = (_read(f"/proc/{pid}/comm") or "?").strip()
                owners[wanted[target]].append({"pid": int(pid), "comm": comm, "unit": _unit_of(pid)})
    return {str(port): found for port, found in sorted(owners.items())}


def model(directory: str | None) -> dict[str, Any] | None:
    if not directory:
        return None
    config_path = os.path.join(directory, "config.json")
    exists = os.path.isdir(directory)
    out: dict[str, Any] = {"dir": directory, "exists": exists, "config": None, "error": None}
    text = _read(config_path)
    if text is None:
        out["error"] = f"no {config_path}" if out["exists"] else f"no directory {directory}"
        return out
    try:
        config = json.loads(text)
    except ValueError as error:
        out["error"] = f"{config_path} is not JSON: {error}"
        return out
    if not isinstance(config, dict):
        out["error"] = f"{config_path} is not a JSON object"
        return out
    out["config"] = {k: config.get(k) for k in ("model_type", "architectures", "torch_dtype")}
    return out


def probe(ports: list[int], paths: list[str], model_dir: str | None) -> dict[str, Any]:
    version_text = _read("/proc/driver/nvidia/version")
    found = MODULE_VERSION.search(version_text or "")
    try:
        gpus: int | None = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        gpus = None
    return {
        "proc_devices": char_majors(_read("/proc/devices") or ""),
        "nodes": device_nodes(),
        "module_version": found.group(1) if found else None,
        "module_version_file": version_text is not None,
        "proc_gpus": gpus,
        "tools": {tool: shutil.which(tool, path=TOOL_PATH) for tool in TOOLS},
        "disks": disks(paths),
        "listeners": listeners(ports),
        "model": model(model_dir),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="doctor probe")
    parser.add_argument("--port", type=int, action="append", default=[])
    parser.add_argument("--path", action="append", default=[])
    parser.add_argument("--model-dir", default=None)
    args = parser.parse_args(argv)
    print(json.dumps(probe(args.port, args.path, args.model_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
