"""Taking instances out of the real SGLang router (sglang-router 0.3.2 from PyPI) and putting them back
(`sglfleet.fleet.RouterWorkers`, its `/workers` API), and why: a draining instance the router still
lists keeps receiving requests; one taken out first receives none."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sglfleet_testing.router import running_router, write_model_dir
from sglfleet_testing.standin.process import StandinProcess, free_port, standin_argv
from support.generate import fleet
from support.polling import wait_until

from sglfleet.fleet import RouterError, RouterWorkers

pytest.importorskip("sglang_router", reason="sglang-router (requirements-dev.txt) is not installed")
pytestmark = pytest.mark.timeout(120)

# The router's own health checks as slow as its defaults: only the deregistration keeps traffic away.
SLOW_CHECKS = ("--health-check-interval-secs", "60", "--health-failure-threshold", "3")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture
def routed(model_dir: Path) -> Iterator[tuple[str, list[StandinProcess]]]:
    # SGLang polls its drain every 5 s; 0.5 s here: long enough that a steady load meets the drain
    flags = {"model_path": str(model_dir), "standin_ttft": 0.02, "standin_drain_poll_seconds": 0.5}
    with fleet(flags, flags) as servers:
        urls = [s.base_url for s in servers]
        with running_router(urls, model_dir, "round_robin", *SLOW_CHECKS) as router:
            yield router, servers


def _generate(router: str, i: int) -> int:
    body = json.dumps({"text": f"prompt {i}", "sampling_params": {"max_new_tokens": 4}}).encode()
    request = urllib.request.Request(
        f"{router}/generate", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return resp.status


@contextlib.contextmanager
def _steady_load(router: str) -> Iterator[list[int]]:
    """Requests through the router, 4 at a time, from entry until exit; their statuses."""
    statuses: list[int] = []
    stop = threading.Event()

    def client() -> None:
        i = 0
        while not stop.is_set():
            statuses.append(_generate(router, i))
            i += 1

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        yield statuses
    finally:
        stop.set()
        for t in threads:
            t.join()


def _accepted_while_draining(server: StandinProcess) -> int:
    wait_until(lambda: server.process.poll() is not None, timeout=30, what="the drained stand-in to exit")
    match = re.search(r"Requests accepted while draining: (\d+)", server.output())
    assert match, server.output()[-2000:]
    return int(match.group(1))


def test_remove_then_add_round_trips_the_worker(routed: tuple[str, list[StandinProcess]]) -> None:
    router, servers = routed
    api = RouterWorkers(router)
    url = servers[0].base_url
    assert api.remove([url + "/"]) == [url]
    assert [w.url for w in api.list()] == [servers[1].base_url]
    assert api.remove([url]) == []  # not listed: nothing to do
    assert api.add([url]) == [url]
    assert sorted((w.url, w.healthy) for w in api.list()) == sorted((s.base_url, True) for s in servers)
    assert api.add([url]) == []


def test_a_worker_taken_out_before_its_drain_receives_nothing(
    routed: tuple[str, list[StandinProcess]],
) -> None:
    router, (draining, _other) = routed
    with _steady_load(router) as statuses:
        wait_until(lambda: len(statuses) > 20, timeout=30, what="the load to flow")
        RouterWorkers(router).remove([draining.base_url])
        draining.process.send_signal(15)
        accepted = _accepted_while_draining(draining)
    assert accepted == 0
    assert set(statuses) == {200}


def test_a_worker_left_in_the_router_receives_requests_while_it_drains(
    routed: tuple[str, list[StandinProcess]],
) -> None:
    """What the deregistration prevents: SGLang answers 503 on /health* only, the router checks every
    60 s, so round_robin keeps sending every other request to the draining instance."""
    router, (draining, _other) = routed
    with _steady_load(router) as statuses:
        wait_until(lambda: len(statuses) > 20, timeout=30, what="the load to flow")
        draining.process.send_signal(15)
        accepted = _accepted_while_draining(draining)
    assert accepted > 0


def test_a_worker_that_never_answers_is_an_error_naming_it(routed: tuple[str, list[StandinProcess]]) -> None:
    router, _ = routed
    with pytest.raises(RouterError, match=r"127\.0\.0\.1:1 as a healthy worker"):
        RouterWorkers(router).add(["http://127.0.0.1:1"], wait_s=1.0)


def test_a_worker_added_before_it_answers_is_registered_once_it_does(
    routed: tuple[str, list[StandinProcess]], model_dir: Path
) -> None:
    """`add` gives up after `wait_s`, the router does not: its job retries the worker's /health for up to
    --worker-startup-timeout-secs (sgl-router 0.3.2 `src/core/steps/worker/local/mod.rs:79-106`)."""
    router, _ = routed
    api = RouterWorkers(router)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(RouterError, match="as a healthy worker"):
        api.add([url], wait_s=1.0)
    late = subprocess.Popen(
        standin_argv(port, model_path=str(model_dir), log_level="warning"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: url in {w.url for w in api.list() if w.healthy}, timeout=60, what="the late one")
    finally:
        late.kill()
        late.wait()


def test_an_unreachable_router_is_an_error_naming_it() -> None:
    with pytest.raises(RouterError, match=r"http://127\.0\.0\.1:9/workers: the router did not answer"):
        RouterWorkers("http://127.0.0.1:9", timeout_s=2).list()
