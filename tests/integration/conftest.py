"""Fixtures of the integration tests: ansible-playbook against the lab's CT 200 (harness: ansible_lab.py).

The session holds the machine-wide lab lock (/tmp/sglfleet-lab.lock) from its first test to its last,
whether or not pytest itself was started under `flock /tmp/sglfleet-lab.lock ...`.

State is shared across the session where the tests allow it: CT 200 is made once (`ct`) and prepared
once (`prepared_ct`); a test module that needs a clean slate cleans what it uses, not the whole CT.
The modules run in an order that makes the most of that (see pytest_collection_modifyitems).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible_lab import (
    CT_VMID,
    FAKE_NVIDIA_SMI,
    INVENTORY,
    OWN_CT_ENV,
    TARGET_ENV,
    Ansible,
    Container,
    LabTarget,
    LocalTarget,
    OwnCt,
    Target,
    lab_inventory,
    wait_until,
)
from proxmoxer import ProxmoxAPI
from sglfleet_testing.lab.lock import LabLockTimeout, hold
from sglfleet_testing.lab.service import up
from sglfleet_testing.lab.settings import LabSettings

LOCK_WAIT_S = 1800
# Eight stand-in servers and pip need more than PVE's default 512 MiB.
CT_MEMORY_MIB = 4096

# Modules that run first, in this order; the rest follow in file order. test_provision destroys CT 200
# and makes it anew through provision.yml: first, so that it destroys nothing the others prepared.
# test_toolchain converges the CUDA toolchain into the empty role_target; test_sglang_role (after it)
# builds on that toolchain instead of installing its own.
FIRST = ("test_provision.py", "test_toolchain.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    slots = [i for i, item in enumerate(items) if item.path.parent == here]
    ours = [items[i] for i in slots]

    def rank(item: pytest.Item) -> int:
        return FIRST.index(item.path.name) if item.path.name in FIRST else len(FIRST)

    # Stable: file order and the order within each file are kept; other directories' tests keep their places.
    for i, item in zip(slots, sorted(ours, key=rank), strict=True):
        items[i] = item


@pytest.fixture(scope="session", autouse=True)
def lab_lock() -> Iterator[None]:
    """Hold the lab lock for the session (a no-op under `flock /tmp/sglfleet-lab.lock pytest ...`)."""
    try:
        with hold(timeout=LOCK_WAIT_S, say=print):
            yield
    except LabLockTimeout as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def lab_settings() -> LabSettings:
    """The lab up (a no-op when it is): fakepve on 127.0.0.1:8006, the template, the SSH key."""
    settings = LabSettings()
    up(settings, say=lambda line: print(f"lab: {line}"))
    return settings


@pytest.fixture(scope="session")
def lab_pve(lab_settings: LabSettings) -> ProxmoxAPI:
    """proxmoxer against the lab's PVE API with its token, verifying the lab's TLS certificate."""
    lab = lab_settings
    return ProxmoxAPI(
        lab.host,
        port=lab.port,
        user=lab.user,
        token_name=lab.token_name,
        token_value=lab.token_secret,
        verify_ssl=str(lab.ca_cert),
    )


def wait_task(pve: ProxmoxAPI, node: str, upid: str, timeout: float = 120) -> dict:
    """Poll a PVE task until it stopped; fail unless it ended OK."""
    tasks = pve.nodes(node).tasks
    status = wait_until(
        lambda: (s := tasks(upid).status.get())["status"] == "stopped" and s,
        timeout=timeout,
        interval=0.2,
        what=f"PVE task {upid} stopped",
    )
    assert status.get("exitstatus") == "OK", f"PVE task {upid} failed: {status}"
    return status


@pytest.fixture(scope="session")
def ansible() -> Ansible:
    return Ansible()


@pytest.fixture(scope="session")
def ct(ct200: Container) -> Container:
    """CT 200 running and answering SSH: created and started through the lab's PVE API when it is not
    there (as playbooks/provision.yml would), with room for a fleet."""
    return ct200


def lab_ct(lab: LabSettings, pve: ProxmoxAPI, vmid: int) -> Container:
    """Lab CT `vmid` running and answering SSH (on 127.0.0.1, port lab.ssh_port(vmid)): created and
    started through the lab's PVE API when it is not (as playbooks/provision.yml would), with room for
    a fleet."""
    start = time.monotonic()
    lxc = pve.nodes(lab.node).lxc
    if vmid not in [int(c["vmid"]) for c in lxc.get()]:
        upid = lxc.post(
            vmid=vmid,
            ostemplate=lab.ostemplate,
            storage=lab.rootfs_storage,
            hostname=f"ct{vmid}",
            cores=2,
            memory=CT_MEMORY_MIB,
            **{"ssh-public-keys": lab.ssh_key.with_suffix(".pub").read_text()},
        )
        wait_task(pve, lab.node, upid)
    elif int(lxc(vmid).config.get().get("memory", 512)) < CT_MEMORY_MIB:
        lxc(vmid).config.put(memory=CT_MEMORY_MIB)
    if lxc(vmid).status.current.get()["status"] != "running":
        wait_task(pve, lab.node, lxc(vmid).status.start.post())
    container = Container(port=lab.ssh_port(vmid), name=f"CT {vmid}")
    container.wait_reachable(timeout=60)
    print(f"CT {vmid} answers SSH {time.monotonic() - start:.1f} s after the lab was up")
    return container


def prepare(ansible: Ansible, container: Container, inventory: Path = INVENTORY) -> Container:
    """The sglfleet runtime (the modules' interpreter) and the stand-in in /opt/sglang/venv, by
    tests/integration/prepare_sglfleet.yml."""
    run = ansible.playbook("tests/integration/prepare_sglfleet.yml", inventory=inventory)
    assert run.rc == 0, run.explain()
    print(f"{container.name} prepared in {run.seconds:.1f} s")
    return container


# The fixtures here build on `ct200`, not on `ct`, so that a test module may define a `ct` of its own
# on top of `prepared_ct` (test_generate_job does) without a cycle.
@pytest.fixture(scope="session")
def ct200(lab_settings: LabSettings, lab_pve: ProxmoxAPI) -> Iterator[Container]:
    """CT 200 (see `ct`)."""
    container = lab_ct(lab_settings, lab_pve, CT_VMID)
    yield container
    container.disconnect()


@pytest.fixture(scope="session")
def prepared_ct(ct200: Container, ansible: Ansible) -> Container:
    """CT 200 with this checkout's sglfleet in the runtime venv (the modules' interpreter) and in
    /opt/sglang/venv (the stand-in); the lab's model store comes with every lab container."""
    return prepare(ansible, ct200)


