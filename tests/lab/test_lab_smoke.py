"""The lab smoke test: through proxmoxer, CT 200 from the template, booted with systemd, reached over SSH,
shut down and destroyed; and the lab's promises around it (idempotent up, the host's network untouched)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proxmoxer.core import ResourceException
from sglfleet_testing.lab.container import LxcHost

pytestmark = pytest.mark.timeout(180)


def test_ct_lifecycle_through_the_api(new_ct):
    upid = new_ct.post_create(cores=2, memory=1024)
    # The container is being unpacked in a worker thread: the API keeps answering meanwhile.
    asked = time.monotonic()
    assert new_ct.pve.version.get()["version"]
    assert time.monotonic() - asked < 1.0
    assert new_ct.pve.nodes(new_ct.settings.node).tasks(upid).status.get()["status"] == "running"
    created = new_ct.run_task(upid)
    assert created["exitstatus"] == "OK", created
    log = [line["t"] for line in new_ct.pve.nodes(new_ct.settings.node).tasks(upid).log.get()]
    assert f"lab: container 200 made from {new_ct.settings.template_name}, sshd on 127.0.0.1:2222" in log
    assert new_ct.status() == "stopped"
    config = new_ct.api.config.get()
    assert (config["hostname"], config["cores"], int(config["memory"])) == ("ct200", 2, 1024)

    assert new_ct.start()["exitstatus"] == "OK"
    current = new_ct.api.status.current.get()
    assert current["status"] == "running"
    assert current["pid"] == LxcHost(new_ct.settings).state(new_ct.vmid).pid

    booted = new_ct.ssh("systemctl is-system-running --wait; hostname")
    state, hostname = booted.stdout.split()
    assert state in ("running", "degraded"), booted
    assert hostname == "ct200"

    shutdown = new_ct.run_task(new_ct.api.status.shutdown.post(timeout=30))
    assert shutdown["exitstatus"] == "OK", shutdown
    assert new_ct.status() == "stopped"
    assert not LxcHost(new_ct.settings).state(new_ct.vmid).running

    assert new_ct.run_task(new_ct.api.delete())["exitstatus"] == "OK"
    with pytest.raises(ResourceException, match="does not exist"):
        new_ct.api.config.get()
    assert not (new_ct.settings.lxc_path / str(new_ct.vmid)).exists()


def test_lab_up_on_a_running_lab_is_a_no_op(lab_settings):
    settings = lab_settings
    pid_before = settings.pidfile.read_text()
    template_mtime = settings.template_path.stat().st_mtime_ns
    done = subprocess.run(
        [sys.executable, "-m", "sglfleet_testing.lab", "up"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("lab already up"), done.stdout
    assert settings.pidfile.read_text() == pid_before
    assert settings.template_path.stat().st_mtime_ns == template_mtime


def host_network() -> str:
    """The host's interfaces, addresses, routes and rules (address lifetimes left out: they tick)."""
    out = []
    for cmd in (
        ["ip", "-d", "link"],
        ["ip", "addr"],
        ["ip", "route", "show", "table", "all"],
        ["ip", "-6", "route", "show", "table", "all"],
        ["ip", "rule"],
    ):
        out.append(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return re.sub(r"(valid|preferred)_lft \S+", "", "\n".join(out))


def test_host_network_is_unchanged_by_a_container_boot(new_ct):
    before = host_network()
    new_ct.create()
    new_ct.start()
    booted = new_ct.ssh("systemctl is-system-running --wait")
    assert booted.stdout.strip() in ("running", "degraded"), booted
    masked = new_ct.ssh(
        "systemctl show -p LoadState --value networking.service systemd-networkd.service ifup@eth0.service"
    )
    assert masked.stdout.split() == ["masked"] * 3, masked
    assert host_network() == before
    # Root in the container cannot change the host's network either (no CAP_NET_ADMIN there).
    tamper = new_ct.ssh(
        "ip addr add 198.51.100.7/32 dev lo || ip link set lo mtu 1280 || ip route add 198.51.100.0/24 dev lo"
    )
    assert tamper.returncode != 0
    assert "Operation not permitted" in tamper.stderr
    new_ct.run_task(new_ct.api.status.shutdown.post(timeout=30))
    assert host_network() == before


def test_config_changes_are_realised(new_ct):
    new_ct.create(cores=1, memory=512)
    new_ct.api.config.put(hostname="renamed", cores=2, memory=768)
    lxc_config = (new_ct.settings.lxc_path / "200" / "config").read_text()
    assert "lxc.uts.name = renamed" in lxc_config
    assert f"lxc.cgroup.memory.limit_in_bytes = {768 * 1024**2}" in lxc_config
    assert "lxc.cgroup.cpu.cfs_quota_us = 200000" in lxc_config

    new_ct.start()
    seen = new_ct.ssh("hostname; cat /sys/fs/cgroup/memory/memory.limit_in_bytes")
    assert seen.stdout.split() == ["renamed", str(768 * 1024**2)], seen
    assert cpu_quota(new_ct) == 200000

    # A running container takes memory and cores at once, as on PVE.
    new_ct.api.config.put(memory=640, cores=1)
    seen = new_ct.ssh("cat /sys/fs/cgroup/memory/memory.limit_in_bytes")
    assert seen.stdout.split() == [str(640 * 1024**2)], seen
    assert cpu_quota(new_ct) == 100000
    assert int(new_ct.api.config.get()["memory"]) == 640


def cpu_quota(new_ct) -> int:
    """The container's CFS quota, read on the host (systemd in the container hides the cpu controller)."""
    cmd = ["lxc-cgroup", "-P", str(new_ct.settings.lxc_path), "-n", str(new_ct.vmid), "cpu.cfs_quota_us"]
    return int(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def test_gpu_passthrough_is_root_pam_only_and_ignored(new_ct, root_pve):
    new_ct.create()
    with pytest.raises(ResourceException, match="403"):
        new_ct.api.config.put(dev0="/dev/nvidia0")
    as_root = root_pve.nodes(new_ct.settings.node).lxc(new_ct.vmid)
    as_root.config.put(dev0="/dev/nvidia0,mode=0666")
    assert as_root.config.get()["dev0"] == "/dev/nvidia0,mode=0666"
    assert new_ct.start()["exitstatus"] == "OK"
    assert new_ct.ssh("test ! -e /dev/nvidia0").returncode == 0


def test_a_container_that_powers_off_shows_stopped(new_ct):
    new_ct.create()
    new_ct.start()
    assert new_ct.ssh("systemctl is-system-running --wait").stdout.strip() in ("running", "degraded")
    new_ct.ssh("systemctl poweroff")

    # Each way of reading a container's status asks LXC: the CT list, the cluster's resources, its status.
    def listed() -> str:
        return {c["vmid"]: c["status"] for c in new_ct.pve.nodes(new_ct.settings.node).lxc.get()}[new_ct.vmid]

    def resource() -> str:
        return {r["vmid"]: r["status"] for r in new_ct.pve.cluster.resources.get(type="vm")}[new_ct.vmid]

    deadline = time.monotonic() + 30
    while resource() != "stopped" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert resource() == listed() == new_ct.status() == "stopped"
    assert new_ct.start()["exitstatus"] == "OK"
    pid = new_ct.api.status.current.get()["pid"]
    assert new_ct.run_task(new_ct.api.status.reboot.post(timeout=30))["exitstatus"] == "OK"
    rebooted = new_ct.api.status.current.get()
    assert rebooted["status"] == "running"
    assert rebooted["pid"] != pid
    assert new_ct.ssh("systemctl is-system-running --wait").stdout.strip() in ("running", "degraded")


def test_the_container_takes_the_hosts_package_access(new_ct):
    new_ct.create()
    new_ct.start()
    host_files = [
        Path(path)
        for path in (
            "/etc/resolv.conf",
            "/etc/ssl/certs/ca-certificates.crt",
            "/etc/pip.conf",
            "/etc/apt/sources.list",
        )
        if Path(path).is_file()
    ]
    host_files += sorted(p for p in Path("/etc/apt/sources.list.d").glob("*") if p.is_file())
    assert host_files, "the host has none of the files the lab carries"
    for path in host_files:
        assert new_ct.ssh(f"cat {path}").stdout == path.read_text(), path
    if not Path("/etc/apt/sources.list").exists():
        assert new_ct.ssh("test ! -e /etc/apt/sources.list").returncode == 0
    pip = new_ct.ssh("python3 -m pip download --no-deps --dest /tmp/dl six && ls /tmp/dl", timeout=120)
    assert pip.returncode == 0, pip
    assert re.search(r"^six-.*\.whl$", pip.stdout, re.M), pip


def test_a_restarted_bridge_takes_its_containers_back(new_ct):
    assert new_ct.create(start=1)["exitstatus"] == "OK"
    assert new_ct.status() == "running"
    pid = new_ct.api.status.current.get()["pid"]
    daemon = int(new_ct.settings.pidfile.read_text())
    os.kill(daemon, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while (
        Path(f"/proc/{daemon}/status").exists() and "zombie" not in Path(f"/proc/{daemon}/status").read_text()
    ):
        assert time.monotonic() < deadline, "fakepve did not die"
        time.sleep(0.05)
    done = subprocess.run(
        [sys.executable, "-m", "sglfleet_testing.lab", "up"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "serves the PVE API" in done.stdout
    current = new_ct.api.status.current.get()
    assert (current["status"], current["pid"]) == ("running", pid)
    assert new_ct.run_task(new_ct.api.status.shutdown.post(timeout=30))["exitstatus"] == "OK"
