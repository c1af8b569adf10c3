"""The data phases' roles run with ansible-playbook (local connection, no lab): they follow an inventory
that moves the variables every phase shares (role sglfleet), phase prompts is idempotent, and phase
generate builds its endpoints from what phase fleet recorded in each host's ledger, or says which host
has not served yet."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from sglfleet_testing.standin.process import standin_argv
from support.net import consecutive_free_ports
from support.paths import REPO

from sglfleet.fleet import check_fleet, endpoints_from_range, load_ledger, record_phase
from sglfleet.gen import job_phase_status, job_verdict

pytestmark = pytest.mark.timeout(240)

ROOT = REPO
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")


def inventory(tmp_path: Path, **group_vars: object) -> Path:
    """A one-host inventory (the controller itself as fleet host) whose group_vars move the shared paths."""
    inv = tmp_path / "inventory"
    (inv / "group_vars" / "fleet").mkdir(parents=True, exist_ok=True)
    (inv / "hosts.ini").write_text(
        f"[fleet]\nlocalhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    )
    shared = {
        "sglfleet_ledger_path": str(tmp_path / "fleet" / "ledger.json"),
        "sglfleet_data_work_dir": str(tmp_path / "work"),
        "sglfleet_data_prompts_path": str(tmp_path / "fleet" / "prompts.jsonl"),
        "sglfleet_data_results_path": str(tmp_path / "fleet" / "results.jsonl"),
    }
    (inv / "group_vars" / "fleet" / "data.yml").write_text(json.dumps({**shared, **group_vars}))
    (tmp_path / "fleet").mkdir(exist_ok=True)
    return inv


def playbook(inv: Path, *args: str) -> tuple[int, str, dict[str, int]]:
    proc = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(inv), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=220,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        check=False,
    )
    recap = re.search(r"^localhost\s*:\s*(.*)$", proc.stdout, re.MULTILINE)
    stats = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", recap.group(1))} if recap else {}
    return proc.returncode, proc.stdout + proc.stderr, stats


def test_prompts_follows_the_inventory_and_reruns_unchanged(tmp_path: Path) -> None:
    inv = inventory(tmp_path, prompt_mix_config=str(ROOT / "examples/mix/lab-mix.yaml"))
    rc, out, stats = playbook(inv, "playbooks/prompts.yml")
    assert rc == 0, out[-4000:]
    prompts = (tmp_path / "fleet" / "prompts.jsonl").read_text().splitlines()
    assert len(prompts) == 120
    assert (tmp_path / "work" / "prompts.jsonl").read_text().splitlines() == prompts
    record = load_ledger(tmp_path / "fleet" / "ledger.json").phases["prompts"]
    assert record.status == "done" and record.evidence["prompts"] == 120
    assert record.evidence["path"] == str(tmp_path / "fleet" / "prompts.jsonl")

    rc, out, stats = playbook(inv, "playbooks/prompts.yml")
    assert rc == 0 and stats["changed"] == 0, out[-4000:]
    rc, out, stats = playbook(inv, "playbooks/prompts.yml", "--check")
    assert rc == 0 and stats["changed"] == 0, out[-4000:]

    # sglfleet mix decides, from the report JSON's inputs: an output gone is a rebuild, which check
    # mode predicts without writing it
    (tmp_path / "work" / "prompts.jsonl").unlink()
    rc, out, stats = playbook(inv, "playbooks/prompts.yml", "--check")
    assert rc == 0 and stats["changed"] == 1, out[-4000:]
    assert "Build the mix when its inputs changed" in out.split("changed:")[0].rsplit("TASK", 1)[-1]
    assert not (tmp_path / "work" / "prompts.jsonl").exists()
    rc, out, stats = playbook(inv, "playbooks/prompts.yml")
    assert rc == 0 and stats["changed"] == 1, out[-4000:]
    assert (tmp_path / "work" / "prompts.jsonl").read_text().splitlines() == prompts


def test_prompts_preflight_names_what_is_missing(tmp_path: Path) -> None:
    rc, out, _ = playbook(inventory(tmp_path), "playbooks/prompts.yml")
    assert rc != 0
    assert "set prompt_mix_config" in out
    assert not (tmp_path / "work").exists(), "nothing may be written before the preflight passes"


def _endpoints(tmp_path: Path, inv: Path, *extra: str) -> tuple[int, str, list[str] | None]:
    """generate.yml up to its endpoints step only; the endpoint list it built."""
    result = tmp_path / "endpoints.json"
    wrapper = tmp_path / "wrapper.yml"
    wrapper.write_text(
        "- name: The playbook under test\n"
        f"  ansible.builtin.import_playbook: {ROOT / 'playbooks/generate.yml'}\n"
        "- name: Save the endpoints\n  hosts: fleet\n  gather_facts: false\n  tasks:\n"
        "    - name: Save them\n      ansible.builtin.copy:\n"
        '        content: \'{{ {"urls": __generate_endpoints, "model": __generate_model} | to_json }}\'\n'
        f"        dest: {result}\n        mode: '0644'\n      tags: [generate_endpoints]\n"
    )
    rc, out, _ = playbook(inv, str(wrapper), "--tags", "generate_preflight,generate_endpoints", *extra)
    return rc, out, json.loads(result.read_text()) if result.exists() else None


def test_generate_takes_its_endpoints_from_the_fleet_phase_record(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    path = tmp_path / "fleet" / "ledger.json"
    ports = [31000, 31001, 31002]
    record_phase(path, "fleet", "done", {"instances": 3, "ports": ports, "model": "target-model"})
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / "localhost.yml").write_text("generate_endpoint_host: 10.9.8.7\n")
    rc, out, saved = _endpoints(tmp_path, inv)
    assert rc == 0, out[-4000:]
    assert saved == {"urls": [f"http://10.9.8.7:{p}" for p in ports], "model": "target-model"}

    rc, out, saved = _endpoints(tmp_path, inv, "-e", json.dumps({"generate_endpoints": ["http://h:1"]}))
    assert rc == 0, out[-4000:]
    assert saved == {"urls": ["http://h:1"], "model": ""}


def test_generate_refuses_a_host_whose_fleet_has_not_served(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    record_phase(tmp_path / "fleet" / "ledger.json", "prompts", "done", {"prompts": 3})
    rc, out, saved = _endpoints(tmp_path, inv)
    assert rc != 0 and saved is None
    assert "phase fleet is not done on localhost" in out and "playbooks/fleet.yml" in out


def _record(tmp_path: Path, inv: Path, job: dict, max_failures: int) -> tuple[int, str]:
    """Run role generate's record step on a job result as generation_job returns it."""
    play = tmp_path / "record.yml"
    play.write_text(
        json.dumps(
            [
                {
                    "name": "Record a finished job",
                    "hosts": "fleet",
                    "gather_facts": False,
                    "vars": {
                        "generate_max_failures": max_failures,
                        "__generate_job": job,
                        "__generate_endpoints": ["http://127.0.0.1:1", "http://127.0.0.1:2"],
                    },
                    "tasks": [
                        {
                            "name": "The record step of role generate",
                            "ansible.builtin.include_role": {"name": "generate", "tasks_from": "record"},
                        }
                    ],
                }
            ]
        )
    )
    rc, out, _ = playbook(inv, str(play))
    return rc, out


