"""``OUT.manifest.json``: what a generation job was asked, how far it got, and how fast.

The manifest ties an output to its input (SHA-256 and size) and its generation parameters: a
later run with another input or other parameters is refused unless forced. A run's
:class:`ManifestWriter` rewrites it atomically (:mod:`sglfleet.atomicio`: a temporary file written
whole, ``fsync``, ``rename``, the directory ``fsync``-ed) at the start, every few seconds, and at the
end of the run, so readers (``sglfleet job status``, the ``generation_job`` module) always see a whole
document, and a full disk or a short write leaves the previous manifest as it was and no temporary
file behind.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from sglfleet.atomicio import atomic_write
from sglfleet.gen._store import errors_path
from sglfleet.records import (  # the manifest's record, declared with the job's other records
    Counts,
    InputInfo,
    Manifest,
    ResultsSummary,
    Status,
    Throughput,
    Timings,
    Tokens,
)

if TYPE_CHECKING:
    from sglfleet.gen._dispatch import Endpoint
    from sglfleet.gen._progress import Stats


class ManifestError(RuntimeError):
    pass


def manifest_path(output: Path) -> Path:
    return output.with_name(output.name + ".manifest.json")


def load(path: Path) -> Manifest | None:
    """The manifest at ``path``, or None when there is none."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:  # a directory, unreadable, ...
        raise ManifestError(f"{path}: cannot read it as a manifest: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ManifestError(f"{path} is not a generation manifest: not UTF-8 text") from None
    try:
        return Manifest.model_validate_json(text)
    except ValidationError as exc:
        raise ManifestError(f"{path} is not a generation manifest: {exc.errors()[0]['msg']}") from None


def save(path: Path, manifest: Manifest) -> None:
    """Replace ``path`` with ``manifest``, whole or not at all (OSError, e.g. ENOSPC, on failure)."""
    data = json.dumps(manifest.model_dump(mode="json"), indent=2).encode() + b"\n"
    with atomic_write(Path(path), durable=True) as fh:
        fh.write(data)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class ManifestWriter:
    """The manifest of one run of the job writing ``output``: what it was asked (``input_info``,
    ``params``), and from the run's stats and endpoints, how far it got; the timings carry on from
    ``previous``, the manifest of the runs before it (None: the first run); ``results`` says what the
    output holds each time it is written (:meth:`sglfleet.gen.OutputStore.summary`)."""

    def __init__(
        self,
        output: Path,
        input_info: InputInfo,
        params: dict[str, Any],
        previous: Manifest | None,
        results: Callable[[], ResultsSummary | None] | None = None,
    ) -> None:
        self.path = manifest_path(output)
        self.errors_file = str(errors_path(output))
        self.input = input_info
        self.params = params
        self.run_started = _now()
        self.first_started = previous.timings.first_started_at if previous else self.run_started
        self.runs = previous.timings.runs + 1 if previous else 1  # this run counts once it writes
        self.elapsed_before = previous.timings.total_elapsed_s if previous else 0.0
        self.results = results

    def build(self, stats: Stats, status: Status, endpoints: list[Endpoint], message: str = "") -> Manifest:
        elapsed = stats.elapsed()
        return Manifest(
            status=status,
            input=self.input,
            params=self.params,
            endpoints=[e.url for e in endpoints],
            counts=_counts(stats),
            tokens=Tokens(prompt=stats.prompt_tokens, completion=stats.completion_tokens),
            throughput=_throughput(stats, elapsed, running=status == "running"),
            timings=Timings(
                first_started_at=self.first_started,
                run_started_at=self.run_started,
                updated_at=_now(),
                run_elapsed_s=round(elapsed, 3),
                total_elapsed_s=round(self.elapsed_before + elapsed, 3),
                runs=self.runs,
            ),
            errors_file=self.errors_file,
            message=message,
            endpoint_stats={e.url: _endpoint_stats(e) for e in endpoints},
            pid=os.getpid(),
            results=self.results() if self.results is not None else None,
        )

    def save(self, stats: Stats, status: Status, endpoints: list[Endpoint], message: str = "") -> Manifest:
        m = self.build(stats, status, endpoints, message)
        save(self.path, m)
        return m


def _counts(stats: Stats) -> Counts:
    return Counts(
        total=stats.total,
        done=stats.done,
        failed=stats.failed,
        remaining=stats.remaining,
        sent_this_run=stats.done_this_run + stats.failed,
        retries_this_run=stats.retries,
        resent_this_run=stats.resent,
    )


def _throughput(stats: Stats, elapsed: float, *, running: bool) -> Throughput:
    """This run's rates; the time left at the recent rate while it runs."""
    eta = stats.eta(stats.sample()[0]) if running else None
    if elapsed <= 0:
        return Throughput(eta_s=None if eta is None else round(eta, 1))
    return Throughput(
        requests_per_s=round(stats.done_this_run / elapsed, 3),
        output_tokens_per_s=round(stats.completion_tokens_this_run / elapsed, 3),
        eta_s=None if eta is None else round(eta, 1),
    )


def _endpoint_stats(e: Endpoint) -> dict[str, float]:
    return {
        "ok": e.ok,
        "errors": e.errors,
        "sent": e.sent,
        "up": float(e.up),
        "stalls": e.stalls,
        "in_flight": e.in_flight,
    }


def input_change(previous: Manifest, sha256: str, size: int, prefix_sha256: str | None) -> str | None:
    """What changed in the input since ``previous`` was written, in words; None when nothing did.

    ``prefix_sha256``: the hash of the input's first ``previous.input.size`` bytes as it is now."""
    if previous.input.sha256 == sha256:
        return None
    old = previous.input.size
    if old is None:
        return f"the input changed (sha256 {previous.input.sha256[:12]}… → {sha256[:12]}…)"
    if size > old and prefix_sha256 == previous.input.sha256:
        return (
            f"the input grew from {old} to {size} bytes (lines were appended; the first {old} are unchanged)"
        )
    if size < old:
        return f"the input shrank from {old} to {size} bytes"
    was, now = previous.input.sha256[:12], sha256[:12]
    return f"the input was edited within its first {old} bytes (sha256 {was}… → {now}…)"


def mismatches(
    previous: Manifest,
    sha256: str,
    params: dict[str, Any],
    size: int | None = None,
    prefix_sha256: str | None = None,
) -> list[str]:
    """Why a run with this input and these parameters is not a continuation of ``previous``."""
    reasons = []
    change = input_change(previous, sha256, size if size is not None else -1, prefix_sha256)
    if change:
        reasons.append(change)
    if previous.params != params:
        keys = sorted(set(previous.params) | set(params))
        diff = [
            f"{k}: {previous.params.get(k)!r} → {params.get(k)!r}"
            for k in keys
            if previous.params.get(k) != params.get(k)
        ]
        reasons.append("the generation parameters changed (" + "; ".join(diff) + ")")
    return reasons
