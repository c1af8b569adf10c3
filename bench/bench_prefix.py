"""Prefix-aware dispatch, side by side in one run: wall time and prefix-cache hit rate.

    .venv/bin/python bench/bench_prefix.py            # both workloads, every row
    .venv/bin/python bench/bench_prefix.py --quick    # smaller workloads (a smoke run)

Eight stand-ins model SGLang's prefix cache (`--standin-prefill-tps`: uncached prompt tokens cost
prefill time, one prefill at a time per instance; the cache holds prompts and outputs, LRU within
the KV pool). Two workloads, SpecForge's:

- multi-turn: conversations regenerated with `--turns all` (turn k's prompt holds turns 1..k-1 and
  their regenerated answers);
- single-turn: one prompt each, sharing a few long system prompts (the mission's mix).

Rows, each on freshly flushed caches: round robin (the real `sglang-router --policy round_robin`),
sglfleet least-loaded, sglfleet prefix-aware (straight to the eight), and the real router's
`cache_aware` (sglfleet sends to the router as one endpoint). Hit rate = cached prompt tokens over
prompt tokens, summed over the eight (`sglang:cached_tokens_total / sglang:prompt_tokens_total`).
Goals: prefix-aware >= the router's hit rate and <= its wall time; >= 1.3x faster than least-loaded
on multi-turn; <= 1.02x least-loaded's wall on single-turn.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import re
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from sglfleet_testing.router import running_router, write_model_dir
from sglfleet_testing.standin.process import StandinProcess, start_standin

from sglfleet.gen import ExitCode, GenerateConfig, GenParams, LogReporter, run

SERVERS = 8
CONCURRENCY = 32  # per instance: sglfleet's default
STANDIN = {
    "max_running_requests": CONCURRENCY,
    "standin_prefill_tps": 8000,  # tokens/s of prefill per instance
    "standin_decode_tps": 100,  # tokens/s per request
    "standin_ttft": 0.02,
    "enable_metrics": True,
    "log_level": "warning",
}


def _words(rng: random.Random, n: int) -> str:
    return " ".join(f"w{rng.randrange(100_000)}" for _ in range(n))


def write_multi(path: Path, conversations: int, seed: int = 1) -> int:
    """SpecForge rows: 2-6 user turns of 40-160 words, old assistant turns to be regenerated."""
    rng = random.Random(seed)
    turns_total = 0
    with path.open("w") as fh:
        for i in range(conversations):
            turns = []
            for _ in range(rng.randint(2, 6)):
                turns += [
                    {"role": "user", "content": _words(rng, rng.randint(40, 160))},
                    {"role": "assistant", "content": "old"},
                ]
                turns_total += 1
            fh.write(json.dumps({"id": f"c{i:06d}", "conversations": turns}) + "\n")
    return turns_total


def write_single(path: Path, prompts: int, systems: int = 4, seed: int = 2) -> int:
    """Single prompts of 20-120 words, each behind one of a few 600-word system prompts."""
    rng = random.Random(seed)
    system_prompts = [_words(rng, 600) for _ in range(systems)]
    with path.open("w") as fh:
        for i in range(prompts):
            turns = [
                {"role": "system", "content": rng.choice(system_prompts)},
                {"role": "user", "content": _words(rng, rng.randint(20, 120))},
                {"role": "assistant", "content": "old"},
            ]
            fh.write(json.dumps({"id": f"s{i:06d}", "conversations": turns}) + "\n")
    return prompts


@contextlib.contextmanager
def fleet(model_dir: Path) -> Iterator[list[StandinProcess]]:
    servers: list[StandinProcess] = []
    try:
        for i in range(SERVERS):
            servers.append(start_standin(model_path=str(model_dir), standin_seed=i, **STANDIN))  # type: ignore[arg-type]
        yield servers
    finally:
        for s in servers:
            s.close()


def _counter(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    match = re.search(rf"^{name}\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M)
    assert match, f"{name} not in {url}/metrics"
    return float(match.group(1))


def _totals(urls: list[str]) -> tuple[float, float]:
    return (
        sum(_counter(u, "sglang:cached_tokens_total") for u in urls),
        sum(_counter(u, "sglang:prompt_tokens_total") for u in urls),
    )


def _flush(urls: list[str]) -> None:
    for u in urls:
        req = urllib.request.Request(f"{u}/flush_cache", method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200


def job(inp: Path, out: Path, endpoints: list[str], *, concurrency: int, dispatch: str, turns: str) -> float:
    for p in (out, out.with_name(out.name + ".manifest.json"), out.with_name(out.name + ".errors.jsonl")):
        p.unlink(missing_ok=True)
    config = GenerateConfig(
        input=inp,
        output=out,
        endpoints=endpoints,
        concurrency=concurrency,
        dispatch=dispatch,
        params=GenParams(max_tokens=256, turns=turns),
    )
    t0 = time.perf_counter()
    outcome = run(config, LogReporter(io.StringIO(), interval=3600), handle_signals=False)
    elapsed = time.perf_counter() - t0
    assert outcome.exit_code == ExitCode.OK, outcome.message
    return elapsed


ROWS = ("round robin (router)", "sglfleet least-loaded", "sglfleet prefix-aware", "router cache_aware")
SELECTED = set(ROWS)  # --rows
SPREAD: dict[str, str] = {}  # row -> the fewest-most requests an instance served (its last run)


ROUTER_FLAGS: list[str] = []  # --router-flags: more flags for the router rows (balance thresholds)


def measure(
    row: str, inp: Path, out: Path, urls: list[str], *, model_dir: Path, turns: str
) -> tuple[float, float]:
    _flush(urls)
    cached0, prompt0 = _totals(urls)
    requests0 = [_counter(u, "sglang:num_requests_total") for u in urls]
    if row.startswith("sglfleet"):
        dispatch = "prefix" if "prefix" in row else "least-loaded"
        wall = job(inp, out, urls, concurrency=CONCURRENCY, dispatch=dispatch, turns=turns)
    else:
        policy = "round_robin" if row.startswith("round robin") else "cache_aware"
        with running_router(urls, model_dir, policy, *ROUTER_FLAGS) as router:
            wall = job(
                inp, out, [router], concurrency=CONCURRENCY * len(urls), dispatch="least-loaded", turns=turns
            )
    cached1, prompt1 = _totals(urls)
    per = [int(_counter(u, "sglang:num_requests_total") - r0) for u, r0 in zip(urls, requests0, strict=True)]
    SPREAD[row] = f"{min(per)}-{max(per)}"
    return wall, (cached1 - cached0) / max(prompt1 - prompt0, 1)


def workload(
    title: str, inp: Path, out: Path, urls: list[str], *, model_dir: Path, turns: str, rounds: int
) -> dict:
    """Every row, ``rounds`` times interleaved (the order turned each round); medians."""
    print(f"## {title}")
    rows = [row for row in ROWS if row in SELECTED]
    runs: dict[str, list[tuple[float, float]]] = {row: [] for row in rows}
    for r in range(rounds):
        for row in rows if r % 2 == 0 else rows[::-1]:
            runs[row].append(measure(row, inp, out, urls, model_dir=model_dir, turns=turns))
    results = {}
    for row in rows:
        wall = statistics.median(w for w, _ in runs[row])
        hit = statistics.median(h for _, h in runs[row])
        results[row] = (wall, hit)
        each = " ".join(f"{w:.1f}" for w, _ in runs[row])
        print(
            f"{row:24s} wall {wall:7.2f} s   prefix hit rate {hit:6.1%}   requests per instance "
            f"{SPREAD[row]}   (runs: {each} s)",
            flush=True,
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small workloads")
    parser.add_argument("--conversations", type=int, default=600)
    parser.add_argument("--prompts", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=1, help="runs of each row, interleaved (medians)")
    parser.add_argument("--workload", choices=("multi", "single", "both"), default="both")
    parser.add_argument(
        "--rows", default="all", help="comma-separated: rr, least-loaded, prefix, cache_aware (default all)"
    )
    parser.add_argument(
        "--router-flags",
        default="",
        help='more flags for the router rows, e.g. "--balance-abs-threshold 4 --balance-rel-threshold 1.2"',
    )
    args = parser.parse_args()
    ROUTER_FLAGS[:] = args.router_flags.split()
    if args.rows != "all":
        short = dict(zip(("rr", "least-loaded", "prefix", "cache_aware"), ROWS, strict=True))
        SELECTED.clear()
        SELECTED.update(short[r.strip()] for r in args.rows.split(","))
    if ROUTER_FLAGS:
        print(f"router flags: {' '.join(ROUTER_FLAGS)}")
    if args.quick:
        args.conversations, args.prompts = 120, 300
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        model_dir = write_model_dir(tmpdir / "model")
        multi, single, out = tmpdir / "multi.jsonl", tmpdir / "single.jsonl", tmpdir / "out.jsonl"
        turns = write_multi(multi, args.conversations)
        write_single(single, args.prompts)
        knobs = {k: v for k, v in STANDIN.items() if k.startswith("standin")}
        print(f"{SERVERS} stand-ins: {json.dumps(knobs)}, {CONCURRENCY} in flight per instance")
        m = s = None
        with fleet(model_dir) as servers:
            urls = [srv.base_url for srv in servers]
            common = {"model_dir": model_dir, "rounds": args.rounds}
            if args.workload in ("multi", "both"):
                title = f"multi-turn: {args.conversations} conversations, {turns} turns, --turns all"
                m = workload(title, multi, out, urls, turns="all", **common)
            if args.workload in ("single", "both"):
                title = f"single-turn: {args.prompts} prompts sharing 4 system prompts"
                s = workload(title, single, out, urls, turns="last", **common)
    rr, ll, pa, ca = ROWS
    if set(ROWS) != SELECTED:
        return
    print("## ratios")
    if m is not None:
        print(f"multi-turn: least-loaded wall / prefix-aware wall = {m[ll][0] / m[pa][0]:.2f}x (goal >= 1.3)")
        print(f"multi-turn: round robin wall / prefix-aware wall = {m[rr][0] / m[pa][0]:.2f}x")
        print(
            f"multi-turn: router cache_aware wall / prefix-aware = {m[ca][0] / m[pa][0]:.2f}x (goal >= 1.0)"
        )
        print(f"multi-turn: prefix-aware hit {m[pa][1]:.1%} vs router cache_aware {m[ca][1]:.1%} (goal >=)")
    if s is not None:
        print(
            f"single-turn: prefix-aware wall / least-loaded wall = {s[pa][0] / s[ll][0]:.2f}x (goal <= 1.02)"
        )
        print(f"single-turn: router cache_aware wall / prefix-aware wall = {s[ca][0] / s[pa][0]:.2f}x")
        print(f"single-turn: prefix-aware hit {s[pa][1]:.1%} vs router cache_aware {s[ca][1]:.1%}")


if __name__ == "__main__":
    main()