def _job(status: str, failed: int, max_failures: int = 0) -> dict:
    """A finished job as generation_job returns it: its phase_done and phase_status are the package's."""
    counts = {"total": 600, "done": 600 - failed, "failed": failed}
    manifest = SimpleNamespace(status=status, counts=SimpleNamespace(failed=failed))
    phase_done, _ = job_verdict(
        SimpleNamespace(manifest=manifest, running=False, exit_status=None, results_problem=None),
        max_failures,
    )
    return {
        "phase_done": phase_done,
        "phase_status": job_phase_status(phase_done),
        "unit": "sglfleet-gen-x.service",
        "status": status,
        "counts": counts,
        "reason": "it ended",
        "tokens": {"completion": 1234},
        "message": "the failures are in out.jsonl.errors.jsonl",
    }


@pytest.mark.parametrize(
    ("status", "failed", "max_failures", "recorded"),
    [
        ("complete", 0, 0, "done"),
        ("complete_with_failures", 3, 5, "done"),
        ("complete_with_failures", 5, 5, "done"),
        ("complete_with_failures", 600, 0, "failed"),
        ("complete_with_failures", 6, 5, "failed"),
    ],
)
def test_generate_is_done_only_within_the_failure_tolerance(
    tmp_path: Path, status: str, failed: int, max_failures: int, recorded: str
) -> None:
    inv = inventory(tmp_path)
    rc, out = _record(tmp_path, inv, _job(status, failed, max_failures), max_failures)
    record = load_ledger(tmp_path / "fleet" / "ledger.json").phases["generate"]
    assert record.status == recorded, out[-3000:]
    assert record.evidence["failed"] == failed and record.evidence["max_failures"] == max_failures
    if recorded == "done":
        assert rc == 0, out[-3000:]
    else:
        assert rc != 0
        assert f"with {failed} of 600 prompts failed, more than generate_max_failures={max_failures}" in out


