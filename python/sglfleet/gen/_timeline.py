"""A job's time series, ``OUT.timeline.jsonl``: what `sglfleet job report OUT` draws.

While `sglfleet generate` runs it appends one sample (one JSON line) every ``interval`` seconds and
one when the run ends, runs of a resumed job one after the other in the same file:

    {"t": "2026-12-04T15:40:00.250+00:00", "run": 2, "total": 193000, "done": 81234, "failed": 3,
     "completion_tokens": 51234567,
     "endpoints": {"http://10.0.0.5:30000": {"ok": 10234, "errors": 1, "in_flight": 32, "up": true}}}

``t`` is the wall-clock time (UTC), so the runs of a resumed job line up; ``done`` counts every id in
the output (earlier runs included), ``failed`` and ``completion_tokens`` the run's own (as the manifest
does), an endpoint's ``ok`` and ``errors`` the answers it gave in this run. The file stays small: when
it reaches ``MAX_SAMPLES`` lines every other sample is dropped (a 10-hour job at 10 s keeps one sample
every 20 s, about 2,000 lines), so its size is bounded whatever the job's length.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sglfleet.atomicio import atomic_write

MAX_SAMPLES = 2000
DEFAULT_INTERVAL_S = 10.0


def timeline_path(output: str | Path) -> Path:
    output = Path(output)
    return output.with_name(output.name + ".timeline.jsonl")


def sample(
    *,
    run: int,
    total: int,
    done: int,
    failed: int,
    completion_tokens: int,
    endpoints: Sequence[Any],
    now: dt.datetime,
) -> dict[str, Any]:
    """One sample (the record above); `endpoints`: the dispatcher's, with url, ok, errors, in_flight, up."""
    return {
        "t": now.astimezone(dt.UTC).isoformat(timespec="milliseconds"),
        "run": run,
        "total": total,
        "done": done,
        "failed": failed,
        "completion_tokens": completion_tokens,
        "endpoints": {
            e.url: {"ok": e.ok, "errors": e.errors, "in_flight": e.in_flight, "up": bool(e.up)}
            for e in endpoints
        },
    }


class TimelineWriter:
    """Appends samples to ``OUT.timeline.jsonl``, thinning it to stay under ``max_samples`` lines."""

    def __init__(self, output: str | Path, max_samples: int = MAX_SAMPLES) -> None:
        self.path = timeline_path(output)
        self.max_samples = max(2, max_samples)
        self._lines: int | None = None

    def append(self, record: dict[str, Any]) -> None:
        if self._lines is None:
            self._lines = len(_read_lines(self.path))
        if self._lines >= self.max_samples:
            self._thin()
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._lines += 1

    def _thin(self) -> None:
        """Keep every other sample (the first and the latest kept), written whole or not at all."""
        lines = _read_lines(self.path)
        kept = lines[::2] if len(lines) % 2 else [*lines[:-1:2], lines[-1]]
        with atomic_write(self.path) as fh:
            fh.write("".join(line + "\n" for line in kept).encode())
        self._lines = len(kept)


def _read_lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [line for line in text.splitlines() if line.strip()]


def load(output: str | Path) -> list[dict[str, Any]]:
    """The samples of the job writing `output`, oldest first; ValueError naming the file and line of a
    bad one, or saying that there is none (a job started before timelines were kept, or a wrong OUT)."""
    path = timeline_path(output)
    if not path.exists():
        raise ValueError(f"{path}: no timeline (has `sglfleet generate -o {output}` run?)")
    samples = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            dt.datetime.fromisoformat(record["t"])
            int(record["done"]), int(record["total"])
            if not isinstance(record.get("endpoints", {}), dict):
                raise TypeError("endpoints is not an object")
        except (ValueError, KeyError, TypeError) as exc:
            if number == len(lines):
                break  # a torn last line of a run killed while writing it
            raise ValueError(f"{path}:{number}: not a timeline sample: {exc}") from None
        samples.append(record)
    if not samples:
        raise ValueError(f"{path}: no samples yet")
    return samples
