"""sglfleet.fleet._health against real HTTP servers on 127.0.0.1, and the sglang_health module."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sglfleet_testing.standin.process import running_standin, standin_process
from support.generate import LATENCY_SERVER
from support.module_runner import assert_examples_use_documented_options, module_doc, run_module
from support.polling import wait_until

from sglfleet.fleet import Endpoint, check_fleet, endpoints_from_range, endpoints_from_urls, parse_loads

pytestmark = pytest.mark.timeout(60)

LATENCY_S = 0.4


@pytest.fixture(scope="module")
def latency_ports() -> Iterator[list[int]]:
    """Eight instances answering every request after LATENCY_S seconds."""
    proc = subprocess.Popen(
        [sys.executable, str(LATENCY_SERVER), "8", str(LATENCY_S)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line, "latency server did not start"
        yield json.loads(line)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def urls(ports: list[int]) -> list[Endpoint]:
    return endpoints_from_urls([f"http://127.0.0.1:{p}" for p in ports])


def _in_flight(port: int, action: str = "") -> dict:
    method = "POST" if action else "GET"
    request = urllib.request.Request(f"http://127.0.0.1:{port}/in_flight{action}", method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_eight_probes_are_in_flight_at_once(latency_ports: list[int]) -> None:
    """Probing eight instances costs about one round trip because the probes are sent together: the
    servers see all eight in flight at once (counted, not timed: a loaded machine stretches any time)."""
    _in_flight(latency_ports[0], "/reset")
    eight = check_fleet(urls(latency_ports))
    assert eight.all_healthy and eight.healthy_count == 8
    assert _in_flight(latency_ports[0])["peak"] >= 8


def test_rows_carry_model_and_load(latency_ports: list[int]) -> None:
    fleet = check_fleet(urls(latency_ports[:3]))
    assert [r.port for r in fleet.instances] == latency_ports[:3]
    row = fleet.instances[2]
    assert (row.healthy, row.status_code, row.reason) == (True, 200, None)
    assert (row.model, row.model_path) == ("latency-model", "/models/latency")
    assert (row.running_requests, row.waiting_requests, row.token_usage, row.gen_throughput) == (
        2,
        0,
        0.5,
        100.0,
    )
    assert row.gpu is None


def test_refused_and_timeout(latency_ports: list[int]) -> None:
    dead = free_port()
    fleet = check_fleet(urls([dead, latency_ports[0]]), timeout=LATENCY_S / 4)
    assert [(r.healthy, r.reason, r.status_code) for r in fleet.instances] == [
        (False, "refused", None),
        (False, "timeout", None),
    ]
    assert not fleet.all_healthy and fleet.healthy_count == 0
    assert fleet.summary().startswith("0/2 instances healthy; unhealthy: http://127.0.0.1:")


def test_expected_model(latency_ports: list[int]) -> None:
    ok = check_fleet(urls(latency_ports[:1]), expected_model="latency-model")
    by_path = check_fleet(urls(latency_ports[:1]), expected_model="/models/latency")
    wrong = check_fleet(urls(latency_ports[:1]), expected_model="Qwen/Qwen3-32B")
    assert ok.all_healthy and by_path.all_healthy
    row = wrong.instances[0]
    assert (row.healthy, row.status_code, row.reason) == (False, 200, "unexpected model")
    assert "expected Qwen/Qwen3-32B" in row.detail


class FakeClock:
    """A clock that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_wait_gives_up_after_the_wait() -> None:
    """wait=1.0, interval=0.25: probes at 0, 0.25, 0.5, 0.75 and 1.0 s of the wait, then it gives up
    (another interval would end past the wait), on a clock that moves only by the waits."""
    clock = FakeClock()
    fleet = check_fleet(urls([free_port()]), wait=1.0, interval=0.25, clock=clock, sleep=clock.sleep)
    assert not fleet.all_healthy and fleet.healthy_count == 0
    assert fleet.attempts == 5 and clock.slept == [0.25] * 4 and fleet.waited_s == 1.0


