"""Fixtures for the lab's own tests: the lab up, a proxmoxer client, a clean CT, SSH into it.

These tests drive the real lab (fakepve on 127.0.0.1:8006, real LXC containers) and need root. The
session holds the machine-wide lab lock (/tmp/sglfleet-lab.lock) from its first test to its last, as the
integration tests do (a no-op under `flock /tmp/sglfleet-lab.lock .venv/bin/pytest tests/lab`).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException
from sglfleet_testing.lab.lock import LabLockTimeout, hold
from sglfleet_testing.lab.service import up
from sglfleet_testing.lab.settings import LabSettings

VMID = 200
LOCK_WAIT_S = 1800


@pytest.fixture(scope="session", autouse=True)
def lab_lock() -> Iterator[None]:
    """Hold the lab lock for the session: nobody else brings the lab up, down, or uses its CTs meanwhile."""
    try:
        with hold(timeout=LOCK_WAIT_S, say=print):
            yield
    except LabLockTimeout as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def settings() -> LabSettings:
    if os.geteuid() != 0:
        pytest.fail("the lab tests need root (they run LXC containers)")
    settings = LabSettings()
    up(settings, say=lambda line: print(f"lab: {line}"))
    return settings


def client(settings: LabSettings, password: bool = False) -> ProxmoxAPI:
    """proxmoxer against the lab, verifying its TLS certificate; the token, or root@pam's password."""
    auth = (
        {"password": settings.password}
        if password
        else {"token_name": settings.token_name, "token_value": settings.token_secret}
    )
    return ProxmoxAPI(
        settings.host, port=settings.port, user=settings.user, verify_ssl=str(settings.ca_cert), **auth
    )


@pytest.fixture(scope="session")
def pve(settings: LabSettings) -> ProxmoxAPI:
    return client(settings)


@pytest.fixture(scope="session")
def root_pve(settings: LabSettings) -> ProxmoxAPI:
    """Logged in as root@pam with its password (a ticket), which may do what a token may not."""
    return client(settings, password=True)


def wait_task(pve: ProxmoxAPI, node: str, upid: str, timeout: float = 60) -> dict:
    """Poll a task until it stopped; its status (exitstatus "OK" on success)."""
    deadline = time.monotonic() + timeout
    while True:
        status = pve.nodes(node).tasks(upid).status.get()
        if status["status"] == "stopped":
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"task {upid} still running after {timeout} s")
        time.sleep(0.1)


def remove_ct(pve: ProxmoxAPI, node: str, vmid: int) -> None:
    """Stop and destroy the CT if it exists (through the API)."""
    try:
        current = pve.nodes(node).lxc(vmid).status.current.get()
    except ResourceException:
        return
    if current["status"] == "running":
        wait_task(pve, node, pve.nodes(node).lxc(vmid).status.stop.post())
    assert wait_task(pve, node, pve.nodes(node).lxc(vmid).delete())["exitstatus"] == "OK"


@dataclass
class Ct:
    """A CT the test owns: created by the test, removed after it."""

    pve: ProxmoxAPI
    settings: LabSettings
    vmid: int

    @property
    def api(self):
        return self.pve.nodes(self.settings.node).lxc(self.vmid)

    def run_task(self, upid: str, timeout: float = 60) -> dict:
        return wait_task(self.pve, self.settings.node, upid, timeout)

    def create(self, **params) -> dict:
        """POST /nodes/{node}/lxc from the lab template with the lab's SSH key; the finished task."""
        return self.run_task(self.post_create(**params))

    def post_create(self, **params) -> str:
        """POST /nodes/{node}/lxc from the lab template with the lab's SSH key; the task's UPID."""
        defaults = {
            "ostemplate": self.settings.ostemplate,
            "storage": self.settings.rootfs_storage,
            "hostname": f"ct{self.vmid}",
            "ssh-public-keys": self.settings.ssh_key.with_suffix(".pub").read_text(),
        }
        return self.pve.nodes(self.settings.node).lxc.post(vmid=self.vmid, **{**defaults, **params})

    def start(self) -> dict:
        return self.run_task(self.api.status.start.post())

    def status(self) -> str:
        return self.api.status.current.get()["status"]

    def ssh(self, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run command over SSH as root, retrying while sshd is not up yet."""
        deadline = time.monotonic() + timeout
        while True:
            done = subprocess.run(
                [
                    "ssh", "-i", str(self.settings.ssh_key), "-p", str(self.settings.ssh_port(self.vmid)),
                    "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                    "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR",
                    "root@127.0.0.1", command,
                ],
                capture_output=True, text=True, check=False, timeout=timeout,
            )  # fmt: skip
            if done.returncode != 255 or time.monotonic() > deadline:
                return done
            time.sleep(0.2)


@pytest.fixture
def ct(settings: LabSettings, pve: ProxmoxAPI) -> Iterator[Ct]:
    """CT 200, absent before the test and removed after it."""
    remove_ct(pve, settings.node, VMID)
    yield Ct(pve, settings, VMID)
    remove_ct(pve, settings.node, VMID)
