"""The real SGLang router (sglang-router 0.3.2 from PyPI) in front of stand-ins: what it asks of the
workers, and `sglfleet generate` / the health probe taking it as one endpoint."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sglfleet_testing.router import running_router, write_model_dir
from support.generate import (
    Background,
    assert_exactly_once,
    count_lines,
    fleet,
    requests_served,
    write_batch,
    write_conversations,
)
from support.polling import wait_until

from sglfleet.fleet import endpoints_from_urls, probe_fleet_async
from sglfleet.gen import ExitCode, GenerateConfig, GenParams, LogReporter, run

pytest.importorskip("sglang_router", reason="sglang-router (requirements-dev.txt) is not installed")
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def routed(model_dir: Path) -> Iterator[tuple[str, list[str]]]:
    flags = {"model_path": str(model_dir), "standin_ttft": 0.005}
    with fleet(flags, flags) as servers:
        workers = [s.base_url for s in servers]
        with running_router(workers, model_dir, "round_robin") as router:
            yield router, workers


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_router_answers_the_old_names_only(routed: tuple[str, list[str]]) -> None:
    router, _ = routed
    assert [
        _status(f"{router}{p}") for p in ("/health", "/health_generate", "/get_model_info", "/v1/models")
    ] == [200] * 4
    assert [_status(f"{router}{p}") for p in ("/model_info", "/server_info", "/v1/loads")] == [404] * 3


def test_the_health_probe_takes_the_router_and_finds_its_model(
    routed: tuple[str, list[str]], model_dir: Path
) -> None:
    router, _ = routed
    (row,) = asyncio.run(probe_fleet_async(endpoints_from_urls([router]), expected_model=str(model_dir)))
    assert row.healthy, row
    assert row.model_path == str(model_dir)
    assert row.running_requests is None  # the router has no /v1/loads


@pytest.mark.parametrize("turns", ["last", "all"])
def test_one_job_through_the_router_exactly_once_across_both_workers(
    routed: tuple[str, list[str]], tmp_path: Path, turns: str
) -> None:
    router, workers = routed
    before = [requests_served(w) for w in workers]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_conversations(inp, 60) if turns == "all" else write_batch(inp, 200)
    config = GenerateConfig(
        input=inp, output=out, endpoints=[router], concurrency=16, params=GenParams(max_tokens=8, turns=turns)
    )
    outcome = run(config, LogReporter(io.StringIO(), interval=5), handle_signals=False)
    assert outcome.exit_code == ExitCode.OK, outcome.message
    assert_exactly_once(out, ids)
    served = [requests_served(w) - b for w, b in zip(workers, before, strict=True)]
    assert sum(served) >= len(ids) and min(served) > 0, served


def test_a_job_through_the_router_survives_a_worker_killed_mid_run(model_dir: Path, tmp_path: Path) -> None:
    flags = {"model_path": str(model_dir), "standin_ttft": 0.005}
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 300)
    with (
        fleet({**flags, "standin_crash_after": 40}, flags) as servers,
        running_router([s.base_url for s in servers], model_dir, "round_robin") as router,
    ):
        config = GenerateConfig(
            input=inp,
            output=out,
            endpoints=[router],
            concurrency=16,
            params=GenParams(max_tokens=8),
            backoff_base=0.05,
            max_retries=20,
        )
        outcome = run(config, LogReporter(io.StringIO(), interval=5), handle_signals=False)
    assert outcome.exit_code == ExitCode.OK, outcome.message
    assert_exactly_once(out, ids)


# -- readiness (issue #29 point 2) ---------------------------------------------------------------------
# sglang-router 0.3.2: /health and /liveness answer 200 "OK" with no worker at all; /readiness answers
# 503 {"status": "not ready", ...} until one registered worker is healthy (sgl-router/src/server.rs,
# async fn readiness).


def test_the_health_probe_reports_a_routers_readiness(routed: tuple[str, list[str]], model_dir: Path) -> None:
    router, _ = routed
    (row,) = asyncio.run(probe_fleet_async(endpoints_from_urls([router])))
    assert row.healthy and row.router, row
    assert row.detail == "router: 2/2 workers healthy"
    with running_router([], model_dir, "round_robin") as empty:
        assert _status(f"{empty}/health") == 200  # what a probe of /health alone would believe
        (row,) = asyncio.run(probe_fleet_async(endpoints_from_urls([empty])))
    assert not row.healthy and row.router and row.reason == "not ready", row
    assert row.detail is not None and "insufficient healthy workers" in row.detail


def _add_worker(router: str, worker: str) -> None:
    req = urllib.request.Request(
        f"{router}/workers",
        data=json.dumps({"url": worker}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status in (200, 202), resp.status


def test_generate_waits_for_the_routers_readiness_before_sending(model_dir: Path, tmp_path: Path) -> None:
    """A job started while the router has no worker yet waits (--start-timeout) instead of exiting 5,
    and runs once a worker registers."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 50)
    flags = {"model_path": str(model_dir), "standin_ttft": 0.005}
    with running_router([], model_dir, "round_robin") as router:
        config = GenerateConfig(
            input=inp,
            output=out,
            endpoints=[router],
            concurrency=8,
            params=GenParams(max_tokens=8),
            start_timeout=60,
        )
        job = Background(config)  # its first probe finds no worker (a stand-in takes seconds to start)
        with fleet(flags) as servers:
            assert job.outcome is None, job.outcome
            _add_worker(router, servers[0].base_url)
            outcome = job.join(60)
    assert outcome.exit_code == ExitCode.OK, outcome.message
    assert_exactly_once(out, ids)


def test_through_the_router_a_frozen_worker_costs_seconds_not_the_request_timeout(
    model_dir: Path, tmp_path: Path
) -> None:
    """One worker frozen (SIGSTOP) behind the router: the requests it holds are overdue against the
    job's latencies and re-sent through the router (its health checks, set fast as the role does,
    take the worker out); every request is written once, long before the 60 s request timeout."""
    flags = {"model_path": str(model_dir), "standin_ttft": 0.02, "max_running_requests": 8}
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 600)
    fast = (
        "--health-check-interval-secs",
        "2",
        "--health-failure-threshold",
        "2",
        "--health-check-timeout-secs",
        "2",
    )
    with (
        fleet(flags, flags, flags) as servers,
        running_router([s.base_url for s in servers], model_dir, "cache_aware", *fast) as router,
    ):
        job = Background(
            GenerateConfig(
                input=inp,
                output=out,
                endpoints=[router],
                concurrency=24,
                params=GenParams(max_tokens=32),
                request_timeout=60,
            )
        )
        frozen = None
        try:
            wait_until(lambda: count_lines(out) >= 100, timeout=30, what="100 results written")
            # the worker the router sends most to (cache_aware may send all of a shared prefix to one)
            frozen = max(servers, key=lambda s: requests_served(s.base_url))
            os.kill(frozen.process.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            outcome = job.join(60)
            after = time.monotonic() - t0
        finally:
            if frozen is not None:
                os.kill(frozen.process.pid, signal.SIGCONT)
    assert outcome.exit_code == ExitCode.OK, outcome.message
    assert after < 20, f"the job took {after:.1f} s after the freeze (request timeout 60 s)"
    assert_exactly_once(out, ids)
