"""What a slot's release says about its endpoint (EndpointPool.release with a Release), and the two
ways the pool runs out of endpoints told apart by type: a refused key (exit 4) or none answering (5)."""

from __future__ import annotations

import asyncio

import pytest

from sglfleet.gen._dispatch import EndpointPool, KeyRefused, NoEndpoint, Release


async def _never_up(_ep: object) -> bool:
    return False


def _pool(**kw: object) -> EndpointPool:
    return EndpointPool(["http://a:1", "http://b:1"], 1, _never_up, probe_interval=3600, **kw)  # type: ignore[arg-type]


def test_a_refused_key_everywhere_is_key_refused_without_waiting_for_the_down_timeout() -> None:
    async def scenario() -> None:
        pool = _pool(down_timeout=3600)
        try:
            for ep in [await pool.acquire(), await pool.acquire()]:
                pool.release(ep, Release.AUTH)
            assert not any(ep.up for ep in pool.endpoints)
            with pytest.raises(KeyRefused, match="refused the API key"):
                await pool.acquire()
        finally:
            await pool.aclose()

    asyncio.run(scenario())


def test_endpoints_down_after_three_failures_in_a_row_are_no_endpoint_not_a_key_problem() -> None:
    async def scenario() -> None:
        pool = _pool(down_after=3, down_timeout=0.01)
        try:
            a = pool.endpoints[0]
            for outcome in (Release.DOWN, Release.DOWN, Release.CANCELLED, Release.DOWN):
                assert a.up
                a.in_flight += 1
                pool.release(a, outcome)
            assert not a.up and a.errors == 3  # a cancelled attempt says nothing about the endpoint
            b = pool.endpoints[1]
            b.in_flight += 1
            pool.release(b, Release.ERROR)
            assert b.up and b.failures_in_row == 0 and b.errors == 1
            for _ in range(3):
                b.in_flight += 1
                pool.release(b, Release.DOWN)
            with pytest.raises(NoEndpoint) as caught:
                await pool.acquire()
            assert not isinstance(caught.value, KeyRefused)
        finally:
            await pool.aclose()

    asyncio.run(scenario())
