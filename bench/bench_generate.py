"""Benchmarks of `sglfleet generate`, each printing ratios measured side by side in one run.

    .venv/bin/python bench/bench_generate.py ceiling   # wall ÷ a plain aiohttp worker pool's (goal <= 1.05)
    .venv/bin/python bench/bench_generate.py slow      # 8 stand-ins, one 4x slower: time ÷ ideal, ours vs RR
    .venv/bin/python bench/bench_generate.py resume    # 200K results written: time to find the missing, RSS
    .venv/bin/python bench/bench_generate.py resume_run  # 40K job, 38K done: wall ÷ a pool's resume (<= 1.5)
    .venv/bin/python bench/bench_generate.py frozen    # 1 of 4 instances SIGSTOPped: time ÷ none (<= 1.25)
    .venv/bin/python bench/bench_generate.py rss       # peak RSS of a whole job, 200K prompts vs 20K
    .venv/bin/python bench/bench_generate.py all

Every server is a stand-in (`python -m sglfleet_testing.standin`) on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop
from sglfleet_testing.standin.process import StandinProcess, start_standin

from sglfleet.gen import (
    ExitCode,
    GenerateConfig,
    GenParams,
    LogReporter,
    OutputStore,
    iter_requests,
    result_line,
    run,
    scan_input,
)
from sglfleet.gen import _client as client


@contextlib.contextmanager
def standins(*flag_sets: dict[str, object]) -> Iterator[list[StandinProcess]]:
    servers: list[StandinProcess] = []
    try:
        for flags in flag_sets:
            servers.append(start_standin(log_level="warning", **flags))  # type: ignore[arg-type]
        yield servers
    finally:
        for s in servers:
            s.close()


def conversations(path: Path, n: int) -> None:
    with path.open("w") as fh:
        for i in range(n):
            turns = [
                {"role": "user", "content": f"prompt {i}: write about topic {i % 101} in detail"},
                {"role": "assistant", "content": "old"},
            ]
            fh.write(json.dumps({"id": f"p{i:07d}", "conversations": turns}) + "\n")


def engine_job(
    inp: Path, out: Path, urls: list[str], concurrency: int, max_tokens: int = 16, *, resume: bool = False
) -> float:
    """Run our engine in this process; seconds from start to the last result."""
    if not resume:
        for p in (out, out.with_name(out.name + ".manifest.json"), out.with_name(out.name + ".errors.jsonl")):
            p.unlink(missing_ok=True)
    config = GenerateConfig(
        input=inp,
        output=out,
        endpoints=urls,
        concurrency=concurrency,
        params=GenParams(max_tokens=max_tokens),
    )
    t0 = time.perf_counter()
    outcome = run(config, LogReporter(io.StringIO(), interval=3600), handle_signals=False)
    elapsed = time.perf_counter() - t0
    assert outcome.exit_code == ExitCode.OK, outcome.message
    return elapsed


POOL_BASELINE = (
    "a plain aiohttp worker pool: N workers per endpoint pulling from one queue, orjson, results appended"
)
RESUME_BASELINE = "the same pool, the done ids read into a set, the missing sent"


async def _pool_workers(
    queue: asyncio.Queue[tuple[str, bytes]], urls: list[str], concurrency: int, sink: io.BufferedWriter
) -> None:
    """``concurrency`` workers per endpoint pull (custom_id, body) from one queue until it is empty; each
    answer is parsed (orjson) and appended to ``sink`` as an OpenAI Batch output line, one write each."""
    connector = aiohttp.TCPConnector(limit=concurrency * len(urls), limit_per_host=0)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def worker(url: str) -> None:
            while True:
                try:
                    cid, body = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                async with session.post(url, data=body) as resp:
                    raw = await resp.read()
                    assert resp.status == 200
                answer = orjson.loads(raw)
                line = {"custom_id": cid, "response": {"status_code": 200, "body": answer}, "error": None}
                sink.write(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))

        endpoints = [u + "/v1/chat/completions" for u in urls]
        await asyncio.gather(*(worker(u) for u in endpoints for _ in range(concurrency)))


def _pool_bodies(
    inp: Path, max_tokens: int, done: set[str] | frozenset[str] = frozenset()
) -> list[tuple[str, bytes]]:
    """Every input line parsed (orjson), the ids in ``done`` skipped, the last assistant turn cut."""
    out = []
    with inp.open("rb") as fh:
        for raw in fh:
            row = orjson.loads(raw)
            cid = str(row["id"])
            if cid in done:
                continue
            msgs = row["conversations"]
            if msgs and msgs[-1]["role"] == "assistant":
                msgs = msgs[:-1]
            out.append((cid, orjson.dumps({"messages": msgs, "max_tokens": max_tokens})))
    return out


def _on_uvloop(coro: Any) -> float:
    """Run a baseline on the event loop ours runs on (uvloop), so that the loop is not the difference."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


