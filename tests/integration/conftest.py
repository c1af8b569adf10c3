"""Shared fixtures of the integration tests: ansible-playbook against the lab's CT 200.

Every test here holds the machine-wide lab lock (/tmp/sglfleet-lab.lock) for the whole session,
whether or not pytest itself was started under `flock /tmp/sglfleet-lab.lock ...`.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible_lab import LAB_LOCK, REPO, Ansible, Container, ancestor_holds_lab_lock

LOCK_WAIT_S = 1800


@pytest.fixture(scope="session", autouse=True)
def lab_lock() -> Iterator[None]:
    """Hold the lab lock for the session (a no-op under `flock /tmp/sglfleet-lab.lock pytest ...`)."""
    if ancestor_holds_lab_lock():
        yield
        return
    with LAB_LOCK.open("a") as handle:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
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


@pytest.fixture(scope="session")
def ct(ansible: Ansible) -> Container:
    """CT 200, up and answering SSH; playbooks/provision.yml brings it there when it is not."""
    container = Container()
    if not container.reachable():
        provision = REPO / "playbooks/provision.yml"
        if not provision.exists():
            pytest.fail(
                "CT 200 does not answer SSH on 127.0.0.1:2222 and there is no playbooks/provision.yml"
            )
        run = ansible.playbook("playbooks/provision.yml")
        assert run.rc == 0, run.explain()
        assert container.reachable(), "CT 200 still does not answer SSH after playbooks/provision.yml"
    return container


@pytest.fixture(scope="session")
def sglfleet_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of this checkout's sglfleet package."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(REPO / "python")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("sglfleet-*.whl")
    return wheel


@pytest.fixture(scope="session")
def prepared_ct(ct: Container, ansible: Ansible, sglfleet_wheel: Path) -> Container:
    """CT 200 with /opt/sglang/venv holding this checkout's sglfleet, and the lab's model directory."""
    run = ansible.playbook("tests/integration/prepare_sglfleet.yml", "-e", f"sglfleet_wheel={sglfleet_wheel}")
    assert run.rc == 0, run.explain()
    return ct
