"""Where a job stands, from another shell: ``sglfleet job status OUT``.

Reads ``OUT.manifest.json`` (rewritten every few seconds by the running job) and asks the output's
lock whether a run holds it, so a job killed without a chance to write its last manifest reads
``stopped`` rather than ``running`` forever; the counts of a job that is not running are then read
from its files (one line per result), which a killed run or a full disk leaves ahead of the manifest.
The ETA is the running job's own (its recent rate), "unknown" when nothing has answered lately.

The results on disk are the truth: a job that is not running whose output is not the file its
manifest summarised (deleted, emptied, cut short: :func:`sglfleet.records.results_problem`) reads
``results_missing`` ("results missing or short: rerun resumes"), never ``complete``.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sglfleet.gen import _manifest as manifest
from sglfleet.records import results_problem


@dataclass
class JobStatus:
    output: str
    state: str  # running, complete, complete_with_failures, interrupted, failed, stopped, results_missing
    running: bool
    total: int
    done: int
    failed: int
    remaining: int
    percent: float
    requests_per_s: float
    output_tokens_per_s: float
    eta_s: float | None
    updated_s_ago: float
    runs: int
    message: str
    endpoints: dict[str, dict[str, float]]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        eta = _hms(self.eta_s) if self.eta_s is not None else "unknown" if self.running else "-"
        shown = self.state.replace("_", " ")
        # the message when it says more than the state ("complete (complete)" said nothing twice)
        note = (
            f" ({self.message})" if self.message not in ("", self.state, shown) and not self.running else ""
        )
        if self.state == "stopped":  # killed before its last manifest: nothing said what to do
            note = " (killed before it could say so; rerun the same `sglfleet generate` command: it resumes)"
        out = [
            f"{self.output}: {shown}{note}",
            f"  {self.done}/{self.total} done ({self.percent:.1f}%), {self.failed} failed, "
            f"{self.remaining} remaining",
            f"  {self.requests_per_s:,.1f} req/s, {self.output_tokens_per_s:,.0f} out tok/s, ETA {eta}; "
            f"manifest updated {self.updated_s_ago:.0f} s ago; run {self.runs}",
        ]
        for url, s in self.endpoints.items():
            state = "up" if s.get("up") else "down"
            out.append(
                f"  {url}: {state}, {int(s.get('ok', 0))} ok, {int(s.get('errors', 0))} errors, "
                f"{int(s.get('in_flight', 0))} in flight, {int(s.get('stalls', 0))} stalls"
            )
        return out


def _hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def is_locked(output: Path) -> bool:
    """True while a run holds the output's lock (``sglfleet generate`` takes it for its whole run)."""
    try:
        fd = os.open(output, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops our shared lock, if we got it
    return False


def _count_lines(path: Path) -> int:
    """Whole lines of a results file (one per id, exactly once; a torn last line is not one)."""
    n = 0
    try:
        with path.open("rb") as fh:
            while block := fh.read(1 << 20):
                n += block.count(b"\n")
    except (FileNotFoundError, IsADirectoryError):
        return 0
    return n


def job_status(output: Path) -> JobStatus:
    """The status of the job writing ``output``; ManifestError when there is no manifest."""
    output = Path(output)
    path = manifest.manifest_path(output)
    m = manifest.load(path)
    if m is None:
        raise manifest.ManifestError(f"{path}: no manifest (has `sglfleet generate -o {output}` run?)")
    running = is_locked(output)
    state = m.status
    if state == "running" and not running:
        state = "stopped"  # killed before it could say so; a rerun resumes
    updated = dt.datetime.fromisoformat(m.timings.updated_at)
    ago = (dt.datetime.now(dt.UTC) - updated).total_seconds()
    rate = m.throughput.requests_per_s
    done, failed = m.counts.done, m.counts.failed
    if not running:  # a run killed (or out of disk) before its last manifest: the files say more
        done = max(done, _count_lines(output))
        if state in ("stopped", "failed"):
            failed = max(failed, _count_lines(output.with_name(output.name + ".errors.jsonl")))
        problem = results_problem(output, m.results, m.counts.done)
        if problem is not None:  # the results on disk are the truth, not the manifest
            state, done = "results_missing", _count_lines(output)
            m.message = problem
    total = m.counts.total
    remaining = max(0, total - done - failed)
    eta = None
    if running and m.throughput.eta_s is not None:
        eta = max(0.0, m.throughput.eta_s - max(0.0, ago))
    return JobStatus(
        output=str(output),
        state=state,
        running=running,
        total=total,
        done=done,
        failed=failed,
        remaining=remaining,
        percent=100.0 * done / total if total else 100.0,
        requests_per_s=rate,
        output_tokens_per_s=m.throughput.output_tokens_per_s,
        eta_s=eta,
        updated_s_ago=max(0.0, ago),
        runs=m.timings.runs,
        message=m.message,
        endpoints=m.endpoint_stats,
    )
