"""playbooks/status.yml and `sglfleet status` against CT 200 running eight instances under systemd.

The fleet is brought up by playbooks/serve.yml (stand-in instances, with an API key), so that the
ledger holds the fleet phase and /etc/sglang holds the instances' environment files.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible_lab import MODULE_PYTHON, Ansible, Container, PlaybookRun

pytestmark = pytest.mark.timeout(600)

INSTANCES = 8
PORT_BASE = 30000
API_KEY = "lab-only-status-key-7d21"
MODEL = "standin-7b"
RESET = (
    "systemctl stop 'sglang@*.service'; "
    "for i in $(seq 0 15); do systemctl disable sglang@$i.service 2>/dev/null; done; "
    "rm -rf /etc/sglang /etc/systemd/system/sglang@.service; systemctl daemon-reload; "
    "systemctl reset-failed 'sglang@*.service'; true"
)


class Lab:
    def __init__(self, ct: Container, ansible: Ansible, tmp: Path) -> None:
        self.ct, self.ansible, self.tmp = ct, ansible, tmp
        self.vars = {"ansible_python_interpreter": MODULE_PYTHON, "sglang_fleet_api_key": API_KEY}

    def playbook(self, name: str, *args: str, **overrides: object) -> PlaybookRun:
        extra = self.tmp / f"vars-{time.monotonic_ns()}.json"
        extra.write_text(json.dumps({**self.vars, **overrides}))
        return self.ansible.playbook(name, "-e", f"@{extra}", *args)


@pytest.fixture(scope="module")
def lab(prepared_ct: Container, ansible: Ansible, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    prepared_ct.run(RESET)
    lab = Lab(prepared_ct, ansible, tmp_path_factory.mktemp("status"))
    served = lab.playbook("playbooks/serve.yml")
    assert served.rc == 0, served.explain()
    yield lab
    prepared_ct.run(RESET)


def instance_rows(output: str) -> dict[int, list[str]]:
    """The instance table's rows by port: the cells of each line that holds a fleet port."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 8 and cells[1].isdigit() and PORT_BASE <= int(cells[1]) < PORT_BASE + 16:
            rows[int(cells[1])] = cells
    return rows


def test_status_playbook_prints_checklist_and_eight_rows(lab: Lab) -> None:
    run = lab.playbook("playbooks/status.yml")
    assert run.rc == 0, run.explain()
    assert API_KEY not in run.output
    assert re.search(r"│ fleet\s+│ done\s+│ \d{4}-\d\d-\d\d \d\d:\d\d UTC │ .*instances=8", run.output), (
        run.output
    )
    for phase in ("provision", "training_stop", "toolchain", "sglang", "prompts", "generate", "merge"):
        assert re.search(rf"│ {phase}\s+│ (done|pending|failed)\s+│", run.output), phase
    assert "Instances (8/8 healthy)" in run.output
    rows = instance_rows(run.output)
    assert sorted(rows) == [PORT_BASE + i for i in range(INSTANCES)], run.output
    for i in range(INSTANCES):
        gpu, _port, health, model, running, waiting, _tps, memory = rows[PORT_BASE + i]
        assert (gpu, health, model, running, waiting, memory) == (str(i), "200 healthy", MODEL, "0", "0", "-")
    assert run.recap["changed"] == 0 and run.recap["failed"] == 0


def test_status_playbook_check_mode_and_json(lab: Lab) -> None:
    run = lab.playbook("playbooks/status.yml", "--check", status_json=True)
    assert run.rc == 0, run.explain()
    block = run.output[run.output.index("msg: |-") + len("msg: |-") : run.output.index("PLAY RECAP")]
    data = json.loads(block)
    assert [(r["port"], r["healthy"], r["model"]) for r in data["instances"]] == [
        (PORT_BASE + i, True, MODEL) for i in range(INSTANCES)
    ]
    assert next(r for r in data["checklist"] if r["phase"] == "fleet")["status"] == "done"


def test_sglfleet_status_in_the_container(lab: Lab) -> None:
    """Run as root in the CT with no flags: the instances, GPUs and API key come from /etc/sglang."""
    out = lab.ct.out(f"{MODULE_PYTHON} -m sglfleet status --width 160")
    assert "Instances (8/8 healthy)" in out, out
    rows = instance_rows(out)
    assert [rows[PORT_BASE + i][3] for i in range(INSTANCES)] == [MODEL] * INSTANCES  # needs the API key
    data = json.loads(lab.ct.out(f"{MODULE_PYTHON} -m sglfleet status --json"))
    assert data["summary"].endswith("all 8 instances healthy")
    assert [r["health"]["gpu"] for r in data["instances"]] == list(range(INSTANCES))


def test_a_stopped_instance_shows_refused_and_comes_back(lab: Lab) -> None:
    lab.ct.run("systemctl stop sglang@5.service")
    try:
        run = lab.playbook("playbooks/status.yml")
        assert run.rc == 0, run.explain()
        assert "Instances (7/8 healthy)" in run.output
        assert instance_rows(run.output)[PORT_BASE + 5][2] == "refused"
        health = lab.ct.run(f"{MODULE_PYTHON} -m sglfleet health --count 8 --json", check=False)
        assert health.returncode == 1
        assert json.loads(health.stdout)["healthy_count"] == 7
    finally:
        lab.ct.run("systemctl start sglang@5.service")
    back = lab.ct.run(f"{MODULE_PYTHON} -m sglfleet health --count 8 --wait 60 --interval 0.5", check=False)
    assert back.returncode == 0, back.stdout + back.stderr
