"""The stand-in starts and stops as SGLang 0.5.12 does (real server processes, real signals).

Start: connections refused while the model loads, then 503 on /health* during the warm-up, then a
/health_generate that takes its time. SIGTERM: keep serving (new requests too), 503 on /health*,
drain every request, then SIGKILL of itself. SIGINT: stop listening, finish, exit 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import httpx
import pytest
from sglfleet_testing.standin.cli import parse_config
from sglfleet_testing.standin.process import free_port, standin_argv, start_standin
from support.polling import wait_until

pytestmark = pytest.mark.timeout(60)

SLOW = {"model": "m", "prompt": "drain me", "max_tokens": 5, "ignore_eos": True}


def _running(base_url: str) -> int:
    return httpx.get(f"{base_url}/v1/loads").json()["loads"][0]["num_running_reqs"]


def _post_in_thread(url: str, body: dict, into: list) -> threading.Thread:
    """POST in a thread; the response, or the transport error, lands in `into`."""

    def post() -> None:
        try:
            into.append(httpx.post(url, json=body, timeout=30))
        except httpx.TransportError as error:
            into.append(error)

    thread = threading.Thread(target=post)
    thread.start()
    return thread


def test_defaults_are_sglangs_own_durations():
    config = parse_config(["--model-path", "m"])
    assert config.health_seconds == 1.0  # http_server.py:558 `await asyncio.sleep(1)`
    assert config.drain_poll_seconds == 5.0  # tokenizer_manager.py:2377, 2400 `asyncio.sleep(5)`
    assert (config.load_seconds, config.warmup_seconds) == (0.0, 0.0)


class TestStart:
    def test_refuses_connections_while_loading_then_503_during_warmup_then_200(self):
        started = time.monotonic()
        server = start_standin(wait_healthy=False, standin_load_seconds=1.5, standin_warmup_seconds=1.0)
        try:
            # start_standin returns once the port listens: the load phase has passed by then.
            assert time.monotonic() - started >= 1.5
            assert httpx.get(f"{server.base_url}/health_generate").status_code == 503
            wait_until(
                lambda: httpx.get(f"{server.base_url}/health_generate").status_code == 200,
                timeout=10,
                what="/health_generate answers 200",
            )
            output = server.output()
            assert output.index("Load weight end.") < output.index("fired up and ready to roll")
        finally:
            server.close()

    def test_nothing_listens_during_the_load(self):
        port = free_port()
        process = subprocess.Popen(
            standin_argv(port, standin_load_seconds=30),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            assert process.stdout is not None
            while b"Load weight begin" not in process.stdout.readline():
                assert process.poll() is None
            for _ in range(5):
                with pytest.raises(httpx.ConnectError):
                    httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                time.sleep(0.1)
            assert process.poll() is None
        finally:
            process.kill()
            process.wait()

    def test_health_generate_takes_the_configured_time(self):
        server = start_standin(standin_health_seconds=0.4)
        try:
            for path in ("/health", "/health_generate"):
                began = time.monotonic()
                assert httpx.get(server.base_url + path).status_code == 200
                assert time.monotonic() - began >= 0.4
        finally:
            server.close()

    def test_logs_its_arguments_as_sglang_does_key_included(self):
        server = start_standin(api_key="sk-visible-without-the-launcher")
        try:
            lines = [line for line in server.output().splitlines() if "server_args=ServerArgs(" in line]
            assert len(lines) == 1
            # [2026-01-01 12:00:00] server_args=ServerArgs(model_path='standin/model', ...)
            assert lines[0].startswith("[20")
            assert "] server_args=ServerArgs(model_path='standin/model'" in lines[0]
            assert "api_key='sk-visible-without-the-launcher'" in lines[0]
        finally:
            server.close()


class TestSigterm:
    def test_keeps_serving_503_on_health_drains_then_kills_itself(self):
        server = start_standin(standin_ttft=1.5)
        try:
            answers: list[httpx.Response] = []
            first = _post_in_thread(f"{server.base_url}/v1/completions", SLOW, answers)
            wait_until(lambda: _running(server.base_url) == 1, timeout=10, what="one request running")
            server.process.send_signal(signal.SIGTERM)
            wait_until(
                lambda: "Draining requests and shutting down" in server.output(),
                timeout=10,
                what="the drain logged",
            )
            assert httpx.get(f"{server.base_url}/health").status_code == 503
            assert httpx.get(f"{server.base_url}/health_generate").status_code == 503
            # still listening and serving: a request sent during the drain is answered too
            second = _post_in_thread(f"{server.base_url}/v1/completions", SLOW, answers)
            wait_until(lambda: _running(server.base_url) == 2, timeout=10, what="two requests running")
            assert server.process.poll() is None
            first.join(10)
            second.join(10)
            assert [a.status_code for a in answers] == [200, 200]
            assert all(a.json()["usage"]["completion_tokens"] == 5 for a in answers)
            assert server.process.wait(10) == -signal.SIGKILL
            output = server.output()
            assert "Gracefully exiting... Remaining number of requests 2." in output
            assert "Gracefully exiting... Remaining number of requests 0." in output
            assert "Health check request received during shutdown. Returning 503." in output
        finally:
            server.close()

    def test_idle_server_exits_within_one_poll(self):
        server = start_standin(standin_drain_poll_seconds=0.5)
        try:
            began = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(5) == -signal.SIGKILL
            assert time.monotonic() - began < 1.5  # <= one poll for the flag, none for the drain
        finally:
            server.close()

    def test_force_shutdown_flag_skips_the_drain(self, monkeypatch):
        monkeypatch.setenv("SGL_FORCE_SHUTDOWN", "1")
        server = start_standin(standin_ttft=20)
        try:
            answers: list[httpx.Response] = []
            _post_in_thread(f"{server.base_url}/v1/completions", SLOW, answers)
            wait_until(lambda: _running(server.base_url) == 1, timeout=10, what="one request running")
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(5) == -signal.SIGKILL
            assert "force shutdown flag set. Force exiting." in server.output()
            wait_until(lambda: answers != [], timeout=10, what="an answer")
            assert isinstance(answers[0], httpx.RemoteProtocolError)  # the request in flight is lost
        finally:
            server.close()


def test_sigint_stops_listening_finishes_in_flight_and_exits_0():
    server = start_standin(standin_ttft=1.0)
    try:
        answers: list[httpx.Response] = []
        thread = _post_in_thread(f"{server.base_url}/v1/completions", SLOW, answers)
        wait_until(lambda: _running(server.base_url) == 1, timeout=10, what="one request running")
        server.process.send_signal(signal.SIGINT)

        def refused() -> bool:
            try:
                httpx.get(f"{server.base_url}/health", timeout=1)
            except httpx.ConnectError:
                return True
            return False

        wait_until(refused, timeout=2, what="connections refused")
        thread.join(10)
        assert answers[0].status_code == 200
        assert server.process.wait(10) == 0
        assert "stopped" in server.output()
    finally:
        server.close()
