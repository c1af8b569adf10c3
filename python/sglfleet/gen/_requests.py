"""The request lifecycle: each request of a run sent, retried, re-sent and recorded, exactly once.

A :class:`RequestRunner` starts one worker per request slot of the endpoint pool (twice as many with
prefix affinity); a worker takes the next request and sees it through: an attempt on the endpoint
with the fewest in flight, retries with backoff (another endpoint each time), every turn of a
conversation with ``--turns all``, then its result or its error written to the output. A request
whose endpoint stalls is sent to another endpoint too; the first answer wins and is written once.
So is a request that is overdue on its own (:meth:`EndpointPool.overdue`: the job's latencies for its
``max_tokens``, while other answers keep coming), which is what a frozen worker behind a router looks
like: the re-send goes to another endpoint where there is one, else through the router again, and a
re-send overdue in turn is given up and sent again, at most ``max_resends`` times.
A stop (a signal, a fatal error) ends the sending; the requests in flight get the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from sglfleet.exitcodes import ExitCode
from sglfleet.gen import _client as client
from sglfleet.gen._dispatch import Endpoint, EndpointPool, KeyRefused, NoEndpoint, PauseWatch, Release
from sglfleet.gen._formats import InputChanged, Request
from sglfleet.gen._progress import Stats
from sglfleet.gen._store import OutputStore

if TYPE_CHECKING:
    from sglfleet.gen._config import GenerateConfig

__all__: list[str] = []


def is_disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class _Halt(Exception):
    """Ends the run with an exit code (raised inside request handlers, caught by them)."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class RequestPolicy:
    """What the requests of a run are held to: the job's settings a request's lifecycle reads."""

    request_timeout: float  # seconds per attempt
    max_retries: int
    backoff_base: float
    backoff_cap: float
    max_resends: int  # times one request is sent elsewhere because its endpoint stalled
    grace: float  # seconds the requests in flight get after a stop
    keep_reasoning: bool  # the answer's reasoning_content kept in the conversation written
    source: Path  # the input, named when it cannot be read

    @classmethod
    def of(cls, config: GenerateConfig) -> RequestPolicy:
        """The policy of a job's settings."""
        return cls(
            request_timeout=config.request_timeout,
            max_retries=config.max_retries,
            backoff_base=config.backoff_base,
            backoff_cap=config.backoff_cap,
            max_resends=config.max_resends,
            grace=config.grace,
            keep_reasoning=config.params.keep_reasoning,
            source=Path(config.input),
        )


@dataclass(eq=False)
class _Ticket:
    """An attempt in flight: what :meth:`RequestRunner.resend_stalled` needs to send it elsewhere too."""

    url: str
    body: bytes
    task: asyncio.Task[Any]
    started: float = 0.0  # pool time it was sent
    max_tokens: int | None = None
    detached: bool = False  # overdue: its slot was given back (EndpointPool.detach)
    settled: bool = False  # the waiting task has its answer (or gave up): nothing more to do
    hedge: asyncio.Task[None] | None = None
    resends: int = 0  # times it was sent to another endpoint because the one it waited on stalled
    won: tuple[client.Attempt, Endpoint] | None = None  # the other endpoint's answer, when it came first


@dataclass
class _Answer:
    """What one request (all its turns) came to."""

    attempt: client.Attempt
    conversation: list[dict[str, Any]] | None = None
    usage: tuple[int, int] = (0, 0)


def _release_of(a: client.Attempt) -> Release:
    """What an answered attempt says about its endpoint."""
    if a.endpoint_down:
        return Release.DOWN
    if a.kind is client.Kind.AUTH:
        return Release.AUTH
    return Release.OK if a.kind is client.Kind.OK else Release.ERROR


def max_tokens_of(body: bytes) -> int | None:
    """The ``max_tokens`` of a JSON request body, read without parsing it (None when absent)."""
    i = body.find(b'"max_tokens"')
    if i < 0:
        return None
    j = body.find(b":", i + 12)
    if j < 0:
        return None
    j += 1
    while j < len(body) and body[j] in b" \t":
        j += 1
    k = j
    while k < len(body) and 48 <= body[k] <= 57:
        k += 1
    return int(body[j:k]) if k > j else None


def _usage(body: Any) -> tuple[int, int]:
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


