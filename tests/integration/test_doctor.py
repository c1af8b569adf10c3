"""playbooks/doctor.yml against the session's own lab CT: one read-only pass that lists every blocker at
once, in one table, and fails only after printing all of it."""

from __future__ import annotations

import re
import shlex
import socket
from pathlib import Path

import pytest
import yaml
from support.ansible_lab import Ansible, Container, PlaybookRun, wait_until

pytestmark = [pytest.mark.timeout(900)]

SQUATTER = "sglfleet-doctor-squat"


def ct_only_inventory(ct: Container, directory: Path) -> Path:
    """The session's inventory without the stand-in node, which the CT 202 session may be rebooting."""
    directory.mkdir()
    hosts = yaml.safe_load((ct.inventory / "hosts.yml").read_text())
    hosts.pop("pve_hosts", None)
    (directory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    (directory / "group_vars").symlink_to((ct.inventory / "group_vars").resolve(), target_is_directory=True)
    return directory


def rows(run: PlaybookRun, host: str) -> dict[str, tuple[str, str]]:
    """{check: (status, "found | fix")} of `host`'s rows in the printed table."""
    found = {}
    for line in run.output.splitlines():
        gap = r"\s{2,}"
        match = re.match(rf"^\s*(\S.*?){gap}{re.escape(host)}{gap}(ok|BLOCKER|warn|skipped){gap}(.*)$", line)
        if match:
            found[match.group(1)] = (match.group(2), " | ".join(re.split(gap, match.group(3).strip())))
    return found


@pytest.fixture(scope="module")
def doctor(ct: Container, tmp_path_factory: pytest.TempPathFactory) -> Ansible:
    return Ansible(inventory=ct_only_inventory(ct, tmp_path_factory.mktemp("doctor") / "inventory"))


def test_the_lab_as_declared_has_no_blocker_and_says_why_gpu_checks_skip(
    doctor: Ansible, ct: Container
) -> None:
    run = doctor.playbook("doctor.yml")
    assert run.rc == 0, run.explain()
    host = f"ct{ct.vmid}"
    table = rows(run, host)
    for check in ("driver", "device nodes", "GPU count"):
        assert table[check] == ("skipped", "inventory declares no GPU (sglfleet_gpus_expected=false) | -"), (
            table
        )
    assert table["ports"][0] == "ok", table
    assert table["PVE privileges"][0] == "ok", table
    assert "no blocker found" in run.output
    assert run.total("changed") == 0, run.changed_tasks()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_two_blockers_at_once_are_both_listed_before_it_fails(doctor: Ansible, ct: Container) -> None:
    """A port of the fleet taken by something else, and a CT that should have 8 GPUs but has no device node:
    both rows are there, each with its fix, and only then does the play fail (in check mode too)."""
    port = ct.port_base + 1
    host = f"ct{ct.vmid}"
    ct.run(f"systemd-run --unit={SQUATTER} --collect python3 -m http.server {port} --bind 127.0.0.1")
    try:
        wait_until(lambda: _listening(port), timeout=30, what=f"the squatter on port {port}")
        run = doctor.playbook(
            "doctor.yml",
            "--check",
            "-e",
            "sglfleet_gpus_expected=true",
            "-e",
            "proxmox_lxc_gpu_count=8",
        )
    finally:
        ct.ssh(f"systemctl stop {shlex.quote(SQUATTER)}")
    assert run.rc != 0, run.explain()
    table = rows(run, host)
    status, rest = table["device nodes"]
    assert status == "BLOCKER", table
    assert "missing /dev/nvidia0, /dev/nvidia1" in rest and "/dev/nvidia-uvm-tools" in rest, rest
    assert "phase provision" in rest and "proxmox_lxc_gpu_count" in rest, rest
    status, rest = table["ports"]
    assert status == "BLOCKER", table
    assert re.search(rf"taken: {port} by pid \d+ python3 \({SQUATTER}\.service\)", rest), rest
    assert "sglang_fleet_port_base" in rest, rest
    # the rest of the table is there too: every check ran, whatever the others found
    assert table["GPU count"][0] == "BLOCKER", table
    assert table["PVE privileges"][0] == "BLOCKER", table  # devN needs root@pam's password, not a token
    assert table["disk: CUDA toolchain"][0] == "ok", table
    assert run.status("Fail when the table holds a BLOCKER") == ["fatal"], run.explain()
    assert run.output.index("device nodes") < run.output.index("BLOCKER row(s) above")
    assert run.total("changed") == 0, run.changed_tasks()
