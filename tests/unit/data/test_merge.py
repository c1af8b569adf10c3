"""`sglfleet merge`: existing rows + generation results → conversation rows; drops; report = recount."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.paths import REPO

from sglfleet.cli import main
from sglfleet.data import DataError, build_mix, load_config, merge

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI caches the existing set's categories; keep that cache inside the test's directory."""
    monkeypatch.setenv("SGLFLEET_CACHE_DIR", str(tmp_path / "cache"))


def result(
    cid: str, *, content: str = "word " * 30, tokens: int = 30, finish: str = "stop", status: int = 200
) -> dict:
    body: dict[str, Any] = {
        "id": f"chatcmpl-{cid}",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": tokens, "total_tokens": 12 + tokens},
    }
    if status != 200:
        body = {"object": "error", "message": "overloaded", "type": "ServerError", "code": status}
    return {
        "id": f"batch_req_{cid}",
        "custom_id": cid,
        "response": {"status_code": status, "request_id": cid, "body": body},
        "error": None,
    }


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def mixed(tmp_path: Path) -> tuple[Path, Path, list[dict]]:
    """The lab mix: the existing set and the 120 prompts built from the sample sources."""
    config = load_config(REPO / "examples/mix/lab-mix.yaml")
    prompts = tmp_path / "prompts.jsonl"
    build_mix(config, prompts)
    assert config.existing is not None
    return config.existing.path, prompts, [json.loads(line) for line in prompts.read_text().splitlines()]


def test_merge_keeps_good_answers_and_drops_the_rest(tmp_path: Path, mixed) -> None:
    existing, prompts, rows = mixed
    ids = [r["custom_id"] for r in rows]
    results = [result(cid) for cid in ids[:100]]
    results[0] = result(ids[0], status=503)
    results[1] = result(ids[1], finish="length")
    results[2] = result(ids[2], tokens=16)  # under the default minimum of 17
    results[3] = result(ids[3], tokens=17)  # exactly the minimum: kept
    results[4] = result(ids[4], content="   ")
    results[5] = {
        "id": "x",
        "custom_id": ids[5],
        "response": None,
        "error": {"code": "timeout", "message": "t"},
    }
    results.append(result(ids[6]))  # a second answer for the same prompt
    results_path = write_jsonl(tmp_path / "results.jsonl", results)
    out, report_md = tmp_path / "merged.jsonl", tmp_path / "merge-report.md"
    report = merge(existing, results_path, prompts, out, report_md)

    assert dict(report.dropped) == {
        "failed": 2,
        "finish_reason_length": 1,
        "too_short": 1,
        "empty": 1,
        "duplicate": 1,
    }
    lines = out.read_bytes().splitlines(keepends=True)
    existing_lines = existing.read_bytes().splitlines(keepends=True)
    assert lines[: len(existing_lines)] == existing_lines  # existing rows are copied unchanged
    new = [json.loads(line) for line in lines[len(existing_lines) :]]
    assert len(new) == 95 == sum(report.new.values())
    assert len({r["id"] for r in new}) == 95
    by_id = {r["custom_id"]: r for r in rows}
    for row in new:
        assert set(row) == {"id", "conversations"}
        assert row["conversations"][:-1] == by_id[row["id"]]["body"]["messages"]
        assert row["conversations"][-1] == {"role": "assistant", "content": "word " * 30}
    assert ids[3] in {r["id"] for r in new} and ids[2] not in {r["id"] for r in new}

    data = json.loads(report_md.with_suffix(".json").read_text())
    assert data["rows"] == {"existing": 100, "new": 95, "total": 195}
    assert data["results_read"] == 101
    assert data["prompts"] == 120 and data["prompts_without_result"] == 20
    recount = Counter(by_id[r["id"]]["metadata"]["category"] for r in new)
    assert {c: v["rows"] for c, v in data["shares"]["new"].items()} == dict(recount)
    assert data["shares"]["before"]["code"] == {"rows": 77, "share": 0.77}
    after = data["shares"]["after"]
    assert sum(v["rows"] for v in after.values()) == 195
    assert after["code"]["rows"] == 77 and after["code"]["share"] == round(77 / 195, 4)
    assert "| code | 77 (77.0%) | 0 (0.0%) | 77 (39.5%) |" in report_md.read_text()