class RequestRunner:
    """The requests of one run (one event loop): the workers, the attempts in flight, and why the
    run stopped (``fatal``, ``fatal_code``) when it did."""

    def __init__(
        self,
        policy: RequestPolicy,
        *,
        store: OutputStore,
        stats: Stats,
        pool: EndpointPool,
        session: aiohttp.ClientSession,
        stop: asyncio.Event,
    ) -> None:
        self.policy = policy
        self.store = store
        self.stats = stats
        self.pool = pool
        self.session = session
        self.stop = stop
        self.fatal: str | None = None
        self.fatal_code = ExitCode.FATAL
        self.rng = random.Random()
        self.timeout = aiohttp.ClientTimeout(total=policy.request_timeout)
        self.tasks: set[asyncio.Task[None]] = set()
        self.tickets: dict[Endpoint, set[_Ticket]] = {}

    def halt(self, fatal: str | None = None, code: ExitCode = ExitCode.FATAL) -> None:
        if fatal and not self.fatal:
            self.fatal, self.fatal_code = fatal, code
        self.stop.set()

    def halt_on_write_error(self, what: str, exc: OSError) -> None:
        if is_disk_full(exc):
            self.halt(f"no space left for {what} ({exc.strerror}); free some and rerun", ExitCode.DISK_FULL)
        else:
            self.halt(f"cannot write {what}: {exc}")

    # -- every request ------------------------------------------------------------------------

    async def send_all(self, batches: Iterator[list[Request]], force: asyncio.Event) -> None:
        """Send every request and wait for the answers; on a stop, give the requests in flight the
        grace period (none after a fatal error), or until ``force`` is set."""
        feeder = asyncio.create_task(self.start_workers(batches))
        stop_wait = asyncio.create_task(self.stop.wait())
        try:
            await asyncio.wait({feeder, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if feeder.done():
                feeder.result()
                # everything is dispatched: wait for the rest, unless told to stop
                while self.tasks and not self.stop.is_set():
                    await asyncio.wait({*self.tasks, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if self.stop.is_set() and self.tasks:
                await self._grace(force)
        finally:
            stop_wait.cancel()
            if not feeder.done():
                feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError, InputChanged):
                await feeder

    async def _grace(self, force: asyncio.Event) -> None:
        """Let the requests in flight finish within the grace period (or until ``force``), then end them."""
        force_wait = asyncio.create_task(force.wait())
        grace = asyncio.create_task(self.wait_in_flight(self.policy.grace if not self.fatal else 0))
        await asyncio.wait({grace, force_wait}, return_when=asyncio.FIRST_COMPLETED)
        force_wait.cancel()
        grace.cancel()
        await self.cancel_in_flight()

    async def start_workers(self, batches: Iterator[list[Request]]) -> None:
        """Start the workers, one per request slot of the pool, each taking the next request and
        seeing it through (its retries included: a request waiting to retry holds its worker, so
        requests in flight + waiting to retry stay within the capacity). Not a task per request,
        nor more workers than slots (they would queue for a slot on every release): both cost
        throughput. The input is read on the loop, a batch at a time as the workers need it (a
        thread reading it would compete with the loop for the interpreter).

        With prefix affinity, twice as many: a freed slot then has waiting requests to choose from
        (the one whose prefix its endpoint holds, EndpointPool._wake_for); with exactly one worker per
        slot nobody ever waits, and every request goes to the one free slot, wherever it is."""
        requests = itertools.chain.from_iterable(batches)
        workers = self.pool.capacity * (2 if self.pool.affinity is not None else 1)
        for _ in range(workers):
            task = asyncio.create_task(self._work_through(requests))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _work_through(self, requests: Iterator[Request]) -> None:
        try:
            while not self.stop.is_set():
                req = next(requests, None)  # one iterator shared by every worker, read in turn
                if req is None:
                    return
                await self.see_through(req)
        except InputChanged as exc:
            self.halt(str(exc), ExitCode.INPUT_CHANGED)
        except OSError as exc:  # reading the input (see_through catches its own write errors)
            self.halt(f"cannot read the input {self.policy.source}: {exc}")

    async def wait_in_flight(self, seconds: float | None) -> None:
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=seconds)

    async def cancel_in_flight(self) -> None:
        pending = list(self.tasks)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- one request --------------------------------------------------------------------------

    async def see_through(self, req: Request) -> None:
        """Send ``req`` (every turn of it) and write its result, or its error once it failed for good."""
        try:
            answer = await (self._regenerate_every_turn(req) if req.all_turns else self._complete_once(req))
            if answer is not None:
                self._record_result(req, answer)
        except _Halt as exc:
            self.halt(str(exc), exc.code)
        except KeyRefused as exc:
            self.halt(str(exc), ExitCode.AUTH)
        except NoEndpoint as exc:
            self.halt(str(exc), ExitCode.NO_ENDPOINT)
        except OSError as exc:
            self.halt_on_write_error(f"the output {self.store.output}", exc)
        except Exception as exc:
            # an answer or a bug nothing above foresaw: this request's error, in the errors file; never
            # the worker's death (the request neither done nor failed, the worker gone for the run)
            failed = client.Attempt(client.Kind.PERMANENT, message=f"{type(exc).__name__}: {exc}")
            self._record_failure(req, "internal_error", failed)

    async def _complete_once(self, req: Request) -> _Answer | None:
        a = await self._complete(req, req.url, req.body)
        if a is None:
            return None
        conversation = None
        if req.turns is not None:
            conversation = [*req.turns, self._assistant_turn(a.body)]
        return _Answer(a, conversation, _usage(a.body))

    async def _regenerate_every_turn(self, req: Request) -> _Answer | None:
        """SpecForge's regeneration: system and user turns kept, each assistant turn regenerated
        from the regenerated conversation before it (the old assistant turns are dropped)."""
        assert req.turns is not None
        base = orjson.loads(req.body)
        messages: list[dict[str, Any]] = []
        prompt = completion = 0
        last: client.Attempt | None = None
        for turn in req.turns:
            if turn["role"] == "assistant":
                continue
            messages.append(turn)
            if turn["role"] != "user":
                continue
            last = await self._complete(req, req.url, orjson.dumps({**base, "messages": messages}))
            if last is None:
                return None
            p, c = _usage(last.body)
            prompt, completion = prompt + p, completion + c
            messages = [*messages, self._assistant_turn(last.body)]
        assert last is not None
        # the recorded body is the last turn's, its usage the sum over every turn (what a resume
        # reads back, and what merge's minimum-length rule sees)
        body = dict(last.body)
        body["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        last.body, last.raw = body, b""
        return _Answer(last, messages, (prompt, completion))

    def _assistant_turn(self, body: Any) -> dict[str, Any]:
        message = body["choices"][0].get("message") or {}
        content = message.get("content")
        if content is None:  # a text completion
            content = body["choices"][0].get("text", "")
        turn: dict[str, Any] = {"role": "assistant", "content": content}
        if self.policy.keep_reasoning and message.get("reasoning_content") is not None:
            turn["reasoning_content"] = message["reasoning_content"]
        return turn

    async def _complete(self, req: Request, url: str, body: bytes) -> client.Attempt | None:
        """One completion with retries; None when it failed for good (recorded as a failure)."""
        attempts = 0
        waits = 0  # attempts not counted: their endpoint is down (the next acquire waits for one)
        avoid: Endpoint | None = None
        while not self.stop.is_set():
            a, ep = await self._attempt_or_its_resend(url, body, avoid)
            if a is None:  # stopped meanwhile
                return None
            if a.kind is client.Kind.OK:
                return a
            avoid = ep  # the next attempt goes elsewhere where it can
            if a.endpoint_down and not ep.up and waits < self.policy.max_retries:
                # taken out (a router with no healthy worker: /readiness 503): wait for an endpoint,
                # up to --down-timeout, rather than spend this request's retries
                waits += 1
                continue
            if a.kind is client.Kind.AUTH:
                self._halt_unless_an_endpoint_takes_the_key(ep, a)
                continue  # another endpoint may take the key; not this request's fault
            if a.kind is client.Kind.PERMANENT:
                self._record_failure(req, "http_error", a)
                return None
            attempts += 1
            delay = self._retry_delay(req, a, attempts)
            if delay is None or not await client.sleep(delay, self.stop):
                return None
        return None

    def _retry_delay(self, req: Request, a: client.Attempt, attempts: int) -> float | None:
        """Seconds to wait before the next attempt of a request whose ``attempts``-th failed; None
        when that was its last (its failure is recorded)."""
        if attempts > self.policy.max_retries:
            code = "invalid_response" if a.invalid_body else "retries_exhausted"
            self._record_failure(req, code, a, f" (after {attempts} attempts)")
            return None
        self.stats.retries += 1
        delay = client.backoff(attempts, self.policy.backoff_base, self.policy.backoff_cap, self.rng)
        if a.retry_after is not None:
            delay = max(delay, a.retry_after)
        return delay

    def _halt_unless_an_endpoint_takes_the_key(self, ep: Endpoint, a: client.Attempt) -> None:
        """A 401/403 is an answer: once no endpoint that is up takes the key, stop (exit 4), without
        waiting for the endpoints that are down to come back."""
        if not any(e.up and not e.auth_failed for e in self.pool.endpoints):
            status = {401: "401 Unauthorized", 403: "403 Forbidden"}.get(a.status or 0, f"HTTP {a.status}")
            raise _Halt(ExitCode.AUTH, f"{status} from {ep.url}: check the API key")

    async def _attempt_or_its_resend(
        self, url: str, body: bytes, avoid: Endpoint | None
    ) -> tuple[client.Attempt | None, Endpoint]:
        """One attempt, awaited in this task (no task per request: that costs throughput). Should its
        endpoint stall meanwhile, :meth:`resend_stalled` sends the same body to another endpoint too;
        when that answers first it cancels this await and its answer is returned instead."""
        ep = await self.pool.acquire(avoid, body)
        if self.stop.is_set():
            self.pool.release(ep, Release.CANCELLED)
            return None, ep
        max_tokens = max_tokens_of(body)
        ticket = _Ticket(url, body, asyncio.current_task(), self.pool.now(), max_tokens)  # type: ignore[arg-type]
        waiting = self.tickets.setdefault(ep, set())
        waiting.add(ticket)
        try:
            a = await self._post(ep, url, body, max_tokens, ticket)
            ticket.settled = True
            return a, ep
        except asyncio.CancelledError:
            if ticket.won is None:
                raise
            ticket.task.uncancel()  # our own cancellation: the other endpoint's answer won
            return ticket.won
        finally:
            ticket.settled = True
            waiting.discard(ticket)
            if ticket.hedge is not None and not ticket.hedge.done():
                ticket.hedge.cancel()

    # -- stalled endpoints --------------------------------------------------------------------

    async def resend_stalled(self, interval: float) -> None:
        """Every ``interval`` s: :meth:`resend_tick`. Time our own process did not run (SIGSTOP, found by
        :class:`PauseWatch`) is first forgiven: nobody could answer us meanwhile, so it counts against no
        endpoint and no request."""
        watch = PauseWatch(interval, self.pool.now())
        while True:
            await asyncio.sleep(interval)
            now = self.pool.now()
            paused = watch.tick(now)
            if paused:
                self.pool.forgive(paused)
                for tickets in self.tickets.values():
                    for ticket in tickets:
                        ticket.started += paused
            self.resend_tick(now)

    def resend_tick(self, now: float) -> None:
        """Take stalled endpoints out and re-send their requests elsewhere; re-send the requests
        overdue on their own (:meth:`EndpointPool.overdue`), each once at a time."""
        for ep in self.pool.find_stalled(now):
            self.pool.mark_stalled(ep)
            for ticket in list(self.tickets.get(ep, ())):
                if ticket.hedge is None and not ticket.settled:
                    ticket.hedge = asyncio.create_task(self._resend_elsewhere(ticket, ep))
        overdue = self.pool.overdue
        for ep, tickets in self.tickets.items():
            for ticket in tickets:
                if ticket.hedge is not None or ticket.settled:
                    continue
                if overdue(ticket.started, ticket.max_tokens, now):
                    self.stats.overdue += 1
                    ticket.detached = True
                    self.pool.detach(ep)
                    ticket.hedge = asyncio.create_task(self._resend_elsewhere(ticket, ep))

    async def _resend_elsewhere(self, ticket: _Ticket, stalled: Endpoint) -> None:
        """Send a request whose endpoint stalled to another endpoint, and again whenever that one
        stalls or fails too, at most ``max_resends`` times: the first answer wins (the waiting task
        takes it and cancels the rest), so it is written exactly once."""
        avoid = stalled
        while self._still_worth_a_resend(ticket):
            other = await self._acquire_another(avoid, ticket)
            if other is None:
                return
            ticket.resends += 1
            self.stats.resent += 1
            a = await self._attempt_unless_stalled(other, ticket)
            if a is not None and a.kind is not client.Kind.RETRY:
                if a.kind is client.Kind.OK and not ticket.settled:
                    ticket.won = (a, other)
                    ticket.settled = True
                    ticket.task.cancel()
                return  # answered; or refused (the request, the key): the waiting attempt's answer decides
            avoid = other
            if a is not None:  # it failed (not stalled): back off as a retry does
                delay = client.backoff(
                    ticket.resends, self.policy.backoff_base, self.policy.backoff_cap, self.rng
                )
                if not await client.sleep(delay, self.stop):
                    return

    def _still_worth_a_resend(self, ticket: _Ticket) -> bool:
        return not ticket.settled and not self.stop.is_set() and ticket.resends < self.policy.max_resends

    async def _acquire_another(self, avoid: Endpoint, ticket: _Ticket) -> Endpoint | None:
        """A slot on another endpoint than ``avoid`` for a re-send; None when there is none (the waiting
        task meets the same and says so) or the re-send is no longer needed."""
        try:
            other = await self.pool.acquire(avoid)
        except NoEndpoint:
            return None
        if ticket.settled or self.stop.is_set():
            self.pool.release(other, Release.CANCELLED)
            return None
        return other

    async def _attempt_unless_stalled(self, ep: Endpoint, ticket: _Ticket) -> client.Attempt | None:
        """:meth:`_post`, given up (None) as soon as ``ep`` is found stalled, or this attempt is
        overdue in turn (behind a router the re-send may have met the same frozen worker)."""
        stalled = ep.stalled  # this up period's event (a fresh one once the endpoint is back)
        pool = self.pool
        started = pool.now()
        attempt = asyncio.ensure_future(self._post(ep, ticket.url, ticket.body, ticket.max_tokens))
        waiter = asyncio.ensure_future(stalled.wait())
        # each re-send gets twice the time of the one before: behind a router, the worker that froze
        # may get it again until the router's health checks take that worker out (seconds)
        patience = 2.0 ** max(ticket.resends - 1, 0)
        try:
            while True:
                limit = pool.overdue_limit(ticket.max_tokens)
                done, _ = await asyncio.wait(
                    {attempt, waiter},
                    timeout=None if limit is None else limit * patience,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if done or pool.overdue(started, ticket.max_tokens, pool.now(), patience):
                    break
        finally:
            waiter.cancel()
            if not attempt.done():
                attempt.cancel()  # its slot goes back as "cancelled"
        if attempt.done() and not attempt.cancelled():
            return attempt.result()
        with contextlib.suppress(asyncio.CancelledError):
            await attempt  # it hands its slot back
        return None

    # -- one attempt, and what it came to -----------------------------------------------------

    async def _post(
        self,
        ep: Endpoint,
        url: str,
        body: bytes,
        max_tokens: int | None = None,
        ticket: _Ticket | None = None,
    ) -> client.Attempt:
        """POST to ``ep`` holding one of its slots; the slot goes back with what the answer says."""
        now = self.pool.now
        started = now()
        outcome = Release.CANCELLED
        latency = None
        try:
            a = await client.post(self.session, ep.url + url, body, self.timeout)
            latency = now() - started
            outcome = _release_of(a)
            return a
        finally:
            held = ticket is None or not ticket.detached
            self.pool.release(ep, outcome, latency, max_tokens, held)

    def _record_result(self, req: Request, answer: _Answer) -> None:
        a = answer.attempt
        raw = a.raw or None
        self.store.add_result(req.custom_id, a.request_id, a.body, raw, answer.conversation)
        prompt, completion = answer.usage
        self.stats.prompt_tokens += prompt
        self.stats.completion_tokens += completion
        self.stats.completion_tokens_this_run += completion
        self.stats.done += 1
        self.stats.done_this_run += 1

    def _record_failure(self, req: Request, code: str, a: client.Attempt, suffix: str = "") -> None:
        try:
            try:
                self.store.add_error(req.custom_id, code, a.message + suffix, a.status, a.body)
            except TypeError:  # a body JSON cannot write back (orjson: an integer over 64 bits): its text
                text = a.raw[:2000].decode("utf-8", "replace")
                self.store.add_error(req.custom_id, code, a.message + suffix, a.status, text)
        except OSError as exc:
            self.halt_on_write_error(f"the errors file {self.store.errors_path}", exc)
            return
        self.stats.failed += 1
