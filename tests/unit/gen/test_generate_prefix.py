"""Prefix-aware dispatch (`--dispatch prefix`, the default) against real stand-ins that model
SGLang's prefix cache: requests go where their prompt prefix is cached while load allows, and the
engine's guarantees (exactly once, stall handling) hold as with least-loaded."""

from __future__ import annotations

import asyncio
import io
import json
import random
import re
import urllib.request
from pathlib import Path

import orjson
import pytest
from support.generate import assert_exactly_once, fleet, requests_served

from sglfleet.cli import main as cli_main
from sglfleet.gen import ExitCode, GenerateConfig, GenParams, LogReporter, Outcome, run
from sglfleet.gen._affinity import PrefixAffinity
from sglfleet.gen._dispatch import EndpointPool, Release

pytestmark = pytest.mark.timeout(90)


def _run(inp: Path, out: Path, endpoints: list[str], **kw: object) -> Outcome:
    kw.setdefault("backoff_base", 0.01)
    kw.setdefault("probe_interval", 0.1)
    config = GenerateConfig(input=inp, output=out, endpoints=endpoints, **kw)  # type: ignore[arg-type]
    return run(config, LogReporter(io.StringIO(), interval=5), handle_signals=False)


def _counter(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    match = re.search(rf"^{name}\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M)
    assert match, text[:300]
    return float(match.group(1))


def _tokens(urls: list[str]) -> tuple[float, float]:
    """Cached and prompt tokens so far, over every instance."""
    return (
        sum(_counter(u, "sglang:cached_tokens_total") for u in urls),
        sum(_counter(u, "sglang:prompt_tokens_total") for u in urls),
    )


def hit_rate(urls: list[str]) -> float:
    cached, prompt = _tokens(urls)
    return cached / prompt


def _words(rng: random.Random, n: int) -> str:
    return " ".join(f"w{rng.randrange(10**6)}" for _ in range(n))


def write_shared_systems(path: Path, n: int, systems: int) -> list[str]:
    """Single prompts behind a few 300-word system prompts, in turn."""
    rng = random.Random(5)
    prompts = [_words(rng, 300) for _ in range(systems)]
    ids = [f"s{i:04d}" for i in range(n)]
    with path.open("w") as fh:
        for i, cid in enumerate(ids):
            turns = [
                {"role": "system", "content": prompts[i % systems]},
                {"role": "user", "content": _words(rng, 10)},
                {"role": "assistant", "content": "old"},
            ]
            fh.write(json.dumps({"id": cid, "conversations": turns}) + "\n")
    return ids


# Each stand-in's cache holds one system prompt and a few answers, not two system prompts: where a
# request lands decides whether its system prompt is a hit.
SMALL_CACHE = {"standin_prefix_cache_tokens": 400, "standin_ttft": 0.01, "max_running_requests": 2}


def test_requests_go_where_their_system_prompt_is_cached(tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    ids = write_shared_systems(inp, 120, systems=3)
    rates = {}
    with fleet(SMALL_CACHE, SMALL_CACHE, SMALL_CACHE) as servers:
        urls = [s.base_url for s in servers]
        for dispatch in ("least-loaded", "prefix"):  # side by side, on emptied caches
            for url in urls:
                urllib.request.urlopen(urllib.request.Request(f"{url}/flush_cache", method="POST"), timeout=5)
            before = _tokens(urls)
            out = tmp_path / f"{dispatch}.jsonl"
            outcome = _run(inp, out, urls, concurrency=2, dispatch=dispatch, params=GenParams(max_tokens=8))
            assert outcome.exit_code == ExitCode.OK, outcome.message
            assert_exactly_once(out, ids)
            after = _tokens(urls)
            rates[dispatch] = (after[0] - before[0]) / (after[1] - before[1])
    # least-loaded: each instance serves every system prompt in turn and its cache keeps one
    assert rates["prefix"] >= 1.5 * rates["least-loaded"], rates


def test_a_shared_prefix_does_not_pile_every_request_on_one_instance(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_shared_systems(inp, 150, systems=1)  # every request prefers the same instance
    flags = {"standin_ttft": 0.02, "max_running_requests": 4}
    with fleet(flags, flags, flags) as servers:
        urls = [s.base_url for s in servers]
        outcome = _run(inp, out, urls, concurrency=4, params=GenParams(max_tokens=8))
        assert outcome.exit_code == ExitCode.OK, outcome.message
        served = [requests_served(u) for u in urls]
    assert min(served) >= 0.2 * sum(served), served  # the load bound spreads them
    assert_exactly_once(out, ids)


def test_every_turn_of_a_conversation_finds_its_history_cached(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rng = random.Random(9)
    ids = []
    with inp.open("w") as fh:
        for i in range(24):
            turns = []
            for _ in range(4):
                turns += [{"role": "user", "content": _words(rng, 60)}, {"role": "assistant", "content": "x"}]
            ids.append(f"c{i:03d}")
            fh.write(json.dumps({"id": ids[-1], "conversations": turns}) + "\n")
    flags = {"standin_ttft": 0.01, "standin_decode_tps": 2000, "max_running_requests": 4}
    with fleet(flags, flags, flags, flags) as servers:
        urls = [s.base_url for s in servers]
        outcome = _run(inp, out, urls, concurrency=4, params=GenParams(max_tokens=64, turns="all"))
        assert outcome.exit_code == ExitCode.OK, outcome.message
        rate = hit_rate(urls)
    # turns 2-4 hold turn 1..k-1 and their answers: well over half of all prompt tokens
    assert rate >= 0.5, rate
    records = assert_exactly_once(out, ids)
    assert all(len(r["conversations"]) == 8 for r in records)


def test_an_instance_killed_mid_run_the_prefix_job_completes_exactly_once(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_shared_systems(inp, 300, systems=3)
    with fleet({"standin_crash_after": 30}, {}, {}) as servers:
        outcome = _run(inp, out, [s.base_url for s in servers], concurrency=4, params=GenParams(max_tokens=8))
    assert outcome.exit_code == ExitCode.OK, outcome.message
    assert_exactly_once(out, ids)


def test_dispatch_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_shared_systems(inp, 10, systems=2)
    with pytest.raises(SystemExit) as exc:
        cli_main(["generate", "-i", str(inp), "-o", str(out), "-e", "http://127.0.0.1:9", "--dispatch", "rr"])
    assert exc.value.code == 2
    assert "--dispatch" in capsys.readouterr().err
    with fleet({}) as (server,):
        code = cli_main(
            ["generate", "-i", str(inp), "-o", str(out), "-e", server.base_url, "--dispatch", "least-loaded"]
        )
    assert code == ExitCode.OK
    assert_exactly_once(out, ids)


class TestAffinityKeys:
    def test_message_prefixes_count_once_long_enough(self) -> None:
        aff = PrefixAffinity(min_chars=10)
        short = [{"role": "system", "content": "hi"}]
        long = [{"role": "system", "content": "a" * 20}, {"role": "user", "content": "b"}]
        assert aff.keys(orjson.dumps({"messages": short})) == []
        keys = aff.keys(orjson.dumps({"messages": long}))
        assert len(keys) == 2
        # the next turn starts with the same messages: same keys, then its own
        longer = [*long, {"role": "assistant", "content": "c"}, {"role": "user", "content": "d"}]
        assert aff.keys(orjson.dumps({"messages": longer}))[:2] == keys

    def test_text_prompts_in_blocks(self) -> None:
        aff = PrefixAffinity(min_chars=1)
        assert len(aff.keys(orjson.dumps({"prompt": "x" * 3000}))) == 2  # two whole 1024-char blocks
        assert len(aff.keys(orjson.dumps({"text": "x" * 100}))) == 0
        assert aff.keys(b"not json") == []

    def test_longest_known_prefix_wins_and_forget_drops_an_endpoint(self) -> None:
        aff = PrefixAffinity(min_chars=1)
        keys = aff.keys(orjson.dumps({"messages": [{"role": "user", "content": str(i)} for i in range(3)]}))
        aff.record(keys[:1], 0)
        aff.record(keys, 1)
        assert aff.preferred(keys) == 1
        aff.record(keys[:1], 2)
        assert aff.preferred(keys[:2]) == 1 and aff.preferred(keys[:1]) == 2
        aff.forget(1)
        assert aff.preferred(keys) == 2

    def test_the_table_is_bounded(self) -> None:
        aff = PrefixAffinity(min_chars=1, max_entries=10)
        for i in range(50):
            aff.record([i], 0)
        assert len(aff) == 10
        assert aff.preferred([0]) is None and aff.preferred([49]) == 0


class TestPoolWaitsForThePrefix:
    """EndpointPool's policy on its own: a full preferred endpoint is waited for within the slack,
    a slot it frees goes to the request waiting for it, an avoided endpoint is never waited for."""

    BODY = orjson.dumps({"messages": [{"role": "system", "content": "s" * 300}]})

    @staticmethod
    async def _up(_ep: object) -> bool:
        return True

    def _pool(self, slack: int) -> EndpointPool:
        return EndpointPool(["http://a", "http://b"], 1, self._up, affinity=PrefixAffinity(slack=slack))

    def test_a_full_preferred_endpoint_is_waited_for_and_its_freed_slot_kept(self) -> None:
        async def scenario() -> None:
            pool = self._pool(slack=4)
            a, b = pool.endpoints
            assert await pool.acquire(body=self.BODY) is a  # no preference yet: the prefix is recorded on a
            waiter = asyncio.ensure_future(pool.acquire(body=self.BODY))
            await asyncio.sleep(0)
            assert not waiter.done()  # b is free, but a holds the prefix
            pool.release(a, Release.OK)
            other = await pool.acquire()  # arrives before the waiter runs: the freed slot is kept
            assert other is b
            assert await asyncio.wait_for(waiter, 5) is a
            assert pool.affinity is not None and pool.affinity.hits == 1 and pool.affinity.misses == 0

        asyncio.run(scenario())

    def test_beyond_the_slack_or_avoided_it_goes_elsewhere(self) -> None:
        async def scenario() -> None:
            pool = self._pool(slack=1)
            a, b = pool.endpoints
            assert await pool.acquire(body=self.BODY) is a
            # a: 1 in flight, b: 0; one more for a would put it 2 above b
            assert await asyncio.wait_for(pool.acquire(body=self.BODY), 5) is b
            pool.release(b, Release.OK)
            assert pool.affinity is not None and pool.affinity.preferred(pool.affinity.keys(self.BODY)) == 1
            # a retry avoiding b, b full, a free: it goes to a at once, not in line for b
            assert await pool.acquire(body=self.BODY) is b
            pool.release(a, Release.OK)
            assert await asyncio.wait_for(pool.acquire(avoid=b, body=self.BODY), 5) is a

        asyncio.run(scenario())
