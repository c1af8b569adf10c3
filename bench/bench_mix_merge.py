#!/usr/bin/env python3
"""Benchmarks of `sglfleet mix` and `sglfleet merge`, each measured side by side in one run.

0. Near-copy clusters: 1,001 and 3,001 near copies of one prompt, how many are kept (ideal: 1).
1. Near-duplicate recall: pairs planted at known Jaccard similarity (word 3-grams), half of them
   against the existing set; prints recall at >= threshold + 0.05, false drops at <= threshold - 0.1,
   the unrelated rows dropped, and the memory per row.
2. Merge against two plain merges (~20 lines each, orjson, same drop rules, same rows out: the
   outputs are compared byte for byte; A finds each prompt by offset and seek, B holds the prompts
   in a dict and copies the existing file in blocks): `sglfleet merge` with the existing set's
   categories cached (as `sglfleet mix` leaves them) and without (classified in the run, every
   repeat). Goals: not cached <= 2x, cached <= 1.3x, against both.
3. (--mix) Mix and merge at two sizes (the reference job: 1M existing rows, 300K candidates, 193K
   picked), their ratio showing how time and memory grow.
4. (--mix-against DIR) The mix of this checkout against another one's, on the same data, runs
   interleaved: wall, CPU and peak RSS as this / other, and whether both wrote the same bytes.

Every timed run is a fresh subprocess; its peak memory is its own VmHWM (ru_maxrss would carry the
parent's over fork and exec).

    .venv/bin/python bench/bench_mix_merge.py                     # recall + merge at 300K + 60K
    .venv/bin/python bench/bench_mix_merge.py --merge-scale 1     # merge at 1M existing + 200K results
    .venv/bin/python bench/bench_mix_merge.py --mix --scale 0.1   # adds the mix table at 1/10 and 1/100
    .venv/bin/python bench/bench_mix_merge.py --skip-recall --skip-clusters --skip-merge \
        --mix-against /tmp/before/python --scale 0.1              # this mix against another checkout's
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from sglfleet_testing.textgen import Words, planted_pair

EXISTING_ROWS = 1_000_000
CANDIDATES = 300_000
PICK = 193_000

_VOCAB_RNG = random.Random(0)
VOCAB = [
    "".join(_VOCAB_RNG.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(_VOCAB_RNG.randint(3, 9)))
    for _ in range(5000)
]
CODE = ["Write a Python function that {}.", "Fix this JavaScript bug: {}", "Refactor the Rust code that {}."]
OTHER = [
    "Explain in simple terms {}.",
    "Solve for x: {n}x + {m} = {k}, then tell me {}.",
    "Write a short poem about {}.",
    "¿Puedes explicar por qué {} es importante para la ciudad?",
    "Which of the following is true about {}? Think step by step.",
]


def phrase(rng: random.Random) -> str:
    return " ".join(rng.choices(VOCAB, k=rng.randint(8, 24)))


def prompt_text(rng: random.Random, code: bool) -> str:
    template = rng.choice(CODE if code else OTHER)
    return template.format(phrase(rng), n=rng.randint(2, 9), m=rng.randint(1, 99), k=rng.randint(100, 999))


def make_data(root: Path, scale: float) -> dict[str, int]:
    """Write the existing set and the three sources under `root`; returns the row counts."""
    rng = random.Random(42)
    n_existing, n_cand = int(EXISTING_ROWS * scale), int(CANDIDATES * scale)
    existing_texts: list[str] = []
    with (root / "existing.jsonl").open("w", encoding="utf-8") as fh:
        for i in range(n_existing):
            text = prompt_text(rng, code=rng.random() < 0.77)
            if i % 1000 == 0:
                existing_texts.append(text)
            row = {
                "id": f"train-{i}",
                "conversations": [
                    {"role": "user", "content": text},
                    {"role": "assistant", "content": "Sure. " + phrase(rng)},
                ],
            }
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    per_source = n_cand // 3
    seen: list[str] = []

    def candidate() -> str:
        roll = rng.random()
        if roll < 0.03 and seen:  # exact duplicate, case and spacing changed
            return "  " + rng.choice(seen).upper()
        if roll < 0.05 and seen:  # near duplicate: a few words added
            return rng.choice(seen) + " " + " ".join(rng.choices(VOCAB, k=2))
        if roll < 0.06 and existing_texts:  # already in the training set
            return rng.choice(existing_texts)
        text = prompt_text(rng, code=rng.random() < 0.1)
        if len(seen) < 20_000:
            seen.append(text)
        elif rng.random() < 0.01:
            seen[rng.randrange(len(seen))] = text
        return text

    with (root / "sharegpt.jsonl").open("w", encoding="utf-8") as fh:
        for _ in range(per_source):
            row = {
                "conversations": [{"from": "human", "value": candidate()}, {"from": "gpt", "value": "..."}]
            }
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    with (root / "openai.jsonl").open("w", encoding="utf-8") as fh:
        for _ in range(per_source):
            fh.write(
                json.dumps({"messages": [{"role": "user", "content": candidate()}]}, ensure_ascii=False)
                + "\n"
            )
    alpaca = [candidate() for _ in range(per_source)]
    pq.write_table(pa.table({"instruction": alpaca, "input": [""] * per_source}), root / "alpaca.parquet")
    return {"existing": n_existing, "candidates": 3 * per_source}


def write_config(root: Path, scale: float, near: bool) -> Path:
    pick = int(PICK * scale)
    config = {
        "seed": 1,
        "total": pick,
        "shortfall": "fill",
        "existing": {"path": "existing.jsonl", "format": "sharegpt"},
        "dedupe": {"near": {"enabled": near, "threshold": 0.8}},
        "generation": {"max_tokens": 2048, "temperature": 0.7},
        "sources": [
            {"name": "sharegpt", "path": "sharegpt.jsonl", "format": "sharegpt", "quota": "40%"},
            {"name": "openai", "path": "openai.jsonl", "format": "openai", "quota": "35%"},
            {"name": "alpaca", "path": "alpaca.parquet", "format": "alpaca", "quota": "25%"},
        ],
    }
    path = root / "mix.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def make_results(prompts: Path, results: Path) -> int:
    """A synthetic Batch output line per prompt: 3% failed, 4% cut by length, 3% too short."""
    rng = random.Random(7)
    n = 0
    with prompts.open("rb") as src, results.open("w", encoding="utf-8") as out:
        for line in src:
            cid = json.loads(line)["custom_id"]
            roll = rng.random()
            tokens = 5 if roll > 0.97 else rng.randint(20, 400)
            finish = "length" if 0.03 <= roll < 0.07 else "stop"
            status = 500 if roll < 0.03 else 200
            body = {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": phrase(rng)},
                        "finish_reason": finish,
                    }
                ],
                "usage": {"prompt_tokens": 30, "completion_tokens": tokens, "total_tokens": 30 + tokens},
            }
            row = {
                "id": f"batch_req_{n}",
                "custom_id": cid,
                "response": {"status_code": status, "request_id": str(n), "body": body},
                "error": None,
            }
            out.write(json.dumps(row) + "\n")
            n += 1
    return n


CHILD = """
import json, resource, sys, time
from pathlib import Path


