"""Queueing at --max-running-requests, the latency model, and the zero-latency fast path."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import aiohttp
import httpx
import pytest
from sglfleet_testing.standin.process import free_port, running_standin

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
            load = await _load(http)
            while load["num_running_reqs"] + load["num_waiting_reqs"] < 5:  # all five arrived
                assert time.monotonic() - start < 0.8, load
                await asyncio.sleep(0.02)
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
            # Three waves (2 + 2 + 1) of 1 s each; unlimited, all would be done in 1 s.
            assert 2.9 <= elapsed < 7, elapsed
            load = await _load(http)
            assert (load["num_running_reqs"], load["num_waiting_reqs"], load["num_used_tokens"]) == (0, 0, 0)
            assert (await http.post("/flush_cache")).status_code == 200

    with running_standin(max_running_requests=2, standin_ttft=1.0, enable_metrics=True) as url:
        asyncio.run(scenario(url))


def test_a_client_that_hangs_up_frees_its_slot():
    async def scenario(url: str) -> None:
        async with httpx.AsyncClient(base_url=url) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.post("/v1/completions", json=_body(), timeout=0.3)
            deadline = time.monotonic() + 2  # well before the abandoned request's 5 s are up
            while (load := await _load(http))["num_running_reqs"]:
                assert time.monotonic() < deadline, load
                await asyncio.sleep(0.02)
            assert load["num_waiting_reqs"] == 0

    with running_standin(max_running_requests=1, standin_ttft=5.0) as url:
        asyncio.run(scenario(url))


def test_latency_is_ttft_plus_tokens_over_decode_rate():
    with running_standin(standin_ttft=0.2, standin_decode_tps=50) as url:
        start = time.monotonic()
        out = httpx.post(f"{url}/v1/completions", json=_body(10), timeout=10).json()
        elapsed = time.monotonic() - start
        assert out["usage"]["completion_tokens"] == 10
        assert 0.4 <= elapsed < 1.5, elapsed  # 0.2 + 10 / 50


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
        assert 0.2 <= arrivals[5] - arrivals[0] < 1.0  # 5 gaps of 1/20 s


def test_gen_throughput_reflects_recent_tokens():
    with running_standin() as url:
        for _ in range(5):
            httpx.post(f"{url}/v1/completions", json=_body(100))
        load = httpx.get(f"{url}/v1/loads").json()["loads"][0]
        assert load["gen_throughput"] > 0


BARE_SERVER = """
import sys
from aiohttp import web

async def handle(request):
    await request.read()
    return web.json_response({"text": "bare", "output_ids": [1], "meta_info": {}})

app = web.Application()
app.add_routes([web.post("/generate", handle)])
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


async def _rate(url: str, requests: int = 600, concurrency: int = 16) -> float:
    body = {"text": "bench", "sampling_params": {"max_new_tokens": 16}}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, connector=connector) as session:

        async def one() -> None:
            async with session.post("/generate", json=body) as response:
                await response.read()
                assert response.status == 200

        await asyncio.gather(*(one() for _ in range(concurrency)))
        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(requests)))
        return requests / (time.perf_counter() - start)


def test_zero_latency_is_nearly_as_fast_as_a_bare_aiohttp_handler():
    """The stand-in serves as a zero-latency target for benchmarking clients: keep it lean.

    Measured side by side with a bare aiohttp handler (best of 3 each, interleaved), so the
    ratio holds however busy the machine is.
    """
    port = free_port()
    bare = subprocess.Popen([sys.executable, "-c", BARE_SERVER, str(port)])
    try:
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert bare.poll() is None
            time.sleep(0.02)
        with running_standin() as url:
            standin, baseline = [], []
            for _ in range(3):
                standin.append(asyncio.run(_rate(url)))
                baseline.append(asyncio.run(_rate(f"http://127.0.0.1:{port}")))
    finally:
        bare.terminate()
        bare.wait(5)
    ratio = max(standin) / max(baseline)
    print(f"stand-in {max(standin):.0f} req/s, bare aiohttp {max(baseline):.0f} req/s, ratio {ratio:.2f}")
    assert ratio > 0.3, (standin, baseline)
