"""A hung instance heals itself: a job across 4 instances, one of which hangs at 30% of its work.

    .venv/bin/python bench/bench_hang.py [--prompts 4800] [--ttft 0.5] [--concurrency 8] [--watchdog 20]

Side by side in one run, the same job twice on 4 stand-in instances, each started the way the fleet's
unit starts SGLang (``python -m sglfleet.launch sglfleet_testing.standin ... --watchdog-timeout W``) under
a supervisor that does what systemd's ``Restart=on-failure`` / ``RestartSec=1`` does (restart after a
non-zero exit, and only then):

1. no fault;
2. instance 0 started with ``--standin-hang-after`` at 30% of its share of the forward batches: its
   forward loop stops, HTTP still accepts, and its watchdog kills it after W seconds (as SGLang 0.5.12's
   scheduler watchdog does); the launcher exits 137, the supervisor restarts it (without the fault).

It prints both walls, their ratio (target <= 1.3), when instance 0 hung, died (exit status), restarted and
answered /health_generate again, whether that was before the job ended, how many requests it answered
after it came back, and that every prompt has exactly one result. Exit status 0 when all of that holds.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from sglfleet_testing.standin.process import free_port

from sglfleet.gen import ExitCode, GenerateConfig, GenParams, LogReporter, run

RESTART_SEC = 1.0  # the lab fleet's sglang_fleet_restart_sec


class Supervised:
    """One instance under a Restart=on-failure supervisor, with a timeline of what happened to it."""

    def __init__(self, port: int, flags: list[str], log_dir: Path, fault: list[str]) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.flags = flags
        self.fault = fault
        self.log_dir = log_dir
        self.events: list[tuple[float, str]] = []
        self.exit_codes: list[int] = []
        self._stop = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._supervise, daemon=True)

    def _argv(self, first: bool) -> list[str]:
        return [
            sys.executable, "-m", "sglfleet.launch", "sglfleet_testing.standin", "--model-path", "standin/m",
            "--port", str(self.port), "--log-level", "warning", *self.flags, *(self.fault if first else []),
        ]  # fmt: skip

    def _start(self, first: bool) -> None:
        log = (self.log_dir / f"instance-{self.port}.log").open("ab")
        self._process = subprocess.Popen(self._argv(first), stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def _supervise(self) -> None:
        first = True
        while not self._stop.is_set():
            self._start(first)
            assert self._process is not None
            code = self._process.wait()
            if self._stop.is_set():
                return
            self.exit_codes.append(code)
            self.events.append((time.monotonic(), f"exited {code}"))
            if code == 0:  # Restart=on-failure: a clean exit stays down
                return
            time.sleep(RESTART_SEC)
            first = False
            self.events.append((time.monotonic(), "restarted"))
            threading.Thread(target=self._until_healthy, daemon=True).start()

    def _until_healthy(self) -> None:
        while not self._stop.is_set():
            try:
                if httpx.get(f"{self.url}/health_generate", timeout=5).status_code == 200:
                    self.events.append((time.monotonic(), "serves again"))
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.url}/health_generate", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"{self.url} never became healthy"
            time.sleep(0.1)

    def close(self) -> None:
        self._stop.set()
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


def prompts(path: Path, n: int) -> None:
    with path.open("w") as fh:
        for i in range(n):
            turns = [{"role": "user", "content": f"prompt {i}: write about topic {i % 101}"}]
            fh.write(json.dumps({"id": f"p{i:07d}", "conversations": turns}) + "\n")


def job(inp: Path, out: Path, urls: list[str], concurrency: int) -> tuple[float, dict]:
    config = GenerateConfig(
        input=inp, output=out, endpoints=urls, concurrency=concurrency, params=GenParams(max_tokens=16)
    )
    t0 = time.perf_counter()
    outcome = run(config, LogReporter(io.StringIO(), interval=3600), handle_signals=False)
    wall = time.perf_counter() - t0
    assert outcome.exit_code == ExitCode.OK, outcome.message
    manifest = json.loads(out.with_name(out.name + ".manifest.json").read_text())
    return wall, manifest


def one_run(tmp: Path, name: str, n: int, *, flags: list[str], fault: list[str], concurrency: int):
    inp, out = tmp / "in.jsonl", tmp / f"{name}.jsonl"
    if not inp.exists():
        prompts(inp, n)
    fleet = [Supervised(free_port(), flags, tmp, fault if i == 0 else []) for i in range(4)]
    try:
        for inst in fleet:
            inst.start()
        started = time.monotonic()
        wall, manifest = job(inp, out, [inst.url for inst in fleet], concurrency)
        ended = time.monotonic()
    finally:
        for inst in fleet:
            inst.close()
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines() if line.strip()]
    assert len(ids) == len(set(ids)) == n, (len(ids), len(set(ids)), n)
    return wall, manifest, fleet[0], started, ended


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=4800)
    parser.add_argument("--ttft", type=float, default=0.5, help="seconds per request at each stand-in")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight per instance")
    parser.add_argument("--watchdog", type=float, default=20.0, help="--watchdog-timeout of every instance")
    parser.add_argument(
        "--hang-at", type=float, default=0.3, help="share of instance 0's work before it hangs"
    )
    args = parser.parse_args(argv)
    n = args.prompts
    flags = [
        "--standin-ttft", str(args.ttft), "--max-running-requests", str(args.concurrency),
        "--watchdog-timeout", str(args.watchdog), "--standin-warmup-seconds", "1",
        "--standin-health-seconds", "1",
    ]  # fmt: skip
    # Two forward batches per request (the prefill, the decode): its share is n / 4 requests.
    hang_after = max(1, round(2 * args.hang_at * n / 4))
    print(
        f"## a hung instance heals itself: {n} prompts, 4 stand-ins through sglfleet.launch at "
        f"{args.ttft * 1000:.0f} ms per request, {args.concurrency} in flight each, --watchdog-timeout "
        f"{args.watchdog:g}; instance 0 hangs after {hang_after} forward batches "
        f"({args.hang_at:.0%} of its share)"
    )
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        plain, _m, _i, _s, _e = one_run(tmp, "plain", n, flags=flags, fault=[], concurrency=args.concurrency)
        fault = ["--standin-hang-after", str(hang_after)]
        hung, manifest, victim, started, ended = one_run(
            tmp, "hang", n, flags=flags, fault=fault, concurrency=args.concurrency
        )
        hung_at = _hung_at(tmp / f"instance-{victim.port}.log")
    print(f"no hang:               {plain:7.2f} s")
    print(
        f"one instance hangs:    {hung:7.2f} s   "
        f"(re-sent {manifest['counts'].get('resent_this_run', '?')} requests)"
    )
    for when, what in victim.events:
        print(f"  instance 0 {what:<14} at {when - started:6.1f} s of {ended - started:.1f} s")
    if hung_at:
        print(f"  (its log: {hung_at})")
    back = [when for when, what in victim.events if what == "serves again"]
    crashed = [c for c in victim.exit_codes if c != 0]
    print(
        f"exit status of the hung instance: {crashed or 'none'} (128 + SIGKILL = 137: a failure, restarted)"
    )
    print(f"serves again before the job ends: {bool(back) and back[0] < ended}")
    print(f"every prompt exactly once: {manifest['counts']['done']} done of {n}")
    served = int(manifest["endpoint_stats"].get(victim.url, {}).get("ok", 0))
    before = hang_after // 2  # two forward batches per request: the requests it answered before the hang
    print(f"instance 0 answered {served} requests, {served - before} of them after it came back")
    print(f"ratio hang / none: {hung / plain:.3f}  (target <= 1.3)")
    ok = hung / plain <= 1.3 and bool(back) and back[0] < ended and crashed == [137] and served > before
    return 0 if ok else 1


def _hung_at(log: Path) -> str:
    wanted = ("forward loop stopped", "watchdog timeout", "SIGQUIT received")
    lines = [line for line in log.read_text(errors="replace").splitlines() if any(w in line for w in wanted)]
    return "; ".join(lines)


if __name__ == "__main__":
    sys.exit(main())