def test_min_tokens_and_finish_reasons_are_configurable(tmp_path: Path, mixed) -> None:
    existing, prompts, rows = mixed
    ids = [r["custom_id"] for r in rows[:3]]
    results = write_jsonl(
        tmp_path / "r.jsonl",
        [result(ids[0], finish="length"), result(ids[1], tokens=5), result(ids[2], tokens=40)],
    )
    report = merge(
        existing, results, prompts, tmp_path / "o.jsonl", drop_finish_reasons=(), min_completion_tokens=1
    )
    assert sum(report.new.values()) == 3 and not report.dropped
    report = merge(existing, results, prompts, tmp_path / "o.jsonl", min_completion_tokens=41)
    assert sum(report.new.values()) == 0
    assert dict(report.dropped) == {"finish_reason_length": 1, "too_short": 2}


def test_a_result_for_an_unknown_prompt_is_an_error_naming_the_line(tmp_path: Path, mixed) -> None:
    existing, prompts, rows = mixed
    results = write_jsonl(tmp_path / "r.jsonl", [result(rows[0]["custom_id"]), result("nope-1-abc")])
    with pytest.raises(DataError, match=r"r\.jsonl:2: custom_id 'nope-1-abc' is not in the prompts file"):
        merge(existing, results, prompts, tmp_path / "o.jsonl")
    assert not (tmp_path / "o.jsonl").exists()
    (tmp_path / "bad.jsonl").write_text('{"id": "e", "text": "no conversations"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:1: row has no field 'conversations'"):
        merge(tmp_path / "bad.jsonl", results, prompts, tmp_path / "o.jsonl")


def test_cli_merge(tmp_path: Path, mixed, capsys: pytest.CaptureFixture) -> None:
    existing, prompts, rows = mixed
    results = write_jsonl(tmp_path / "r.jsonl", [result(r["custom_id"]) for r in rows])
    out = tmp_path / "merged.jsonl"
    args = ["merge", "--existing", str(existing), "--results", str(results), "--prompts", str(prompts)]
    assert main([*args, "--output", str(out), "--report", str(tmp_path / "m.md")]) == 0
    assert "220 rows written" in capsys.readouterr().out
    assert len(out.read_text().splitlines()) == 220
    assert main([*args, "--output", str(out), "--min-completion-tokens", "31"]) == 0
    assert "100 rows written" in capsys.readouterr().out
    assert main([*args[:-1], str(tmp_path / "missing.jsonl"), "--output", str(out)]) == 2
    assert "prompts: " in capsys.readouterr().err


def test_prompts_default_to_the_input_of_the_generation_manifest(tmp_path: Path, mixed) -> None:
    existing, prompts, rows = mixed
    results = write_jsonl(tmp_path / "r.jsonl", [result(r["custom_id"]) for r in rows[:10]])
    with pytest.raises(
        DataError, match=r"r\.jsonl: no r\.jsonl\.manifest\.json next to it .* pass --prompts"
    ):
        merge(existing, results, None, tmp_path / "o.jsonl")
    manifest = {  # relative: to the manifest's directory (where the mix wrote the prompts)
        "status": "complete",
        "input": {"path": prompts.name, "sha256": hashlib.sha256(prompts.read_bytes()).hexdigest()},
    }
    (tmp_path / "r.jsonl.manifest.json").write_text(json.dumps(manifest))
    report = merge(existing, results, None, tmp_path / "o.jsonl")
    assert sum(report.new.values()) == 10 and report.prompts == 120
