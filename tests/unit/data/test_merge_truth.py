"""`sglfleet merge` pairs each answer with its own prompt and cleans up after itself (issue 20): the
prompts the generation manifest names, checked against its hash; no temporary file of a killed merge
left behind; no orphaned worker; a torn results file says what to do."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.generate import latency_servers, run_job
from support.polling import wait_until

from sglfleet.cli import main
from sglfleet.data import DataError, merge
from sglfleet.gen import ExitCode

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLFLEET_CACHE_DIR", str(tmp_path / "cache"))


def _prompts(path: Path, n: int, topic: str) -> list[str]:
    ids = [f"p{i:03d}" for i in range(n)]
    with path.open("w") as fh:
        for i, cid in enumerate(ids):
            body = {"messages": [{"role": "user", "content": f"{topic} question {i}"}], "max_tokens": 64}
            fh.write(
                json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body})
            )
            fh.write("\n")
    return ids


def _existing(path: Path) -> Path:
    row = {
        "id": "old",
        "conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
    }
    path.write_text(json.dumps(row) + "\n")
    return path


def _pairs(merged: Path) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in merged.read_text().splitlines()][1:]
    return [(r["conversations"][0]["content"], r["conversations"][-1]["content"]) for r in rows]


@pytest.fixture
def generated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real generate run on job/prompts.jsonl, started in job/ with the relative path a user types."""
    job = tmp_path / "job"
    job.mkdir()
    _prompts(job / "prompts.jsonl", 8, "geography")
    monkeypatch.chdir(job)
    with latency_servers(1, 0.0, "ok") as urls:  # it answers "answer to <the prompt's text>"
        outcome = run_job(Path("prompts.jsonl"), Path("results.jsonl"), urls)
    assert outcome.exit_code == ExitCode.OK, outcome.message
    return job / "results.jsonl"


# -- 1. the prompts the results answer, and no other file ---------------------------------------------


