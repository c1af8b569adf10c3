"""sglfleet.doctor: every check of a host runs whatever the others found; device nodes are judged by their
major:minor against /proc/devices; a skip names the inventory's decision; the table lists every row."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sglfleet.doctor import (
    DiskNeed,
    HostExpect,
    ModelSource,
    ProvisionNeeds,
    Row,
    Status,
    _probe,
    check_host,
    missing_privileges,
    render,
)

GIB = 1024**3
# As a 580+ driver registers 195 (open-gpu-kernel-modules nv.c nvidia_init_module: "nvidia", "nvidiactl").
PROC_DEVICES = (
    "Character devices:\n  1 mem\n195 nvidia\n195 nvidiactl\n511 nvidia-uvm\n\nBlock devices:\n  8 sd\n"
)
COMMIT = "5d1a7c0f3b2e4d6a8c9b0e1f2a3b4c5d6e7f8a9b"


def node(major: int, minor: int) -> dict:
    return {"char": True, "major": major, "minor": minor}


def healthy(gpus: int = 8) -> dict:
    nodes = {f"nvidia{i}": node(195, i) for i in range(gpus)}
    nodes |= {"nvidiactl": node(195, 255), "nvidia-uvm": node(511, 0), "nvidia-uvm-tools": node(511, 1)}
    return {
        "proc_devices": _probe.char_majors(PROC_DEVICES),
        "nodes": nodes,
        "module_version": "595.58.03",
        "proc_gpus": gpus,
        "tools": {t: f"/usr/sbin/{t}" for t in ("modprobe", "rmmod", "lsmod", "depmod", "nvidia-modprobe")},
        "disks": [{"path": "/opt/cuda-13.2", "probed": "/opt", "free_bytes": 50 * GIB}],
        "listeners": {},
        "model": {"dir": "/srv/m", "exists": True, "config": {"model_type": "llama"}, "error": None},
    }


def ct(**kw) -> HostExpect:
    base = {
        "role": "ct",
        "gpus_expected": True,
        "gpu_count": 8,
        "disks": [DiskNeed("/opt/cuda-13.2", 4, "CUDA toolchain")],
        "ports": list(range(30000, 30008)),
        "model": ModelSource("mount", "/srv/m"),
        "checksummed_versions": ["595.58.03"],
    }
    return HostExpect(**(base | kw))


def by_check(rows: list[Row]) -> dict[str, Row]:
    return {row.check: row for row in rows}


def test_a_healthy_gpu_ct_has_only_ok_rows() -> None:
    rows = check_host("ct200", ct(), healthy())
    assert [r.status for r in rows] == [Status.OK] * len(rows), render(rows)
    assert "nvidia-uvm 511:0, nvidia-uvm-tools 511:1" in by_check(rows)["device nodes"].found


def test_the_uvm_nodes_of_the_old_loop_are_named_with_their_wrong_minors() -> None:
    """The `-u -c7` loop made only nvidia-uvm 511:7 and nvidia-uvm-tools 511:8 (issue 19)."""
    probe = healthy()
    probe["nodes"] = {"nvidia-uvm": node(511, 7), "nvidia-uvm-tools": node(511, 8)}
    row = by_check(check_host("kpro6", ct(role="node"), probe))["device nodes"]
    assert row.status is Status.BLOCKER
    assert "missing /dev/nvidia0, /dev/nvidia1" in row.found and "/dev/nvidiactl" in row.found
    assert "/dev/nvidia-uvm is 511:7, /proc/devices wants 511:0" in row.found
    assert "/dev/nvidia-uvm-tools is 511:8, /proc/devices wants 511:1" in row.found
    assert "phase host" in row.fix


def test_a_node_that_is_not_a_character_device_or_a_missing_uvm_major_is_a_blocker() -> None:
    probe = healthy(1)
    probe["nodes"]["nvidia0"] = {"char": False, "major": None, "minor": None}
    probe["proc_devices"] = {"nvidia": 195}
    row = by_check(check_host("ct200", ct(gpu_count=1), probe))["device nodes"]
    assert "/dev/nvidia0 is not a character device" in row.found
    assert "no nvidia-uvm entry" in row.found


def test_every_blocker_is_listed_at_once() -> None:
    probe = healthy()
    probe["module_version"] = "550.54.14"
    probe["nodes"] = {}
    probe["listeners"] = {"30001": [{"pid": 42, "comm": "python3", "unit": "squat.service"}]}
    probe["disks"][0]["free_bytes"] = 1 * GIB
    probe["model"] = {"dir": "/srv/m", "exists": False, "config": None, "error": "no directory /srv/m"}
    rows = by_check(check_host("ct200", ct(), probe))
    blocked = {check for check, row in rows.items() if row.status is Status.BLOCKER}
    assert blocked == {
        "driver",
        "device nodes",
        "GPU count",
        "driver installer checksum",
        "disk: CUDA toolchain",
        "ports",
        "model source",
    }
    assert "branch 550" in rows["driver"].found
    assert rows["ports"].found == "taken: 30001 by pid 42 python3 (squat.service)"
    assert all(row.fix for row in rows.values() if row.status is Status.BLOCKER)


def test_the_fleets_own_instances_holding_its_ports_are_ok() -> None:
    probe = healthy()
    probe["listeners"] = {"30000": [{"pid": 7, "comm": "python", "unit": "sglang@0.service"}]}
    row = by_check(check_host("ct200", ct(), probe))["ports"]
    assert row.status is Status.OK and "sglang@0.service" in row.found


def test_a_skip_is_the_inventorys_decision_and_says_so() -> None:
    probe = healthy()
    probe |= {"nodes": {}, "module_version": None, "proc_gpus": None, "proc_devices": {}}
    rows = by_check(check_host("ct200", ct(gpus_expected=False), probe))
    for check in ("driver", "device nodes", "GPU count", "driver installer checksum"):
        assert rows[check].status is Status.SKIPPED
        assert rows[check].found == "inventory declares no GPU (sglfleet_gpus_expected=false)"


def test_a_host_that_should_have_gpus_and_shows_none_names_the_missing_module() -> None:
    probe = healthy()
    probe |= {"nodes": {}, "module_version": None, "proc_gpus": None, "proc_devices": {}}
    rows = by_check(check_host("kpro6", ct(role="node"), probe))
    assert rows["driver"].status is Status.BLOCKER
    assert "no /proc/driver/nvidia/version" in rows["driver"].found
    assert "no nvidia (195) entry" in rows["device nodes"].found


def test_an_unpinned_hf_model_is_a_blocker_and_one_not_downloaded_yet_a_warning() -> None:
    probe = healthy()
    probe["model"] = {"dir": "/srv/m", "exists": False, "config": None, "error": "no directory /srv/m"}
    unpinned = ct(model=ModelSource("hf", "/srv/m", "org/m", "main"))
    assert by_check(check_host("ct200", unpinned, probe))["model source"].status is Status.BLOCKER
    pinned = ct(model=ModelSource("hf", "/srv/m", "org/m", COMMIT))
    row = by_check(check_host("ct200", pinned, probe))["model source"]
    assert row.status is Status.WARN and "not downloaded yet" in row.found


def test_an_unreachable_host_is_one_blocker_row() -> None:
    rows = check_host("ct200", ct(), None, "Failed to connect to the host via ssh")
    assert rows == [
        Row(
            "reachable",
            "ct200",
            Status.BLOCKER,
            "Failed to connect to the host via ssh",
            "phase provision creates and starts the CT",
        )
    ]


def test_the_table_lists_every_row_and_a_verdict() -> None:
    rows = check_host("ct200", ct(gpus_expected=False), healthy())
    lines = render(rows)
    assert lines[0].split() == ["check", "host", "status", "found", "fix"]
    assert len(lines) == len(rows) + 3
    assert lines[-1].startswith("no blocker found: 0 BLOCKER")
    blocked = render([Row("ports", "ct200", Status.BLOCKER, "taken", "move them")])
    assert blocked[-1].startswith("blocked: 1 BLOCKER")


NEEDS = ProvisionNeeds(node="kpro6", vmid=200, storage="local-lvm", template_storage="local")


def test_privileges_propagate_from_ancestors_and_missing_ones_are_named() -> None:
    everything = {"/": dict.fromkeys(("VM.Allocate", "VM.Audit", "VM.PowerMgmt", "Datastore.Audit"), 1)}
    everything["/vms"] = dict.fromkeys(
        ("VM.Config.CPU", "VM.Config.Disk", "VM.Config.Memory", "VM.Config.Network", "VM.Config.Options"), 1
    )
    everything["/storage/local-lvm"] = {"Datastore.AllocateSpace": 0}
    assert missing_privileges(everything, NEEDS) == []
    not_propagated = everything | {"/vms": dict.fromkeys(everything["/vms"], 0)}
    assert "VM.Config.CPU on /vms/200" in missing_privileges(not_propagated, NEEDS)
    privileged = ProvisionNeeds(**{**NEEDS.__dict__, "unprivileged": False})
    assert missing_privileges(everything, privileged) == ["Sys.Modify on /"]


def test_the_probe_reads_proc_devices_char_section_only() -> None:
    assert _probe.char_majors(PROC_DEVICES) == {"mem": 1, "nvidia": 195, "nvidiactl": 195, "nvidia-uvm": 511}


def test_a_driver_before_the_open_modules_names_195_nvidia_frontend() -> None:
    probe = healthy()
    old = PROC_DEVICES.replace("195 nvidia\n195 nvidiactl", "195 nvidia-frontend")
    probe["proc_devices"] = _probe.char_majors(old)
    assert probe["proc_devices"] == {"mem": 1, "nvidia-frontend": 195, "nvidia-uvm": 511}
    assert by_check(check_host("ct200", ct(), probe))["device nodes"].status is Status.OK


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
def test_the_probe_follows_a_symlinked_node_as_pve_and_nvidia_modprobe_stat_do(tmp_path: Path) -> None:
    """PVE's stat() (PVE/Tools.pm) and nvidia-modprobe's follow links: a link to the node is the node."""
    os.mknod(tmp_path / "real-nvidiactl", 0o600 | stat.S_IFCHR, os.makedev(195, 255))
    (tmp_path / "nvidiactl").symlink_to(tmp_path / "real-nvidiactl")
    (tmp_path / "nvidia-dangling").symlink_to(tmp_path / "gone")
    nodes = _probe.device_nodes(str(tmp_path))
    assert nodes == {"nvidiactl": {"char": True, "major": 195, "minor": 255}}


def test_the_probe_finds_who_listens_and_reads_the_models_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["X"]}))
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        out = subprocess.run(
            [
                sys.executable,
                _probe.__file__,
                f"--port={port}",
                f"--path={tmp_path}/no/such",
                f"--model-dir={tmp_path}",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    seen = json.loads(out.stdout)
    owners = seen["listeners"][str(port)]
    assert os.getpid() in [owner["pid"] for owner in owners]
    assert seen["disks"][0]["probed"] == str(tmp_path)
    assert seen["model"]["config"] == {"model_type": "llama", "architectures": ["X"], "torch_dtype": None}


@pytest.mark.parametrize("missing", ["modprobe", "nvidia-modprobe"])
def test_a_node_without_kmod_or_nvidia_modprobe_is_blocked(missing: str) -> None:
    probe = healthy()
    probe["tools"][missing] = None
    row = by_check(check_host("kpro6", ct(role="node"), probe))["kmod"]
    assert row.status is Status.BLOCKER and missing in row.found
