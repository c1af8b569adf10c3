"""One worker killed and one frozen, direct and through the real router: wall times as ratios to the
clean run measured in the same script.

    .venv/bin/python bench/bench_router_faults.py [--prompts 1200] [--servers 4] [--rows all]

Each row starts a fresh fleet of stand-ins (`sglfleet_testing.standin`), runs one `sglfleet
generate` job over it, and, in a fault row, once a quarter of the results are written, kills
instance 0 (SIGKILL: connections refused from then on) and freezes instance 1 (SIGSTOP: its sockets
stay open, nothing answers: a hung GPU, a stuck process). Rows:

- direct: sglfleet sends to the instances itself (its own stall detection per endpoint);
- router: sglfleet sends to `sglang-router` 0.3.2 (`--policy cache_aware`) as its one endpoint,
  with the router's health defaults (60 s interval, 3 failures) or with fast ones (2 s, 2 failures,
  2 s timeout: what `sglang_router_health_check_*` are set to).

It prints each row's wall, the client's CPU seconds, retries, re-sends, and the fault rows' walls
over their clean row's, next to the floor: the clean run's pace until the faults, then half the
capacity (the stand-ins are capacity-bound: two of four gone halve the throughput whatever the
client does). Goal: faults through the router <= 1.3x its clean run where the fleet has the headroom,
else at the floor, as direct. Every row asserts exactly one result per prompt.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from sglfleet_testing.router import running_router, write_model_dir
from sglfleet_testing.standin.process import StandinProcess, start_standin

from sglfleet.gen import ExitCode, GenerateConfig, GenParams, LogReporter, run

CONCURRENCY = 16  # per instance
STANDIN = {
    "max_running_requests": CONCURRENCY,
    "standin_decode_tps": 200,  # tokens/s per request
    "standin_ttft": 0.05,
    "log_level": "warning",
}
FAST_HEALTH = (
    "--health-check-interval-secs", "2",
    "--health-failure-threshold", "2",
    "--health-check-timeout-secs", "2",
)  # fmt: skip


def write_prompts(path: Path, prompts: int, seed: int = 3) -> None:
    rng = random.Random(seed)
    with path.open("w") as fh:
        for i in range(prompts):
            words = " ".join(f"w{rng.randrange(100_000)}" for _ in range(rng.randint(20, 80)))
            fh.write(json.dumps({"id": f"p{i:06d}", "conversations": [{"role": "user", "content": words}]}))
            fh.write("\n")


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


class Faults:
    """Once ``at`` results are in the output: SIGKILL instance 0, SIGSTOP instance 1."""

    def __init__(self, servers: list[StandinProcess], out: Path, at: int) -> None:
        self.servers, self.out, self.at = servers, out, at
        self.done = threading.Event()
        self.fired_at: float | None = None
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self.done.is_set():
            if _lines(self.out) >= self.at:
                self.servers[0].process.send_signal(signal.SIGKILL)
                self.servers[1].process.send_signal(signal.SIGSTOP)
                self.fired_at = time.monotonic()
                return
            self.done.wait(0.05)

    def __enter__(self) -> Faults:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        self.servers[1].process.send_signal(signal.SIGCONT)


def job(inp: Path, out: Path, endpoints: list[str], concurrency: int, prompts: int) -> dict[str, float]:
    for p in (out, out.with_name(out.name + ".manifest.json"), out.with_name(out.name + ".errors.jsonl")):
        p.unlink(missing_ok=True)
    config = GenerateConfig(
        input=inp,
        output=out,
        endpoints=endpoints,
        concurrency=concurrency,
        params=GenParams(max_tokens=64),
        request_timeout=600.0,
    )
    cpu0, t0 = time.process_time(), time.perf_counter()
    outcome = run(config, LogReporter(io.StringIO(), interval=3600), handle_signals=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert outcome.exit_code == ExitCode.OK, outcome.message
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == prompts, f"{len(ids)} results, {len(set(ids))} ids, {prompts} prompts"
    m = outcome.manifest
    assert m is not None
    counts = m.counts
    return {"wall": wall, "cpu": cpu, "retries": counts.retries_this_run, "resent": counts.resent_this_run}


def row(name: str, args: argparse.Namespace, tmp: Path, model_dir: Path) -> dict[str, float]:
    inp, out = tmp / "in.jsonl", tmp / "out.jsonl"
    servers = [
        start_standin(model_path=str(model_dir), standin_seed=i, **STANDIN)  # type: ignore[arg-type]
        for i in range(args.servers)
    ]
    try:
        urls = [s.base_url for s in servers]
        faulty = "fault" in name

        def go(endpoints: list[str], concurrency: int) -> dict[str, float]:
            if not faulty:
                return job(inp, out, endpoints, concurrency, args.prompts)
            out.unlink(missing_ok=True)  # the clean row's: the faults watch this one fill
            with Faults(servers, out, args.prompts // 4) as faults:
                start = time.monotonic()
                result = job(inp, out, endpoints, concurrency, args.prompts)
            assert faults.fired_at is not None, "the faults never fired"
            result["fault_at"] = faults.fired_at - start
            return result

        if name.startswith("direct"):
            result = go(urls, CONCURRENCY)
        else:
            extra = FAST_HEALTH if "fast" in name else ()
            with running_router(urls, model_dir, "cache_aware", *extra) as router:
                result = go([router], CONCURRENCY * len(urls))
    finally:
        for s in servers:
            s.process.send_signal(signal.SIGCONT)
            s.close()
    print(
        f"{name:34s} wall {result['wall']:7.2f} s  client cpu {result['cpu']:6.2f} s  "
        f"retries {int(result['retries']):4d}  re-sent {int(result['resent']):4d}",
        flush=True,
    )
    return result


ROWS = {
    "direct": ("direct clean", "direct faults"),
    "router": ("router clean", "router faults (default health)"),
    "router-fast": ("router clean (fast health)", "router faults (fast health)"),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=1200)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--rows", choices=(*ROWS, "all"), default="all")
    args = parser.parse_args()
    groups = list(ROWS) if args.rows == "all" else [args.rows]
    print(
        f"{args.servers} stand-ins {json.dumps(STANDIN)}, {CONCURRENCY} in flight each, "
        f"{args.prompts} prompts, max_tokens 64; faults at 25%: instance 0 SIGKILL, instance 1 SIGSTOP; "
        f"python {sys.version.split()[0]}, pid {os.getpid()}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        model_dir = write_model_dir(tmpdir / "model")
        write_prompts(tmpdir / "in.jsonl", args.prompts)
        ratios = []
        for group in groups:
            clean_name, fault_name = ROWS[group]
            clean = row(clean_name, args, tmpdir, model_dir)
            fault = row(fault_name, args, tmpdir, model_dir)
            # the floor: the clean run's rate until the faults, then half the instances' capacity
            at, lost = fault["fault_at"], 2 / args.servers
            floor = (at + (clean["wall"] - at) / (1 - lost)) / clean["wall"]
            ratios.append(
                f"{fault_name} / {clean_name}: {fault['wall'] / clean['wall']:.2f}x "
                f"(faults at {at:.1f} s; floor with {args.servers - 2} of {args.servers} left: {floor:.2f}x)"
            )
    print("## ratios (goal through the router: <= 1.3x)")
    for line in ratios:
        print(line)


if __name__ == "__main__":
    main()
