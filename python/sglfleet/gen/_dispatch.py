"""Which endpoint gets the next request: the healthy one with the fewest requests in flight.

Each endpoint takes at most ``concurrency`` requests at a time. A request waits for a free slot
and then goes to the endpoint with the fewest in flight (ties go to the one that finished most
recently, then the first listed), so a slow server simply holds on to its slots longer and gets
fewer requests: no round robin, no slow instance stalling the rest.

With a :class:`~sglfleet.gen._affinity.PrefixAffinity` (``--dispatch prefix``), a request whose
prompt prefix an endpoint served last goes there instead, while that endpoint has a free slot and
at most ``slack`` more requests in flight than the least-loaded one. When it is full, the request
waits for it while its load (in flight plus waiting for it) stays within ``slack`` of the
least-loaded endpoint's, and a slot it frees is kept for such a waiter; beyond that the request
spills to the least-loaded endpoint. An endpoint a request avoids, or one that is down, is never waited for;
everything else above holds.

An endpoint that stops answering (``down_after`` connection errors, timeouts or 502/503/504 in a
row) is taken out; a prober asks its ``/health`` until it answers 200 and puts it back.

An endpoint that stalls (requests in flight, none completed for ``stall_factor`` times its own recent
latency, at least ``stall_min`` seconds, while another endpoint completes requests: a frozen
process keeps its sockets open and never answers) is found by :meth:`find_stalled` and taken out
the same way by :meth:`mark_stalled`; the engine then sends its requests to another endpoint too.
Time our own process did not run (a SIGSTOP of `sglfleet generate`, found by :class:`PauseWatch`)
counts against no endpoint (:meth:`EndpointPool.forgive`).
An endpoint that answers 401/403 is taken out for good (a key does not fix itself).

A request can be overdue on its own, without its endpoint stalling as a whole: behind a router (one
endpoint for the pool) a frozen worker holds only the requests the router gave it. :meth:`overdue`
judges one request against the latencies this job has seen, per token of ``max_tokens`` when the
request has one (an EWMA of latency / max_tokens, times ``stall_factor``, at least ``stall_min``),
while the job still gets answers, or past ``QUIET_FACTOR`` times that limit when nothing answers (a
router may have sent every request in flight to the one worker that froze); the runner then
re-sends it (see :mod:`sglfleet.gen._requests`).

Time comes from ``clock`` (the running loop's by default), so that tests drive stalls and overdue
requests with a fake clock.

With ``watch_interval``, the endpoints that are up are asked too, every ``watch_interval`` seconds:
one that does not answer 200 is taken out the same way. That is how a draining SGLang is seen: on
SIGTERM, SGLang 0.5.12 keeps accepting and answering requests and only its ``/health*`` answer 503
(sglang/srt/entrypoints/http_server.py:515-517); it exits once no request is left
(managers/tokenizer_manager.py:2375-2411), so a client that kept sending would hold a rolling
restart until systemd's stop timeout kills the instance.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import enum
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sglfleet.gen._affinity import PrefixAffinity

__all__: list[str] = []


@dataclass(eq=False)
class Endpoint:
    url: str
    index: int
    in_flight: int = 0
    reserved: int = 0  # free slots handed to a woken waiter that has not taken them yet
    up: bool = True
    failures_in_row: int = 0
    sent: int = 0
    ok: int = 0
    errors: int = 0
    last_release: float = 0.0
    probes: int = 0
    latency: float | None = None  # moving average of the seconds an answered request took
    last_done: float = 0.0  # loop time of the last answer
    busy_since: float = 0.0  # loop time it last went from idle to busy
    stalls: int = 0
    auth_failed: bool = False
    latency_buckets: list[int] = field(default_factory=list, repr=False)
    latency_sum: float = 0.0
    latency_count: int = 0
    stalled: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _prober: asyncio.Task[None] | None = field(default=None, repr=False)
    _watcher: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.url.removeprefix("http://").removeprefix("https://").rstrip("/")


Probe = Callable[[Endpoint], Awaitable[bool]]
Clock = Callable[[], float]
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
LATENCY_WEIGHT = 0.2  # of the newest sample in the moving average
QUIET_FACTOR = 4.0  # an overdue request while nothing answers: judged past this many times its limit


class NoEndpoint(RuntimeError):
    """No endpoint answered for longer than the pool's ``down_timeout``."""