async def _plain_pool(inp: Path, out: Path, urls: list[str], concurrency: int, max_tokens: int) -> float:
    """The baseline (see POOL_BASELINE), timed like ours: from reading the input to the last answer."""
    t0 = time.perf_counter()
    queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
    for item in _pool_bodies(inp, max_tokens):
        queue.put_nowait(item)
    with out.open("wb", buffering=0) as sink:
        await _pool_workers(queue, urls, concurrency, sink)  # type: ignore[arg-type]
    return time.perf_counter() - t0


def bench_ceiling(n: int, servers: int, concurrency: int, rounds: int) -> None:
    print(
        f"## 1. client ceiling: {n} requests, {servers} zero-latency stand-ins, {concurrency} in flight each"
    )
    ours: list[float] = []
    plain: list[float] = []
    cpu_ours: list[float] = []
    cpu_plain: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, standins(*({} for _ in range(servers))) as fleet:
        inp, out, pout = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl", Path(tmp) / "pool.jsonl"
        conversations(inp, n)
        urls = [s.base_url for s in fleet]

        def timed(job: Callable[[], float], walls: list[float], cpus: list[float]) -> None:
            c0 = time.process_time()
            walls.append(job())
            cpus.append((time.process_time() - c0) / n * 1e6)

        def run_plain() -> None:
            timed(lambda: _on_uvloop(_plain_pool(inp, pout, urls, concurrency, 16)), plain, cpu_plain)

        def run_ours() -> None:
            timed(lambda: engine_job(inp, out, urls, concurrency), ours, cpu_ours)

        engine_job(inp, out, urls, concurrency)  # warm-up: page cache, stand-ins' first requests
        for r in range(rounds):  # interleaved, alternating who goes first
            for job in (run_plain, run_ours) if r % 2 else (run_ours, run_plain):
                job()
    ratios = [o / p for o, p in zip(ours, plain, strict=True)]
    med = statistics.median
    print(f"baseline: {POOL_BASELINE}")
    print(f"pool:               {n / med(plain):7.0f} req/s  client CPU {med(cpu_plain):4.0f} us/request")
    print(f"sglfleet generate:  {n / med(ours):7.0f} req/s  client CPU {med(cpu_ours):4.0f} us/request")
    print(f"ours/pool wall per round: {', '.join(f'{x:.2f}' for x in ratios)}")
    print(
        f"ratio sglfleet / pool wall, median of {rounds} interleaved rounds: {med(ratios):.3f}"
        f"  (goal <= 1.05); client CPU ratio {med(cpu_ours) / med(cpu_plain):.3f}"
    )
    print("(both in this process, from reading the input to the last answer written; ours also validates")
    print(" the whole input first and fsyncs the output and the manifest; client CPU: this process only)")


async def _round_robin(inp: Path, urls: list[str], concurrency: int, max_tokens: int) -> float:
    """The public scripts' dispatch: request i goes to endpoint i % N (each capped at `concurrency`)."""
    scan = scan_input(inp)
    assert scan.format is not None
    reqs = list(iter_requests(inp, scan.format, GenParams(max_tokens=max_tokens)))
    sems = [asyncio.Semaphore(concurrency) for _ in urls]
    timeout = aiohttp.ClientTimeout(total=600)
    async with client.make_session(concurrency * len(urls)) as session:

        async def one(i: int) -> None:
            async with sems[i % len(urls)]:
                a = await client.post(session, urls[i % len(urls)] + reqs[i].url, reqs[i].body, timeout)
                assert a.kind is client.Kind.OK, a.message

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(len(reqs))))
        return time.perf_counter() - t0


