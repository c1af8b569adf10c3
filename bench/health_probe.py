"""Probing N SGLang instances at once vs one after another, measured side by side in one run.

    .venv/bin/python bench/health_probe.py [--instances 8] [--rounds 20] [--latency 0.05]

Two fleets on 127.0.0.1: N SGLang stand-ins (no added latency: the cost is HTTP and parsing), and
N instances of tests/unit/latency_server.py answering every request after --latency seconds (a
stand-in for a busy or remote server). For each, the median time of one `check_fleet` over all N
(concurrent) and of N `check_fleet` calls one instance at a time (sequential), and their ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from sglfleet_testing.standin.process import standin_process

from sglfleet.fleet import check_fleet, endpoints_from_urls

ROOT = Path(__file__).resolve().parents[1]


def median_s(fn: Callable[[], object], rounds: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@contextlib.contextmanager
def standins(n: int) -> Iterator[list[str]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(standin_process()).base_url for _ in range(n)]


@contextlib.contextmanager
def latency_fleet(n: int, latency: float) -> Iterator[list[str]]:
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests/unit/latency_server.py"), str(n), str(latency)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ports = json.loads(proc.stdout.readline())
        yield [f"http://127.0.0.1:{p}" for p in ports]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def measure(name: str, urls: list[str], rounds: int) -> None:
    endpoints = endpoints_from_urls(urls)
    assert check_fleet(endpoints).all_healthy

    def concurrent() -> None:
        check_fleet(endpoints)

    def sequential() -> None:
        for endpoint in endpoints:
            check_fleet([endpoint])

    one = median_s(lambda: check_fleet(endpoints[:1]), rounds)
    together = median_s(concurrent, rounds)
    apart = median_s(sequential, rounds)
    print(
        f"{name:<28} 1 instance {one * 1000:7.1f} ms | {len(urls)} at once {together * 1000:7.1f} ms "
        f"| {len(urls)} one by one {apart * 1000:7.1f} ms | one-by-one / at-once = {apart / together:4.1f}x "
        f"| at-once / one = {together / one:4.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--latency", type=float, default=0.05)
    args = parser.parse_args()
    with standins(args.instances) as urls:
        measure("stand-in (no latency)", urls, args.rounds)
    with latency_fleet(args.instances, args.latency) as urls:
        measure(f"fixed {args.latency * 1000:g} ms per request", urls, args.rounds)


if __name__ == "__main__":
    main()
