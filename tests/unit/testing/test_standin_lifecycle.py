"""Flags, warm-up and the injected faults, against real server processes (stop and start:
test_standin_stop_start.py)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from sglfleet_testing.standin.app import CRASH_EXIT_CODE
from sglfleet_testing.standin.cli import parse_config
from sglfleet_testing.standin.process import running_standin, standin_process, start_standin

pytestmark = pytest.mark.timeout(60)

GEN = {"text": "fault?", "sampling_params": {"max_new_tokens": 3}}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "fault?"}], "max_tokens": 3}


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sglfleet_testing.standin", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


class TestFlags:
    def test_unknown_flag_exits_2_naming_it(self):
        result = _run("--model-path", "m", "--no-such-flag")
        assert result.returncode == 2
        assert "unrecognized arguments: --no-such-flag" in result.stderr

    def test_missing_model_path_exits_2(self):
        result = _run("--port", "1234")
        assert result.returncode == 2
        assert "--model-path" in result.stderr

    @pytest.mark.parametrize(
        ("argv", "named"),
        [
            (["--mem-fraction-static", "1.5"], "--mem-fraction-static"),
            (["--mem-fraction-static", "0"], "--mem-fraction-static"),
            (["--attention-backend", "fa9"], "--attention-backend"),
            (["--max-running-requests", "0"], "--max-running-requests"),
            (["--tp-size", "two"], "--tp-size"),
            (["--log-level", "loud"], "--log-level"),
            (["--port", "70000"], "--port"),
            (["--standin-error-rate", "1.5"], "--standin-error-rate"),
            (["--standin-error-rate", "0.6", "--standin-hang-rate", "0.6"], "--standin-hang-rate"),
            (["--standin-natural-tokens", "9:3"], "--standin-natural-tokens"),
            (["--context-len", "10"], "--context-len"),  # no abbreviations
        ],
    )
    def test_invalid_values_exit_2_naming_the_flag(self, argv, named, capsys):
        with pytest.raises(SystemExit) as exit_info:
            parse_config(["--model-path", "m", *argv])
        assert exit_info.value.code == 2
        assert named in capsys.readouterr().err

    def test_every_launch_server_flag_the_project_passes_is_accepted(self):
        config = parse_config(
            [
                "--model-path", "/models/qwen", "--host", "0.0.0.0", "--port", "30001",
                "--served-model-name", "qwen", "--api-key", "k", "--enable-metrics",
                "--attention-backend", "flashinfer", "--mem-fraction-static", "0.85",
                "--max-running-requests", "64", "--context-length", "8192", "--tp-size", "1",
                "--log-level", "warning", "--watchdog-timeout", "600",
            ]
        )  # fmt: skip
        assert (config.model_name, config.port, config.max_running_requests) == ("qwen", 30001, 64)
        assert (config.attention_backend, config.context_length, config.enable_metrics) == (
            "flashinfer",
            8192,
            True,
        )

    def test_help_exits_0(self):
        result = _run("--help")
        assert result.returncode == 0
        assert "--standin-crash-after" in result.stdout


def test_a_port_in_use_exits_1_saying_so():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = _run("--model-path", "m", "--port", str(port))
    assert result.returncode == 1
    assert f"cannot serve on 127.0.0.1:{port}" in result.stderr
    assert "address already in use" in result.stderr.lower()


def test_health_is_503_during_warmup_then_200():
    server = start_standin(wait_healthy=False, standin_warmup_seconds=2.0)
    try:
        started = time.monotonic()
        assert httpx.get(f"{server.base_url}/health").status_code == 503
        assert httpx.get(f"{server.base_url}/health_generate").status_code == 503
        assert httpx.get(f"{server.base_url}/server_info").json()["status"] == "starting"
        while httpx.get(f"{server.base_url}/health").status_code == 503:
            assert time.monotonic() - started < 10
            time.sleep(0.05)
        assert time.monotonic() - started >= 1.0
        assert httpx.get(f"{server.base_url}/server_info").json()["status"] == "ready"
    finally:
        server.close()


class TestFaults:
    def test_error_rate_1_answers_500_in_sglang_shapes(self):
        with running_standin(standin_error_rate=1.0) as url:
            native = httpx.post(f"{url}/generate", json=GEN)
            assert native.status_code == 500
            assert "injected" in native.json()["error"]["message"]
            openai = httpx.post(f"{url}/v1/chat/completions", json=CHAT)
            assert openai.status_code == 500
            body = openai.json()
            assert (body["object"], body["code"], body["type"]) == ("error", 500, "InternalServerError")
            assert httpx.get(f"{url}/health").status_code == 200  # faults hit generation only

    def test_error_pattern_is_reproducible_from_the_seed(self):
        def pattern(seed: int) -> list[int]:
            with running_standin(standin_error_rate=0.5, standin_seed=seed) as url, httpx.Client() as http:
                return [http.post(f"{url}/generate", json=GEN).status_code for _ in range(24)]

        first = pattern(3)
        assert set(first) == {200, 500}
        assert pattern(3) == first
        assert pattern(4) != first

    def test_hang_rate_1_never_answers(self):
        with standin_process(standin_hang_rate=1.0) as server:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{server.base_url}/generate", json=GEN, timeout=0.5)
            load = httpx.get(f"{server.base_url}/v1/loads").json()["loads"][0]
            assert load["num_running_reqs"] == 0  # hung before admission: the engine is free
            assert httpx.get(f"{server.base_url}/health").status_code == 200
            # A hung request does not hold up shutdown.
            started = time.monotonic()
            assert server.terminate() == -signal.SIGKILL  # SGLang's drain ends in SIGKILL of itself
            assert time.monotonic() - started < 3

    def test_crash_after_n_requests_exits_abruptly(self):
        with standin_process(standin_crash_after=3) as server:
            with httpx.Client(base_url=server.base_url) as http:
                statuses = [http.post("/generate", json=GEN).status_code for _ in range(3)]
                assert statuses == [200, 200, 200]
            assert server.process.wait(5) == CRASH_EXIT_CODE
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"{server.base_url}/health")
            assert "crashing on purpose after 3 requests" in server.output()
