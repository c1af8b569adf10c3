"""The driver floors CUDA 13.2 needs, defined once (sglfleet.doctor._driver) and read by every role."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_doctor import by_check, ct, healthy

from sglfleet.doctor import (
    FULL_DRIVER,
    GA_DRIVER,
    MIN_BRANCH,
    DriverSupport,
    Status,
    check_host,
    driver_support,
)

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("version", "support"),
    [
        ("570.172.08", DriverSupport.BLOCKED),  # no CUDA 13 at all
        ("580.95.05", DriverSupport.COMPAT),  # 13.x minor-version compatibility floor
        ("590.48.01", DriverSupport.COMPAT),
        (GA_DRIVER, DriverSupport.COMPAT),  # 13.2 GA's, older than Update 1's
        (FULL_DRIVER, DriverSupport.FULL),
        ("595.58.10", DriverSupport.FULL),
        ("610.43.03", DriverSupport.FULL),
    ],
)
def test_each_branch_gets_what_cuda_13_2_allows_it(version: str, support: DriverSupport) -> None:
    assert driver_support(version) is support


def test_the_doctor_blocks_below_580_and_warns_under_minor_version_compatibility() -> None:
    rows = {}
    for version in ("570.172.08", "580.95.05", FULL_DRIVER):
        probe = healthy()
        probe["module_version"] = version
        rows[version] = by_check(check_host("ct200", ct(checksummed_versions=[version]), probe))["driver"]
    old, compat, full = rows.values()
    assert old.status is Status.BLOCKER and "CUDA 13 does not start below branch 580" in old.found
    assert compat.status is Status.WARN
    assert "SASS runs" in compat.found and "cudaErrorUnsupportedPtxVersion" in compat.found
    assert f"needs driver >= {FULL_DRIVER}" in compat.fix and f"needs driver >= {FULL_DRIVER}" in old.fix
    assert full.status is Status.OK and not full.fix


def test_a_version_that_is_no_version_is_a_blocker_naming_it() -> None:
    probe = healthy()
    probe["module_version"] = "580.x"
    row = by_check(check_host("ct200", ct(), probe))["driver"]
    assert row.status is Status.BLOCKER and "'580.x' is not a driver version" in row.found


def test_roles_module_and_playbook_use_the_floors_defined_once() -> None:
    def defaults(role: str) -> dict:
        return yaml.safe_load((REPO / f"roles/{role}/defaults/main.yml").read_text())

    assert defaults("pve_host")["pve_host_min_branch"] == MIN_BRANCH
    assert defaults("pve_host")["pve_host_full_driver"] == FULL_DRIVER
    assert defaults("nvidia_userspace")["nvidia_userspace_min_branch"] == MIN_BRANCH
    assert defaults("nvidia_userspace")["nvidia_userspace_full_driver"] == FULL_DRIVER
    module = (REPO / "library/sglfleet_doctor.py").read_text()
    assert f'"min_branch": {{"type": "int", "default": {MIN_BRANCH}}}' in module
    assert f'"full_driver": {{"type": "str", "default": "{FULL_DRIVER}"}}' in module
    playbook = (REPO / "playbooks/doctor.yml").read_text()
    assert f"nvidia_userspace_min_branch | default({MIN_BRANCH})" in playbook
    assert f"nvidia_userspace_full_driver | default('{FULL_DRIVER}')" in playbook
    example = yaml.safe_load((REPO / "inventory/example/group_vars/pve_hosts.yml").read_text())
    assert example.get("pve_host_min_branch", MIN_BRANCH) == MIN_BRANCH
