"""`sglfleet generate` as a process: kill -9 at random moments, SIGINT/SIGTERM, then resume."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.generate import assert_exactly_once, fleet, generate_argv, write_conversations
from support.polling import wait_until

from sglfleet.gen import load_manifest as load
from sglfleet.gen import manifest_path

pytestmark = pytest.mark.timeout(90)


def _start(inp: Path, out: Path, urls: list[str], *extra: str) -> subprocess.Popen[bytes]:
    argv = generate_argv(inp, out, urls, "--max-tokens", "32")
    return subprocess.Popen(
        [*argv, "--backoff-base", "0.05", "--log-interval", "0.5", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _wait_for_lines(path: Path, n: int, proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    def reached() -> bool:
        assert proc.poll() is None, proc.communicate()[0].decode()
        return _lines(path) >= n

    wait_until(reached, timeout=timeout, what=f"{path} reaches {n} lines", interval=0.01)


def test_kill_9_at_random_moments_then_resume_gives_exactly_one_result_per_id(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_conversations(inp, 4000)
    rng = random.Random(os.environ.get("SGLFLEET_TEST_SEED", "kill9"))
    kills = torn = 0
    with fleet({"standin_ttft": 0.01}, {"standin_ttft": 0.01}) as servers:
        urls = [s.base_url for s in servers]
        while kills < 6:
            before = _lines(out)
            proc = _start(inp, out, urls, "--concurrency", "4")
            _wait_for_lines(out, before + 1, proc)  # it is running and writing
            time.sleep(rng.uniform(0.0, 0.4))
            assert proc.poll() is None, "the job finished before it could be killed: make it longer"
            proc.send_signal(signal.SIGKILL)
            assert proc.wait() == -signal.SIGKILL
            kills += 1
            torn += not out.read_bytes().endswith(b"\n")
            assert _lines(out) > before, "each run made progress"
        proc = _start(inp, out, urls, "--concurrency", "16")
        output = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 0, output
    assert kills >= 5
    assert_exactly_once(out, ids)
    m = load(manifest_path(out))
    assert m is not None and m.status == "complete" and m.timings.runs == kills + 1
    assert m.counts.done == len(ids) and 0 < m.counts.sent_this_run < len(ids)
    print(f"{kills} kills, {torn} left a torn last line")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_sending_lets_in_flight_finish_and_exits_130(
    tmp_path: Path, sig: signal.Signals
) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_conversations(inp, 400)
    with fleet({"standin_ttft": 0.2}) as servers:
        urls = [servers[0].base_url]
        proc = _start(inp, out, urls, "--concurrency", "4", "--grace", "10")
        _wait_for_lines(out, 4, proc)
        proc.send_signal(sig)
        output = proc.communicate(timeout=15)[0].decode()
        assert proc.returncode == 130, output
        assert "interrupted" in output
        written = _lines(out)
        m = load(manifest_path(out))
        assert m is not None and m.status == "interrupted" and m.counts.done == written
        assert written < len(ids) and m.counts.failed == 0, "in-flight requests finished, none failed"
        proc = _start(inp, out, urls, "--concurrency", "64")
        output = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 0, output
    assert_exactly_once(out, ids)


def test_grace_period_ends_hung_requests(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_conversations(inp, 50)
    with fleet({"standin_hang_rate": 1.0}) as servers:
        proc = _start(inp, out, [servers[0].base_url], "--grace", "0.5", "--concurrency", "2")

        def sending() -> bool:  # sending has begun once the manifest is written
            assert proc.poll() is None
            return load(manifest_path(out)) is not None

        wait_until(sending, timeout=20, what="the manifest written", interval=0.01)
        proc.send_signal(signal.SIGTERM)
        # every request hangs: only the 0.5 s grace ends them (without it the job would wait for ever;
        # the 10 s is a hang guard, not a timing assertion)
        output = proc.communicate(timeout=10)[0].decode()
    assert proc.returncode == 130, output
    m = load(manifest_path(out))
    assert m is not None and m.status == "interrupted" and m.counts.remaining == 50
