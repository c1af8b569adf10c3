"""`lab down` removes every container, process and file the lab made, and leaves the host's network as
it found it. Runs last (file order): it takes the lab down, then brings it back up for whoever is next."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from sglfleet_testing.lab.node import NODE_PACKAGES, debs_dir
from sglfleet_testing.lab.service import up
from test_lab_smoke import host_network

pytestmark = pytest.mark.timeout(300)


def lab_processes() -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"sglfleet_testing.lab" in cmdline and b"serve" in cmdline:
            out.append(int(proc.name))
    return out


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_lab_down_removes_what_the_lab_made(new_ct):
    settings = new_ct.settings
    network = host_network()
    new_ct.create()
    new_ct.start()
    assert new_ct.ssh("true").returncode == 0
    try:
        done = subprocess.run(
            [sys.executable, "-m", "sglfleet_testing.lab", "down", "--keep-template"],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert lab_processes() == []
        assert not listening(settings.port)
        assert not listening(settings.ssh_port(new_ct.vmid))
        assert not settings.state_dir.exists()
        # Kept on request: the downloads (the template, the node's Debian packages), and nothing else.
        kept = sorted(p for p in settings.cache_dir.rglob("*") if p.is_file())
        debs = sorted(debs_dir(settings) / package.deb for package in NODE_PACKAGES)
        assert kept == sorted([settings.template_path, *debs])
        assert not Path("/run/lxc/lock", str(settings.lxc_path).lstrip("/")).exists()
        assert sorted(Path("/sys/fs/cgroup").glob(f"*/lxc.*.{new_ct.vmid}")) == []
        assert host_network() == network
        status = subprocess.run(
            [sys.executable, "-m", "sglfleet_testing.lab", "status"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert status.returncode == 3
        assert "fakepve: not running" in status.stdout
    finally:
        up(settings)
