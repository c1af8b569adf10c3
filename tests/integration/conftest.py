"""Shared fixtures of the integration tests: ansible-playbook against the lab's CT 200.

Every test here holds the machine-wide lab lock (/tmp/sglfleet-lab.lock) for the whole session,
whether or not pytest itself was started under `flock /tmp/sglfleet-lab.lock ...`.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible_lab import CT_HOST, FAKE_NVIDIA_SMI, LAB_LOCK, Ansible, Container, ancestor_holds_lab_lock
from proxmoxer import ProxmoxAPI
from sglfleet_testing.lab.service import up
from sglfleet_testing.lab.settings import LabSettings

LOCK_WAIT_S = 1800
CT_VMID = 200
# Eight stand-in servers and pip need more than PVE's default 512 MiB.
CT_MEMORY_MIB = 4096


@pytest.fixture(scope="session", autouse=True)
def lab_lock() -> Iterator[None]:
    """Hold the lab lock for the session (a no-op under `flock /tmp/sglfleet-lab.lock pytest ...`)."""
    if ancestor_holds_lab_lock():
        yield
        return
    with LAB_LOCK.open("a") as handle:
        start = time.monotonic()
        deadline = start + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                print(f"lab lock taken after {time.monotonic() - start:.1f} s")
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the lab lock {LAB_LOCK} stayed taken for {LOCK_WAIT_S} s")
                time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def ansible() -> Ansible:
    return Ansible()


def _wait_task(pve: ProxmoxAPI, node: str, upid: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while (status := pve.nodes(node).tasks(upid).status.get())["status"] != "stopped":
        assert time.monotonic() < deadline, f"PVE task {upid} still running after {timeout} s"
        time.sleep(0.2)
    assert status.get("exitstatus") == "OK", f"PVE task {upid} failed: {status}"


@pytest.fixture(scope="session")
def ct() -> Container:
    """CT 200 running and answering SSH: the lab brought up, the CT created and started through the
    lab's PVE API when it is not there (as playbooks/provision.yml would), with room for a fleet."""
    settings = LabSettings()
    up(settings, say=lambda line: print(f"lab: {line}"))
    start = time.monotonic()
    pve = ProxmoxAPI(
        settings.host,
        port=settings.port,
        user=settings.user,
        token_name=settings.token_name,
        token_value=settings.token_secret,
        verify_ssl=str(settings.ca_cert),
    )
    lxc = pve.nodes(settings.node).lxc
    if CT_VMID not in [int(c["vmid"]) for c in lxc.get()]:
        upid = lxc.post(
            vmid=CT_VMID,
            ostemplate=settings.ostemplate,
            storage=settings.rootfs_storage,
            hostname=CT_HOST,
            cores=2,
            memory=CT_MEMORY_MIB,
            **{"ssh-public-keys": settings.ssh_key.with_suffix(".pub").read_text()},
        )
        _wait_task(pve, settings.node, upid)
    elif int(lxc(CT_VMID).config.get().get("memory", 512)) < CT_MEMORY_MIB:
        lxc(CT_VMID).config.put(memory=CT_MEMORY_MIB)
    if lxc(CT_VMID).status.current.get()["status"] != "running":
        _wait_task(pve, settings.node, lxc(CT_VMID).status.start.post())
    container = Container()
    print(f"CT 200 running {time.monotonic() - start:.1f} s after the lab was up")
    deadline = time.monotonic() + 60
    while not container.reachable():
        assert time.monotonic() < deadline, "CT 200 does not answer SSH on 127.0.0.1:2222"
        time.sleep(0.5)
    return container


@pytest.fixture(scope="session")
def prepared_ct(ct: Container, ansible: Ansible) -> Container:
    """CT 200 with this checkout's sglfleet in the runtime venv (the modules' interpreter) and in
    /opt/sglang/venv (the stand-in); the lab's model store comes with every lab container."""
    run = ansible.playbook("tests/integration/prepare_sglfleet.yml")
    assert run.rc == 0, run.explain()
    print(f"CT 200 prepared in {run.seconds:.1f} s")
    return ct


@pytest.fixture(scope="session")
def fake_nvidia_smi(ct: Container) -> str:
    """A stand-in nvidia-smi in CT 200 (tests/integration/files/nvidia-smi): eight GPUs, and a compute
    process for each live pid in /var/tmp/fake-nvidia-smi.pids. Point *_nvidia_smi variables at it."""
    ct.put(FAKE_NVIDIA_SMI, (Path(__file__).parent / "files/nvidia-smi").read_text(), mode="0755")
    return FAKE_NVIDIA_SMI
