"""The smaller points of issue 28 (point 7): finite options, a closed pipe, a full disk as job status
tells it, duplicate endpoints under other names, a paused client, and `next:` lines that work."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.generate import latency_servers, run_job, write_batch

from sglfleet.gen import ExitCode, job_status
from sglfleet.gen._dispatch import Endpoint, EndpointPool, PauseWatch

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_after_a_full_disk_job_status_says_so(tmp_path: Path, small_disk: Path) -> None:
    inp, out = tmp_path / "in.jsonl", small_disk / "out.jsonl"
    write_batch(inp, 400)
    with latency_servers(1, 0.0, "ok") as urls:
        full = run_job(inp, out, urls, manifest_interval=0.05)
    assert full.exit_code == ExitCode.DISK_FULL, full.message
    status = job_status(out)
    assert status.state == "failed" and not status.running
    first = status.lines()[0]
    assert "no space left" in first and "killed before it could say so" not in first, first


# -- a paused client blames no endpoint --------------------------------------------------------------


async def _never(_ep: Endpoint) -> bool:
    return True


def _busy_pool() -> EndpointPool:
    pool = EndpointPool(["http://a:1", "http://b:1"], 4, _never, stall_factor=8.0, stall_min=2.0)
    for ep in pool.endpoints:
        ep.in_flight, ep.latency = 4, 0.2  # busy, answering in 0.2 s: stalled after 2 s of silence
    return pool


def _run(pool: EndpointPool, ticks: list[float], answering: Callable[[float], tuple[int, ...]]) -> list[str]:
    """What the engine's stall check (RequestRunner.resend_stalled) finds at each of ``ticks`` (loop
    times: an injected clock) while the endpoints ``answering(now)`` names answer between ticks."""
    watch = PauseWatch(0.5, ticks[0])
    found = []
    for now in ticks[1:]:
        paused = watch.tick(now)
        if paused:
            pool.forgive(paused)
        found += [ep.url for ep in pool.find_stalled(now)]
        for i in answering(now):  # the answers read on this wake-up
            pool.endpoints[i].last_done = now
    return found


def test_a_paused_client_does_not_mark_healthy_endpoints_stalled() -> None:
    """`sglfleet generate` stopped (SIGSTOP) for 20 s, then continued: the loop's clock jumped 20 s
    while nobody could be heard; both endpoints answer again at once. None of them stalled."""
    before = [i * 0.5 for i in range(21)]  # 10 s of wake-ups every 0.5 s, both answering
    after = [30.5 + i * 0.5 for i in range(10)]  # SIGCONT after 20 s, then on time again
    pool = _busy_pool()
    # the last answers before the stop: a's at 9.5 s, b's at 10 s (one is always a little later)
    assert _run(pool, [*before, *after], lambda now: (1,) if now == 10.0 else (0, 1)) == []


def test_an_endpoint_that_stops_answering_is_still_found_stalled() -> None:
    ticks = [i * 0.5 for i in range(41)]  # 20 s, on time: endpoint b answers, endpoint a does not
    pool = _busy_pool()
    found = _run(pool, ticks, lambda _now: (1,))
    assert found and set(found) == {"http://a:1"}
