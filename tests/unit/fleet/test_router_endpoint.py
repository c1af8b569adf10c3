"""The real SGLang router (sglang-router 0.3.2 from PyPI) in front of stand-ins: what it asks of the
workers, and `sglfleet generate` / the health probe taking it as one endpoint."""

from __future__ import annotations

import asyncio
import io
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sglfleet_testing.router import running_router, write_model_dir
from support.generate import assert_exactly_once, fleet, requests_served, write_batch, write_conversations

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
