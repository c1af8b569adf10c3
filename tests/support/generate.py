"""Helpers of the generation-engine tests: corpora, stand-in fleets, output checks, a job run in-process,
servers with a fixed latency (latency_server.py)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sglfleet_testing.standin.process import StandinProcess, start_standin

from sglfleet.gen import GenerateConfig, LogReporter, Outcome, run

LATENCY_SERVER = Path(__file__).with_name("latency_server.py")


def generate_argv(inp: Path, out: Path, urls: list[str], *extra: str) -> list[str]:
    """`sglfleet generate` of `inp` into `out` across `urls`, then `extra`: a child process's argv."""
    endpoints = [arg for url in urls for arg in ("-e", url)]
    return [sys.executable, "-m", "sglfleet", "generate", "-i", str(inp), "-o", str(out), *endpoints, *extra]


def write_conversations(path: Path, n: int, prefix: str = "c") -> list[str]:
    ids = [f"{prefix}{i:06d}" for i in range(n)]
    with path.open("w") as fh:
        for i, cid in enumerate(ids):
            turns = [
                {"role": "user", "content": f"question number {i}: explain {i % 17} things"},
                {"role": "assistant", "content": "an old answer to be regenerated"},
            ]
            fh.write(json.dumps({"id": cid, "conversations": turns}) + "\n")
    return ids


def write_batch(path: Path, n: int, prefix: str = "b", **body: Any) -> list[str]:
    ids = [f"{prefix}{i:06d}" for i in range(n)]
    with path.open("w") as fh:
        for i, cid in enumerate(ids):
            req_body = {"messages": [{"role": "user", "content": f"prompt {i}"}], "max_tokens": 16, **body}
            fh.write(
                json.dumps(
                    {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": req_body}
                )
                + "\n"
            )
    return ids


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every line parsed; fails on a torn (unterminated or unparsable) line."""
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"{path} ends with a torn line"
    return [json.loads(line) for line in data.splitlines()]


def assert_exactly_once(output: Path, ids: list[str]) -> list[dict[str, Any]]:
    records = read_jsonl(output)
    counts = Counter(r["custom_id"] for r in records)
    repeated = {k: v for k, v in counts.items() if v > 1}
    assert not repeated, f"custom_ids written more than once: {list(repeated.items())[:5]}"
    missing = set(ids) - set(counts)
    assert not missing, f"{len(missing)} custom_ids missing, e.g. {sorted(missing)[:5]}"
    assert set(counts) == set(ids)
    for r in records:
        assert r["response"]["status_code"] == 200 and r["error"] is None
        assert r["response"]["body"]["choices"][0]["message"]["content"]
    return records


@contextlib.contextmanager
def fleet(*flag_sets: dict[str, Any]) -> Iterator[list[StandinProcess]]:
    """Stand-ins, one per flag set (``{}`` for a plain zero-latency one), stopped on exit."""
    servers: list[StandinProcess] = []
    try:
        for flags in flag_sets:
            servers.append(start_standin(**{"enable_metrics": True, "log_level": "warning", **flags}))
        yield servers
    finally:
        for server in servers:
            server.process.kill()
            server.process.wait()
            server.log.close()


def requests_served(base_url: str) -> float:
    """``sglang:num_requests_total`` of a stand-in started with metrics."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    match = re.search(r"^sglang:num_requests_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    assert match, text[:500]
    return float(match.group(1))


# -- running a job in-process, against servers with a fixed latency ------------------------------


def job_config(inp: Path, out: Path, endpoints: list[str], **kw: object) -> GenerateConfig:
    kw.setdefault("concurrency", 8)
    kw.setdefault("backoff_base", 0.01)
    kw.setdefault("probe_interval", 0.1)
    kw.setdefault("metrics_linger", 0.0)  # not the 15 s a last scrape gets: tests scrape before the end
    return GenerateConfig(input=inp, output=out, endpoints=endpoints, **kw)  # type: ignore[arg-type]


def run_job(inp: Path, out: Path, endpoints: list[str], **kw: object) -> Outcome:
    return run(job_config(inp, out, endpoints, **kw), LogReporter(io.StringIO(), 3600), handle_signals=False)


class Background:
    """A job run on a thread, so that the test can act on the world meanwhile."""

    def __init__(self, config: GenerateConfig) -> None:
        self.outcome: Outcome | None = None
        self.thread = threading.Thread(target=self._run, args=(config,), daemon=True)
        self.thread.start()

    def _run(self, config: GenerateConfig) -> None:
        self.outcome = run(config, LogReporter(io.StringIO(), 3600), handle_signals=False)

    def join(self, timeout: float) -> Outcome:
        self.thread.join(timeout)
        assert self.outcome is not None, "the job did not end in time"
        return self.outcome


def count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


@contextlib.contextmanager
def latency_servers(count: int, latency: float, mode: str) -> Iterator[list[str]]:
    proc = subprocess.Popen(
        [sys.executable, str(LATENCY_SERVER), str(count), str(latency), mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, "latency server did not start"
        yield [f"http://127.0.0.1:{p}" for p in json.loads(line)]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())
