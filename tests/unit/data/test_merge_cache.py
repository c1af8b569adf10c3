"""Merge speed without losing the report: the existing set's category counts are cached by content
digest (left by `mix`, reused by `merge`); one JSON library (orjson); the bench's own peak memory."""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO

from sglfleet.data import CategoryCache, DataError, build_mix, classify, load_config, merge

pytestmark = pytest.mark.timeout(120)


def _result(cid: str) -> dict:
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "answer " * 20}}],
        "usage": {"completion_tokens": 30},
    }
    return {"custom_id": cid, "response": {"status_code": 200, "body": body}, "error": None}


@pytest.fixture
def job(tmp_path: Path) -> dict[str, Path]:
    existing = tmp_path / "existing.jsonl"
    existing.write_bytes((REPO / "examples/mix/existing-train.jsonl").read_bytes())
    config = load_config(REPO / "examples/mix/lab-mix.yaml")
    config = config.model_copy(update={"existing": config.existing.model_copy(update={"path": existing})})
    prompts = tmp_path / "prompts.jsonl"
    build_mix(config, prompts, cache=CategoryCache(tmp_path / "cache"))
    results = tmp_path / "results.jsonl"
    ids = [json.loads(line)["custom_id"] for line in prompts.read_text().splitlines()]
    results.write_text("".join(json.dumps(_result(cid)) + "\n" for cid in ids))
    return {"existing": existing, "results": results, "prompts": prompts, "cache": tmp_path / "cache"}


def _merge(job: dict[str, Path], name: str, cache: CategoryCache) -> dict:
    out = job["existing"].parent / f"{name}.jsonl"
    merge(job["existing"], job["results"], job["prompts"], out, out.with_suffix(".md"), cache=cache)
    return json.loads(out.with_suffix(".json").read_text().replace(name, "OUT"))