def bench_slow(n: int, concurrency: int, ttft: float) -> None:
    slow = ttft * 4
    print(
        f"## 2. slow instance: {n} requests, 8 stand-ins (7 at {ttft * 1000:.0f} ms per request, "
        f"1 at {slow * 1000:.0f} ms), {concurrency} in flight each"
    )
    capacity = 7 * concurrency / ttft + concurrency / slow  # requests/s of the whole fleet
    ideal = n / capacity
    flags = [{"standin_ttft": ttft, "max_running_requests": concurrency} for _ in range(7)]
    flags.append({"standin_ttft": slow, "max_running_requests": concurrency})
    with tempfile.TemporaryDirectory() as tmp, standins(*flags) as fleet:
        inp, out = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        conversations(inp, n)
        urls = [s.base_url for s in fleet]
        rr = asyncio.run(_round_robin(inp, urls, concurrency, 16))
        runs = [engine_job(inp, out, urls, concurrency) for _ in range(3)]
        ours = statistics.median(runs)
        shares = json.loads(out.with_name(out.name + ".manifest.json").read_text())["endpoint_stats"]
    print(f"ideal (work / aggregate capacity): {ideal:6.2f} s")
    print(f"round robin:        {rr:6.2f} s   time / ideal = {rr / ideal:.3f}")
    print(f"sglfleet generate:  {ours:6.2f} s   time / ideal = {ours / ideal:.3f}   (target <= 1.15)")
    print(f"  (median of 3 runs: {', '.join(f'{t / ideal:.3f}' for t in runs)})")
    print(f"requests the slow instance got: ours {int(shares[urls[-1]]['ok'])}, round robin {n // 8}")


