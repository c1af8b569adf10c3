"""The category shares chart that `sglfleet mix` and `merge` draw beside their Markdown report
(REPORT.png, the plot extra), the same bytes for the same data, and a note instead without the extra."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from support.paths import REPO
from test_merge import result, write_jsonl

from sglfleet.cli import main
from sglfleet.plot import shares_chart

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLFLEET_CACHE_DIR", str(tmp_path / "cache"))


def test_the_chart_is_a_png_and_the_same_data_gives_the_same_bytes(tmp_path: Path) -> None:
    before, new = Counter(code=77, chat=23), Counter(chat=56, math=23, writing=15, code=0)
    first = shares_chart(before, new, tmp_path / "a.png", title="shares")
    second = shares_chart(before, new, tmp_path / "b.png", title="shares")
    assert first.read_bytes().startswith(PNG) and first.stat().st_size > 10_000
    assert first.read_bytes() == second.read_bytes()  # no timestamp in it: a rerun changes nothing


def test_mix_and_merge_draw_it_beside_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "prompts.jsonl"
    config = str(REPO / "examples/mix/lab-mix.yaml")
    assert main(["mix", "--config", config, "-o", str(prompts), "--report", str(tmp_path / "mix.md")]) == 0
    assert f"chart: {tmp_path / 'mix.png'}" in capsys.readouterr().out
    assert (tmp_path / "mix.png").read_bytes().startswith(PNG)

    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    results = write_jsonl(tmp_path / "r.jsonl", [result(r["custom_id"]) for r in rows])
    existing = str(REPO / "examples/mix/existing-train.jsonl")
    args = ["merge", "--existing", existing, "--results", str(results), "--prompts", str(prompts)]
    assert main([*args, "-o", str(tmp_path / "train.jsonl"), "--report", str(tmp_path / "merge.md")]) == 0
    assert f"chart: {tmp_path / 'merge.png'}" in capsys.readouterr().out
    assert (tmp_path / "merge.png").read_bytes().startswith(PNG)


def test_without_the_plot_extra_the_merge_is_written_and_a_note_says_how(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"custom_id": "a1", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"messages": [{"role": "user", "content": "Write a poem about the sea."}]}})
        + "\n"
    )  # fmt: skip
    results = write_jsonl(tmp_path / "r.jsonl", [result("a1")])
    existing = str(REPO / "examples/mix/existing-train.jsonl")
    argv = ["merge", "--existing", existing, "--results", str(results), "--prompts", str(prompts),
            "-o", str(tmp_path / "train.jsonl"), "--report", str(tmp_path / "merge.md")]  # fmt: skip
    probe = (
        "import sys; sys.modules['matplotlib'] = None\n"  # as if the extra were not installed
        f"from sglfleet.cli import main; sys.exit(main({argv!r}))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "note: no chart: matplotlib is missing; pip install 'sglfleet[plot]'" in proc.stdout
    assert (tmp_path / "merge.md").exists() and not (tmp_path / "merge.png").exists()
