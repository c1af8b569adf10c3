"""`--watch N` of `sglfleet status` and `sglfleet job status`: draw a frame every N seconds, in place
(rich Live), until the frame says it is the last or Ctrl-C.

The clock and the number of frames are injectable, so tests run it without sleeping.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

# A frame: what to draw, the exit code it stands for, and whether it is the last (a finished job).
Frame = tuple[Any, int, bool]


def positive_seconds(text: str) -> float:
    """`--watch`'s value: seconds between frames, a positive number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds (write --watch after the other arguments, or --watch S)"
        ) from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def add_watch_arg(parser: argparse.ArgumentParser, until: str) -> None:
    parser.add_argument(
        "--watch",
        type=positive_seconds,
        nargs="?",
        const=2.0,
        default=None,
        metavar="S",
        help=f"redraw every S seconds (2 when S is left out) {until}; the exit status is the last frame's",
    )


def watch(
    frame: Callable[[], Frame],
    interval: float,
    console: Console,
    *,
    sleep: Callable[[float], None] = time.sleep,
    max_frames: int | None = None,
) -> int:
    """Draw `frame()` every `interval` seconds in place until a frame is the last, `max_frames` were
    drawn, or Ctrl-C; the exit code of the last frame drawn."""
    from rich.live import Live

    drawn, code = 0, 0
    with Live(console=console, auto_refresh=False, transient=False) as live:
        try:
            while True:
                renderable, code, last = frame()
                live.update(renderable, refresh=True)
                drawn += 1
                if last or (max_frames is not None and drawn >= max_frames):
                    break
                sleep(interval)
        except KeyboardInterrupt:  # the watcher stops watching; what it watches goes on
            pass
    if not console.is_terminal:  # off a terminal Live ends its one frame without a newline
        console.line()
    return code