def test_mix_leaves_the_counts_that_merge_uses_and_the_report_is_the_same(
    job: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = CategoryCache(job["cache"])
    assert len(list((job["cache"] / "existing").glob("*.json"))) == 1  # written by the mix
    uncached = _merge(job, "plain", CategoryCache(None))
    calls = []
    real = classify
    monkeypatch.setattr("sglfleet.data._existing.classify", lambda t: calls.append(t) or real(t))
    cached = _merge(job, "cached", cache)
    assert not calls  # not one existing row classified again
    assert cached == uncached
    assert cached["shares"]["before"]["code"] == {"rows": 77, "share": 0.77}


def test_a_changed_existing_set_is_classified_afresh(
    job: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = CategoryCache(job["cache"])
    lines = job["existing"].read_text().splitlines()
    changed = json.loads(lines[0])
    changed["conversations"][0]["content"] = "Write a short poem about the autumn sea."
    lines[0] = json.dumps(changed)
    job["existing"].write_text("\n".join(lines) + "\n")
    calls = []
    real = classify
    monkeypatch.setattr("sglfleet.data._existing.classify", lambda t: calls.append(t) or real(t))
    report = _merge(job, "after-change", cache)
    assert len(calls) == 100 - sum(1 for line in lines if '"category"' in line)
    assert report == _merge(job, "no-cache", CategoryCache(None))
    assert len(list((job["cache"] / "existing").glob("*.json"))) == 2  # old and new content


def test_a_broken_cache_entry_is_a_miss_not_an_error(job: dict[str, Path]) -> None:
    for entry in (job["cache"] / "existing").glob("*.json"):
        entry.write_text('{"rows": 100, "categories": {"code": 3}}')  # counts that do not add up
    report = _merge(job, "broken", CategoryCache(job["cache"]))
    assert report["shares"]["before"]["code"]["rows"] == 77
    not_a_directory = job["cache"] / "a-file"
    not_a_directory.write_text("")
    # a cache that cannot be written only costs time
    assert _merge(job, "unwritable", CategoryCache(not_a_directory))["rows"]["existing"] == 100


def test_the_existing_rows_are_copied_through_unchanged(job: dict[str, Path]) -> None:
    _merge(job, "copied", CategoryCache(job["cache"]))
    out = (job["existing"].parent / "copied.jsonl").read_bytes()
    assert out.startswith(job["existing"].read_bytes())


def test_a_big_existing_set_is_classified_by_workers_with_the_same_counts_and_errors(
    job: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sglfleet.data import _merge

    big = job["existing"].parent / "big.jsonl"
    big.write_text(job["existing"].read_text() * 30)  # 3000 rows
    monkeypatch.setattr(_merge, "CHUNK_LINES", 128)
    monkeypatch.setattr(_merge, "PARALLEL_BYTES", 0)
    serial = _merge.classify_existing(big, "category", workers=1)
    assert _merge.classify_existing(big, "category", workers=2) == serial
    assert sum(serial.values()) == 3000 and serial["code"] == 30 * 77
    lines = big.read_text().splitlines()
    lines[2500] = '{"category": "code", "junk": 1}'
    lines[2900] = "not json"
    big.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"big\.jsonl:2501: row has no field 'conversations'"):
        _merge.classify_existing(big, "category", workers=2)


@pytest.mark.parametrize("block", [1, 2, 7, 64, 1 << 20])
def test_the_block_copy_drops_blank_lines_and_ends_every_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    import io
    import random

    from sglfleet.data import _merge

    monkeypatch.setattr(_merge, "_BLOCK", block)
    rng = random.Random(block)
    for _ in range(50):
        lines = [
            rng.choice([b"", b" \t", b'{"a": 1}\r', b'{"b": "' + b"x" * rng.randint(0, 90) + b'"}'])
            for _ in range(30)
        ]
        data = b"\n".join(lines) + rng.choice([b"", b"\n"])
        (tmp_path / "e.jsonl").write_bytes(data)
        out = io.BytesIO()
        rows, digest = _merge._copy_existing(tmp_path / "e.jsonl", out)
        expected = [line.rstrip(b"\n") + b"\n" for line in io.BytesIO(data) if not line.isspace()]
        assert out.getvalue() == b"".join(expected) and rows == len(expected)
        assert digest == __import__("hashlib").sha256(data).hexdigest()


def test_data_tools_use_orjson_only() -> None:
    """One JSON library: the engine's (orjson); the standard library's json is not imported."""
    package = REPO / "python/sglfleet/data"
    for path in [
        *package.glob("*.py"),
        REPO / "python/sglfleet/cli/mix.py",
        REPO / "python/sglfleet/cli/merge.py",
    ]:
        tree = ast.parse(path.read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert "json" not in imported, path


CHILD_PEAK = """
import sys
sys.path.insert(0, sys.argv[1])
import bench_mix_merge
print(bench_mix_merge.child("plain", sys.argv[1], *sys.argv[2:])["rss_mib"])
"""


def test_bench_reports_the_childs_own_peak_not_the_parents(job: dict[str, Path], tmp_path: Path) -> None:
    """A parent that once held 400 MiB starts a small merge: the child's peak is the child's."""
    code = "ballast = bytearray(400 << 20); ballast[::4096] = b'x' * len(ballast[::4096]); del ballast\n"
    args = [str(REPO / "bench"), str(job["existing"]), str(job["results"]), str(job["prompts"])]
    done = subprocess.run(
        [sys.executable, "-c", code + CHILD_PEAK, *args, str(tmp_path / "plain.jsonl")],
        check=True,
        capture_output=True,
        text=True,
    )
    assert float(done.stdout.split()[-1]) < 150


def test_cli_cache_options(job: dict[str, Path], tmp_path: Path) -> None:
    from sglfleet.cli import main

    args = ["merge", *(a for k in ("existing", "results", "prompts") for a in (f"--{k}", str(job[k])))]
    with pytest.raises(SystemExit):  # one or the other
        main([*args, "--output", str(tmp_path / "a.jsonl"), "--no-cache", "--cache-dir", "x"])
    assert main([*args, "--output", str(tmp_path / "a.jsonl"), "--no-cache"]) == 0
    assert main([*args, "--output", str(tmp_path / "b.jsonl"), "--cache-dir", str(tmp_path / "mine")]) == 0
    assert len(list((tmp_path / "mine/existing").glob("*.json"))) == 1


def test_a_merge_with_a_report_hashes_each_input_once(
    job: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report's input record hashes the existing set, the results and the prompts; the merge then
    uses those digests (the cache key, the check against the manifest) instead of hashing the existing
    set and the prompts again (before: about a tenth of a cached merge's time)."""
    from sglfleet.cli import main

    fed: list[int] = []
    real = hashlib.sha256

    class Counting:
        def __init__(self, data: bytes = b"") -> None:
            self._sha = real(data)
            fed.append(len(data))

        def update(self, data: bytes) -> None:
            fed.append(len(data))
            self._sha.update(data)

        def hexdigest(self) -> str:
            return self._sha.hexdigest()

    monkeypatch.setattr(hashlib, "sha256", Counting)
    args = ["merge", *(a for k in ("existing", "results", "prompts") for a in (f"--{k}", str(job[k])))]
    out = tmp_path / "merged.jsonl"
    assert (
        main(
            [
                *args,
                "--output",
                str(out),
                "--report",
                str(tmp_path / "r.md"),
                "--cache-dir",
                str(job["cache"]),
            ]
        )
        == 0
    )
    inputs = sum(job[k].stat().st_size for k in ("existing", "results", "prompts"))
    assert sum(fed) == inputs
    record = json.loads((tmp_path / "r.json").read_text())["inputs"]["files"]
    assert record["existing set"]["sha256"] == real(job["existing"].read_bytes()).hexdigest()
    assert len(out.read_text().splitlines()) == 100 + len(job["prompts"].read_text().splitlines())
