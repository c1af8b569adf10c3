"""playbooks/training_resume.yml against CT 200: the loop closes.

The whole cycle runs the real playbooks, on a fleet of 3 stand-in instances: the lab's stand-in trainer
runs (testing/playbooks/lab_trainer.yml), phase training_stop stops it (checkpoint written, its unit
recorded), the fleet serves, a job generates, merge builds the grown set on the controller; then phase
training_resume drains and stops the fleet, keeps aside the file that was where the trainer reads its set,
moves the merged set in, and starts the trainer's unit again with a drop-in Environment= that hands over
the set and the checkpoint. The trainer logs the rows it loaded and the step it resumed from: the test
checks them against merge's report and the checkpoint. (That a re-run changes nothing, and so do the phases
before it, is test_site's: site.yml's second run.)
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.ansible_lab import MODULE_PYTHON, Ansible, Container, PlaybookRun, wait_until

pytestmark = pytest.mark.timeout(1200)

UNIT = "sglfleet-trainer.service"
DROP_IN = f"/etc/systemd/system/{UNIT}.d/zz-sglfleet-training-resume.conf"
# What `systemctl edit` writes, and the drop-in older versions of the role wrote (it must go).
OVERRIDE = f"/etc/systemd/system/{UNIT}.d/override.conf"
OLD_DROP_IN = f"/etc/systemd/system/{UNIT}.d/50-sglfleet-training-resume.conf"
# inventory/lab/group_vars/fleet/training_resume.yml and testing/playbooks/lab_trainer.yml
DATASET = "/var/lib/sglfleet-lab/trainer/train.jsonl"
CHECKPOINT = "/var/lib/sglfleet-lab/trainer/checkpoint.json"
LEDGER = "/var/lib/sglfleet/ledger.json"
JOB = "resume-test"
INSTANCES = 3
OLD_SET = '{"messages": [{"role": "user", "content": "an older set"}]}\n'


def _vars(work: Path) -> list[str]:
    extra = {
        "sglfleet_data_work_dir": str(work),
        "sglfleet_data_prompts_path": f"/var/lib/sglfleet/{JOB}-prompts.jsonl",
        "sglfleet_data_results_path": f"/var/lib/sglfleet/{JOB}.jsonl",
        "generate_name": JOB,
        "sglang_fleet_instances": INSTANCES,
    }
    return ["-e", json.dumps(extra)]


def _ledger(ct: Container) -> dict:
    return json.loads(ct.out(f"cat {LEDGER}"))["phases"]


def _forget(ct: Container, *phases: str) -> None:
    code = "from sglfleet.fleet import remove_phase\n"
    code += f"for p in {list(phases)!r}: remove_phase({LEDGER!r}, p)"
    ct.run(f"{MODULE_PYTHON} -c {shlex.quote(code)}")


def _clean(ct: Container) -> None:
    ct.run(
        f"systemctl stop {UNIT} 2>/dev/null; rm -rf /etc/systemd/system/{UNIT}.d"
        f" /var/lib/sglfleet-lab/trainer; rm -f /var/lib/sglfleet/{JOB}*; systemctl daemon-reload;"
        f" systemctl reset-failed {UNIT} 2>/dev/null;"
        " systemctl stop 'sglang@*.service'; true"
    )
    _forget(ct, "training_stop", "training_resume")


@pytest.fixture(scope="module")
def cycle(fleet_ct: Container, ansible: Ansible, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """training running → stopped → fleet → prompts → generate → merge; the old set in the trainer's place."""
    ct = fleet_ct
    work = tmp_path_factory.mktemp("resume-work")
    _clean(ct)
    extra = _vars(work)
    phases = (
        "testing/playbooks/lab_trainer.yml",
        "training_stop.yml",
        "fleet.yml",
        "prompts.yml",
        "generate.yml",
        "merge.yml",
    )
    for playbook in phases:
        run = ansible.playbook(playbook, *extra)
        assert run.rc == 0, f"{playbook}: {run.explain()}"
    ct.put(DATASET, OLD_SET)
    yield {"work": work, "extra": extra, "checkpoint": json.loads(ct.out(f"cat {CHECKPOINT}"))}
    _clean(ct)
    ct.run(f"rm -f {DATASET}.kept-*; true")


@pytest.fixture(scope="module")
def resumed(cycle: dict, fleet_ct: Container, ansible: Ansible) -> PlaybookRun:
    check = ansible.playbook("training_resume.yml", "--check", "--diff", *cycle["extra"])
    assert check.rc == 0, check.explain()
    # Check mode predicts the work and does none of it.
    assert check.total("changed") > 0, check.explain()
    units = " ".join(f"sglang@{i}.service" for i in range(INSTANCES))
    assert fleet_ct.out(f"systemctl is-active {units}").split() == ["active"] * INSTANCES
    assert fleet_ct.out(f"cat {DATASET}") == OLD_SET.strip()
    assert fleet_ct.run(f"systemctl is-active {UNIT}", check=False).stdout.strip() != "active"
    # A user's override.conf sets a name the role sets too: drop-ins apply in file-name order
    # (systemd.unit(5)), so ours (zz-) wins; the 50- drop-in an older role wrote is removed.
    fleet_ct.put(OVERRIDE, "[Service]\nEnvironment=SGLFLEET_TRAIN_DATASET=/not/this/one\n")
    fleet_ct.put(OLD_DROP_IN, "[Service]\nEnvironment=SGLFLEET_TRAIN_RESUME_FROM=/not/this/one\n")
    fleet_ct.run("systemctl daemon-reload")
    run = ansible.playbook("training_resume.yml", *cycle["extra"])
    assert run.rc == 0, run.explain()
    return run


