"""`sglfleet mix` / `sglfleet merge --skip-unchanged --check --json`: the commands decide that their inputs
are unchanged (the report JSON keeps each input's SHA-256 and the options) and say so in one JSON object;
the report JSON carries the evidence the ledger records for phases prompts and merge."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.paths import REPO

from sglfleet.cli import main

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLFLEET_CACHE_DIR", str(tmp_path / "cache"))


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--skip-unchanged", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _results(prompts: Path, results: Path) -> None:
    with results.open("w") as fh:
        for line in prompts.read_text().splitlines():
            body = {"choices": [{"message": {"role": "assistant", "content": "an answer " * 20},
                                 "finish_reason": "stop"}], "usage": {"completion_tokens": 40}}  # fmt: skip
            row = {"custom_id": json.loads(line)["custom_id"], "response": {"status_code": 200, "body": body}}
            fh.write(json.dumps(row) + "\n")


def test_mix_builds_once_then_reports_unchanged_until_an_input_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(REPO / "examples/mix", tmp_path / "mix")
    config, out, report = tmp_path / "mix/lab-mix.yaml", tmp_path / "p.jsonl", tmp_path / "r.md"
    mix = ("mix", "--config", str(config), "--output", str(out), "--report", str(report))

    assert _run(capsys, *mix, "--check")["changed"] is True
    assert not out.exists()  # --check writes nothing
    first = _run(capsys, *mix)
    assert first["changed"] is True and first["report"] == str(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["evidence"] == {
        "prompts": 120,
        "config": "lab-mix.yaml",
        "seed": 20261202,
        "shares": {c: v["share"] for c, v in data["shares"]["new"].items()},
    }
    assert set(data["inputs"]["files"]) == {
        "mix config", "source chat", "source math", "source general", "source multilingual", "existing set"
    }  # fmt: skip
    written = out.stat().st_mtime_ns

    again = _run(capsys, *mix)
    assert again["changed"] is False and "unchanged" in again["message"]
    assert _run(capsys, *mix, "--check")["changed"] is False
    assert out.stat().st_mtime_ns == written

    assert _run(capsys, *mix, "--seed", "9")["changed"] is True  # an option is an input too
    assert json.loads((tmp_path / "r.json").read_text())["evidence"]["seed"] == 9
    assert _run(capsys, *mix, "--seed", "9")["changed"] is False
    source = tmp_path / "mix/sources/openai-math.jsonl"
    source.write_text(
        source.read_text() + json.dumps({"messages": [{"role": "user", "content": "x" * 40}]}) + "\n"
    )
    rebuilt = out.stat().st_mtime_ns
    assert _run(capsys, *mix, "--seed", "9", "--check")["changed"] is True
    assert out.stat().st_mtime_ns == rebuilt
    (tmp_path / "r.md").unlink()  # a report gone: built again
    assert _run(capsys, *mix, "--seed", "9")["changed"] is True


def test_merge_builds_once_then_reports_unchanged_until_an_input_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts, results = tmp_path / "prompts.jsonl", tmp_path / "results.jsonl"
    config = str(REPO / "examples/mix/lab-mix.yaml")
    assert main(["mix", "--config", config, "--output", str(prompts), "--no-cache"]) == 0
    _results(prompts, results)
    existing = REPO / "examples/mix/existing-train.jsonl"
    out = tmp_path / "merged.jsonl"
    merge = ("merge", "--existing", str(existing), "--results", str(results), "--prompts", str(prompts),
             "--output", str(out), "--report", str(tmp_path / "m.md"))  # fmt: skip
    capsys.readouterr()

    assert _run(capsys, *merge)["changed"] is True
    data = json.loads((tmp_path / "m.json").read_text())
    rows = data["rows"]
    assert rows["new"] == 120 and rows["total"] == rows["existing"] + 120
    assert data["evidence"] == {
        "rows_before": rows["existing"],
        "rows_new": 120,
        "rows_after": rows["total"],
        "results": 120,
        "dropped": 0,
        "shares_before": {c: v["share"] for c, v in data["shares"]["before"].items()},
        "shares_after": {c: v["share"] for c, v in data["shares"]["after"].items()},
    }
    assert _run(capsys, *merge)["changed"] is False
    assert _run(capsys, *merge, "--min-completion-tokens", "50", "--check")["changed"] is True
    assert _run(capsys, *merge, "--min-completion-tokens", "50")["changed"] is True
    assert json.loads((tmp_path / "m.json").read_text())["evidence"]["dropped"] == 120
    with results.open("a") as fh:
        fh.write("\n")
    assert _run(capsys, *merge, "--min-completion-tokens", "50", "--check")["changed"] is True
