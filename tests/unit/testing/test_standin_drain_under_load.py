"""A generation job against a stand-in that drains (SIGTERM, as in a rolling restart): the job stops
sending to it once its /health says 503, so the drain ends while the job runs; nothing is lost.

SGLang 0.5.12 keeps accepting requests while it drains (tokenizer_manager.py:2375-2411): a client
that kept sending would hold the drain until the service manager's stop timeout kills the server.
"""

from __future__ import annotations

import io
import signal
import threading
import time
from pathlib import Path

import pytest
from support.generate import assert_exactly_once, fleet, write_conversations

from sglfleet.gen import ExitCode, GenerateConfig, GenParams, LogReporter, Outcome, run

pytestmark = pytest.mark.timeout(90)

# Completions of 4..64 tokens: requests end at different moments, so a server under load always has
# some in flight (as a real one does), never an idle instant for the drain to end by chance.
SLOW = {
    "standin_ttft": 0.05,
    "standin_decode_tps": 400,
    "standin_natural_tokens": "4:64",
    "standin_drain_poll_seconds": 0.2,
}


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_a_draining_instance_gets_no_new_requests_and_exits_while_the_job_runs(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    # long enough that the job outlives the drain even on a loaded machine (about 15 s unloaded)
    ids = write_conversations(inp, 2000)
    outcome: list[Outcome] = []
    with fleet(SLOW, SLOW) as (draining, staying):
        config = GenerateConfig(
            input=inp,
            output=out,
            endpoints=[draining.base_url, staying.base_url],
            concurrency=8,
            params=GenParams(model="m", max_tokens=64, temperature=0.0),
            backoff_base=0.01,
            probe_interval=0.1,
            watch_interval=0.2,
        )
        job = threading.Thread(
            target=lambda: outcome.append(run(config, LogReporter(io.StringIO()), handle_signals=False))
        )
        job.start()
        deadline = time.monotonic() + 30
        while _lines(out) < 100:
            assert time.monotonic() < deadline and job.is_alive()
            time.sleep(0.02)
        draining.process.send_signal(signal.SIGTERM)
        assert draining.process.wait(20) == -signal.SIGKILL  # drained, then killed itself
        assert job.is_alive(), "the job ended before the drain: make it longer"
        done_at_exit = _lines(out)
        assert "Draining requests and shutting down" in draining.output()
        job.join(60)
        assert done_at_exit < len(ids)
    assert outcome[0].exit_code == ExitCode.OK, outcome[0].message
    assert_exactly_once(out, ids)
