"""sglfleet.fleet._ledger: the phase ledger file, and the fleet_ledger module run as Ansible runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.module_runner import assert_examples_use_documented_options, module_doc, run_module

from sglfleet.fleet import (
    LEDGER_PATH,
    OPTIONAL_PHASES,
    PHASES,
    STATUSES,
    LedgerError,
    load_ledger,
    record_phase,
    remove_phase,
)

pytestmark = pytest.mark.timeout(60)

T0 = datetime(2026, 12, 2, 18, 0, 0, tzinfo=UTC)
T1 = datetime(2026, 12, 2, 19, 0, 0, tzinfo=UTC)


def test_the_optional_router_phase_is_listed_once_recorded(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    record_phase(path, "fleet", "done", {"ports": [30000]}, now=T0)
    assert "router" not in [r.phase for r in load_ledger(path).checklist()]
    record_phase(path, "router", "done", {"url": "http://10.0.0.5:30100", "workers": 16}, now=T1)
    rows = load_ledger(path).checklist()
    phases = [r.phase for r in rows]
    assert phases[phases.index("fleet") + 1] == "router"  # in run order: it needs the fleet up
    router = rows[phases.index("router")]
    assert (router.status, router.evidence["workers"]) == ("done", 16)


def test_missing_file_reads_as_every_phase_pending(tmp_path: Path) -> None:
    ledger = load_ledger(tmp_path / "nope.json")
    rows = ledger.checklist()
    assert [r.phase for r in rows] == [
        "host", "provision", "training_stop", "toolchain", "sglang", "model", "fleet",
        "prompts", "generate", "merge", "training_resume",
    ]  # fmt: skip
    assert {r.status for r in rows} == {"pending"}
    assert not any(r.recorded for r in rows)


def test_record_writes_status_time_evidence(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "ledger.json"
    result = record_phase(path, "fleet", "done", {"instances": 8, "ports": [30000, 30001]}, now=T0)
    assert result.changed and result.before is None
    on_disk = json.loads(path.read_text())
    assert on_disk == {
        "version": 1,
        "phases": {
            "fleet": {
                "status": "done",
                "time": "2026-12-02T18:00:00Z",
                "evidence": {"instances": 8, "ports": [30000, 30001]},
            }
        },
    }  # fmt: skip
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    row = next(r for r in load_ledger(path).checklist() if r.phase == "fleet")
    assert (row.status, row.time, row.recorded) == ("done", T0, True)


def test_identical_outcome_is_unchanged_and_keeps_first_time(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    record_phase(path, "sglang", "done", {"version": "0.5.12"}, now=T0)
    mtime = path.stat().st_mtime_ns
    again = record_phase(path, "sglang", "done", {"version": "0.5.12"}, now=T1)
    assert not again.changed
    assert again.after is not None and again.after.time == T0
    assert path.stat().st_mtime_ns == mtime  # not rewritten


@pytest.mark.parametrize(
    ("status", "evidence"),
    [("failed", {"version": "0.5.12"}), ("done", {"version": "0.5.13"}), ("done", {})],
)
def test_new_status_or_evidence_is_a_change_with_new_time(
    tmp_path: Path, status: str, evidence: dict
) -> None:
    path = tmp_path / "ledger.json"
    record_phase(path, "sglang", "done", {"version": "0.5.12"}, now=T0)
    result = record_phase(path, "sglang", status, evidence, now=T1)
    assert result.changed
    assert result.before is not None and result.before.time == T0
    stored = load_ledger(path).phases["sglang"]
    assert (stored.status, stored.evidence, stored.time) == (status, evidence, T1)


def test_other_phases_survive_a_record(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    record_phase(path, "provision", "done", {"vmid": 200}, now=T0)
    record_phase(path, "training_stop", "failed", {"pid": 4242}, now=T1)
    phases = load_ledger(path).phases
    assert set(phases) == {"provision", "training_stop"}
    assert phases["provision"].evidence == {"vmid": 200}


def test_check_mode_reports_the_change_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "ledger.json"
    result = record_phase(path, "fleet", "done", {"n": 8}, check_mode=True, now=T0)
    assert result.changed
    assert not path.parent.exists()  # not even the directory or the lock file
    record_phase(path, "fleet", "done", {"n": 8}, now=T0)
    assert not record_phase(path, "fleet", "done", {"n": 8}, check_mode=True).changed
    assert record_phase(path, "fleet", "failed", {"n": 8}, check_mode=True).changed
    assert load_ledger(path).phases["fleet"].status == "done"


def test_remove_phase(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    record_phase(path, "generate", "done", {}, now=T0)
    assert remove_phase(path, "generate", check_mode=True).changed
    assert "generate" in load_ledger(path).phases
    assert remove_phase(path, "generate").changed
    assert "generate" not in load_ledger(path).phases
    assert not remove_phase(path, "generate").changed


def test_bad_json_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    path.write_text('{\n  "version": 1,\n  "phases": {,}\n}\n')
    with pytest.raises(LedgerError, match=rf"{path}:3:\d+: not valid JSON"):
        load_ledger(path)


def test_bad_schema_names_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    path.write_text(
        json.dumps(
            {"version": 1, "phases": {"fleet": {"status": "half-done", "time": "2026-12-02T18:00:00Z"}}}
        )
    )
    with pytest.raises(LedgerError, match=rf"{path}: not a valid sglfleet ledger: phases.fleet.status"):
        load_ledger(path)
    path.write_text(
        json.dumps({"version": 1, "phases": {"deploy": {"status": "done", "time": "2026-12-02T18:00:00Z"}}})
    )
    with pytest.raises(LedgerError, match=r"phases.deploy"):
        load_ledger(path)


def test_bad_arguments_change_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    with pytest.raises(ValueError, match="phase 'deploy' is not one of host, provision"):
        record_phase(path, "deploy", "done")
    with pytest.raises(ValueError, match="status 'ok' is not one of done, failed, pending"):
        record_phase(path, "fleet", "ok")
    with pytest.raises(ValueError, match="evidence must be JSON data"):
        record_phase(path, "fleet", "done", {"when": datetime.now(UTC)})
    assert not path.exists()


def test_atomic_write_leaves_no_temp_files_and_old_file_on_failure(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "ledger.json"
    record_phase(path, "fleet", "done", {"n": 8}, now=T0)
    before = path.read_text()

    def boom(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(LedgerError, match=rf"{path}: cannot write the ledger: No space left on device"):
        record_phase(path, "fleet", "failed", {"n": 8}, now=T1)
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.json", "ledger.json.lock"]


def test_concurrent_writers_from_processes_lose_no_phase(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    code = (
        "import sys; from sglfleet.fleet import record_phase; "
        "record_phase(sys.argv[1], sys.argv[2], 'done', {'i': int(sys.argv[3])})"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(path), phase, str(i)])
        for i, phase in enumerate(PHASES)
    ]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    assert set(load_ledger(path).phases) == set(PHASES)


def test_threads_reading_never_see_half_a_file(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    record_phase(path, "fleet", "done", {"blob": "x" * 200_000}, now=T0)
    stop = threading.Event()
    errors: list[Exception] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                load_ledger(path)
            except LedgerError as exc:  # a torn read would fail to parse
                errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(30):
        record_phase(path, "fleet", "done", {"blob": str(i) * 200_000})
    stop.set()
    thread.join()
    assert errors == []


# --- the module, run as Ansible runs it ---------------------------------------------------------


def test_module_records_then_is_idempotent_with_diff(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    args = {"path": str(path), "phase": "fleet", "status": "done", "evidence": {"instances": 8}}
    first = run_module("fleet_ledger", args, tmp_path, diff=True)
    assert first["changed"] is True
    assert first["record"]["status"] == "done" and first["record"]["evidence"] == {"instances": 8}
    assert first["diff"]["before"] == {} and first["diff"]["after"]["evidence"] == {"instances": 8}
    second = run_module("fleet_ledger", args, tmp_path, diff=True)
    assert second["changed"] is False
    assert "diff" not in second
    assert second["record"] == first["record"]


def test_module_check_mode_matches_real_run(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    args = {
        "path": str(path),
        "phase": "training_stop",
        "status": "done",
        "evidence": {"stopped": ["train.service"]},
    }
    checked = run_module("fleet_ledger", args, tmp_path, check=True, diff=True)
    assert checked["changed"] is True
    assert checked["diff"]["after"]["status"] == "done"
    assert not path.exists()
    assert run_module("fleet_ledger", args, tmp_path)["changed"] is True
    assert run_module("fleet_ledger", args, tmp_path, check=True)["changed"] is False
    failed = {**args, "status": "failed"}
    diffed = run_module("fleet_ledger", failed, tmp_path, check=True, diff=True)
    assert diffed["changed"] is True
    assert (diffed["diff"]["before"]["status"], diffed["diff"]["after"]["status"]) == ("done", "failed")
    assert load_ledger(path).phases["training_stop"].status == "done"


def test_module_read_and_absent(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    empty = run_module("fleet_ledger", {"path": str(path), "state": "read"}, tmp_path)
    assert empty["changed"] is False and empty["exists"] is False
    assert [r["status"] for r in empty["checklist"]] == ["pending"] * (len(PHASES) - len(OPTIONAL_PHASES))
    run_module("fleet_ledger", {"path": str(path), "phase": "provision", "evidence": {"vmid": 200}}, tmp_path)
    read = run_module("fleet_ledger", {"path": str(path), "state": "read"}, tmp_path)
    assert read["checklist"][1] == {
        "phase": "provision", "status": "done", "time": read["ledger"]["phases"]["provision"]["time"],
        "evidence": {"vmid": 200}, "recorded": True,
    }  # fmt: skip
    gone = run_module("fleet_ledger", {"path": str(path), "phase": "provision", "state": "absent"}, tmp_path)
    assert gone["changed"] is True and gone["record"] is None
    assert (
        run_module("fleet_ledger", {"path": str(path), "phase": "provision", "state": "absent"}, tmp_path)[
            "changed"
        ]
        is False
    )


def test_module_rejects_bad_input_before_writing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    bad_phase = run_module("fleet_ledger", {"path": str(path), "phase": "deploy"}, tmp_path)
    assert bad_phase["failed"] and "phase" in bad_phase["msg"] and "deploy" in bad_phase["msg"]
    no_phase = run_module("fleet_ledger", {"path": str(path)}, tmp_path)
    assert no_phase["failed"] and "phase" in no_phase["msg"]
    assert not path.exists()
    path.write_text("{not json")
    broken = run_module("fleet_ledger", {"path": str(path), "phase": "fleet"}, tmp_path)
    assert broken["failed"] and broken["msg"].startswith(f"{path}:1:2: not valid JSON")
    assert path.read_text() == "{not json"


def test_module_documentation_renders() -> None:
    doc = module_doc("fleet_ledger")
    assert doc["doc"]["short_description"].startswith("Record or read a phase's outcome")
    assert set(doc["doc"]["options"]) == {"path", "phase", "status", "evidence", "state"}
    assert doc["doc"]["options"]["phase"]["choices"] == list(PHASES)
    assert doc["doc"]["options"]["status"]["choices"] == list(STATUSES)
    assert doc["doc"]["options"]["path"]["default"] == str(LEDGER_PATH)
    assert {"record", "previous", "ledger", "checklist"} <= set(doc["return"])
    assert_examples_use_documented_options("fleet_ledger", doc)
