"""playbooks/status.yml run with ansible-playbook (local connection) against real stand-ins."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sglfleet_testing.standin.process import standin_argv
from support.net import consecutive_free_ports
from support.paths import FIXTURES, REPO

from sglfleet.fleet import check_fleet, endpoints_from_range, record_phase

pytestmark = pytest.mark.timeout(120)

ROOT = REPO
DATA = FIXTURES / "nvidia_smi"


@pytest.fixture(scope="module")
def two_instances() -> Iterator[int]:
    base = consecutive_free_ports(3)
    procs = [
        subprocess.Popen(
            standin_argv(base + i, model_path="/srv/models/standin-7b", served_model_name="standin-7b"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(2)
    ]
    try:
        assert check_fleet(endpoints_from_range("127.0.0.1", base, 2), wait=30, interval=0.1).all_healthy
        yield base
    finally:
        for p in procs:
            p.kill()
            p.wait()


def run_status(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(
        f"[fleet]\nlocalhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    )
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(inventory),
            "playbooks/status.yml",
            *extra,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        env={
            **os.environ,
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            **(env or {}),
        },
        check=False,
    )


def test_status_playbook_prints_checklist_and_table(tmp_path: Path, two_instances: int) -> None:
    path = tmp_path / "ledger.json"
    record_phase(path, "provision", "done", {"vmid": 200})
    record_phase(path, "fleet", "done", {"instances": 2})
    proc = run_status(
        tmp_path,
        "-e", f"status_ledger_path={path}", "-e", f"status_port_base={two_instances}",
        "-e", "status_instances=3", "-e", f"status_nvidia_smi={DATA / 'fake-nvidia-smi'}", "--check",
        env={"FAKE_NVSMI": str(DATA / "rtxpro6000_srv_training")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert re.search(r"│ provision\s+│ done\s+│ \d{4}-\d\d-\d\d \d\d:\d\d UTC │ vmid=200", out), out
    assert re.search(r"│ toolchain\s+│ pending\s+│ -", out)
    assert "Instances (2/3 healthy)" in out
    assert re.search(rf"│\s+1 │ {two_instances + 1} │ 200 healthy\s+│ standin-7b .*│ 91.5 / 97.9 GB", out), (
        out
    )
    # The GPU table too: GPU 1's memory, and the port of the instance on it.
    gpu_row = rf"│\s+1 │ NVIDIA RTX PRO 6000 .*│ 91.5 / 97.9 GB │ 1\s+│ {two_instances + 1}\s+│"
    assert re.search(gpu_row, out), out
    assert re.search(rf"│\s+2 │ {two_instances + 2} │ refused", out)
    assert "2/11 phases done; 2/3 instances healthy" in out
    assert re.search(r"localhost\s+: ok=\d+\s+changed=0 .*failed=0", out)


def test_status_playbook_json_and_instances_from_gpu_count(tmp_path: Path, two_instances: int) -> None:
    proc = run_status(
        tmp_path,
        "-e", f"status_ledger_path={tmp_path / 'none.json'}", "-e", f"status_port_base={two_instances}",
        "-e", f"status_nvidia_smi={DATA / 'fake-nvidia-smi'}", "-e", "status_json=true",
        env={"FAKE_NVSMI": str(DATA / "rtxpro6000_ws_idle")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    block = proc.stdout[proc.stdout.index("msg: |-") + len("msg: |-") : proc.stdout.index("PLAY RECAP")]
    data = json.loads(block)
    assert len(data["instances"]) == 8  # one per GPU found
    assert [i["health"]["healthy"] for i in data["instances"]] == [True, True] + [False] * 6
    assert {r["status"] for r in data["checklist"]} == {"pending"}
    assert data["gpu_count"] == 8
    no_ledger = re.escape(f"(no ledger at {tmp_path / 'none.json'})")
    summary = data["summary"]
    assert re.fullmatch(rf"0/\d+ phases done {no_ledger}; 2/8 instances healthy", summary), summary
