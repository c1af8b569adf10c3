"""Queueing at --max-running-requests, the latency model, and the zero-latency fast path."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from sglfleet.testing.standin.process import running_standin

pytestmark = pytest.mark.timeout(60)


def _body(max_tokens: int = 4) -> dict:
    return {"model": "m", "prompt": "queue", "max_tokens": max_tokens, "ignore_eos": True}


async def _load(http: httpx.AsyncClient) -> dict:
    return (await http.get("/v1/loads")).json()["loads"][0]


def test_requests_beyond_the_limit_wait_and_all_complete():
    async def scenario(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            start = time.monotonic()
            tasks = [asyncio.create_task(http.post("/v1/completions", json=_body())) for _ in range(5)]
            await asyncio.sleep(0.25)
            load = await _load(http)
            assert (load["num_running_reqs"], load["num_waiting_reqs"]) == (2, 3)
            metrics = (await http.get("/metrics")).text
            assert "sglang:num_running_reqs{" in metrics
            gauges = {
                line.split("{")[0]: float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines()
                if line.startswith(("sglang:num_running_reqs{", "sglang:num_queue_reqs{"))
            }
            assert gauges == {"sglang:num_running_reqs": 2.0, "sglang:num_queue_reqs": 3.0}
            assert load["num_used_tokens"] > 0
            # Cache flushing is refused while requests run or wait, as in SGLang.
            assert (await http.post("/flush_cache")).status_code == 400
            responses = await asyncio.gather(*tasks)
            elapsed = time.monotonic() - start
            assert [r.status_code for r in responses] == [200] * 5
            # Three waves (2 + 2 + 1) of 0.6 s each.
            assert 1.7 <= elapsed < 3.5, elapsed
            load = await _load(http)
            assert (load["num_running_reqs"], load["num_waiting_reqs"], load["num_used_tokens"]) == (0, 0, 0)
            assert (await http.post("/flush_cache")).status_code == 200

    with running_standin(max_running_requests=2, standin_ttft=0.6, enable_metrics=True) as url:
        asyncio.run(scenario(url))


def test_a_client_that_hangs_up_frees_its_slot():
    async def scenario(url: str) -> None:
        async with httpx.AsyncClient(base_url=url) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.post("/v1/completions", json=_body(), timeout=0.3)
            await asyncio.sleep(0.1)
            load = await _load(http)
            assert (load["num_running_reqs"], load["num_waiting_reqs"]) == (0, 0)
            start = time.monotonic()
            response = await http.post("/v1/completions", json=_body(), timeout=10)
            assert response.status_code == 200
            assert time.monotonic() - start < 4  # got the slot at once, not after the first one's 5 s

    with running_standin(max_running_requests=1, standin_ttft=3.0) as url:
        asyncio.run(scenario(url))


def test_latency_is_ttft_plus_tokens_over_decode_rate():
    with running_standin(standin_ttft=0.2, standin_decode_tps=50) as url:
        start = time.monotonic()
        out = httpx.post(f"{url}/v1/completions", json=_body(10), timeout=10).json()
        elapsed = time.monotonic() - start
        assert out["usage"]["completion_tokens"] == 10
        assert 0.4 <= elapsed < 0.9, elapsed  # 0.2 + 10 / 50


def test_streamed_tokens_are_paced_by_the_decode_rate():
    with running_standin(standin_decode_tps=20) as url:
        arrivals = []
        with httpx.stream(
            "POST", f"{url}/v1/completions", json={**_body(6), "stream": True}, timeout=10
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    arrivals.append(time.monotonic())
        assert len(arrivals) == 7  # 6 tokens and the finish chunk
        assert 0.2 <= arrivals[5] - arrivals[0] < 0.6  # 5 gaps of 1/20 s


def test_gen_throughput_reflects_recent_tokens():
    with running_standin() as url:
        for _ in range(5):
            httpx.post(f"{url}/v1/completions", json=_body(100))
        load = httpx.get(f"{url}/v1/loads").json()["loads"][0]
        assert load["gen_throughput"] > 0


def test_zero_latency_is_fast():
    """The stand-in serves as a zero-latency target for benchmarking clients: keep it lean."""

    async def hammer(url: str) -> float:
        async with httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=16)) as http:
            await http.post("/generate", json={"text": "warm"})
            start = time.monotonic()
            body = {"text": "bench", "sampling_params": {"max_new_tokens": 16}}
            responses = await asyncio.gather(*(http.post("/generate", json=body) for _ in range(400)))
            assert all(r.status_code == 200 for r in responses)
            return 400 / (time.monotonic() - start)

    with running_standin() as url:
        rate = asyncio.run(hammer(url))
    # Loose floor (the client shares two cores with the server); a regression to per-request
    # logging or sleeping would fall far below it.
    assert rate > 150, rate
