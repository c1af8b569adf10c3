"""Stand-in details a real client of SGLang 0.5.12 sees (each cited in the stand-in's code): the
cache-hit gauge reset at each decode log, /v1/loads' num_total_tokens and total_* aggregates, /get_load
(sglang-router's power_of_two reads it), the moe_ep_rank label, the Bearer scheme in any case, and the
immediate exit on SIGTERM once a health check has failed. Real server processes."""

from __future__ import annotations

import signal

import httpx
import pytest
from sglfleet_testing.standin.process import running_standin, start_standin
from support.polling import wait_until
from test_standin_stop_start import SLOW, _post_in_thread, _running

pytestmark = pytest.mark.timeout(60)


def _gauge(base_url: str, name: str) -> str:
    text = httpx.get(f"{base_url}/metrics").text
    return next(line for line in text.splitlines() if line.startswith(name + "{"))


def _complete(base_url: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_cache_hit_gauge_is_reset_by_the_next_decode_log() -> None:
    prompt = "one two three four five six seven eight nine ten"
    with running_standin(model_path="m", enable_metrics=True, decode_log_interval=4) as url:
        _complete(url, prompt, 1)
        _complete(url, prompt, 1)  # a prefix hit, and no decode batch: the gauge shows the hit
        hit = float(_gauge(url, "sglang:cache_hit_rate").rsplit(" ", 1)[1])
        assert hit > 0
        assert httpx.get(f"{url}/v1/loads").json()["loads"][0]["cache_hit_rate"] == round(hit, 4)
        _complete(url, prompt, 6)  # the same hit, then 5 decode batches: a decode log (every 4th) comes
        assert float(_gauge(url, "sglang:cache_hit_rate").rsplit(" ", 1)[1]) == 0.0
        assert httpx.get(f"{url}/v1/loads").json()["loads"][0]["cache_hit_rate"] == 0.0
        # The run's rate stays in the counters (cached_tokens_total / prompt_tokens_total).
        assert float(_gauge(url, "sglang:cached_tokens_total").rsplit(" ", 1)[1]) > 0


def test_metrics_carry_the_moe_ep_rank_label() -> None:
    with running_standin(model_path="m", enable_metrics=True) as url:
        line = _gauge(url, "sglang:num_running_reqs")
        assert 'moe_ep_rank="0"' in line and 'tp_rank="0"' in line and 'pp_rank="0"' in line


def test_loads_count_waiting_prompts_in_num_total_tokens_and_get_load_shows_them() -> None:
    server = start_standin(model_path="m", max_running_requests=1, standin_ttft=2.0)
    try:
        url = server.base_url
        idle = httpx.get(f"{url}/v1/loads").json()
        assert idle["loads"][0]["num_total_tokens"] == idle["loads"][0]["num_used_tokens"] == 0
        assert {"total_used_tokens", "total_tokens"} <= set(idle["aggregate"])
        answers: list[httpx.Response] = []
        threads = [_post_in_thread(f"{url}/v1/completions", SLOW, answers) for _ in range(2)]
        wait_until(
            lambda: httpx.get(f"{url}/v1/loads").json()["loads"][0]["num_waiting_reqs"] == 1,
            timeout=10,
            what="one request running, one waiting",
        )
        body = httpx.get(f"{url}/v1/loads").json()
        (load,) = body["loads"]
        assert load["num_total_tokens"] > load["num_used_tokens"] > 0  # the waiting prompt counts too
        assert body["aggregate"]["total_tokens"] == load["num_total_tokens"]
        assert body["aggregate"]["total_used_tokens"] == load["num_used_tokens"]
        (old,) = httpx.get(f"{url}/get_load").json()
        assert set(old) == {
            "dp_rank",
            "num_reqs",
            "num_waiting_reqs",
            "num_tokens",
            "num_pending_tokens",
            "ts_tic",
        }
        assert (old["dp_rank"], old["num_reqs"], old["num_waiting_reqs"]) == (0, 2, 1)
        assert old["num_tokens"] == load["num_total_tokens"]
        assert old["num_pending_tokens"] == load["num_total_tokens"] - load["num_used_tokens"]
        for thread in threads:
            thread.join(20)
        assert [a.status_code for a in answers] == [200, 200]
        assert "Endpoint '/get_load' is deprecated" in server.output()
    finally:
        server.close()


def test_the_bearer_scheme_is_taken_in_any_case() -> None:
    with running_standin(model_path="m", api_key="sk-test") as url:
        for header, status in (
            ("Bearer sk-test", 200),
            ("bearer sk-test", 200),
            ("BEARER sk-test", 200),
            ("Bearer  sk-test", 401),  # split at the first space: the key is " sk-test"
            ("Token sk-test", 401),
            ("sk-test", 401),
        ):
            assert httpx.get(f"{url}/v1/models", headers={"Authorization": header}).status_code == status, (
                header
            )


def test_sigterm_after_a_failed_health_check_exits_at_once_with_requests_in_flight(monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "0.2")
    server = start_standin(model_path="m", standin_hang_after=1, standin_drain_poll_seconds=0.2)
    try:
        answers: list[httpx.Response] = []
        _post_in_thread(f"{server.base_url}/v1/completions", SLOW, answers)  # its forward never returns
        wait_until(lambda: _running(server.base_url) == 1, timeout=10, what="one request stuck")
        assert httpx.get(f"{server.base_url}/health_generate", timeout=10).status_code == 503
        server.process.send_signal(signal.SIGTERM)
        # A healthy server would drain (wait for the stuck request forever); this one exits.
        assert server.process.wait(10) == -signal.SIGKILL
        output = server.output()
        assert "Signal SIGTERM received while health check failed. Force exiting." in output
        assert "Gracefully exiting..." not in output
    finally:
        server.close()