def _fill_resume(inp: Path, out: Path, n: int, missing: int) -> None:
    conversations(inp, n)
    body = {
        "id": "chatcmpl-0",
        "object": "chat.completion",
        "model": "default",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "lorem ipsum " * 40},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 80, "total_tokens": 92},
    }
    raw = json.dumps(body).encode()
    skip = set(range(0, n, n // missing))
    with out.open("wb") as fh:
        for i in range(n):
            if i not in skip:
                fh.write(result_line(f"p{i:07d}", "chatcmpl-0", body, raw, f"batch_req_{i:016x}"))


def peak_rss_mib() -> float:
    """This process's peak RSS (VmHWM: ru_maxrss would carry the parent's over fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _resume_probe(inp: str, out: str, naive: bool) -> None:
    """(child process) list the missing ids; print the seconds taken and the peak RSS as JSON."""
    t0, c0 = time.perf_counter(), time.process_time()
    scan = scan_input(Path(inp))
    assert scan.format is not None
    t_scan, c_scan = time.perf_counter() - t0, time.process_time() - c0
    if naive:  # what a script would do: every output line parsed, the ids kept as a set of strings
        with open(out, "rb") as fh:
            done = {json.loads(line)["custom_id"] for line in fh}
        skip = done.__contains__
    else:
        store = OutputStore(Path(out))
        skip = store.open().done.__contains__
        store.close()
    missing = sum(1 for _ in iter_requests(Path(inp), scan.format, GenParams(), skip=skip))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    result = {"seconds": elapsed, "scan": t_scan, "cpu": cpu, "cpu_scan": c_scan}
    print(json.dumps({**result, "rss_mib": peak_rss_mib(), "missing": missing}))


def _child(*args: str) -> dict[str, float]:
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_resume(n: int, missing: int) -> None:
    print(f"## 3. resume: {n} prompts, {n - missing} results already written ({missing} missing)")
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        _fill_resume(inp, out, n, missing)
        size = out.stat().st_size / 2**20
        ours = _child("_resume", str(inp), str(out), "ours")
        naive = _child("_resume", str(inp), str(out), "naive")
    assert ours["missing"] == naive["missing"] == missing, (ours, naive)
    print(
        f"output: {size:.0f} MiB. Finding the missing ids = validate the input + read the output + list them"
    )
    for name, r in (("sglfleet (id index)", ours), ("naive (json.loads, set[str])", naive)):
        print(
            f"{name:29} wall {r['seconds']:5.2f} s, CPU {r['cpu']:5.2f} s (input validation "
            f"{r['cpu_scan']:4.2f} s, the rest {r['cpu'] - r['cpu_scan']:4.2f} s)  "
            f"peak RSS {r['rss_mib']:5.1f} MiB"
        )
    c_ratio = ours["cpu"] / naive["cpu"]
    rss_ratio = ours["rss_mib"] / naive["rss_mib"]
    print(f"ratio ours / naive: CPU time {c_ratio:.2f}, peak RSS {rss_ratio:.2f}")


def _manifest_for(inp: Path, out: Path, max_tokens: int) -> None:
    """The manifest a run that wrote ``out`` from ``inp`` leaves (so that the next run resumes)."""
    from sglfleet.gen import _manifest as manifest

    scan = scan_input(inp, index=False)
    now = "2026-01-01T00:00:00+00:00"
    m = manifest.Manifest(
        status="interrupted",
        input=manifest.InputInfo(
            path=str(inp), sha256=scan.sha256, format=str(scan.format), requests=scan.requests, size=scan.size
        ),
        params=GenParams(max_tokens=max_tokens).record(),
        endpoints=[],
        counts=manifest.Counts(total=scan.requests),
        tokens=manifest.Tokens(),
        throughput=manifest.Throughput(),
        timings=manifest.Timings(first_started_at=now, run_started_at=now, updated_at=now),
        errors_file=str(out) + ".errors.jsonl",
    )
    manifest.save(manifest.manifest_path(out), m)


async def _pool_resume(inp: Path, out: Path, urls: list[str], concurrency: int, max_tokens: int) -> float:
    """The baseline (see RESUME_BASELINE): every output line parsed (orjson) for its custom_id into a
    set, every input line parsed, the missing ones queued for the pool and appended to the output."""
    t0 = time.perf_counter()
    with out.open("rb") as fh:
        done = {orjson.loads(line)["custom_id"] for line in fh}
    queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
    for item in _pool_bodies(inp, max_tokens, done):
        queue.put_nowait(item)
    with out.open("ab", buffering=0) as sink:
        await _pool_workers(queue, urls, concurrency, sink)  # type: ignore[arg-type]
    return time.perf_counter() - t0


def bench_resume_run(n: int, missing: int, servers: int, concurrency: int, rounds: int) -> None:
    print(
        f"## 3b. resumed run: {n} prompts, {n - missing} results written, the {missing} missing sent to "
        f"{servers} zero-latency stand-ins, {concurrency} in flight each"
    )
    ours: list[float] = []
    plain: list[float] = []
    cpu_ours: list[float] = []
    cpu_plain: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, standins(*({} for _ in range(servers))) as fleet:
        inp, base = Path(tmp) / "in.jsonl", Path(tmp) / "base.jsonl"
        _fill_resume(inp, base, n, missing)
        out = Path(tmp) / "out.jsonl"
        urls = [s.base_url for s in fleet]

        def fresh() -> None:
            for p in (out, out.with_name(out.name + ".errors.jsonl")):
                p.unlink(missing_ok=True)
            shutil.copyfile(base, out)
            _manifest_for(inp, out, 16)
            with out.open("rb+") as fh:  # on disk, as the run that wrote it left it: no fsync owed
                os.fsync(fh.fileno())

        def run_ours() -> None:
            fresh()
            c0 = time.process_time()
            ours.append(engine_job(inp, out, urls, concurrency, resume=True))
            cpu_ours.append(time.process_time() - c0)
            assert sum(1 for _ in out.open("rb")) == n

        def run_plain() -> None:
            fresh()
            c0 = time.process_time()
            plain.append(_on_uvloop(_pool_resume(inp, out, urls, concurrency, 16)))
            cpu_plain.append(time.process_time() - c0)
            assert sum(1 for _ in out.open("rb")) == n

        run_ours()  # warm-up
        ours.clear()
        cpu_ours.clear()
        for r in range(rounds):
            for job in (run_plain, run_ours) if r % 2 else (run_ours, run_plain):
                job()
    ratios = [o / p for o, p in zip(ours, plain, strict=True)]
    med = statistics.median
    print(f"baseline: {RESUME_BASELINE}")
    print(f"pool resume:        {med(plain):6.2f} s   client CPU {med(cpu_plain):5.2f} s")
    print(
        f"sglfleet generate:  {med(ours):6.2f} s   client CPU {med(cpu_ours):5.2f} s"
        "   (checks the input against the manifest, probes, fsyncs)"
    )
    print(f"ours/pool wall per round: {', '.join(f'{x:.2f}' for x in ratios)}")
    print(
        f"ratio sglfleet / pool resume wall, median of {rounds} interleaved rounds: {med(ratios):.3f}"
        f"  (goal <= 1.5); client CPU ratio {med(cpu_ours) / med(cpu_plain):.3f}"
    )


def bench_frozen(n: int, ttft: float, concurrency: int, freeze_at: float) -> None:
    print(
        f"## 5. frozen instance: {n} requests, 4 stand-ins at {ttft * 1000:.0f} ms per request, "
        f"{concurrency} in flight each; one SIGSTOPped at {freeze_at:.0%} of the plain job's time"
    )
    flags = [{"standin_ttft": ttft, "max_running_requests": concurrency} for _ in range(4)]
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        conversations(inp, n)
        with standins(*flags) as fleet:
            plain = engine_job(inp, out, [s.base_url for s in fleet], concurrency)
        with standins(*flags) as fleet:
            victim = fleet[0].process.pid
            timer = threading.Timer(freeze_at * plain, os.kill, (victim, signal.SIGSTOP))
            timer.start()
            try:
                frozen = engine_job(inp, out, [s.base_url for s in fleet], concurrency)
            finally:
                timer.cancel()
                os.kill(victim, signal.SIGCONT)
            m = json.loads(out.with_name(out.name + ".manifest.json").read_text())
    floor = freeze_at + (1 - freeze_at) * 4 / 3  # the 3 others' capacity after the freeze, no loss at all
    print(f"no instance frozen:  {plain:6.2f} s")
    print(f"one frozen:          {frozen:6.2f} s   (re-sent {m['counts']['resent_this_run']} requests)")
    print(f"capacity floor (3 of 4 instances after the freeze): {floor:.3f}")
    print(f"ratio frozen / none: {frozen / plain:.3f}  (target <= 1.25; before: 617 s / ~50 s)")


def _job_rss(inp: Path, out: Path, urls: list[str], concurrency: int) -> tuple[float, float]:
    argv = ["generate", "-i", str(inp), "-o", str(out), "--max-tokens", "16"]
    argv += ["--concurrency", str(concurrency), "--log-interval", "3600"]
    for u in urls:
        argv += ["-e", u]
    t0 = time.perf_counter()
    result = _child("_job", *argv)
    return time.perf_counter() - t0, result["rss_mib"]


def _job_child(argv: list[str]) -> None:
    """(child process) `sglfleet generate ARGV`, then its peak RSS as JSON."""
    from sglfleet.cli import main as cli_main

    with contextlib.redirect_stdout(io.StringIO()):
        code = cli_main(argv)
    assert code == 0, code
    print(json.dumps({"rss_mib": peak_rss_mib()}))


def bench_rss(small: int, large: int, servers: int, concurrency: int) -> None:
    print(
        f"## 4. memory: peak RSS of whole jobs, {large} prompts vs {small}, {servers} zero-latency stand-ins"
    )
    with tempfile.TemporaryDirectory() as tmp, standins(*({} for _ in range(servers))) as fleet:
        urls = [s.base_url for s in fleet]
        rows = []
        for n in (small, large):
            inp, out = Path(tmp) / f"in{n}.jsonl", Path(tmp) / f"out{n}.jsonl"
            conversations(inp, n)
            seconds, rss = _job_rss(inp, out, urls, concurrency)
            rows.append((n, seconds, rss))
            print(f"{n:>8} prompts: {seconds:7.1f} s  {n / seconds:7.0f} req/s  peak RSS {rss:6.1f} MiB")
    print(f"peak RSS ratio {large} / {small} prompts: {rows[1][2] / rows[0][2]:.3f}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_resume":
        _resume_probe(sys.argv[2], sys.argv[3], sys.argv[4] == "naive")
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_job":
        _job_child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("which", choices=("ceiling", "slow", "resume", "resume_run", "frozen", "rss", "all"))
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply request counts (0.1 for a quick look)"
    )
    parser.add_argument("--servers", type=int, default=2, help="stand-ins for ceiling and rss (2)")
    parser.add_argument(
        "--concurrency", type=int, default=64, help="in flight per stand-in for ceiling and rss"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds of ceiling (5), resume_run (3)"
    )
    args = parser.parse_args()
    s = args.scale
    if args.which in ("ceiling", "all"):
        bench_ceiling(int(20_000 * s), args.servers, args.concurrency, rounds=args.rounds)
    if args.which in ("slow", "all"):
        bench_slow(int(2_000 * s), concurrency=4, ttft=0.1)
    if args.which in ("resume", "all"):
        bench_resume(int(200_000 * s), missing=int(10_000 * s))
    if args.which in ("resume_run", "all"):
        bench_resume_run(
            int(40_000 * s), int(2_000 * s), args.servers, args.concurrency, rounds=max(1, args.rounds - 2)
        )
    if args.which in ("frozen", "all"):
        bench_frozen(int(2_000 * s), ttft=0.5, concurrency=8, freeze_at=0.3)
    if args.which in ("rss", "all"):
        bench_rss(int(20_000 * s), int(200_000 * s), args.servers, args.concurrency)


if __name__ == "__main__":
    main()
