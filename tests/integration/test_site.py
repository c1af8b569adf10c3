"""playbooks/site.yml on the lab, as `make demo` runs it: every phase in order converges CT 200 to a fleet
of 8 healthy stand-in instances, builds the prompt mix on the controller, runs the generation job across
all 8 instances, merges the answers into the sample training set, gives the GPUs back to the lab's
stand-in trainer (the fleet drained and stopped, the trainer resumed on the merged set), and prints the
checklist with every phase done; a second run changes nothing (the finished job is not run again, the
resumed training and the stopped fleet are left alone), and `--check --diff` on the converged lab reports
nothing to change."""

from __future__ import annotations

import json
import shutil

import pytest
from sglfleet_testing.lab.driver import module_steady
from support.ansible_lab import REPO, Container, PlaybookRun

pytestmark = pytest.mark.timeout(1500)

PHASES = (
    "provision", "training_stop", "toolchain", "sglang", "fleet", "prompts", "generate", "merge",
    "training_resume",
)  # fmt: skip
OUT = REPO / "out/lab"
EXISTING = REPO / "examples/mix/existing-train.jsonl"
# inventory/lab/group_vars/fleet/data.yml
CT_PROMPTS = "/var/lib/sglfleet/prompts.jsonl"
CT_RESULTS = "/var/lib/sglfleet/generated.jsonl"


def _lines(text: str) -> int:
    return len([line for line in text.splitlines() if line.strip()])


def site(ct: Container, *args: str) -> PlaybookRun:
    # Phase toolchain installs the userspace of the declared driver module, which another session may change.
    with module_steady():
        return ct.playbook("playbooks/site.yml", *args, timeout=1200)


@pytest.fixture(scope="module")
def converged(ct: Container) -> PlaybookRun:
    # The data phases start from nothing: no controller work dir, no prompts or results in the CT.
    shutil.rmtree(OUT, ignore_errors=True)
    ct.run(f"rm -f {CT_PROMPTS} {CT_RESULTS} {CT_RESULTS}.*")
    # As `make demo`: the lab's stand-in training job runs first, so that training_stop stops it and
    # training_resume starts it again.
    trainer = ct.playbook("testing/playbooks/lab_trainer.yml")
    assert trainer.rc == 0, trainer.explain()
    run = site(ct)
    assert run.rc == 0, run.explain()
    print(f"site.yml converged in {run.seconds:.1f} s")
    return run


def test_site_brings_every_phase_up_to_a_healthy_fleet(converged: PlaybookRun, ct: Container) -> None:
    for phase in PHASES:
        assert f"│ {phase:<15} │ done" in converged.output, phase
    # The fleet phase's gate saw 8 healthy instances; training_resume then drained and stopped them all.
    fleet = json.loads(ct.out("cat /var/lib/sglfleet/ledger.json"))["phases"]["fleet"]["evidence"]
    assert fleet["healthy"] == fleet["instances"] == 8
    assert "Instances (0/8 healthy)" in converged.output
    states = ct.out("systemctl is-active " + " ".join(f"sglang@{i}" for i in range(8)) + " || true")
    assert states.split() == ["inactive"] * 8
    # Phase sglang decided SM120's backend (the lab's GPUs are RTX PRO 6000s) and every instance runs it.
    assert "SGLANG_ATTENTION_BACKEND=flashinfer" in ct.out("cat /etc/sglang/common.env")
    for i in range(8):
        assert "--attention-backend flashinfer" in ct.out(f"grep SGLANG_ARGS /etc/sglang/instance-{i}.env")


def test_the_job_ran_across_all_eight_instances(converged: PlaybookRun, ct: Container) -> None:
    prompts = (OUT / "prompts.jsonl").read_text()
    assert ct.out(f"cat {CT_PROMPTS}") == prompts.strip()
    manifest = json.loads(ct.out(f"cat {CT_RESULTS}.manifest.json"))
    assert manifest["status"] == "complete", manifest["message"]
    assert manifest["counts"]["done"] == _lines(prompts) == 120
    served = {url: stats["ok"] for url, stats in manifest["endpoint_stats"].items()}
    assert len(served) == 8 and all(ok > 0 for ok in served.values()), served
    ledger = json.loads(ct.out("cat /var/lib/sglfleet/ledger.json"))["phases"]
    assert ledger["generate"]["evidence"]["endpoints"] == 8
    assert ledger["prompts"]["evidence"]["prompts"] == 120


def test_the_merged_set_is_the_existing_set_plus_the_kept_answers(
    converged: PlaybookRun, ct: Container
) -> None:
    report = json.loads((OUT / "merge-report.json").read_text())
    existing = _lines(EXISTING.read_text())
    kept = report["results_read"] - report["dropped"]
    assert report["results_read"] == 120
    assert kept > 0
    assert report["rows"] == {"existing": existing, "new": kept, "total": existing + kept}
    merged = (OUT / "merged.jsonl").read_text().splitlines()
    assert len(merged) == existing + kept
    assert merged[:existing] == EXISTING.read_text().splitlines()
    ledger = json.loads(ct.out("cat /var/lib/sglfleet/ledger.json"))["phases"]["merge"]["evidence"]
    assert (ledger["rows_before"], ledger["rows_after"]) == (existing, existing + kept)


def test_the_trainer_runs_again_on_the_merged_set(converged: PlaybookRun, ct: Container) -> None:
    report = json.loads((OUT / "merge-report.json").read_text())
    unit = "sglfleet-trainer.service"
    assert ct.out(f"systemctl is-active {unit}") == "active"
    pid = ct.unit_props(unit, ["MainPID"])["MainPID"]
    log = ct.out(f"journalctl --unit={unit} _PID={pid} --output=cat")
    assert f"loaded {report['rows']['total']} rows from /var/lib/sglfleet-lab/trainer/train.jsonl" in log, log
    assert "resumed from checkpoint /var/lib/sglfleet-lab/trainer/checkpoint.json at step " in log, log
    evidence = json.loads(ct.out("cat /var/lib/sglfleet/ledger.json"))["phases"]["training_resume"]
    assert evidence["evidence"]["loaded_rows"] == report["rows"]["total"]
    assert evidence["evidence"]["units"] == [unit] and evidence["evidence"]["instances_stopped"] == list(
        range(8)
    )


def test_second_run_changes_nothing(converged: PlaybookRun, ct: Container) -> None:
    before = (OUT / "merged.jsonl").stat().st_mtime_ns
    again = site(ct)
    assert again.rc == 0, again.explain()
    assert again.total("changed") == 0, again.explain()
    assert again.total("failed") == 0
    assert "lab-demo.service: complete" in again.output
    assert (OUT / "merged.jsonl").stat().st_mtime_ns == before
    print(f"site.yml re-run in {again.seconds:.1f} s (first run {converged.seconds:.1f} s)")


def test_check_diff_on_the_converged_lab_reports_nothing(converged: PlaybookRun, ct: Container) -> None:
    check = site(ct, "--check", "--diff")
    assert check.rc == 0, check.explain()
    assert check.total("changed") == 0, check.explain()
