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
    overdue: int = 0  # requests re-sent because their own answer was overdue (no endpoint stalled)
    metrics_port: int | None = None  # where --metrics-port listens, once it does
    prompt_tokens: int = 0
    completion_tokens: int = 0
    completion_tokens_this_run: int = 0
    exit_code: int | None = None  # once the run has ended (the metrics say it)
    _samples: deque[tuple[float, int, int]] = field(default_factory=lambda: deque(maxlen=64), repr=False)
    _last_count: int = field(default=0, repr=False)
    _last_change: float | None = field(default=None, repr=False)  # when done_this_run last grew

    @property
    def remaining(self) -> int:
        return max(0, self.total - self.done - self.failed)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def sample(self, window: float = 10.0) -> tuple[float, float]:
        """(requests/s, output tokens/s) over about the last ``window`` seconds (or since the
        previous sample, when that is longer ago: a log line every 30 s rates those 30 s)."""
        now = time.monotonic()
        if self.done_this_run != self._last_count:
            self._last_count, self._last_change = self.done_this_run, now
        base = None
        for t, d, k in self._samples:  # oldest first
            if now - t >= window or (base is None and now - t >= 0.5):
                base = (t, d, k)
        self._samples.append((now, self.done_this_run, self.completion_tokens_this_run))
        t0, d0, k0 = base or (self.started, 0, 0)
        span = max(now - t0, 1e-9)
        return (self.done_this_run - d0) / span, (self.completion_tokens_this_run - k0) / span

    def eta(self, rate: float) -> float | None:
        """Seconds left at ``rate`` (a recent one); None, "unknown", when nothing is answering: no
        answer for over 4 times the usual gap between answers (and 2 s), or none at all lately."""
        if self.remaining == 0:
            return 0.0
        if rate <= 0:
            return None
        since = self._last_change if self._last_change is not None else self.started
        if time.monotonic() - since > max(2.0, 4.0 / rate):
            return None
        return self.remaining / rate


def _hms(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
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
        self._live.update(self.frame(stats, endpoints, self.console.width))
        self._live.refresh()

    @staticmethod
    def frame(stats: Stats, endpoints: list[Endpoint], width: int) -> Group:
        """What is drawn: lines that each fit `width` columns (the terminal's at this refresh, so a
        resize redraws at the new width): the bar with done/total, then the rates, then the table."""
        rps, tps = stats.sample()
        count = f" {stats.done:,}/{stats.total:,} {100.0 * stats.done / max(stats.total, 1):.1f}%"
        bar = ProgressBar(
            total=max(stats.total, 1),
            completed=stats.done + stats.failed,
            width=max(10, min(60, width - len(count) - 1)),
        )
        top = Table.grid(padding=0)
        top.add_row(bar, Text(count, style="bold", no_wrap=True, overflow="ellipsis"))
        rates = Text.assemble(
            f"{rps:,.1f} req/s  {tps:,.0f} out tok/s  ETA {_hms(stats.eta(rps))}  ",
            (f"errors {stats.failed}", "red" if stats.failed else ""),
            f"  retries {stats.retries}",
            no_wrap=True,
            overflow="ellipsis",
        )
        table = Table(box=None, show_header=True, header_style="dim", pad_edge=False)
        for col in ("endpoint", "in flight", "done", "errors", "state"):
            right = col not in ("endpoint", "state")
            table.add_column(col, justify="right" if right else "left", no_wrap=True, overflow="ellipsis")
        for e in endpoints:
            table.add_row(
                e.name,
                str(e.in_flight),
                str(e.ok),
                str(e.errors),
                "up" if e.up else Text(_state(e)[1:-1], "red"),
            )
        return Group(top, rates, table)


def reporter_for(stream: IO[str], log_interval: float) -> Reporter:
    if stream.isatty():
        return RichReporter(Console(file=stream))
    return LogReporter(stream, log_interval)