def test_prompts_then_merge_follow_the_inventory_and_rerun_unchanged(tmp_path: Path) -> None:
    """Phase prompts, a real job against a stand-in (as phase generate runs it), then phase merge: the
    merged set and both ledger records land where the inventory says; a second merge changes nothing."""
    inv = inventory(
        tmp_path,
        prompt_mix_config=str(ROOT / "examples/mix/lab-mix.yaml"),
        merge_existing=str(ROOT / "examples/mix/existing-train.jsonl"),
    )
    rc, out, _ = playbook(inv, "playbooks/prompts.yml")
    assert rc == 0, out[-4000:]
    port = consecutive_free_ports(1)
    server = subprocess.Popen(standin_argv(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        assert check_fleet(endpoints_from_range("127.0.0.1", port, 1), wait=30, interval=0.1).all_healthy
        job = subprocess.run(
            [sys.executable, "-m", "sglfleet", "generate", "-i", str(tmp_path / "fleet" / "prompts.jsonl"),
             "-o", str(tmp_path / "fleet" / "results.jsonl"), "-e", url, "--max-tokens", "64"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert job.returncode == 0, job.stderr[-3000:]
    finally:
        server.kill()
        server.wait()

    rc, out, stats = playbook(inv, "playbooks/merge.yml")
    assert rc == 0, out[-4000:]
    report = json.loads((tmp_path / "work" / "merge-report.json").read_text())
    merged = (tmp_path / "work" / "merged.jsonl").read_text().splitlines()
    assert len(merged) == report["rows"]["total"] > report["rows"]["existing"]
    record = load_ledger(tmp_path / "fleet" / "ledger.json").phases["merge"]
    assert record.status == "done" and record.evidence["rows_after"] == len(merged)

    rc, out, stats = playbook(inv, "playbooks/merge.yml")
    assert rc == 0 and stats["changed"] == 0, out[-4000:]
    rc, out, stats = playbook(inv, "playbooks/merge.yml", "--check")
    assert rc == 0 and stats["changed"] == 0, out[-4000:]
    assert record.evidence == report["evidence"]  # the ledger records what the report JSON says

    # prompts on the controller that are not what the job ran on (the same ids, other questions): the
    # job's manifest came with its results, and merge refuses to pair answers with them
    prompts = tmp_path / "work" / "prompts.jsonl"
    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    for row in rows:
        row["body"]["messages"][-1]["content"] = "changed: " + row["body"]["messages"][-1]["content"]
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    rc, out, _ = playbook(inv, "playbooks/merge.yml")
    assert rc != 0, out[-4000:]
    assert "are not the input the results were generated from" in " ".join(out.split()), out[-4000:]
    assert (tmp_path / "work" / "merged.jsonl").read_text().splitlines() == merged