def test_the_fleet_is_drained_stopped_and_disabled(resumed: PlaybookRun, fleet_ct: Container) -> None:
    for i in range(INSTANCES):
        props = fleet_ct.unit_props(f"sglang@{i}.service", ["ActiveState", "UnitFileState", "Result"])
        # Result=success: the launcher exits 0 after SGLang's drain (a stop, not a crash).
        expected = {"ActiveState": "inactive", "UnitFileState": "disabled", "Result": "success"}
        assert props == expected, (i, props)


def test_the_merged_set_is_in_place_and_the_old_one_kept_aside(
    resumed: PlaybookRun, fleet_ct: Container, cycle: dict
) -> None:
    merged = (cycle["work"] / "merged.jsonl").read_text()
    assert fleet_ct.out(f"cat {DATASET}") == merged.strip()
    kept = fleet_ct.out(f"ls {DATASET}.kept-*").split()
    assert len(kept) == 1 and re.search(r"\.kept-\d{8}T\d{6}Z-[0-9a-f]{12}$", kept[0]), kept
    assert fleet_ct.out(f"cat {kept[0]}") == OLD_SET.strip()


def test_the_trainer_runs_again_on_the_merged_set_from_its_checkpoint(
    resumed: PlaybookRun, fleet_ct: Container, cycle: dict
) -> None:
    ct = fleet_ct
    assert ct.out(f"systemctl is-active {UNIT}") == "active"
    dropin = ct.out(f"cat {DROP_IN}")
    assert f'Environment="SGLFLEET_TRAIN_DATASET={DATASET}"' in dropin
    assert ct.run(f"test -e {OLD_DROP_IN}", check=False).returncode != 0
    in_effect = ct.out(f"systemctl show --property=Environment --value {UNIT}").split()
    assert (
        f"SGLFLEET_TRAIN_DATASET={DATASET}" in in_effect
        and f"SGLFLEET_TRAIN_RESUME_FROM={CHECKPOINT}" in in_effect
    )
    assert f'Environment="SGLFLEET_TRAIN_RESUME_FROM={CHECKPOINT}"' in dropin
    report = json.loads((cycle["work"] / "merge-report.json").read_text())
    pid = ct.unit_props(UNIT, ["MainPID"])["MainPID"]
    log = ct.out(f"journalctl --unit={UNIT} _PID={pid} --output=cat")
    assert f"loaded {report['rows']['total']} rows from {DATASET}" in log, log
    assert f"resumed from checkpoint {CHECKPOINT} at step {cycle['checkpoint']['step']}" in log, log
    evidence = _ledger(ct)["training_resume"]["evidence"]
    assert evidence["rows"] == evidence["loaded_rows"] == report["rows"]["total"]
    assert evidence["sha256"] == ct.out(f"sha256sum {DATASET}").split()[0]
    assert evidence["units"] == [UNIT] and evidence["job"] == JOB
    assert evidence["instances_stopped"] == list(range(INSTANCES)) and evidence["instances_kept"] == []


# A re-run, and the phases before it (the cycle is closed: training_stop leaves the resumed training alone,
# the fleet stays stopped), change nothing: test_site's second run of site.yml, and its --check --diff run.


def test_a_stop_under_a_running_generation_job_is_refused(
    resumed: PlaybookRun, fleet_ct: Container, ansible: Ansible, cycle: dict
) -> None:
    ct = fleet_ct
    ct.run("systemctl start sglang@0.service")
    ct.run("systemd-run --unit=sglfleet-gen-resume-probe.service --collect sleep 300")
    try:
        run = ansible.playbook("training_resume.yml", "--tags", "training_resume_preflight", *cycle["extra"])
        assert run.rc != 0
        refusal = "a generation job is still running on the fleet (sglfleet-gen-resume-probe.service)"
        assert refusal in run.output, run.explain()
        assert ct.out("systemctl is-active sglang@0.service") == "active"
        # Kept instances are not stopped, so nothing is refused.
        kept = ansible.playbook(
            "training_resume.yml", *cycle["extra"], "-e", '{"training_resume_keep_instances": [0]}'
        )
        assert kept.rc == 0, kept.explain()
        assert ct.out("systemctl is-active sglang@0.service") == "active"
    finally:
        ct.run("systemctl stop sglfleet-gen-resume-probe.service sglang@0.service; true")
    wait_until(
        lambda: ct.run("systemctl is-active sglang@0.service", check=False).stdout.strip() != "active",
        timeout=60,
        what="sglang@0 stopped",
    )