def peak_rss_mib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


t = time.perf_counter()
if sys.argv[1] == "mix":
    from sglfleet.data import CategoryCache, build_mix, load_config
    cache = CategoryCache(Path(sys.argv[5]))
    report = build_mix(load_config(Path(sys.argv[2])), Path(sys.argv[3]), Path(sys.argv[4]), cache=cache)
    rows = report.as_dict()["prompts"]
elif sys.argv[1] == "merge":
    from sglfleet.data import CategoryCache, merge
    cache = CategoryCache(Path(sys.argv[7]) if sys.argv[7] != "-" else None)
    report = merge(*(Path(a) for a in sys.argv[2:6]), Path(sys.argv[6]), cache=cache)
    rows = report.as_dict()["rows"]["total"]
elif sys.argv[1] == "recall":
    sys.path.insert(0, sys.argv[2])
    from bench_mix_merge import recall_bench
    num_perm = None if sys.argv[6] == "auto" else int(sys.argv[6])
    result = recall_bench(float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), num_perm)
    plan = result.pop("plan")
    result |= {"num_perm": plan.num_perm, "bands": plan.bands, "rows_per_band": plan.rows}
    print(json.dumps(result))
    sys.exit(0)
else:
    sys.path.insert(0, sys.argv[2])
    from bench_mix_merge import dict_merge, plain_merge
    rows = (dict_merge if sys.argv[1] == "dict" else plain_merge)(*(Path(a) for a in sys.argv[3:7]))