@pytest.fixture(scope="session")
def fake_nvidia_smi(ct200: Container) -> str:
    """A stand-in nvidia-smi in CT 200 (tests/integration/files/nvidia-smi): eight GPUs, and a compute
    process for each live pid in /var/tmp/fake-nvidia-smi.pids. Point *_nvidia_smi variables at it."""
    ct200.put(FAKE_NVIDIA_SMI, (Path(__file__).parent / "files/nvidia-smi").read_text(), mode="0755")
    return FAKE_NVIDIA_SMI


@pytest.fixture(scope="session")
def own_ct(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnCt]:
    """SGLFLEET_TEST_CT=VMID: lab CT VMID, made by provision.yml and prepared, with inventory/lab's group_vars
    and its own vmid, hostname and instance ports (30000 + 1000 per CT after 200): `make test` runs
    these modules on CTs 201 and 202 beside the others on CT 200. Unset: CT 200, prepared."""
    vmid = int(os.environ.get(OWN_CT_ENV) or CT_VMID)
    if vmid == CT_VMID:
        yield OwnCt(CT_VMID, request.getfixturevalue("prepared_ct"), INVENTORY, 30000)
        return
    lab: LabSettings = request.getfixturevalue("lab_settings")
    ansible: Ansible = request.getfixturevalue("ansible")
    port_base = 30000 + 1000 * (vmid - CT_VMID)
    inventory = lab_inventory(
        tmp_path_factory.mktemp("own-ct") / "inventory",
        vmid=vmid,
        port=lab.ssh_port(vmid),
        host_vars={
            "pve_vmid": vmid,
            "proxmox_lxc_hostname": f"ct{vmid}",
            "sglang_fleet_port_base": port_base,
        },
    )
    # Made as the inventory declares it (what site.yml's phase provision then finds converged).
    run = ansible.playbook("provision.yml", inventory=inventory)
    assert run.rc == 0, run.explain()
    container = Container(port=lab.ssh_port(vmid), name=f"CT {vmid}")
    container.wait_reachable(timeout=60)
    prepare(ansible, container, inventory)
    yield OwnCt(vmid, container, inventory, port_base)
    container.disconnect()


@pytest.fixture(scope="session")
def session_ct(own_ct: OwnCt) -> Container:
    """The session's own CT (see own_ct): CT 200 unless SGLFLEET_TEST_CT names another."""
    return own_ct.container


@pytest.fixture(scope="session")
def session_ansible(own_ct: OwnCt) -> Ansible:
    """Playbooks against the session's own CT, through its inventory."""
    return Ansible(inventory=own_ct.inventory)


@pytest.fixture(scope="session")
def role_target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Target:
    """Where the role tests (cuda_toolchain, sglang) converge, emptied once per session, then shared:
    the session's own CT (see own_ct) under /opt/sglfleet-test, or this machine with
    SGLFLEET_ROLE_TESTS_TARGET=local."""
    work = tmp_path_factory.mktemp("roles")
    where = os.environ.get(TARGET_ENV, "lab")
    if where == "local":
        target: Target = LocalTarget(work)
    elif where == "lab":
        own: OwnCt = request.getfixturevalue("own_ct")
        target = LabTarget(work, own.container, own.inventory)
    else:
        pytest.fail(f"{TARGET_ENV}={where!r}: expected lab or local")
    target.reset()
    return target
