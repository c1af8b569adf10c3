"""Helpers of the generation-engine tests: corpora, stand-in fleets, output checks."""

from __future__ import annotations

import contextlib
import json
import re
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sglfleet_testing.standin.process import StandinProcess, start_standin


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