class KeyRefused(NoEndpoint):
    """Every endpoint that answers refused the API key (401/403); the ones down are not waited for."""


class Release(enum.StrEnum):
    """What became of an attempt, said when its slot goes back (:meth:`EndpointPool.release`)."""

    OK = "ok"
    ERROR = "error"  # answered, but a failure that says nothing about the endpoint's health
    DOWN = "down"  # no answer, a timeout, 502/503/504
    AUTH = "auth"  # 401/403
    CANCELLED = "cancelled"  # we gave up on it: an interrupt, or another endpoint answered first


class PauseWatch:
    """The gaps when our own process did not run, seen by a task meant to wake every ``interval`` s
    (:meth:`tick` with the loop's time each time it wakes): a wake-up more than half an interval late
    means the process was stopped (SIGSTOP, a suspended VM) or its event loop blocked for that long,
    and no endpoint could be heard meanwhile (:meth:`EndpointPool.forgive`)."""

    def __init__(self, interval: float, now: float) -> None:
        self.interval = interval
        self.last = now

    def tick(self, now: float) -> float:
        """Seconds the process was not running since the last tick; 0.0 when it woke on time."""
        late = now - self.last - self.interval
        self.last = now
        return late if late > self.interval / 2 else 0.0


class EndpointPool:
    def __init__(
        self,
        urls: list[str],
        concurrency: int,
        probe: Probe,
        *,
        down_after: int = 3,
        probe_interval: float = 1.0,
        probe_interval_max: float = 10.0,
        down_timeout: float = 600.0,
        stall_factor: float = 8.0,
        stall_min: float = 2.0,
        watch_interval: float | None = None,
        affinity: PrefixAffinity | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not urls:
            raise ValueError("at least one endpoint is needed")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.endpoints = [Endpoint(u.rstrip("/"), i) for i, u in enumerate(urls)]
        self.concurrency = concurrency
        self.down_after = down_after
        self.probe_interval = probe_interval
        self.probe_interval_max = probe_interval_max
        self.down_timeout = down_timeout
        self.stall_factor = stall_factor
        self.stall_min = stall_min
        for ep in self.endpoints:
            ep.latency_buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.watch_interval = watch_interval
        self.affinity = affinity
        self._probe = probe
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._wants: dict[asyncio.Future[None], int] = {}  # waiter -> the endpoint its prefix prefers
        self._handed: dict[asyncio.Future[None], Endpoint] = {}  # woken waiter -> the slot kept for it
        self._clock = 0.0  # a counter, not time: orders releases for tie-breaking
        self._closed = False
        self._watching = False  # the watchers are started (by the first acquire)
        self._time = clock  # None: the running loop's clock
        # the job's latencies, whatever the endpoint: for requests overdue on their own
        self.per_token: float | None = None  # EWMA of latency / max_tokens (requests that set it)
        self.per_request: float | None = None  # EWMA of latency (every request)
        self.last_answer: float | None = None  # when the job last got an answer

    def now(self) -> float:
        """The pool's time: its clock's, else the running loop's."""
        return self._time() if self._time is not None else asyncio.get_running_loop().time()

    @property
    def capacity(self) -> int:
        return self.concurrency * len(self.endpoints)

    def in_flight(self) -> int:
        return sum(e.in_flight for e in self.endpoints)

    def _pick(self, avoid: Endpoint | None) -> Endpoint | None:
        best: Endpoint | None = None
        for ep in self.endpoints:
            if not ep.up or ep.in_flight + ep.reserved >= self.concurrency:
                continue
            if best is None or (ep.in_flight, -ep.last_release) < (best.in_flight, -best.last_release):
                best = ep
        if best is avoid and avoid is not None:
            # a retry prefers another endpoint when one has a free slot
            others = [e for e in self.endpoints if e is not avoid and e.up and self._free(e)]
            if others:
                best = min(others, key=lambda e: (e.in_flight, -e.last_release))
        return best

    def _free(self, ep: Endpoint) -> bool:
        return ep.in_flight + ep.reserved < self.concurrency

    def _pick_for(self, avoid: Endpoint | None, keys: list[int]) -> tuple[Endpoint | None, int | None]:
        """Where a request with these prefix ``keys`` goes: (the endpoint, None), or (None, the
        endpoint's index it waits for), or (None, None) when no slot is free anywhere.

        The endpoint holding the longest of ``keys`` takes it while its load allows (a free slot, at
        most ``slack`` more in flight than the least-loaded one). Full, it is waited for while its
        load (in flight plus the requests waiting for it, this one included) stays within ``slack``
        of the least-loaded endpoint's (like the router's cache_aware balance threshold): a request
        sent to another endpoint pays its whole prefill there and pushes that endpoint's prefixes
        out of its cache. Beyond that the request spills to the least-loaded endpoint (and the prefix's record
        moves there). An endpoint that is down, or that the request avoids (it stalled or failed
        under it), is never waited for."""
        affinity = self.affinity
        assert affinity is not None
        best = self._pick(avoid)
        index = affinity.preferred(keys)
        if index is None:
            return best, None
        ep = self.endpoints[index]
        if ep is avoid or not ep.up:
            if best is not None:
                affinity.misses += 1
            return best, None
        if self._free(ep):
            if best is None or ep is best or ep.in_flight <= best.in_flight + affinity.slack:
                affinity.hits += 1
                return ep, None
            affinity.misses += 1
            return best, None
        waiting = [0] * len(self.endpoints)
        for wanted in self._wants.values():
            waiting[wanted] += 1
        least = min(e.in_flight + waiting[e.index] for e in self.endpoints if e.up and e is not avoid)
        if ep.in_flight + waiting[index] < least + affinity.slack:
            return None, index
        if best is not None:
            affinity.misses += 1
        return best, None

    async def acquire(self, avoid: Endpoint | None = None, body: bytes | None = None) -> Endpoint:
        """Wait for a free slot on a healthy endpoint and take it. With prefix affinity, ``body`` (the
        request's JSON) says which prompt prefixes it carries."""
        if not self._watching:
            self._start_watchers()
        all_down_since: float | None = None
        keys = self.affinity.keys(body) if self.affinity is not None and body is not None else None
        while True:
            wait_for = None
            if keys:
                ep, wait_for = self._pick_for(avoid, keys)
            else:
                ep = self._pick(avoid)
            if ep is not None:
                if keys:
                    self.affinity.record(keys, ep.index)  # type: ignore[union-attr]
                if ep.in_flight == 0:
                    ep.busy_since = self.now()
                ep.in_flight += 1
                ep.sent += 1
                return ep
            timeout = None
            if not any(e.up for e in self.endpoints):
                all_down_since = all_down_since or self.now()
                timeout = self.down_timeout - (self.now() - all_down_since)
                if timeout <= 0:
                    raise NoEndpoint(f"no endpoint has answered for {self.down_timeout:g} s")
                refused = [e.url for e in self.endpoints if e.auth_failed]
                if refused:  # a 401/403 is an answer: no need to wait for the endpoints that are down
                    raise KeyRefused(
                        f"{', '.join(refused)} refused the API key (401/403) and no other endpoint "
                        "answers: check the API key"
                    )
            else:
                all_down_since = None
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            if wait_for is not None:
                self._wants[fut] = wait_for
            try:
                if timeout is None:
                    await fut  # the common wait: no timer
                else:
                    await asyncio.wait_for(fut, timeout)
            except TimeoutError:
                continue
            finally:
                if not fut.done() or fut.cancelled():  # still queued (a woken one was taken off)
                    fut.cancel()
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(fut)
                self._wants.pop(fut, None)
                handed = self._handed.pop(fut, None)
                if handed is not None:  # the slot kept for it is free again: the loop above takes it
                    handed.reserved -= 1

    def _wake_for(self, ep: Endpoint) -> None:
        """A slot of ``ep`` is free: wake the first waiter whose prefix ``ep`` holds, else the first
        that waits for no endpoint in particular (it loses nothing anywhere), and keep the slot for
        it until it runs (else a request arriving in between takes it: the releasing worker's next
        one, whose own endpoint is full, would spill there); with neither, wake the first."""
        wants = self._wants
        if wants:
            free = None
            for fut in self._waiters:
                if fut.done():
                    continue
                wanted = wants.get(fut)
                if wanted == ep.index:
                    free = fut
                    break
                if wanted is None and free is None:
                    free = fut
            if free is not None:
                self._waiters.remove(free)
                wants.pop(free, None)  # no longer in line for ep: the slot is kept for it
                free.set_result(None)
                ep.reserved += 1
                self._handed[free] = ep
                return
        self._wake()

    def _wake(self, n: int = 1) -> None:
        while n and self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                n -= 1

    def detach(self, ep: Endpoint) -> None:
        """An overdue request stops counting against ``ep``'s slots (it stays in flight, its
        re-send needs a slot: behind a router every slot may be held by requests a frozen worker
        holds). Its :meth:`release` then passes ``held=False``."""
        ep.in_flight -= 1
        if ep.up:
            self._wake_for(ep)

    def release(
        self,
        ep: Endpoint,
        outcome: Release,
        latency: float | None = None,
        max_tokens: int | None = None,
        held: bool = True,
    ) -> None:
        """Give a slot back, with what became of the attempt (:class:`Release`). ``held``: False when
        the slot was already given back (:meth:`detach`)."""
        if held:
            ep.in_flight -= 1
        self._clock += 1
        ep.last_release = self._clock
        if latency is not None and outcome in (Release.OK, Release.ERROR):
            self._answered(ep, latency, max_tokens)
        if outcome is Release.AUTH:
            ep.errors += 1
            if not ep.auth_failed:
                ep.auth_failed = True
                if ep.up:
                    ep.up = False
                    self._wake(len(self._waiters))
        elif outcome is Release.DOWN:
            ep.errors += 1
            ep.failures_in_row += 1
            if ep.up and ep.failures_in_row >= self.down_after:
                self.take_out(ep)
        elif outcome is not Release.CANCELLED:
            ep.failures_in_row = 0
            if outcome is Release.OK:
                ep.ok += 1
            else:
                ep.errors += 1
        if ep.up:
            self._wake_for(ep)

    def _answered(self, ep: Endpoint, latency: float, max_tokens: int | None = None) -> None:
        ep.last_done = self.last_answer = self.now()
        ep.latency = latency if ep.latency is None else ep.latency + LATENCY_WEIGHT * (latency - ep.latency)
        self.per_request = _ewma(self.per_request, latency)
        if max_tokens:
            self.per_token = _ewma(self.per_token, latency / max_tokens)
        ep.latency_buckets[bisect.bisect_left(LATENCY_BUCKETS, latency)] += 1
        ep.latency_sum += latency
        ep.latency_count += 1

    def stall_limit(self, ep: Endpoint) -> float:
        """Seconds without an answer after which ``ep``, busy, counts as stalled."""
        latency = ep.latency
        if latency is None:  # never answered yet: judge it by the others
            known = [e.latency for e in self.endpoints if e.latency is not None]
            latency = max(known) if known else 0.0
        return max(self.stall_min, self.stall_factor * latency)

    def find_stalled(self, now: float) -> list[Endpoint]:
        """Busy endpoints that answered nothing for longer than their stall limit, while another
        endpoint answered within that time (all quiet means slow work, not a stall)."""
        out = []
        for ep in self.endpoints:
            if not ep.up or ep.in_flight == 0:
                continue
            quiet = now - max(ep.last_done, ep.busy_since)
            if quiet <= self.stall_limit(ep):
                continue
            if any(o is not ep and o.up and now - o.last_done < quiet for o in self.endpoints):
                out.append(ep)
        return out

    def forgive(self, seconds: float) -> None:
        """Our own process did not run for ``seconds`` (SIGSTOP then SIGCONT, a suspended VM, the event
        loop blocked): no endpoint could be heard meanwhile, so that time counts against none of them
        (their quiet time is measured from ``seconds`` later; the order among them is kept)."""
        for ep in self.endpoints:
            ep.last_done += seconds
            ep.busy_since += seconds
        if self.last_answer is not None:
            self.last_answer += seconds

    def overdue_limit(self, max_tokens: int | None) -> float | None:
        """Seconds after which a request with this ``max_tokens`` is overdue; None while the job has
        no latency to judge by."""
        if max_tokens and self.per_token is not None:
            expected = self.per_token * max_tokens
        elif self.per_request is not None:
            expected = self.per_request
        else:
            return None
        return max(self.stall_min, self.stall_factor * expected)

    def overdue(self, started: float, max_tokens: int | None, now: float, patience: float = 1.0) -> bool:
        """True when a request sent at ``started`` has waited past its limit (times ``patience``)
        while the job got an answer within that limit (the rest of the fleet moves; this one does not)."""
        limit = self.overdue_limit(max_tokens)
        if limit is None:
            return False
        limit *= patience
        if now - started <= limit:
            return False
        if self.last_answer is not None and now - self.last_answer < limit:
            return True
        # all quiet: slow work, or every request in flight on one frozen worker (a router's
        # cache_aware may send a whole shared prefix to one): judged so only much later
        return now - started > QUIET_FACTOR * limit

    def mark_stalled(self, ep: Endpoint) -> None:
        """Take ``ep`` out as stalled and wake the requests in flight on it (they go elsewhere too)."""
        ep.stalls += 1
        ep.failures_in_row = 0
        self.take_out(ep)
        ep.stalled.set()

    def take_out(self, ep: Endpoint) -> None:
        """Stop sending to ``ep``; a prober puts it back once its ``/health`` answers 200."""
        ep.up = False
        if self.affinity is not None:  # it may come back restarted, its prefix cache empty
            self.affinity.forget(ep.index)
        if not self._closed:
            ep._prober = asyncio.get_running_loop().create_task(self._probe_until_up(ep))
        # waiters blocked on "all endpoints down" must re-check their deadline
        self._wake(len(self._waiters))

    async def _probe_until_up(self, ep: Endpoint) -> None:
        delay = self.probe_interval
        while not self._closed:
            await asyncio.sleep(delay)
            ep.probes += 1
            try:
                healthy = await self._probe(ep)
            except Exception:
                healthy = False
            if healthy:
                ep.up = True
                ep.failures_in_row = 0
                ep.stalled = asyncio.Event()
                ep.last_done = ep.busy_since = self.now()
                self._wake(self.concurrency)
                return
            delay = min(delay * 2, self.probe_interval_max)

    def _start_watchers(self) -> None:
        if self.watch_interval is None or self._closed:
            return
        self._watching = True
        for ep in self.endpoints:
            if ep._watcher is None:
                ep._watcher = asyncio.get_running_loop().create_task(self._watch(ep))

    async def _watch(self, ep: Endpoint) -> None:
        """While `ep` is up, ask its /health every watch_interval s; take it out unless it says 200."""
        assert self.watch_interval is not None
        while not self._closed:
            await asyncio.sleep(self.watch_interval)
            if not ep.up:
                continue  # the prober has it
            try:
                healthy = await self._probe(ep)
            except Exception:
                healthy = False
            if not healthy and ep.up and not self._closed:
                self.take_out(ep)

    async def aclose(self) -> None:
        self._closed = True
        probers = [e._prober for e in self.endpoints if e._prober and not e._prober.done()]
        probers += [e._watcher for e in self.endpoints if e._watcher and not e._watcher.done()]
        for task in probers:
            task.cancel()
        for task in probers:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _ewma(average: float | None, sample: float) -> float:
    return sample if average is None else average + LATENCY_WEIGHT * (sample - average)
