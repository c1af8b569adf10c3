"""Progress of a generation job: counters, rates, and how they are shown.

On a terminal a live rich display (bar with done/total, requests/s, output tokens/s, ETA, errors,
and the requests in flight per endpoint); otherwise a plain log line every ``interval`` seconds.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO, Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from sglfleet.gen._dispatch import Endpoint


@dataclass
class Stats:
    """Counters of one run. ``done`` counts every id in the output, earlier runs included."""

    total: int
    done: int
    started: float = field(default_factory=time.monotonic)
    done_this_run: int = 0
    failed: int = 0
    retries: int = 0
    resent: int = 0  # requests sent to a second endpoint because theirs stalled
    metrics_port: int | None = None  # where --metrics-port listens, once it does
    prompt_tokens: int = 0
    completion_tokens: int = 0
    completion_tokens_this_run: int = 0
    _samples: deque[tuple[float, int, int]] = field(default_factory=lambda: deque(maxlen=64), repr=False)

    @property
    def remaining(self) -> int:
        return max(0, self.total - self.done - self.failed)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def sample(self, window: float = 10.0) -> tuple[float, float]:
        """(requests/s, output tokens/s) over about the last ``window`` seconds."""
        now = time.monotonic()
        self._samples.append((now, self.done_this_run, self.completion_tokens_this_run))
        t0, d0, k0 = self._samples[0]
        for t, d, k in self._samples:
            if now - t <= window:
                t0, d0, k0 = t, d, k
                break
        if now - t0 < 0.5:  # too short a window: use the whole run
            t0, d0, k0 = self.started, 0, 0
        span = max(now - t0, 1e-9)
        return (self.done_this_run - d0) / span, (self.completion_tokens_this_run - k0) / span

    def eta(self, rate: float) -> float | None:
        return self.remaining / rate if rate > 0 else None


def _hms(seconds: float | None) -> str:
    if seconds is None:
        return "--:--:--"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _state(e: Endpoint) -> str:
    if e.up:
        return ""
    return "(auth)" if e.auth_failed else "(stalled)" if e.stalled.is_set() else "(down)"


def summary_line(stats: Stats, endpoints: list[Endpoint]) -> str:
    rps, tps = stats.sample()
    pct = 100.0 * stats.done / stats.total if stats.total else 100.0
    flight = " ".join(f"{e.name}:{e.in_flight}{_state(e)}" for e in endpoints)
    return (
        f"generate: {stats.done}/{stats.total} ({pct:.1f}%) {rps:.1f} req/s {tps:,.0f} out tok/s "
        f"ETA {_hms(stats.eta(rps))} errors {stats.failed} retries {stats.retries} in flight {flight}"
    )


class Reporter(Protocol):
    interval: float

    def __enter__(self) -> Reporter: ...
    def __exit__(self, *exc: object) -> None: ...
    def update(self, stats: Stats, endpoints: list[Endpoint]) -> None: ...


class LogReporter:
    """A plain line every ``interval`` seconds (stdout is not a terminal: journald, files, CI)."""

    def __init__(self, stream: IO[str] | None = None, interval: float = 10.0) -> None:
        self.stream = stream or sys.stdout
        self.interval = interval

    def __enter__(self) -> LogReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, stats: Stats, endpoints: list[Endpoint]) -> None:
        print(summary_line(stats, endpoints), file=self.stream, flush=True)


class RichReporter:
    """A live bar and per-endpoint table, refreshed a few times a second."""

    def __init__(self, console: Console | None = None, interval: float = 0.25) -> None:
        self.console = console or Console()
        self.interval = interval
        self._live = Live(console=self.console, auto_refresh=False, transient=False)

    def __enter__(self) -> RichReporter:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.__exit__(None, None, None)

    def update(self, stats: Stats, endpoints: list[Endpoint]) -> None:
        rps, tps = stats.sample()
        bar = ProgressBar(total=max(stats.total, 1), completed=stats.done + stats.failed, width=50)
        head = Text.assemble(
            (f" {stats.done}/{stats.total}", "bold"),
            f"  {rps:,.1f} req/s  {tps:,.0f} out tok/s  ETA {_hms(stats.eta(rps))}  ",
            (f"errors {stats.failed}", "red" if stats.failed else ""),
            f"  retries {stats.retries}",
        )
        table = Table(box=None, show_header=True, header_style="dim", pad_edge=False)
        for col in ("endpoint", "in flight", "done", "errors", "state"):
            table.add_column(col, justify="left" if col in ("endpoint", "state") else "right")
        for e in endpoints:
            table.add_row(
                e.name,
                str(e.in_flight),
                str(e.ok),
                str(e.errors),
                "up" if e.up else Text(_state(e)[1:-1], "red"),
            )
        line = Table.grid(padding=(0, 1))
        line.add_row(bar, head)
        self._live.update(Group(line, table))
        self._live.refresh()


def reporter_for(stream: IO[str], log_interval: float) -> Reporter:
    if stream.isatty():
        return RichReporter(Console(file=stream))
    return LogReporter(stream, log_interval)
