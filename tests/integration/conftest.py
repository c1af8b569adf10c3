"""Fixtures of the integration tests: ansible-playbook against the lab's CT 200 (harness: ansible_lab.py).

The session holds the machine-wide lab lock (/tmp/sglfleet-lab.lock) from its first test to its last,
whether or not pytest itself was started under `flock /tmp/sglfleet-lab.lock ...`.

State is shared across the session where the tests allow it: CT 200 is made once (`ct`) and prepared
once (`prepared_ct`); a test module that needs a clean slate cleans what it uses, not the whole CT.
The modules run in an order that makes the most of that (see pytest_collection_modifyitems).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible_lab import CT_HOST, CT_VMID, FAKE_NVIDIA_SMI, Ansible, Container, Target, make_target, wait_until
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


# The fixtures here build on `ct200`, not on `ct`, so that a test module may define a `ct` of its own
# on top of `prepared_ct` (test_generate_job does) without a cycle.
@pytest.fixture(scope="session")
def ct200(lab_settings: LabSettings, lab_pve: ProxmoxAPI) -> Iterator[Container]:
    """CT 200 (see `ct`)."""
    lab, pve = lab_settings, lab_pve
    start = time.monotonic()
    lxc = pve.nodes(lab.node).lxc
    if CT_VMID not in [int(c["vmid"]) for c in lxc.get()]:
        upid = lxc.post(
            vmid=CT_VMID,
            ostemplate=lab.ostemplate,
            storage=lab.rootfs_storage,
            hostname=CT_HOST,
            cores=2,
            memory=CT_MEMORY_MIB,
            **{"ssh-public-keys": lab.ssh_key.with_suffix(".pub").read_text()},
        )
        wait_task(pve, lab.node, upid)
    elif int(lxc(CT_VMID).config.get().get("memory", 512)) < CT_MEMORY_MIB:
        lxc(CT_VMID).config.put(memory=CT_MEMORY_MIB)
    if lxc(CT_VMID).status.current.get()["status"] != "running":
        wait_task(pve, lab.node, lxc(CT_VMID).status.start.post())
    container = Container()
    container.wait_reachable(timeout=60)
    print(f"CT 200 answers SSH {time.monotonic() - start:.1f} s after the lab was up")
    yield container
    container.disconnect()


@pytest.fixture(scope="session")
def prepared_ct(ct200: Container, ansible: Ansible) -> Container:
    """CT 200 with this checkout's sglfleet in the runtime venv (the modules' interpreter) and in
    /opt/sglang/venv (the stand-in); the lab's model store comes with every lab container."""
    run = ansible.playbook("tests/integration/prepare_sglfleet.yml")
    assert run.rc == 0, run.explain()
    print(f"CT 200 prepared in {run.seconds:.1f} s")
    return ct200


@pytest.fixture(scope="session")
def fake_nvidia_smi(ct200: Container) -> str:
    """A stand-in nvidia-smi in CT 200 (tests/integration/files/nvidia-smi): eight GPUs, and a compute
    process for each live pid in /var/tmp/fake-nvidia-smi.pids. Point *_nvidia_smi variables at it."""
    ct200.put(FAKE_NVIDIA_SMI, (Path(__file__).parent / "files/nvidia-smi").read_text(), mode="0755")
    return FAKE_NVIDIA_SMI


@pytest.fixture(scope="session")
def role_target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Target:
    """Where the role tests (cuda_toolchain, sglang) converge: CT 200 under /opt/sglfleet-test, or this
    machine with SGLFLEET_ROLE_TESTS_TARGET=local; emptied once per session, then shared."""
    return make_target(request, tmp_path_factory.mktemp("roles"))
