"""The stand-in's scheduler watchdog keeps SGLang 0.5.12's timing (sglang/srt/utils/watchdog.py:133-163):
it looks every timeout/2, fires after the forward counter stalled longer than the timeout, and waits 5 s
"so that the parent process can print the error" before the SIGQUIT. On a fake clock: no wall-clock bound."""

from __future__ import annotations

import threading

from sglfleet_testing.standin.watchdog import PARENT_PRINT_SECONDS, watch


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_stalled_counter_fires_after_the_timeout_and_the_parents_print_time() -> None:
    clock = FakeClock()
    fired = threading.Event()
    fired_at: list[float] = []

    def fire() -> None:
        fired_at.append(clock.now)
        fired.set()

    thread = watch(1.0, lambda: 3, lambda: True, fire=fire, sleep=clock.sleep, clock=clock)
    thread.join(timeout=30)
    assert fired.is_set()
    # counter 3 seen at 0.0 (it moved from 0), then stalled: 0.5, 1.0 are within the timeout, 1.5 is past it
    assert clock.slept == [0.5, 0.5, 0.5, PARENT_PRINT_SECONDS] and PARENT_PRINT_SECONDS == 5.0
    assert fired_at == [6.5]
