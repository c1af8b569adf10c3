"""The files a job writes next to its output (``OUT.errors.jsonl``, ``OUT.manifest.json``,
``OUT.timeline.jsonl``) are checked like the output itself: one of them that is the output under
another name, or another job's output, is refused before anything is opened (a second reader's
hostile shapes, issue 28). On the branch before this check, the errors file as a symlink to the
output truncated every result (the store opens it with ``O_TRUNC``) and the run still said
"complete"; a timeline linked to the output appended its samples to the results; and a job whose
errors file was another job's output emptied that job's results on every run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.generate import latency_servers, run_job, write_batch

from sglfleet.gen import ExitCode, GenerateConfig, check_config

pytestmark = pytest.mark.timeout(120)

COMPANIONS = (".errors.jsonl", ".manifest.json", ".timeline.jsonl")


def _config(inp: Path, out: Path) -> GenerateConfig:
    return GenerateConfig(input=inp, output=out, endpoints=["http://127.0.0.1:1"])


@pytest.mark.parametrize("suffix", COMPANIONS)
@pytest.mark.parametrize("how", ["symlink", "hard link"])
def test_a_companion_file_that_is_the_output_is_refused(tmp_path: Path, suffix: str, how: str) -> None:
    inp = tmp_path / "in.jsonl"
    write_batch(inp, 3)
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"")
    companion = tmp_path / ("out.jsonl" + suffix)
    if how == "symlink":
        companion.symlink_to("out.jsonl")
    else:
        os.link(out, companion)
    problems = check_config(_config(inp, out))
    assert len(problems) == 1, problems
    assert str(companion) in problems[0] and f"is the output {out}" in problems[0]


def test_an_errors_file_that_is_another_jobs_output_is_refused(tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    write_batch(inp, 3)
    out = tmp_path / "out.jsonl"
    other = tmp_path / "out.jsonl.errors.jsonl"  # a job run with -o out.jsonl.errors.jsonl
    other.write_bytes(b'{"custom_id": "x"}\n')
    (tmp_path / "out.jsonl.errors.jsonl.manifest.json").write_text("{}")
    problems = check_config(_config(inp, out))
    assert len(problems) == 1 and "another job's output" in problems[0], problems
    # and the other way round: an output that is a job's errors file (it empties it on each run)
    (tmp_path / "job.jsonl").write_bytes(b"")
    (tmp_path / "job.jsonl.manifest.json").write_text("{}")
    problems = check_config(_config(inp, tmp_path / "job.jsonl.errors.jsonl"))
    assert len(problems) == 1 and "is the errors file of the job" in problems[0], problems
    # an output that is merely named like a manifest, with no job beside it, is an output
    named = tmp_path / "mine.manifest.json"
    named.write_bytes(b"")
    assert check_config(_config(inp, named)) == []


def test_an_errors_file_linked_to_the_output_loses_no_result(tmp_path: Path) -> None:
    """Through the CLI path: the results of a finished job survive a rerun whose errors file was made
    a symlink to the output (exit 2, output unchanged)."""
    inp = tmp_path / "in.jsonl"
    write_batch(inp, 6)
    out = tmp_path / "out.jsonl"
    with latency_servers(1, 0.0, "ok") as ports:
        first = run_job(inp, out, ports)
        assert first.exit_code == ExitCode.OK
        before = out.read_bytes()
        assert before.count(b"\n") == 6
        errors = tmp_path / "out.jsonl.errors.jsonl"
        errors.unlink()
        errors.symlink_to("out.jsonl")
        again = run_job(inp, out, ports)
    assert again.exit_code == ExitCode.BAD_INPUT
    assert out.read_bytes() == before