def test_without_prompts_the_generated_input_is_used_not_a_same_named_file_here(
    tmp_path: Path, generated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _prompts(elsewhere / "prompts.jsonl", 8, "cooking")  # the same ids, other questions
    monkeypatch.chdir(elsewhere)
    merged = tmp_path / "merged.jsonl"
    merge(_existing(tmp_path / "existing.jsonl"), generated, None, merged, min_completion_tokens=1)
    pairs = _pairs(merged)
    assert len(pairs) == 8
    for question, answer in pairs:
        assert question.startswith("geography") and answer == f"answer to {question}", (question, answer)


def test_a_relative_input_path_is_read_from_the_manifests_directory(
    tmp_path: Path, generated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest that names its input relatively (as before this change) is read against its own
    directory, never the current one."""
    manifest = generated.with_name("results.jsonl.manifest.json")
    data = json.loads(manifest.read_text())
    data["input"]["path"] = "prompts.jsonl"
    manifest.write_text(json.dumps(data))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _prompts(elsewhere / "prompts.jsonl", 8, "cooking")
    monkeypatch.chdir(elsewhere)
    merged = tmp_path / "merged.jsonl"
    merge(_existing(tmp_path / "existing.jsonl"), generated, None, merged, min_completion_tokens=1)
    assert all(q.startswith("geography") for q, _ in _pairs(merged))


def test_prompts_that_are_not_the_generated_input_are_refused_naming_both(
    tmp_path: Path, generated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    decoy = tmp_path / "decoy.jsonl"
    _prompts(decoy, 8, "cooking")
    real = generated.with_name("prompts.jsonl")
    existing = _existing(tmp_path / "existing.jsonl")
    merged = tmp_path / "merged.jsonl"
    with pytest.raises(DataError) as err:
        merge(existing, generated, decoy, merged)
    message = str(err.value)
    for text in (str(decoy), str(real), _sha(decoy), _sha(real)):
        assert text in message, message
    assert not merged.exists(), "nothing is written"
    # the same when the file the manifest names was replaced since
    real.write_bytes(decoy.read_bytes())
    with pytest.raises(DataError, match="are not the input the results were generated from"):
        merge(existing, generated, None, merged)
    args = ["merge", "--existing", str(existing), "--results", str(generated), "--output", str(merged)]
    assert main(args) == ExitCode.BAD_INPUT
    assert "sha256" in capsys.readouterr().err


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- 7. cleaning up ----------------------------------------------------------------------------------------


def test_a_merge_removes_the_temporaries_a_killed_merge_left(tmp_path: Path, generated: Path) -> None:
    merged = tmp_path / "merged.jsonl"
    killed = f"""
import os, signal
from pathlib import Path
from sglfleet.atomicio import atomic_writes
with atomic_writes([Path({str(merged)!r})]) as (fh,):
    fh.write(b"x" * 3_000_000)
    fh.flush()
    os.kill(os.getpid(), signal.SIGKILL)  # kill -9 in the middle of writing the output
"""
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", killed], check=False)
        assert done.returncode == -signal.SIGKILL
    left = sorted(p.name for p in tmp_path.glob(".merged.jsonl.*.tmp"))
    assert len(left) == 3, left
    # a temporary of a writer that still runs is not ours to remove
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        running = tmp_path / f".merged.jsonl.{live.pid}.abcdefgh.tmp"
        running.write_bytes(b"in progress")
        merge(_existing(tmp_path / "existing.jsonl"), generated, None, merged, min_completion_tokens=1)
        assert sorted(p.name for p in tmp_path.glob(".merged.jsonl.*.tmp")) == [running.name]
    finally:
        live.kill()
        live.wait()
    assert len(merged.read_text().splitlines()) == 9


def _children(pid: int) -> set[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return set()
    return {int(x) for x in text.split()}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


@contextlib.contextmanager
def _classifying_merge(
    tmp_path: Path, prelude: str = ""
) -> Iterator[tuple[subprocess.Popen[bytes], set[int]]]:
    """A merge (in a process of its own, `prelude` run first) whose workers classify an existing set
    that comes through a FIFO held open, so that it is caught for sure while its workers wait for the
    next chunk: yields the merge's process and its workers' pids; kills whatever is left after."""
    fifo = tmp_path / "existing.fifo"
    os.mkfifo(fifo)
    child = f"""
{prelude}
from pathlib import Path
from sglfleet.data import _merge
_merge.PARALLEL_BYTES = -1  # workers whatever the size
_merge.classify_existing(Path({str(fifo)!r}), "category", workers=2)
"""
    proc = subprocess.Popen([sys.executable, "-c", child])
    workers: set[int] = set()
    writer = open(fifo, "wb")  # noqa: SIM115 (held open: no end of file, the merge waits)
    try:
        row = json.dumps({"conversations": [{"role": "user", "content": "write a python function"}]})
        writer.write((row + "\n").encode() * 9000)  # more than one chunk (8192 rows)
        writer.flush()
        workers = wait_until(lambda: _children(proc.pid), timeout=30, what="the merge's workers")
        yield proc, workers
    finally:
        writer.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for w in workers | _children(proc.pid):  # whatever is left (reparented once proc died)
            if _alive(w):
                os.kill(w, signal.SIGKILL)


def test_classification_workers_die_with_the_merge(tmp_path: Path) -> None:
    """kill -9 of a merge whose workers classify the existing set leaves no worker behind (before:
    two per kill, ignoring SIGTERM, waiting for work for ever)."""
    with _classifying_merge(tmp_path) as (proc, workers):
        proc.kill()
        proc.wait()
        wait_until(lambda: not any(_alive(w) for w in workers), timeout=10, what="the workers gone")


def test_a_classification_worker_does_not_keep_the_merges_sigterm_handler(tmp_path: Path) -> None:
    """SIGTERM ends a worker even when the merge handles SIGTERM itself (the CLI turns it into
    KeyboardInterrupt): a forked worker must not inherit that handler. Before: the worker's start
    (SIGTERM reset, then die-with-parent) was shadowed by a second definition of the same name, so the
    reset never ran and the worker below kept swallowing SIGTERM."""
    prelude = "import signal\nsignal.signal(signal.SIGTERM, lambda signum, frame: None)  # the merge's own"
    with _classifying_merge(tmp_path, prelude) as (_proc, workers):
        worker = min(workers)
        os.kill(worker, signal.SIGTERM)
        wait_until(lambda: not _alive(worker), timeout=10, what=f"worker {worker} ended by SIGTERM")


def test_a_torn_last_results_line_says_to_rerun_generate(
    tmp_path: Path, generated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = generated.read_bytes()
    generated.write_bytes(data + data.splitlines(keepends=True)[0][:40])  # a write cut short
    existing = _existing(tmp_path / "existing.jsonl")
    args = [
        "merge",
        "--existing",
        str(existing),
        "--results",
        str(generated),
        "--output",
        str(tmp_path / "m.jsonl"),
    ]
    assert main(args) == ExitCode.BAD_INPUT
    err = capsys.readouterr().err
    assert f"{generated}:9: the results file ends with a torn line" in err
    assert "rerun the same `sglfleet generate` command" in err
