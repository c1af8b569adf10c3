"""SGLang 0.5.12's scheduler watchdog, and the hung forward loop it exists for.

SGLang (sglang 0.5.12, read from the wheel):

- ``--watchdog-timeout`` (``srt/server_args.py:460`` ``watchdog_timeout: float = 300``, flag at
  ``:5139-5144``: "If a forward batch takes longer than this, the server will crash to prevent hanging").
- The scheduler starts ``WatchdogRaw`` (``srt/managers/scheduler.py:1172-1176``,
  ``scheduler_runtime_checker_mixin.py:583-603``): it watches ``forward_ct`` (one more per forward batch)
  while a batch is current or while the scheduler initialises (``is_initializing or cur_batch is not None``,
  ``scheduler_runtime_checker_mixin.py:598-599``).
- ``srt/utils/watchdog.py:133-163`` ``_watchdog_once``: it looks every ``watchdog_timeout / 2`` seconds;
  when the counter has not moved for more than ``watchdog_timeout`` while busy, it logs (after a py-spy
  dump) ``Scheduler watchdog timeout (self.watchdog_timeout=300.0, self.soft=False)`` (the flag is a
  float) at error level, sleeps 5 s "so that the parent process can print the error", and sends SIGQUIT
  to its parent, the server's main process.
- The main process's SIGQUIT handler (``srt/managers/tokenizer_manager.py:2808-2817``
  ``running_phase_sigquit_handler``) logs ``SIGQUIT received. signum=None, frame=None. It usually means one
  child failed.`` (it is registered with ``loop.add_signal_handler``, ``tokenizer_manager.py:1635-1639``,
  so asyncio calls it with no arguments and both stay at their defaults) and calls
  ``kill_process_tree(os.getpid())`` (``srt/utils/common.py:1149-1186``): its children get SIGKILL, then
  the process SIGKILLs itself (``itself.kill()``). The server therefore ends killed by SIGKILL, unasked:
  ``sglfleet.launch`` reports that as exit 137, a failure, so that the unit's ``Restart=on-failure`` brings
  the instance back.

The stand-in is one process, scheduler and main process in one: the hang fault (``--standin-hang-after
N``) stops its forward loop after N forward batches (requests in flight and new ones never advance; HTTP
still accepts, and ``/health_generate`` answers 503 after ``SGLANG_HEALTH_CHECK_TIMEOUT`` seconds, as
SGLang's does when no generation comes back); this thread plays the scheduler's watchdog and sends
SIGQUIT to the process itself, whose handler does what SGLang's main process does.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger("sglfleet_testing.standin")

#: watchdog.py:162 `time.sleep(5)` before the SIGQUIT.
PARENT_PRINT_SECONDS = 5.0


def watch(
    timeout: float,
    get_counter: Callable[[], int],
    is_active: Callable[[], bool],
    *,
    fire: Callable[[], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.perf_counter,
) -> threading.Thread:
    """Start the watchdog thread (daemon): `fire` (SIGQUIT to this process) once the counter stalls;
    `clock` and `sleep` measure and spend the time (tests give a fake pair)."""

    def once() -> None:
        last_counter = 0
        last_time = clock()
        while True:
            current = clock()
            if is_active():
                counter = get_counter()
                if last_counter == counter:
                    if current > last_time + timeout:
                        break
                else:
                    last_counter, last_time = counter, current
            sleep(timeout / 2)
        log.error("Scheduler watchdog timeout (self.watchdog_timeout=%r, self.soft=False)", timeout)
        print(file=sys.stderr, flush=True)
        print(file=sys.stdout, flush=True)
        sleep(PARENT_PRINT_SECONDS)
        (fire or _sigquit_self)()

    thread = threading.Thread(target=once, name="scheduler-watchdog", daemon=True)
    thread.start()
    return thread


def _sigquit_self() -> None:
    os.kill(os.getpid(), signal.SIGQUIT)


def sigquit_handler() -> None:
    """running_phase_sigquit_handler: log, then kill_process_tree(os.getpid()), i.e. SIGKILL itself."""
    log.error("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)