def test_wait_returns_as_soon_as_healthy() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", LATE_SERVER, str(port)])
    try:
        fleet = check_fleet(urls([port]), wait=20, interval=0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert fleet.all_healthy and fleet.attempts > 1 and fleet.waited_s < 10


# An instance that starts listening only after a second (as SGLang does while loading).
LATE_SERVER = """
import sys, time
from aiohttp import web
time.sleep(1.0)
app = web.Application()
app.router.add_get("/health_generate", lambda _r: web.Response(status=200))
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def test_endpoints_from_range() -> None:
    eps = endpoints_from_range("127.0.0.1", 30000, 8)
    assert [(e.url, e.port, e.gpu) for e in eps[:2]] == [
        ("http://127.0.0.1:30000", 30000, 0),
        ("http://127.0.0.1:30001", 30001, 1),
    ]
    assert eps[-1].port == 30007 and eps[-1].gpu == 7
    mapped = endpoints_from_range("127.0.0.1", 30000, 2, gpu_ids=[6, 7])
    assert [(e.port, e.gpu) for e in mapped] == [(30000, 6), (30001, 7)]
    with pytest.raises(ValueError, match="gpu_ids has 1 entries for 2 instances"):
        endpoints_from_range("127.0.0.1", 30000, 2, gpu_ids=[6])
    with pytest.raises(ValueError, match="count must be at least 1"):
        endpoints_from_range("127.0.0.1", 30000, 0)
    with pytest.raises(ValueError, match=r"ports 65530..65537 are not all within"):
        endpoints_from_range("127.0.0.1", 65530, 8)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["127.0.0.1:30000"], r"urls\[0\]: '127.0.0.1:30000' is not an http\(s\)://HOST:PORT URL"),
        (["http://a:1", "http://a:1/health"], r"urls\[1\]: .* must be a base URL without path"),
        (["http://a:1", "http://a:1/"], r"urls\[1\]: http://a:1 is listed twice \(also urls\[0\]\)"),
        (["http://a:99999"], r"urls\[0\]: .* has an invalid port"),
    ],
)
def test_bad_urls_are_named(given: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        endpoints_from_urls(given)


def test_parse_loads_sums_ranks() -> None:
    data = {
        "loads": [
            {"num_running_reqs": 3, "num_waiting_reqs": 1, "token_usage": 0.2, "gen_throughput": 100.0},
            {"num_running_reqs": 5, "num_waiting_reqs": 0, "token_usage": 0.4, "gen_throughput": 50.5},
        ]
    }
    assert parse_loads(data) == {
        "running_requests": 8, "waiting_requests": 1, "token_usage": 0.3, "gen_throughput": 150.5,
    }  # fmt: skip
    assert parse_loads({"unexpected": True})["running_requests"] is None


# --- the module, run as Ansible runs it ---------------------------------------------------------


def test_module_probes_and_gates(tmp_path: Path, latency_ports: list[int]) -> None:
    args = {"urls": [f"http://127.0.0.1:{p}" for p in latency_ports]}
    for check in (False, True):
        ok = run_module("sglang_health", {**args, "require_healthy": True}, tmp_path, check=check)
        assert ok["changed"] is False and ok["all_healthy"] is True and ok["healthy_count"] == 8
        assert ok["summary"] == "all 8 instances healthy"
        assert [r["port"] for r in ok["instances"]] == latency_ports
    dead = free_port()
    gate = {
        "urls": [*args["urls"][:2], f"http://127.0.0.1:{dead}"],
        "require_healthy": True,
        "wait": 0.5,
        "interval": 0.2,
    }
    failed = run_module("sglang_health", gate, tmp_path)
    assert failed["failed"] and failed["healthy_count"] == 2
    assert f"http://127.0.0.1:{dead} (refused)" in failed["msg"] and "after" in failed["msg"]
    report = run_module("sglang_health", {**gate, "require_healthy": False, "wait": 0}, tmp_path)
    assert not report.get("failed") and report["all_healthy"] is False


def test_module_count_form_and_bad_input(tmp_path: Path) -> None:
    port = free_port()
    row = run_module("sglang_health", {"count": 2, "port_base": port}, tmp_path)["instances"][0]
    assert (row["port"], row["gpu"], row["reason"]) == (port, 0, "refused")
    mapped = run_module("sglang_health", {"count": 2, "port_base": port, "gpu_ids": [4, 5]}, tmp_path)
    assert [r["gpu"] for r in mapped["instances"]] == [4, 5]
    both = run_module("sglang_health", {"count": 2, "urls": ["http://127.0.0.1:1"]}, tmp_path)
    assert both["failed"] and "mutually exclusive" in both["msg"]
    bad = run_module("sglang_health", {"urls": ["localhost:30000"]}, tmp_path)
    assert bad["failed"] and bad["msg"].startswith("urls[0]: 'localhost:30000'")


def test_module_hides_the_api_key(tmp_path: Path) -> None:
    result = run_module(
        "sglang_health", {"count": 1, "port_base": free_port(), "api_key": "s3cret-key"}, tmp_path
    )
    assert "s3cret-key" not in json.dumps(result)


def test_module_documentation_renders() -> None:
    doc = module_doc("sglang_health")
    assert doc["doc"]["short_description"].startswith("Probe SGLang instances concurrently")
    assert {"urls", "host", "port_base", "count", "api_key", "wait", "require_healthy"} <= set(
        doc["doc"]["options"]
    )
    assert {"instances", "all_healthy", "summary"} <= set(doc["return"])
    assert_examples_use_documented_options("sglang_health", doc)


# --- against the SGLang stand-in ----------------------------------------------------------------


def test_standin_starting_then_healthy_with_wait() -> None:
    with standin_process(wait_healthy=False, standin_warmup_seconds=1.5) as server:
        eps = endpoints_from_urls([server.base_url])
        starting = check_fleet(eps).instances[0]
        assert (starting.healthy, starting.status_code, starting.reason) == (False, 503, "starting")
        fleet = check_fleet(eps, wait=30, interval=0.3)
    assert fleet.all_healthy and fleet.attempts > 1 and 0.5 < fleet.waited_s < 15


def test_standin_api_key_goes_to_model_and_load_endpoints() -> None:
    flags = {"api_key": "k-123", "model_path": "/models/Qwen3-32B", "served_model_name": "qwen3-32b"}
    with running_standin(**flags) as url:
        eps = endpoints_from_urls([url])
        without = check_fleet(eps).instances[0]
        with_key = check_fleet(eps, api_key="k-123", expected_model="qwen3-32b").instances[0]
        wrong_model = check_fleet(eps, api_key="k-123", expected_model="llama").instances[0]
    assert without.healthy and without.model is None and "401" in without.detail
    assert with_key.healthy and (with_key.model, with_key.model_path) == ("qwen3-32b", "/models/Qwen3-32B")
    assert (with_key.running_requests, with_key.waiting_requests) == (0, 0)
    assert (wrong_model.healthy, wrong_model.reason) == (False, "unexpected model")
    assert "serves /models/Qwen3-32B / qwen3-32b, expected llama" in wrong_model.detail


def test_standin_running_and_waiting_requests() -> None:
    body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 4}}).encode()
    with standin_process(max_running_requests=1, standin_ttft=3) as server:
        request = urllib.request.Request(
            f"{server.base_url}/generate", data=body, headers={"Content-Type": "application/json"}
        )
        senders = [threading.Thread(target=_post_quietly, args=(request,), daemon=True) for _ in range(3)]
        for sender in senders:
            sender.start()

        def loaded() -> object:
            row = check_fleet(endpoints_from_urls([server.base_url])).instances[0]
            return row if (row.running_requests, row.waiting_requests) == (1, 2) else None

        row = wait_until(loaded, timeout=10, what="one request running, two waiting", interval=0.1)
        server.process.kill()  # no drain of the queued requests: the test is over
    assert row.healthy


def _post_quietly(request: urllib.request.Request) -> None:
    with contextlib.suppress(OSError):
        urllib.request.urlopen(request, timeout=30).read()
