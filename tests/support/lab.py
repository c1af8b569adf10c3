"""The lab's pytest plugin: the fixtures of tests/lab and tests/integration (each conftest.py loads it with
`pytest_plugins = ["support.lab"]`; the harness they build on is support/ansible_lab.py).

These tests drive the real lab (fakepve on 127.0.0.1:8006, real LXC containers) and need root. A session
holds the machine-wide lab lock (/tmp/sglfleet-lab.lock) from its first test to its last (a no-op under
`flock /tmp/sglfleet-lab.lock .venv/bin/pytest ...`, where an ancestor holds it).

The lock is taken in pytest_runtestloop, before the first test: the wait for it counts against no test's
time limit. Fixtures, all session-scoped but `new_ct`:

- `lab_settings` (the lab up), `pve` (proxmoxer with the lab's token), `root_pve`
  (root@pam's password: what a token may not do), `ansible` (playbooks against inventory/lab);
- the two lab CTs the tests converge on, each a `Container` prepared by tests/integration/prepare_sglfleet.yml
  (this checkout's sglfleet in the runtime venv, the stand-in in /opt/sglang/venv):
  `fleet_ct`, CT 200 through inventory/lab (the fleet modules' tests), and `ct`, the session's own CT:
  CT 200 too, or with SGLFLEET_TEST_CT=VMID that CT, made by provision.yml, with its own inventory and
  instance ports (`make test` runs the role tests, the host phase and site.yml on CTs 201 and 202 beside
  the fleet modules' tests on CT 200);
- `fake_nvidia_smi` (tests/integration/files/nvidia-smi in CT 200), `role_target` (where the role tests
  converge);
- `new_ct` (per test): CT 200 absent before the test and removed after it, made by the test through the
  API (the lab's own tests of the CT lifecycle).

State is shared across a session where the tests allow it: each CT is made and prepared once; a test
module that needs a clean slate cleans what it uses, not the whole CT. pytest_collection_modifyitems
orders the integration modules to make the most of that.
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

from support.ansible_lab import (
    CT_VMID,
    FAKE_NVIDIA_SMI,
    OWN_CT_ENV,
    REPO,
    TARGET_ENV,
    Ansible,
    Container,
    LabTarget,
    LocalTarget,
    Target,
    lab_inventory,
    wait_until,
)

LOCK_WAIT_S = 1800
# Eight stand-in servers and pip need more than PVE's default 512 MiB.
CT_MEMORY_MIB = 4096
INTEGRATION = REPO / "tests" / "integration"

# Integration modules that run first, in this order; the rest follow in file order. test_provision destroys
# CT 200 and makes it anew through provision.yml: first, so that it destroys nothing the others prepared.
# test_toolchain converges the CUDA toolchain into the empty role_target; test_sglang_role (after it)
# builds on that toolchain instead of installing its own.
FIRST = ("test_provision.py", "test_toolchain.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slots = [i for i, item in enumerate(items) if item.path.parent == INTEGRATION]
    ours = [items[i] for i in slots]

    def rank(item: pytest.Item) -> int:
        return FIRST.index(item.path.name) if item.path.name in FIRST else len(FIRST)

    # Stable: file order and the order within each file are kept; other directories' tests keep their places.
    for i, item in zip(slots, sorted(ours, key=rank), strict=True):
        items[i] = item


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Iterator[object]:
    """Hold the lab lock from the session's first test to its last: nobody else brings the lab up, down, or
    uses its CTs meanwhile. Taken before the first test starts, so that the wait for it (other sessions'
    runs) counts against no test's time limit."""
    if session.config.option.collectonly or not session.items:
        return (yield)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    say = reporter.write_line if reporter is not None else print
    lock = hold(timeout=LOCK_WAIT_S, say=say)
    try:
        lock.__enter__()
    except LabLockTimeout as exc:
        pytest.exit(str(exc), returncode=pytest.ExitCode.INTERRUPTED)
    try:
        return (yield)
    finally:
        lock.__exit__(None, None, None)


@pytest.fixture(scope="session")
def lab_settings() -> LabSettings:
    """The lab up (a no-op when it is): fakepve on 127.0.0.1:8006, the template, the SSH key."""
    if os.geteuid() != 0:
        pytest.fail("the lab's tests need root (they run LXC containers)")
    settings = LabSettings()
    up(settings, say=lambda line: print(f"lab: {line}"))
    return settings


def pve_client(settings: LabSettings, password: bool = False) -> ProxmoxAPI:
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
def pve(lab_settings: LabSettings) -> ProxmoxAPI:
    """proxmoxer on the lab's PVE API with its token."""
    return pve_client(lab_settings)


@pytest.fixture(scope="session")
def root_pve(lab_settings: LabSettings) -> ProxmoxAPI:
    """Logged in as root@pam with its password (a ticket), which may do what a token may not."""
    return pve_client(lab_settings, password=True)


