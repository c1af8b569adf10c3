#!/usr/bin/env python3
"""Scale benchmark of `sglfleet mix` and `sglfleet merge`: time and peak RSS at full size and at 1/10.

Full size is the reference job: a 1M-row existing training set (77% code, conversation format) and
300K candidate prompts in three sources (ShareGPT JSONL, OpenAI-messages JSONL, Alpaca Parquet) with
exact and near duplicates and overlap with the existing set; the mix picks 193K; merge joins 193K
synthetic results (some failed, some cut by length, some too short) back into the training set.

Each run is a fresh subprocess, so its peak RSS is its own. The table prints both sizes side by side
and their ratios (time and RSS): linear time is a ratio near 10, bounded memory a much smaller one.

    .venv/bin/python bench/bench_mix_merge.py                # full and 1/10 (a few minutes on 2 cores)
    .venv/bin/python bench/bench_mix_merge.py --scale 0.1    # 1/10 and 1/100 (quick look)
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

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

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
        "dedupe": {"near": {"enabled": near, "threshold": 0.8, "num_perm": 64}},
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
t = time.perf_counter()
if sys.argv[1] == "mix":
    from sglfleet.data._mix import build_mix
    from sglfleet.data._mixconfig import load_config
    report = build_mix(load_config(Path(sys.argv[2])), Path(sys.argv[3]), Path(sys.argv[4]))
    rows = report.as_dict()["prompts"]
else:
    from sglfleet.data._merge import merge
    report = merge(*(Path(a) for a in sys.argv[2:6]), Path(sys.argv[6]))
    rows = report.as_dict()["rows"]["total"]
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu = usage.ru_utime + usage.ru_stime
seconds = time.perf_counter() - t
print(json.dumps({"seconds": seconds, "cpu_s": cpu, "rss_mib": usage.ru_maxrss / 1024, "rows": rows}))
"""


def child(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, *args], check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_size(root: Path, scale: float, near: bool) -> dict[str, dict]:
    root.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    counts = make_data(root, scale)
    print(f"  scale {scale:g}: data written in {time.perf_counter() - t:.0f} s {counts}", flush=True)
    config = write_config(root, scale, near)
    mix = child("mix", str(config), str(root / "prompts.jsonl"), str(root / "mix-report.md"))
    print(f"  scale {scale:g}: mix {mix}", flush=True)
    make_results(root / "prompts.jsonl", root / "results.jsonl")
    merge = child(
        "merge",
        str(root / "existing.jsonl"),
        str(root / "results.jsonl"),
        str(root / "prompts.jsonl"),
        str(root / "merged.jsonl"),
        str(root / "merge-report.md"),
    )
    print(f"  scale {scale:g}: merge {merge}", flush=True)
    return {"counts": counts, "mix": mix, "merge": merge}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--scale", type=float, default=1.0, help="the larger size (1.0 = 1M existing, 300K candidates)"
    )
    parser.add_argument("--no-near", action="store_true", help="exact dedupe only (no MinHash LSH)")
    parser.add_argument("--workdir", type=Path, help="keep the data here (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-mix-") as tmp:
        root = args.workdir or Path(tmp)
        big, small = args.scale, args.scale / 10
        print(f"near dedupe: {'off' if args.no_near else 'on'}; sizes {big:g} and {small:g}", flush=True)
        results = {s: run_size(root / f"scale-{s:g}", s, not args.no_near) for s in (small, big)}
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
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else ["?"]
    print(f"\n(Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average now {' '.join(load)};")
    print(" wall time grows with other load on the machine, CPU time much less.)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
