"""`build_mix` is a pipeline of named stages: each stage's output, and the stages run by hand in order
(scan existing → read → filter → dedupe → fill quotas → write) giving the bytes `build_mix` writes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from sglfleet.data._mix import (
    Survivors,
    build_mix,
    dedupe_stage,
    filter_stage,
    quota_stage,
    read_stage,
    scan_stage,
    write_stage,
)
from sglfleet.data._mixconfig import parse_config
from sglfleet.data._report import SourceReport

pytestmark = pytest.mark.timeout(60)


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_stages_by_hand_write_what_build_mix_writes(tmp_path: Path) -> None:
    texts = [f"prompt number {i} about topic {i * 7} and more words {i}" for i in range(12)]
    rows = [{"text": t} for t in texts]
    rows[3] = {"text": "hi"}  # too short
    rows[5] = {"text": texts[1].upper()}  # exact duplicate of row 1 once normalised
    rows[8] = {"text": texts[0]}  # ... and of the existing set's prompt
    rows.append({"nope": 1})  # does not fit the format: counted as invalid
    source = _jsonl(tmp_path / "src.jsonl", rows)
    existing = _jsonl(
        tmp_path / "existing.jsonl", [{"conversations": [{"role": "user", "content": texts[0]}]}]
    )
    config = parse_config(
        {
            "seed": 3,
            "existing": {"path": str(existing)},
            "filters": {"min_chars": 5},
            "sources": [
                {
                    "name": "s",
                    "path": str(source),
                    "format": "prompt",
                    "field": "text",
                    "quota": 4,
                    "skip_bad_rows": True,
                }
            ],
        }
    )
    (src,) = config.sources

    scanned = scan_stage(config.existing, config.dedupe, None)
    assert sum(scanned.counts.values()) == 1 and scanned.near is None
    report = SourceReport(src.name, str(src.path), src.format.value, 4)
    read = list(read_stage(src, report))
    assert [p.index for p in read] == list(range(12)) and report.total.invalid == 1
    kept = list(filter_stage(iter(read), config.filters, report))
    assert [p.index for p in kept] == [i for i in range(12) if i != 3]
    assert report.total.filtered == {"too_short": 1}
    survivors = dedupe_stage(iter(kept), scanned, config.seed, Survivors(src, report))
    assert list(survivors.indices) == [i for i in range(12) if i not in (0, 3, 5, 8)]
    assert report.total.duplicates == {"existing": 2, "exact": 1}
    assert report.total.available == len(survivors.keys) == 8
    notes: list[str] = []
    (pick,) = quota_stage([survivors], {"s": 4}, config.shortfall, notes)
    assert report.target == len(pick.chosen) == 4 and pick.chosen <= set(range(12)) - {0, 3, 5, 8}
    out = io.BytesIO()
    write_stage([pick], config.generation, config.url, out)
    assert report.total.chosen == 4

    build_mix(config, tmp_path / "mix.jsonl")
    assert (tmp_path / "mix.jsonl").read_bytes() == out.getvalue()
    written = [json.loads(line) for line in out.getvalue().splitlines()]
    assert sorted(int(r["custom_id"].split("-")[1]) for r in written) == sorted(pick.chosen)
