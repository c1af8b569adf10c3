"""Stalls, overdue requests, their re-sends and the auth halt, under a fake clock (issue #29 point 1,
#32 point 5): the pool's time is injected, so no test here waits for a limit to pass."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from support.generate import write_batch

from sglfleet.gen import GenerateConfig, OutputStore
from sglfleet.gen import _client as client
from sglfleet.gen._dispatch import EndpointPool, NoEndpoint, Release
from sglfleet.gen._formats import Request
from sglfleet.gen._progress import Stats
from sglfleet.gen._requests import RequestPolicy, RequestRunner, max_tokens_of


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def _up(_ep: object) -> bool:
    return True


def _pool(clock: FakeClock, urls: tuple[str, ...] = ("http://router",), **kw: float) -> EndpointPool:
    return EndpointPool(list(urls), 4, _up, clock=clock, stall_factor=8.0, stall_min=2.0, **kw)  # type: ignore[arg-type]


async def _answer(
    pool: EndpointPool, clock: FakeClock, at: float, latency: float, max_tokens: int | None
) -> None:
    """One request answered at ``at`` after ``latency`` seconds."""
    clock.t = at
    ep = await pool.acquire()
    pool.release(ep, Release.OK, latency, max_tokens)


def test_max_tokens_is_read_from_the_body_without_parsing_it() -> None:
    assert max_tokens_of(b'{"model":"m","max_tokens":64,"messages":[]}') == 64
    assert max_tokens_of(b'{"max_tokens": 512}') == 512
    assert max_tokens_of(b'{"messages":[]}') is None
    assert max_tokens_of(b'{"max_tokens":null}') is None


def test_a_request_is_overdue_past_the_jobs_latency_for_its_max_tokens_while_answers_come() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        pool = _pool(clock)
        assert pool.overdue_limit(64) is None  # nothing answered yet: nothing is judged
        await _answer(pool, clock, at=1.0, latency=1.0, max_tokens=64)  # 1/64 s per token
        assert pool.overdue_limit(64) == pytest.approx(8.0)  # stall_factor x 1 s
        assert pool.overdue_limit(640) == pytest.approx(80.0)  # ten times the tokens, ten times the time
        assert pool.overdue_limit(8) == pytest.approx(2.0)  # never below stall_min
        await _answer(pool, clock, at=8.5, latency=1.0, max_tokens=64)
        assert not pool.overdue(0.0, 64, now=7.9)  # within its limit
        assert pool.overdue(0.0, 64, now=9.0)  # past it, and the job answered 0.5 s ago
        assert not pool.overdue(0.0, 640, now=9.0)  # a longer request has a longer limit
        assert not pool.overdue(0.0, 64, now=30.0)  # all quiet for 21.5 s: slow work, not a stall...
        assert pool.overdue(0.0, 64, now=33.0)  # ...until 4 times its limit (one frozen worker had all)

    asyncio.run(scenario())


def test_a_busy_endpoint_quiet_while_another_answers_is_stalled() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        pool = _pool(clock, ("http://a", "http://b"))
        a, b = pool.endpoints
        clock.t = 0.0
        assert await pool.acquire() is a
        assert await pool.acquire() is b  # b busy since 0, never answers
        pool.release(a, Release.OK, 0.5)
        clock.t = 3.0
        assert pool.find_stalled(clock.t) == []  # its limit: max(2, 8 x 0.5 s) = 4 s
        await _answer(pool, clock, at=9.5, latency=0.5, max_tokens=None)
        assert pool.find_stalled(10.0) == [b]
        pool.mark_stalled(b)
        assert not b.up and b.stalls == 1 and b.stalled.is_set()
        await pool.aclose()

    asyncio.run(scenario())


def test_when_every_endpoint_refuses_the_key_acquire_stops_at_once_not_after_the_down_timeout() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        pool = _pool(clock, ("http://a", "http://b"), down_timeout=600.0)
        a, b = pool.endpoints
        for ep in (a, b):
            assert await pool.acquire() is ep
        pool.release(a, Release.AUTH)
        pool.release(b, Release.AUTH)
        with pytest.raises(NoEndpoint, match="refused the API key"):
            await asyncio.wait_for(pool.acquire(), 5)
        await pool.aclose()

    asyncio.run(scenario())


OK_BODY = {"id": "x", "choices": [{"message": {"role": "assistant", "content": "hi"}}], "usage": {}}


def test_an_overdue_request_on_the_only_endpoint_is_resent_and_written_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind a router (one endpoint) a frozen worker holds one request: past its limit, while other
    answers come, it is re-sent to the same endpoint (the router picks a worker); the re-send's
    answer is written, once, and the frozen attempt is given up."""
    out = tmp_path / "out.jsonl"
    write_batch(tmp_path / "in.jsonl", 1)
    calls: list[str] = []
    frozen = asyncio.Event()  # never set: the first attempt never answers

    async def fake_post(_session: object, url: str, body: bytes, _limit: object) -> client.Attempt:
        calls.append(url)
        if len(calls) == 1:
            await frozen.wait()
        return client.Attempt(client.Kind.OK, 200, OK_BODY, orjson.dumps(OK_BODY), "rid")

    monkeypatch.setattr(client, "post", fake_post)

    async def scenario() -> RequestRunner:
        clock = FakeClock()
        pool = _pool(clock)
        await _answer(pool, clock, at=1.0, latency=1.0, max_tokens=64)
        store = OutputStore(out)
        store.open()
        config = GenerateConfig(input=tmp_path / "in.jsonl", output=out, endpoints=["http://router"])
        runner = RequestRunner(
            RequestPolicy.of(config),
            store=store,
            stats=Stats(total=1, done=0),
            pool=pool,
            session=None,
            stop=asyncio.Event(),  # type: ignore[arg-type]
        )
        body = orjson.dumps({"max_tokens": 64, "messages": [{"role": "user", "content": "q"}]})
        clock.t = 2.0
        task = asyncio.create_task(runner.see_through(Request("r1", "/v1/chat/completions", body)))
        for _ in range(5):
            await asyncio.sleep(0)
        assert calls == ["http://router/v1/chat/completions"]
        runner.resend_tick(5.0)  # 3 s in, limit 8 s: not overdue
        await _answer(pool, clock, at=10.5, latency=1.0, max_tokens=64)  # the rest of the fleet answers
        runner.resend_tick(11.0)  # 9 s in: overdue
        await asyncio.wait_for(task, 5)
        store.close()
        await pool.aclose()
        return runner

    runner = asyncio.run(scenario())
    assert len(calls) == 2, calls
    assert runner.stats.overdue == 1 and runner.stats.resent == 1 and runner.stats.done == 1
    lines = out.read_bytes().splitlines()
    assert len(lines) == 1 and orjson.loads(lines[0])["custom_id"] == "r1"
