"""playbooks/status.yml, `sglfleet status` and the fleet modules on CT 200 with eight live instances.

The test brings its own state: eight stand-in instances as transient systemd units in CT 200 (on
ports 30100..30107, with an API key), the environment files the sglang_fleet role would write for
them, and a ledger of its own, all removed afterwards. CT 200 shares the host's network namespace.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.ansible_lab import MODULE_PYTHON, REPO, STANDIN_PYTHON, Ansible, Container, PlaybookRun

from sglfleet.fleet import OPTIONAL_PHASES, PHASES

# The checklist counts the phases every fleet goes through; an optional one (router) only once recorded.
REQUIRED = len(PHASES) - len(OPTIONAL_PHASES)

pytestmark = pytest.mark.timeout(600)

INSTANCES = 8
PORT_BASE = 30100
API_KEY = "lab-only-status-key-7d21"  # a test secret: must never show in the output
MODEL = "standin-7b"
WORK = "/var/tmp/sglfleet-status-test"
LEDGER = f"{WORK}/ledger.json"
ENV_DIR = f"{WORK}/sglang"
UNIT = "sglfleet-status-test"
STOP = f"systemctl stop '{UNIT}-*.service'; systemctl reset-failed '{UNIT}-*.service'; true"


def start_instance(i: int) -> str:
    """The command that starts instance i as a transient unit of its own."""
    standin = f"{STANDIN_PYTHON} -m sglfleet_testing.standin"
    return f"systemd-run --unit={UNIT}-{i} --quiet {standin} {standin_args(i)}"


def standin_args(i: int) -> str:
    return (
        f"--model-path /srv/models/{MODEL} --host 127.0.0.1 --port {PORT_BASE + i} "
        f"--served-model-name {MODEL} --api-key {API_KEY}"
    )


class Lab:
    def __init__(self, ct: Container, ansible: Ansible, tmp: Path) -> None:
        self.ct, self.ansible, self.tmp = ct, ansible, tmp
        self.vars = {
            "ansible_python_interpreter": MODULE_PYTHON,
            "status_ledger_path": LEDGER,
            "status_port_base": PORT_BASE,
            "status_instances": INSTANCES,
            "status_api_key": API_KEY,
            # no GPUs here: the memory column reads "-" even where the CT has the stand-in driver's nvidia-smi
            "status_nvidia_smi": "",
        }

    def status(self, *args: str, **overrides: object) -> PlaybookRun:
        extra = self.tmp / f"vars-{time.monotonic_ns()}.json"
        extra.write_text(json.dumps({**self.vars, **overrides}))
        return self.ansible.playbook("playbooks/status.yml", "-e", f"@{extra}", *args)

    def module(self, name: str, args: dict, *flags: str) -> tuple[int, str]:
        """Run a module ad hoc on CT 200 (`ansible fleet -m NAME`): exit status and output."""
        proc = subprocess.run(
            [
                "ansible", "-i", str(REPO / "inventory/lab"), "fleet", "-m", name, "-a", json.dumps(args),
                "-e", f"ansible_python_interpreter={MODULE_PYTHON}", *flags,
            ],
            cwd=REPO, env=self.ansible.env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def lab(fleet_ct: Container, ansible: Ansible, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    ct = fleet_ct
    ct.run(f"{STOP}; rm -rf {WORK}; mkdir -p {ENV_DIR}")
    for i in range(INSTANCES):
        ct.run(start_instance(i))
        ct.put(
            f"{ENV_DIR}/instance-{i}.env",
            f"# Managed by Ansible (role sglang_fleet): SGLang instance {i} (unit sglang@{i}.service).\n"
            f"CUDA_VISIBLE_DEVICES={i}\nPROMETHEUS_MULTIPROC_DIR=/run/sglang/instance-{i}\n"
            f"SGLANG_FLEET_INSTANCE={i}\nSGLANG_FLEET_PORT={PORT_BASE + i}\n"
            f'SGLANG_ARGS="{standin_args(i)}"\n',
            mode="0600",
        )
    lab = Lab(ct, ansible, tmp_path_factory.mktemp("status"))
    rc, out = lab.module(
        "fleet_ledger", {"path": LEDGER, "phase": "fleet", "evidence": {"instances": INSTANCES}}
    )
    assert rc == 0, out
    up = ct.run(
        f"{MODULE_PYTHON} -m sglfleet health --count 8 --port-base {PORT_BASE} --wait 60 --interval 0.5"
    )
    assert up.returncode == 0, up.stdout
    yield lab
    ct.run(f"{STOP}; rm -rf {WORK}")


def instance_rows(output: str) -> dict[int, list[str]]:
    """The instance table's rows by port: the cells of each line that holds one of the test's ports."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 8 and cells[1].isdigit() and PORT_BASE <= int(cells[1]) < PORT_BASE + INSTANCES:
            rows[int(cells[1])] = cells
    return rows


