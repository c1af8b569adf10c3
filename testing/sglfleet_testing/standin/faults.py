"""Injected faults, drawn from a seeded RNG so a test run can be replayed exactly."""

from __future__ import annotations

import enum
import random


class Fault(enum.Enum):
    NONE = "none"
    ERROR = "error"  # answer 500 with an SGLang-like error body
    HANG = "hang"  # never answer


class FaultInjector:
    """Decides each generation request's fault, in arrival order, and when to crash."""

    def __init__(self, *, error_rate: float, hang_rate: float, crash_after: int | None, seed: int) -> None:
        self.error_rate = error_rate
        self.hang_rate = hang_rate
        self.crash_after = crash_after
        self.answered = 0
        self._rng = random.Random(f"standin-faults-{seed}")

    def draw(self) -> Fault:
        if not (self.error_rate or self.hang_rate):
            return Fault.NONE
        x = self._rng.random()
        if x < self.error_rate:
            return Fault.ERROR
        if x < self.error_rate + self.hang_rate:
            return Fault.HANG
        return Fault.NONE

    def answered_one(self) -> bool:
        """Count an answered generation request; True when the process must now crash."""
        self.answered += 1
        return self.crash_after is not None and self.answered >= self.crash_after
