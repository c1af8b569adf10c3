"""Waiting in tests (every tier): poll a condition, never sleep a fixed time to let something happen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], *, timeout: float, what: str, interval: float = 0.02) -> T:
    """Poll `condition` until it returns something truthy (returned); fail naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not so after {timeout:.1f} s")
        time.sleep(interval)
