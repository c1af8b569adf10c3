"""The live display of `sglfleet generate` on a terminal: every line fits the terminal's width (80
and 120 columns, and whatever it is resized to: the frame is laid out at each refresh's width), so a
line never wraps and a redraw leaves no stale line behind."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.text import Text

from sglfleet.gen._dispatch import Endpoint
from sglfleet.gen._progress import RichReporter, Stats


def _busy() -> tuple[Stats, list[Endpoint]]:
    """A big job well under way, with large numbers in every field."""
    stats = Stats(total=193_000, done=81_234, failed=1_234, retries=45_678)
    stats.done_this_run, stats.completion_tokens_this_run = 81_234, 51_234_567
    endpoints = [
        Endpoint(f"http://10.0.0.{i}:{30000 + i}", i, in_flight=128, ok=10_234, errors=12) for i in range(8)
    ]
    endpoints[3].up = False
    return stats, endpoints


@pytest.mark.parametrize("width", [60, 80, 120, 200])
def test_every_line_fits_the_terminal(width: int) -> None:
    stats, endpoints = _busy()
    console = Console(file=io.StringIO(), force_terminal=True, width=width)
    with RichReporter(console) as reporter:  # what the live display draws, at the console's width
        reporter.update(stats, endpoints)
    assert all(len(line) <= width for line in Text.from_ansi(console.file.getvalue()).plain.splitlines())  # type: ignore[attr-defined]
    console = Console(file=io.StringIO(), force_terminal=True, width=width)
    console.print(RichReporter.frame(stats, endpoints, width))  # one frame alone
    drawn = Text.from_ansi(console.file.getvalue()).plain  # type: ignore[attr-defined]
    lines = [line for line in drawn.splitlines() if line.strip()]
    assert all(len(line) <= width for line in lines), "\n".join(lines)
    assert lines[0].rstrip().endswith("81,234/193,000 42.1%")  # the count is never cut
    assert lines[1].startswith(" ") is False and "req/s" in lines[1]
    assert len(lines) == 2 + 1 + len(endpoints)  # bar, rates, header, one row each: nothing wrapped


def test_a_resize_lays_the_next_frame_out_at_the_new_width() -> None:
    stats, endpoints = _busy()
    wide = RichReporter.frame(stats, endpoints, 120)
    narrow = RichReporter.frame(stats, endpoints, 80)
    console = Console(file=io.StringIO(), width=80)
    console.print(narrow)
    assert max(len(line) for line in console.file.getvalue().splitlines()) <= 80  # type: ignore[attr-defined]
    assert wide.renderables[0] is not narrow.renderables[0]
