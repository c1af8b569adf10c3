"""The engine against the field's failures: frozen instances, answers that are not completions,
Retry-After, inputs that change under a run, full disks. Real servers on 127.0.0.1, real files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.generate import (
    Background,
    assert_exactly_once,
    count_lines,
    fleet,
    get_json,
    job_config,
    latency_servers,
    read_jsonl,
    run_job,
    write_batch,
    write_conversations,
)
from support.polling import wait_until

from sglfleet.gen import ExitCode, manifest_path
from sglfleet.gen import load_manifest as load

pytestmark = pytest.mark.timeout(90)


# -- 1. a frozen instance -------------------------------------------------------------------------


def test_a_frozen_instance_is_taken_out_and_its_requests_answered_elsewhere(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_conversations(inp, 600)
    flags = {"standin_ttft": 0.02, "max_running_requests": 4}
    with fleet(flags, flags, flags) as servers:
        frozen = servers[0]
        job = Background(
            job_config(inp, out, [s.base_url for s in servers], concurrency=4, request_timeout=60)
        )
        try:
            wait_until(lambda: count_lines(out) >= 100, timeout=30, what="100 results written")
            os.kill(frozen.process.pid, signal.SIGSTOP)  # sockets stay open, nothing answers
            t0 = time.monotonic()
            outcome = job.join(60)
            after = time.monotonic() - t0
        finally:
            os.kill(frozen.process.pid, signal.SIGCONT)
    assert outcome.exit_code == ExitCode.OK, outcome.message
    assert after < 15, f"the job took {after:.1f} s after the freeze (request timeout 60 s)"
    assert_exactly_once(out, ids)
    m = outcome.manifest
    assert m is not None and m.endpoint_stats[frozen.base_url]["stalls"] >= 1
    assert m.counts.resent_this_run >= 1, "the frozen instance's requests went elsewhere"


# -- 3. a 200 that is not a completion --------------------------------------------------------------


def test_a_200_error_object_is_retried_then_reported_never_written(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 20)
    with latency_servers(1, 0.0, "error_object") as urls:
        ok = run_job(inp, out, urls)
        assert ok.exit_code == ExitCode.OK and ok.manifest is not None, ok.message
        assert ok.manifest.counts.retries_this_run == 20  # every first answer was an error object
        assert_exactly_once(out, ids)

    out2 = tmp_path / "out2.jsonl"
    with latency_servers(1, 0.0, "error_object") as urls:
        failed = run_job(inp, out2, urls, max_retries=0)
    assert failed.exit_code == ExitCode.FAILURES
    assert out2.read_bytes() == b"", "an error object is never written as a result"
    errors = read_jsonl(tmp_path / "out2.jsonl.errors.jsonl")
    assert sorted(e["custom_id"] for e in errors) == ids
    assert all(e["error"]["code"] == "invalid_response" for e in errors)
    assert "not a completion (an error object: injected error object)" in errors[0]["error"]["message"]


# -- 7. Retry-After ---------------------------------------------------------------------------------


def test_retry_after_is_honoured(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 3)
    with latency_servers(1, 0.0, "retry_after") as urls:
        outcome = run_job(inp, out, urls, backoff_base=0.01)
        attempts = get_json(urls[0] + "/attempts")
    assert outcome.exit_code == ExitCode.OK, outcome.message
    assert_exactly_once(out, ids)
    by_body: dict[str, list[float]] = {}
    for at, key in attempts:  # type: ignore[union-attr]
        by_body.setdefault(key, []).append(at)
    assert len(by_body) == 3
    for times in by_body.values():
        assert len(times) == 2 and times[1] - times[0] >= 0.95, times  # Retry-After: 1, backoff 0.01


# -- 4. inputs that change under a run ------------------------------------------------------------------


def test_lines_appended_during_a_run_are_not_sent_and_the_resume_names_the_change(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 300)
    size = inp.stat().st_size
    first = inp.read_text().splitlines()[0]
    with fleet({"standin_ttft": 0.01, "max_running_requests": 2}) as servers:
        job = Background(job_config(inp, out, [servers[0].base_url], concurrency=2))
        wait_until(lambda: count_lines(out) >= 10, timeout=30, what="10 results written")
        with inp.open("a") as fh:
            fh.write(first + "\n")  # a duplicate id
            fh.write('{"custom_id": "x"}\n')  # a bad line
        outcome = job.join(60)
        assert outcome.exit_code == ExitCode.OK, outcome.message
        assert outcome.manifest is not None and outcome.manifest.input.size == size
        assert outcome.manifest.counts.done == outcome.manifest.counts.total == 300
        assert_exactly_once(out, ids)
        again = run_job(inp, out, [servers[0].base_url])
    assert again.exit_code == ExitCode.INPUT_CHANGED
    assert f"the input grew from {size} to" in again.message and "lines were appended" in again.message


def test_a_line_edited_during_a_run_stops_it_naming_the_line(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 400)
    lines = inp.read_bytes().splitlines(keepends=True)
    with fleet({"standin_ttft": 0.01, "max_running_requests": 2}) as servers:
        job = Background(job_config(inp, out, [servers[0].base_url], concurrency=2))
        wait_until(lambda: count_lines(out) >= 5, timeout=30, what="5 results written")
        edited = lines[-1].replace(b"prompt 399", b"prompt 999")
        with inp.open("r+b") as fh:  # in place, same size: only the bytes tell
            fh.seek(sum(len(x) for x in lines[:-1]))
            fh.write(edited)
        outcome = job.join(60)
    assert outcome.exit_code == ExitCode.INPUT_CHANGED, outcome.message
    assert f"{inp} line 400 changed during the run" in outcome.message
    written = {r["custom_id"] for r in read_jsonl(out)}
    assert "b000399" not in written and len(written) < 400


def test_stream_true_is_refused_at_validation(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 3, stream=True)
    outcome = run_job(inp, out, ["http://127.0.0.1:9"])
    assert outcome.exit_code == ExitCode.BAD_INPUT
    assert str(outcome.input_errors[0]).startswith("line 1: body.stream is true")


# -- 5. full disks and short writes ---------------------------------------------------------------------


def test_a_full_disk_stops_with_its_exit_code_leaves_nothing_half_written_and_resumes(
    tmp_path: Path, small_disk: Path
) -> None:
    inp, out = tmp_path / "in.jsonl", small_disk / "out.jsonl"
    ids = write_conversations(inp, 400)
    with fleet({}) as servers:
        full = run_job(inp, out, [servers[0].base_url])
        assert full.exit_code == ExitCode.DISK_FULL, full.message
        assert "no space left" in full.message
        data = out.read_bytes()
        assert data and data.endswith(b"\n"), "no torn line"
        assert [p.name for p in small_disk.iterdir() if p.name.endswith(".tmp")] == []
        m = load(manifest_path(out))  # the manifest on disk is whole (an older one, or the last)
        assert m is not None
        subprocess.run(["mount", "-o", "remount,size=16m", str(small_disk)], check=True)
        resumed = run_job(inp, out, [servers[0].base_url])
    assert resumed.exit_code == ExitCode.OK, resumed.message
    assert_exactly_once(out, ids)


def test_a_short_manifest_write_keeps_the_previous_manifest(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes the kernel cut the write short (then EFBIG), as a full disk does."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 5)
    with fleet({}) as servers:
        assert run_job(inp, out, [servers[0].base_url]).exit_code == ExitCode.OK
    mpath = manifest_path(out)
    before = mpath.read_bytes()
    child = f"""
import resource, signal, sys
from pathlib import Path
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
from sglfleet.gen import _manifest as manifest
m = manifest.load(Path({str(mpath)!r}))
m.message = "x" * 100000
resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))
try:
    manifest.save(Path({str(mpath)!r}), m)
except OSError as exc:
    print("refused", exc.errno)
"""
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    assert proc.stdout.startswith("refused"), proc.stdout + proc.stderr
    assert mpath.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_metrics_port_in_use_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    import socket

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 3)
    with socket.socket() as busy, fleet({}) as servers:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        outcome = run_job(inp, out, [servers[0].base_url], metrics_port=port)
    assert (
        outcome.exit_code == ExitCode.BAD_INPUT and f"--metrics-port {port}: cannot listen" in outcome.message
    )
    assert out.read_bytes() == b""