def test_fleet_ledger_module_on_the_target(lab: Lab) -> None:
    path = f"{WORK}/module-test/ledger.json"
    args = {"path": path, "phase": "sglang", "status": "done", "evidence": {"version": "0.5.12"}}
    rc, out = lab.module("fleet_ledger", args, "--check")
    assert rc == 0 and "CHANGED" in out, out
    assert lab.ct.run(f"test -e {path}", check=False).returncode == 1  # check mode wrote nothing
    rc, out = lab.module("fleet_ledger", args)
    assert rc == 0 and "CHANGED" in out, out
    rc, out = lab.module("fleet_ledger", args)
    assert rc == 0 and "SUCCESS" in out and "changed: false" in out, out
    before = lab.ct.out(f"cat {path}")
    rc, out = lab.module("fleet_ledger", {**args, "status": "failed"}, "--check", "--diff")
    assert rc == 0 and "CHANGED" in out and "-    status: done" in out.replace('"', ""), out
    assert lab.ct.out(f"cat {path}") == before
    assert json.loads(before)["phases"]["sglang"]["evidence"] == {"version": "0.5.12"}


def test_status_playbook_prints_checklist_and_eight_rows(lab: Lab) -> None:
    run = lab.status()
    assert run.rc == 0, run.explain()
    assert API_KEY not in run.output, "the API key leaked into the output"
    assert re.search(r"│ fleet\s+│ done\s+│ \d{4}-\d\d-\d\d \d\d:\d\d UTC │ instances=8", run.output), (
        run.output
    )
    for phase in ("provision", "training_stop", "toolchain", "sglang", "prompts", "generate", "merge"):
        assert re.search(rf"│ {phase}\s+│ pending\s+│ -", run.output), phase
    assert "Instances (8/8 healthy)" in run.output
    rows = instance_rows(run.output)
    assert sorted(rows) == [PORT_BASE + i for i in range(INSTANCES)], run.output
    for i in range(INSTANCES):
        gpu, _port, health, model, running, waiting, _tps, memory = rows[PORT_BASE + i]
        assert (gpu, health, model, running, waiting, memory) == (str(i), "200 healthy", MODEL, "0", "0", "-")
    assert f"1/{REQUIRED} phases done; all 8 instances healthy" in run.output
    assert run.recap["changed"] == 0 and run.recap["failed"] == 0, run.explain()


def test_status_playbook_check_mode_and_json(lab: Lab) -> None:
    run = lab.status("--check", status_json=True)
    assert run.rc == 0, run.explain()
    block = run.output[run.output.index("msg: |-") + len("msg: |-") : run.output.index("PLAY RECAP")]
    data = json.loads(block)
    rows = [r["health"] for r in data["instances"]]  # `sglfleet status --json`
    assert [(r["port"], r["gpu"], r["healthy"], r["model"]) for r in rows] == [
        (PORT_BASE + i, i, True, MODEL) for i in range(INSTANCES)
    ]
    assert next(r for r in data["checklist"] if r["phase"] == "fleet")["status"] == "done"


def test_sglfleet_status_in_the_container(lab: Lab) -> None:
    """As root in the CT: the instances, their GPUs and the API key come from the environment files."""
    cmd = f"{MODULE_PYTHON} -m sglfleet status --ledger {LEDGER} --env-dir {ENV_DIR}"
    out = lab.ct.out(f"{cmd} --width 160")
    assert "Instances (8/8 healthy)" in out, out
    assert "│ fleet " in out and "instances=8" in out
    rows = instance_rows(out)
    assert [rows[PORT_BASE + i][3] for i in range(INSTANCES)] == [MODEL] * INSTANCES  # the key was used
    data = json.loads(lab.ct.out(f"{cmd} --json"))
    assert data["summary"] == f"1/{REQUIRED} phases done; all 8 instances healthy"
    assert [r["health"]["gpu"] for r in data["instances"]] == list(range(INSTANCES))


def test_a_stopped_instance_shows_refused_and_comes_back(lab: Lab) -> None:
    lab.ct.run(f"systemctl stop {UNIT}-5.service")
    try:
        run = lab.status()
        assert run.rc == 0, run.explain()
        assert "Instances (7/8 healthy)" in run.output
        assert instance_rows(run.output)[PORT_BASE + 5][2] == "refused"
        probe = f"{MODULE_PYTHON} -m sglfleet health --count 8 --port-base {PORT_BASE}"
        health = lab.ct.run(f"{probe} --json", check=False)
        assert health.returncode == 1
        assert json.loads(health.stdout)["healthy_count"] == 7
        rc, out = lab.module(
            "sglang_health",
            {"count": 8, "port_base": PORT_BASE, "require_healthy": True, "wait": 1, "interval": 0.5},
        )
        assert rc != 0 and f"http://127.0.0.1:{PORT_BASE + 5} (refused)" in out, out
    finally:
        lab.ct.run(f"systemctl reset-failed {UNIT}-5.service; true")
        lab.ct.run(start_instance(5))
    back = lab.ct.run(f"{probe} --wait 60 --interval 0.5", check=False)
    assert back.returncode == 0, back.stdout + back.stderr