def wait_task(pve: ProxmoxAPI, node: str, upid: str, timeout: float = 120) -> dict:
    """Poll a PVE task until it stopped; its status (exitstatus "OK" on success)."""
    tasks = pve.nodes(node).tasks
    return wait_until(
        lambda: (s := tasks(upid).status.get())["status"] == "stopped" and s,
        timeout=timeout,
        interval=0.2,
        what=f"PVE task {upid} stopped",
    )


@pytest.fixture(scope="session")
def ansible() -> Ansible:
    """Playbooks of this checkout against inventory/lab."""
    return Ansible()


def running_ct(lab: LabSettings, pve: ProxmoxAPI, vmid: int) -> Container:
    """CT 200 running and answering SSH: created and started through the lab's PVE API when it is not (as
    playbooks/provision.yml would), with room for a fleet."""
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
        assert wait_task(pve, lab.node, upid).get("exitstatus") == "OK", f"creating CT {vmid}"
    elif int(lxc(vmid).config.get().get("memory", 512)) < CT_MEMORY_MIB:
        lxc(vmid).config.put(memory=CT_MEMORY_MIB)
    if lxc(vmid).status.current.get()["status"] != "running":
        assert wait_task(pve, lab.node, lxc(vmid).status.start.post()).get("exitstatus") == "OK"
    container = Container(vmid, port=lab.ssh_port(vmid))
    container.wait_reachable(timeout=60)
    print(f"CT {vmid} answers SSH {time.monotonic() - start:.1f} s after the lab was up")
    return container


def prepare(container: Container) -> Container:
    """The sglfleet runtime (the modules' interpreter) and the stand-in in /opt/sglang/venv, by
    tests/integration/prepare_sglfleet.yml."""
    run = container.playbook("tests/integration/prepare_sglfleet.yml")
    assert run.rc == 0, run.explain()
    print(f"{container.name} prepared in {run.seconds:.1f} s")
    return container


@pytest.fixture(scope="session")
def fleet_ct(lab_settings: LabSettings, pve: ProxmoxAPI) -> Iterator[Container]:
    """CT 200 through inventory/lab, made when it is not there and prepared: this checkout's sglfleet in the
    runtime venv (the modules' interpreter) and in /opt/sglang/venv (the stand-in); the lab's model store
    comes with every lab container."""
    container = prepare(running_ct(lab_settings, pve, CT_VMID))
    yield container
    container.disconnect()


@pytest.fixture(scope="session")
def ct(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    """The session's own CT, prepared: `fleet_ct`, or with SGLFLEET_TEST_CT=VMID lab CT VMID, made by
    provision.yml through an inventory of its own (inventory/lab's group_vars, its vmid and hostname, instance
    ports from 30000 + 1000 per CT after 200)."""
    vmid = int(os.environ.get(OWN_CT_ENV) or CT_VMID)
    if vmid == CT_VMID:
        yield request.getfixturevalue("fleet_ct")
        return
    lab: LabSettings = request.getfixturevalue("lab_settings")
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
    container = Container(vmid, port=lab.ssh_port(vmid), inventory=inventory, port_base=port_base)
    # Made as the inventory declares it (what site.yml's phase provision then finds converged).
    run = container.playbook("provision.yml")
    assert run.rc == 0, run.explain()
    container.wait_reachable(timeout=60)
    yield prepare(container)
    container.disconnect()


@pytest.fixture(scope="session")
def fake_nvidia_smi(fleet_ct: Container) -> str:
    """A stand-in nvidia-smi in CT 200 (tests/integration/files/nvidia-smi): eight GPUs, and a compute
    process for each live pid in /var/tmp/fake-nvidia-smi.pids. Point *_nvidia_smi variables at it."""
    fleet_ct.put(FAKE_NVIDIA_SMI, (INTEGRATION / "files/nvidia-smi").read_text(), mode="0755")
    return FAKE_NVIDIA_SMI


@pytest.fixture(scope="session")
def role_target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Target:
    """Where the role tests (cuda_toolchain, sglang) converge, emptied once per session, then shared:
    the session's own CT (`ct`) under /opt/sglfleet-test, or this machine with
    SGLFLEET_ROLE_TESTS_TARGET=local."""
    work = tmp_path_factory.mktemp("roles")
    where = os.environ.get(TARGET_ENV, "lab")
    if where == "local":
        target: Target = LocalTarget(work)
    elif where == "lab":
        target = LabTarget(work, request.getfixturevalue("ct"))
    else:
        pytest.fail(f"{TARGET_ENV}={where!r}: expected lab or local")
    target.reset()
    return target


# -- a CT a test makes itself (the lab's own tests) ----------------------------------------------------


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
class NewCt:
    """A CT the test makes and drives through the lab's PVE API (and reaches over SSH without a master
    connection: its host key changes with every create)."""

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
def new_ct(lab_settings: LabSettings, pve: ProxmoxAPI) -> Iterator[NewCt]:
    """CT 200, absent before the test and removed after it: the test makes it through the API."""
    remove_ct(pve, lab_settings.node, CT_VMID)
    yield NewCt(pve, lab_settings, CT_VMID)
    remove_ct(pve, lab_settings.node, CT_VMID)
