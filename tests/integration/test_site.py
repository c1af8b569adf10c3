"""playbooks/site.yml on the lab, as `make demo` runs it: every phase in order converges CT 200 to a fleet
of 8 healthy stand-in instances and prints the status table; a second run changes nothing, and
`--check --diff` on the converged lab reports nothing to change."""

from __future__ import annotations

import pytest
from ansible_lab import Ansible, Container, PlaybookRun

pytestmark = pytest.mark.timeout(1500)


@pytest.fixture(scope="module")
def converged(ct: Container, ansible: Ansible) -> PlaybookRun:
    run = ansible.playbook("playbooks/site.yml", timeout=1200)
    assert run.rc == 0, run.explain()
    print(f"site.yml converged in {run.seconds:.1f} s")
    return run


def test_site_brings_every_phase_up_to_a_healthy_fleet(converged: PlaybookRun) -> None:
    for phase in ("provision", "training_stop", "toolchain", "sglang", "fleet"):
        assert f"│ {phase:<13} │ done" in converged.output, phase
    assert "Instances (8/8 healthy)" in converged.output
    assert "all 8 instances healthy" in converged.output


def test_second_run_changes_nothing(converged: PlaybookRun, ansible: Ansible) -> None:
    again = ansible.playbook("playbooks/site.yml", timeout=1200)
    assert again.rc == 0, again.explain()
    assert again.recap.get("changed") == 0, again.explain()
    assert again.recap.get("failed") == 0
    print(f"site.yml re-run in {again.seconds:.1f} s (first run {converged.seconds:.1f} s)")


def test_check_diff_on_the_converged_lab_reports_nothing(converged: PlaybookRun, ansible: Ansible) -> None:
    check = ansible.playbook("playbooks/site.yml", "--check", "--diff", timeout=1200)
    assert check.rc == 0, check.explain()
    assert check.recap.get("changed") == 0, check.explain()