usage = resource.getrusage(resource.RUSAGE_SELF)
workers = resource.getrusage(resource.RUSAGE_CHILDREN)  # the merge's classification pool, if any
cpu = usage.ru_utime + usage.ru_stime + workers.ru_utime + workers.ru_stime
seconds = time.perf_counter() - t
print(json.dumps({"seconds": seconds, "cpu_s": cpu, "rss_mib": peak_rss_mib(), "rows": rows}))
"""


def child(*args: str, package: Path | None = None) -> dict:
    """Run one measured step in a fresh process; its time, CPU time and own peak RSS (VmHWM).

    `package`: import sglfleet from this directory (another checkout's `python/`) instead of this one."""
    env = None if package is None else {**os.environ, "PYTHONPATH": str(package)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args], check=True, capture_output=True, text=True, env=env
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def plain_merge(existing: Path, results: Path, prompts: Path, output: Path) -> int:
    """The baseline: a plain streaming merge (existing lines copied, results joined to their prompts
    by custom_id, the same drop rules), no checks and no report. Returns the rows written."""
    offsets, offset = {}, 0
    with prompts.open("rb") as fh:
        for line in fh:
            offsets[orjson.loads(line)["custom_id"]] = offset
            offset += len(line)
    rows, kept = 0, set()
    with (
        output.open("wb") as out,
        existing.open("rb") as src,
        results.open("rb") as res,
        prompts.open("rb") as prm,
    ):
        for line in src:
            out.write(line)
            rows += 1
        for line in res:
            r = orjson.loads(line)
            resp = r.get("response") or {}
            if r.get("error") or resp.get("status_code") != 200 or r["custom_id"] in kept:
                continue
            choice, usage = resp["body"]["choices"][0], resp["body"].get("usage") or {}
            content = (choice.get("message") or {}).get("content") or ""
            if choice.get("finish_reason") == "length" or not content.strip():
                continue
            if usage.get("completion_tokens", 0) < 17:
                continue
            prm.seek(offsets[r["custom_id"]])
            messages = orjson.loads(prm.readline())["body"]["messages"]
            conv = [*messages, {"role": "assistant", "content": content}]
            out.write(
                orjson.dumps({"id": r["custom_id"], "conversations": conv}, option=orjson.OPT_APPEND_NEWLINE)
            )
            kept.add(r["custom_id"])
            rows += 1
    return rows


def dict_merge(existing: Path, results: Path, prompts: Path, output: Path) -> int:
    """The strongest plain merge: the prompts' messages held in a dict by custom_id (orjson), the
    existing file copied in 1 MiB blocks (its rows counted by newline), the same drop rules."""
    with prompts.open("rb") as fh:
        messages = {(p := orjson.loads(line))["custom_id"]: p["body"]["messages"] for line in fh}
    rows, kept = 0, set()
    with output.open("wb") as out, existing.open("rb") as src, results.open("rb") as res:
        while block := src.read(1 << 20):
            out.write(block)
            rows += block.count(b"\n")
        for line in res:
            r = orjson.loads(line)
            resp = r.get("response") or {}
            if r.get("error") or resp.get("status_code") != 200 or r["custom_id"] in kept:
                continue
            choice, usage = resp["body"]["choices"][0], resp["body"].get("usage") or {}
            content = (choice.get("message") or {}).get("content") or ""
            if choice.get("finish_reason") == "length" or not content.strip():
                continue
            if usage.get("completion_tokens", 0) < 17:
                continue
            conv = [*messages[r["custom_id"]], {"role": "assistant", "content": content}]
            out.write(
                orjson.dumps({"id": r["custom_id"], "conversations": conv}, option=orjson.OPT_APPEND_NEWLINE)
            )
            kept.add(r["custom_id"])
            rows += 1
    return rows


# ---- 1. near-duplicate recall ---------------------------------------------------------------------


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak_rss() -> int:
    """Reset this process's VmHWM to its current RSS (Linux clear_refs "5"); returns the RSS in bytes."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS") * 1024


def recall_bench(threshold: float, pairs: int, background: int, num_perm: int | None, seed: int = 3) -> dict:
    """Plant pairs above threshold + 0.05 and below threshold - 0.1 (half of each against the existing
    set) among unrelated texts; count what the deduper drops."""
    import datasketch  # noqa: F401 (loaded before the memory is measured)

    from sglfleet.data import NearDeduper

    rng, words = random.Random(seed), Words()
    high = [planted_pair(rng, words, rng.uniform(threshold + 0.05, 1.0), True) for _ in range(pairs)]
    low = [
        planted_pair(rng, words, rng.uniform(max(0.05, threshold - 0.45), threshold - 0.1), False)
        for _ in range(pairs)
    ]
    planted = [(a, b, j, "high") for a, b, j in high] + [(a, b, j, "low") for a, b, j in low]
    rng.shuffle(planted)
    existing_side = planted[: len(planted) // 2]
    within = planted[len(planted) // 2 :]
    candidates: list[tuple[str, str]] = []  # (text, what it is)
    for a, _, _, _ in within:
        candidates.append((a, "first"))
    for _ in range(background):
        candidates.append((" ".join(words.take(rng.randint(20, 200))), "unrelated"))
    rng.shuffle(candidates)
    for _, b, _, kind in existing_side + within:
        candidates.append((b, kind))  # every second text comes after its first
    before = _reset_peak_rss()
    t = time.perf_counter()
    near = NearDeduper(threshold, num_perm)
    for a, _, _, _ in existing_side:
        near.add(a, existing=True)
    for text, _ in candidates:
        near.add(text)
    verdicts = near.resolve()
    seconds = time.perf_counter() - t
    peak = _status_kib("VmHWM") * 1024 - before
    dropped = {"high": 0, "low": 0, "unrelated": 0, "first": 0}
    total = {"high": 0, "low": 0, "unrelated": 0, "first": 0}
    edge = [0, 0]  # the hardest pairs: threshold + 0.05 .. + 0.07
    edge_j = dict.fromkeys((b for _, b, j, k in planted if k == "high" and j < threshold + 0.07), True)
    for (text, kind), verdict in zip(candidates, verdicts, strict=True):
        total[kind] += 1
        dropped[kind] += verdict is not None
        if text in edge_j:
            edge[0] += verdict is not None
            edge[1] += 1
    rows = near.existing + near.candidates
    return {
        "plan": near.plan,
        "recall": dropped["high"] / total["high"],
        "edge_recall": edge[0] / max(edge[1], 1),
        "edge_pairs": edge[1],
        "false_drops": dropped["low"] / total["low"],
        "unrelated_dropped": dropped["unrelated"] + dropped["first"],
        "unrelated": total["unrelated"] + total["first"],
        "pairs": total,
        "rows": rows,
        "seconds": seconds,
        "kept_bytes_per_row": near.nbytes / rows,
        "peak_mib": peak / 2**20,
    }


def print_recall(threshold: float, pairs: int, background: int) -> None:
    print(f"## Near duplicates: planted pairs, threshold {threshold}")
    print()
    print(
        "| num_perm | bands x rows | recall, J >= t+0.05 | recall, t+0.05..t+0.07 | false drops, J <= t-0.1 "
        "| unrelated dropped | bytes/row kept | peak RSS growth | s |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    here = str(Path(__file__).resolve().parent)
    for num_perm in ("64", "auto"):  # each in a fresh process: its memory is its own
        r = child("recall", here, str(threshold), str(pairs), str(background), num_perm)
        label = f"{r['num_perm']}" + (" (auto)" if num_perm == "auto" else " (set)")
        print(
            f"| {label} | {r['bands']} x {r['rows_per_band']} "
            f"| {100 * r['recall']:.2f}% ({r['pairs']['high']}) "
            f"| {100 * r['edge_recall']:.2f}% ({r['edge_pairs']}) | {100 * r['false_drops']:.2f}% "
            f"({r['pairs']['low']}) | {r['unrelated_dropped']} of {r['unrelated']} "
            f"| {r['kept_bytes_per_row']:.0f} | {r['peak_mib']:.0f} MiB ({r['rows']:,} rows) "
            f"| {r['seconds']:.1f} |",
            flush=True,
        )
    print()


def cluster_bench(sizes: tuple[int, ...], threshold: float) -> None:
    """Clusters of near copies of one prompt (the prompt + one word of its own each: Jaccard >= 0.93
    between any two) among unrelated texts: how many of each cluster are kept (ideal: 1)."""
    from sglfleet.data import NearDeduper

    print(f"## Near-copy clusters, threshold {threshold} (ideal: 1 kept, any cluster size)")
    print()
    print("| near copies of one prompt | kept | unrelated texts kept | s |")
    print("| ---: | ---: | ---: | ---: |")
    for size in sizes:
        words = Words()
        base = words.take(60)
        cluster = [" ".join([*base, w]) for w in words.take(size)]
        unrelated = [" ".join(words.take(40)) for _ in range(2000)]
        near = NearDeduper(threshold)
        offered = [*unrelated[:1000], *cluster, *unrelated[1000:]]
        t = time.perf_counter()
        for text in offered:
            near.add(text)
        verdicts = dict(zip(offered, near.resolve(), strict=True))
        seconds = time.perf_counter() - t
        kept = sum(verdicts[c] is None for c in cluster)
        others = sum(verdicts[u] is None for u in unrelated)
        print(f"| {size:,} | {kept} | {others} of {len(unrelated)} | {seconds:.1f} |", flush=True)
    print()


# ---- 2. merge against a plain merge ---------------------------------------------------------------


def merge_bench(root: Path, existing_rows: int, results_rows: int, repeat: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    rng = random.Random(5)
    with (root / "existing.jsonl").open("wb") as fh:
        for i in range(existing_rows):
            conv = [
                {"role": "user", "content": prompt_text(rng, code=rng.random() < 0.77)},
                {"role": "assistant", "content": "Sure. " + phrase(rng)},
            ]
            row = {"id": f"train-{i}", "conversations": conv}
            fh.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
    with (root / "prompts.jsonl").open("wb") as fh:
        for i in range(results_rows):
            body = {"messages": [{"role": "user", "content": prompt_text(rng, code=rng.random() < 0.1)}]}
            line = {"custom_id": f"p-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            line["metadata"] = {"source": "s", "category": "chat"}
            fh.write(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))
    make_results(root / "prompts.jsonl", root / "results.jsonl")
    print(f"  data written in {time.perf_counter() - t:.0f} s", flush=True)
    paths = [str(root / n) for n in ("existing.jsonl", "results.jsonl", "prompts.jsonl")]
    here = str(Path(__file__).resolve().parent)
    cache = root / "cache"
    runs: dict[str, list[dict]] = {"plain": [], "dict": [], "cold": [], "warm": []}
    for attempt in range(repeat):  # interleaved, so that other load on the machine hits all alike
        runs["plain"].append(child("plain", here, *paths, str(root / "plain.jsonl")))
        runs["dict"].append(child("dict", here, *paths, str(root / "dict.jsonl")))
        # not cached: the first run fills the cache the cached runs use, the others use none
        cold_cache = str(cache) if attempt == 0 else "-"
        runs["cold"].append(
            child("merge", *paths, str(root / "merged-cold.jsonl"), str(root / "cold.md"), cold_cache)
        )
        runs["warm"].append(
            child("merge", *paths, str(root / "merged-warm.jsonl"), str(root / "warm.md"), str(cache))
        )
    best = {
        k: {m: min(r[m] for r in v) for m in ("seconds", "cpu_s", "rss_mib", "rows")} for k, v in runs.items()
    }
    merged = (root / "merged-warm.jsonl").read_bytes()
    same = (root / "plain.jsonl").read_bytes() == merged == (root / "dict.jsonl").read_bytes()
    same = same and (root / "merged-cold.jsonl").read_bytes() == merged
    same_report = (root / "cold.json").read_text().replace("merged-cold", "merged-warm") == (
        root / "warm.json"
    ).read_text()
    print(f"## Merge: {existing_rows:,} existing rows + {results_rows:,} results (best of {repeat})")
    print()
    print("baselines: A = plain streaming merge (orjson, prompts found by offset and seek, lines copied);")
    print("           B = plain merge, prompts in a dict (orjson), the existing file copied in 1 MiB blocks")
    print()
    print("| run | wall s | CPU s | RSS MiB | rows | wall vs A | CPU vs A | wall vs B | CPU vs B | goal |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    a_, b_ = best["plain"], best["dict"]
    for label, r, goal in (
        ("A: plain streaming merge", a_, ""),
        ("B: plain merge, prompts in a dict", b_, ""),
        ("sglfleet merge, categories not cached (existing set never seen by mix)", best["cold"], "<= 2"),
        ("sglfleet merge, categories cached (as after sglfleet mix)", best["warm"], "<= 1.3"),
    ):
        print(
            f"| {label} | {r['seconds']:.1f} | {r['cpu_s']:.1f} | {r['rss_mib']:.0f} | {r['rows']:,} "
            f"| {r['seconds'] / a_['seconds']:.2f}x | {r['cpu_s'] / a_['cpu_s']:.2f}x "
            f"| {r['seconds'] / b_['seconds']:.2f}x | {r['cpu_s'] / b_['cpu_s']:.2f}x | {goal} |"
        )
    print()
    print(
        f"same rows out as both plain merges, cached or not: {same}; same report cached or not: {same_report}"
    )
    print()


# ---- 3. mix and merge at two sizes ----------------------------------------------------------------


def run_size(root: Path, scale: float, near: bool) -> dict[str, dict]:
    root.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    counts = make_data(root, scale)
    print(f"  scale {scale:g}: data written in {time.perf_counter() - t:.0f} s {counts}", flush=True)
    config = write_config(root, scale, near)
    cache = str(root / "cache")
    mix = child("mix", str(config), str(root / "prompts.jsonl"), str(root / "mix-report.md"), cache)
    print(f"  scale {scale:g}: mix {mix}", flush=True)
    make_results(root / "prompts.jsonl", root / "results.jsonl")
    merge = child(
        "merge",
        str(root / "existing.jsonl"),
        str(root / "results.jsonl"),
        str(root / "prompts.jsonl"),
        str(root / "merged.jsonl"),
        str(root / "merge-report.md"),
        cache,
    )
    print(f"  scale {scale:g}: merge {merge}", flush=True)
    return {"counts": counts, "mix": mix, "merge": merge}


def mix_table(root: Path, big: float, near: bool) -> None:
    small = big / 10
    print(f"## Mix and merge at two sizes (near dedupe {'on' if near else 'off'})", flush=True)
    results = {s: run_size(root / f"scale-{s:g}", s, near) for s in (small, big)}
    rows = [
        ("existing rows", lambda r: r["counts"]["existing"], "{:,}"),
        ("candidate prompts", lambda r: r["counts"]["candidates"], "{:,}"),
        ("prompts picked", lambda r: r["mix"]["rows"], "{:,}"),
        ("mix wall time (s)", lambda r: r["mix"]["seconds"], "{:.1f}"),
        ("mix CPU time (s)", lambda r: r["mix"]["cpu_s"], "{:.1f}"),
        ("mix peak RSS (MiB)", lambda r: r["mix"]["rss_mib"], "{:.0f}"),
        ("merged rows", lambda r: r["merge"]["rows"], "{:,}"),
        ("merge wall time (s)", lambda r: r["merge"]["seconds"], "{:.1f}"),
        ("merge CPU time (s)", lambda r: r["merge"]["cpu_s"], "{:.1f}"),
        ("merge peak RSS (MiB)", lambda r: r["merge"]["rss_mib"], "{:.0f}"),
    ]
    print()
    print(f"| measure | scale {small:g} | scale {big:g} | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for label, get, fmt in rows:
        a, b = get(results[small]), get(results[big])
        print(f"| {label} | {fmt.format(a)} | {fmt.format(b)} | {b / a:.2f}x |")
    print()


def mix_against(root: Path, scale: float, near: bool, other: Path, repeat: int) -> None:
    """The mix of this checkout against the mix of another one (`other`: its `python/` directory), on the
    same data, runs interleaved; the outputs compared byte for byte."""
    root.mkdir(parents=True, exist_ok=True)
    counts = make_data(root, scale)
    config = write_config(root, scale, near)
    runs: dict[str, list[dict]] = {"other": [], "this": []}
    for attempt in range(repeat):  # interleaved, so that other load on the machine hits both alike
        for label, package in (
            (("other", other), ("this", None))
            if attempt % 2 == 0
            else (
                ("this", None),
                ("other", other),
            )
        ):
            cache = str(root / f"cache-{label}-{attempt}")  # cold each time: both classify the existing set
            out = root / f"prompts-{label}.jsonl"
            runs[label].append(
                child("mix", str(config), str(out), str(root / f"{label}.md"), cache, package=package)
            )
    same = (root / "prompts-this.jsonl").read_bytes() == (root / "prompts-other.jsonl").read_bytes()
    this = json.loads((root / "this.json").read_text().replace("prompts-this", "prompts-other"))
    theirs = json.loads((root / "other.json").read_text())
    same_report = all(this[k] == theirs[k] for k in this.keys() & theirs.keys())  # a new field aside
    best = {k: {m: min(r[m] for r in v) for m in ("seconds", "cpu_s", "rss_mib")} for k, v in runs.items()}
    print(
        f"## Mix: this checkout against {other} ({counts['existing']:,} existing rows, "
        f"{counts['candidates']:,} candidates, near dedupe {'on' if near else 'off'}; best of {repeat})"
    )
    print()
    print("| measure | other | this | this / other |")
    print("| --- | ---: | ---: | ---: |")
    for label, key, fmt in (
        ("wall s", "seconds", "{:.1f}"),
        ("CPU s", "cpu_s", "{:.1f}"),
        ("RSS MiB", "rss_mib", "{:.0f}"),
    ):
        a, b = best["other"][key], best["this"][key]
        print(f"| {label} | {fmt.format(a)} | {fmt.format(b)} | {b / a:.2f}x |")
    print()
    print(f"same prompts out, byte for byte: {same}; same report (the fields both have): {same_report}")
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threshold", type=float, default=0.8, help="near-dedupe threshold (default 0.8)")
    parser.add_argument("--pairs", type=int, default=3000, help="planted pairs on each side of the threshold")
    parser.add_argument("--background", type=int, default=20000, help="unrelated texts among the candidates")
    parser.add_argument("--merge-scale", type=float, default=0.3, help="1 = 1M existing + 200K results")
    parser.add_argument("--repeat", type=int, default=3, help="merge runs of each kind (the best counts)")
    parser.add_argument("--mix", action="store_true", help="also the mix/merge table at two sizes")
    parser.add_argument("--scale", type=float, default=1.0, help="mix table: larger size, 1 = 1M + 300K")
    parser.add_argument("--no-near", action="store_true", help="mix table: exact dedupe only")
    parser.add_argument(
        "--mix-against",
        type=Path,
        metavar="PYTHON_DIR",
        help="also the mix of this checkout against another one's python/ directory (e.g. a `git archive` "
        "of the commit before a change), side by side at --scale",
    )
    parser.add_argument("--skip-recall", action="store_true")
    parser.add_argument("--skip-clusters", action="store_true")
    parser.add_argument("--skip-merge", action="store_true")
    parser.add_argument("--workdir", type=Path, help="keep the data here (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-mix-") as tmp:
        root = args.workdir or Path(tmp)
        if not args.skip_recall:
            print_recall(args.threshold, args.pairs, args.background)
        if not args.skip_clusters:
            cluster_bench((1_001, 3_001), args.threshold)
        if not args.skip_merge:
            rows = int(EXISTING_ROWS * args.merge_scale)
            merge_bench(root / f"merge-{args.merge_scale:g}", rows, rows // 5, args.repeat)
        if args.mix:
            mix_table(root, args.scale, not args.no_near)
        if args.mix_against:
            mix_against(
                root / "against", args.scale, not args.no_near, args.mix_against.resolve(), args.repeat
            )
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else ["?"]
    print(f"(Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average now {' '.join(load)};")
    print(" wall time grows with other load on the machine, CPU time much less.)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
