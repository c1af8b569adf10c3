"""The engine: admission, the deterministic model, the latency model and the load figures.

Latency model: a request holds a running slot for `ttft + completion_tokens / decode_tps`
seconds (asyncio sleeps, no CPU); with both at 0 it never sleeps at all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Sequence

from sglfleet_testing.standin.config import StandinConfig
from sglfleet_testing.standin.metrics import Metrics, Stats
from sglfleet_testing.standin.model import Completion, DeterministicModel
from sglfleet_testing.standin.scheduler import Scheduler

log = logging.getLogger("sglfleet_testing.standin")

PREFIX_CACHE_ENTRIES = 1_000_000


class ContextOverflow(ValueError):
    """A request that does not fit the context length; its message is SGLang's."""


@dataclasses.dataclass(frozen=True)
class Job:
    prompt: str
    prompt_tokens: int
    max_new_tokens: int
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    seed: int | None = None


@dataclasses.dataclass(frozen=True)
class Result:
    completion: Completion
    prompt_tokens: int
    cached_tokens: int
    e2e_latency: float


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One streamed token: its text delta and id; `result` is set on the last chunk only."""

    delta: str
    token_ids: list[int]
    result: Result | None = None


class Engine:
    def __init__(self, config: StandinConfig) -> None:
        self.config = config
        self.model = DeterministicModel(config.seed, config.natural_tokens)
        self.scheduler = Scheduler(config.max_running_requests)
        self.stats = Stats()
        self.metrics = (
            Metrics(config.model_name, self.stats, self.scheduler, config.max_total_num_tokens)
            if config.enable_metrics
            else None
        )
        self._ttft = config.ttft_seconds
        # SGLang's scheduler forward_ct (the watchdog watches it) and the hang fault (watchdog.py).
        self.forward_ct = 0
        self.hang_after = config.hang_after
        self._hung: asyncio.Future[None] | None = None
        self._stuck = False
        self._tps = config.decode_tokens_per_second
        self._prefix_cache: set[int] = set()

    def job(
        self,
        prompt: str,
        prompt_tokens: int,
        max_new_tokens: int | None,
        *,
        stop: Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        seed: int | None = None,
    ) -> Job:
        """Check a request against the context length (as SGLang's tokenizer manager does)."""
        context = self.config.context_length
        if prompt_tokens >= context:
            raise ContextOverflow(
                f"The input ({prompt_tokens} tokens) is longer than the model's context length "
                f"({context} tokens)."
            )
        if max_new_tokens is None:
            max_new_tokens = context - prompt_tokens - 1
        elif max_new_tokens + prompt_tokens >= context:
            raise ContextOverflow(
                f"Requested token count exceeds the model's maximum context length of {context} tokens. "
                f"You requested a total of {max_new_tokens + prompt_tokens} tokens: {prompt_tokens} tokens "
                f"from the input messages and {max_new_tokens} tokens for the completion. Please reduce the "
                "number of tokens in the input messages or the completion to fit within the limit."
            )
        return Job(prompt, prompt_tokens, max_new_tokens, stop, stop_token_ids, ignore_eos, seed)

    @property
    def hung(self) -> bool:
        return self._hung is not None

    @property
    def busy(self) -> bool:
        """A batch is current (SGLang: `cur_batch is not None`): requests hold slots, or a batch is stuck
        in the stopped forward loop: that one never ends, even when its clients hang up (the scheduler
        would only handle their aborts after the forward that never returns)."""
        return self.scheduler.running > 0 or self._stuck

    async def _forward(self) -> None:
        """One forward batch: counted, unless the forward loop has stopped (then it never returns)."""
        if self._hung is not None:
            self._stuck = True
            await asyncio.shield(self._hung)
        self.forward_ct += 1
        if self.hang_after is not None and self.forward_ct >= self.hang_after and self._hung is None:
            log.warning("forward loop stopped after %d batches (--standin-hang-after)", self.hang_after)
            self._hung = asyncio.get_running_loop().create_future()

    def flush_cache(self) -> bool:
        """Empty the prefix cache; refused (False) while requests run or wait, like SGLang."""
        if self.scheduler.running or self.scheduler.waiting:
            return False
        self._prefix_cache.clear()
        return True

    def _complete(self, job: Job) -> tuple[Completion, int]:
        completion = self.model.complete(
            job.prompt,
            max_new_tokens=job.max_new_tokens,
            stop=job.stop,
            stop_token_ids=job.stop_token_ids,
            ignore_eos=job.ignore_eos,
            request_seed=job.seed,
        )
        key = hash(job.prompt)
        cache = self._prefix_cache
        if key in cache:
            cached = max(job.prompt_tokens - 1, 0)
        else:
            cached = 0
            if len(cache) >= PREFIX_CACHE_ENTRIES:
                cache.clear()
            cache.add(key)
        return completion, cached

    def _finish(self, job: Job, completion: Completion, cached: int, start: float, ttft: float) -> Result:
        e2e = time.perf_counter() - start
        self.stats.finished(job.prompt_tokens, completion.completion_tokens, cached)
        if self.metrics is not None:
            self.metrics.ttft.observe(ttft)
            self.metrics.e2e.observe(e2e)
        return Result(completion, job.prompt_tokens, cached, e2e)

    async def generate(self, job: Job) -> Result:
        """Run a request to completion: wait for a slot, 'decode', answer."""
        start = time.perf_counter()
        scheduler = self.scheduler
        await scheduler.acquire()
        # Time to first token: the wait for a slot, then the prefill (the first token comes with it).
        ttft = time.perf_counter() - start + self._ttft
        try:
            await self._forward()  # the prefill
            completion, cached = self._complete(job)
            in_use = job.prompt_tokens + completion.completion_tokens
            self.stats.used_tokens += in_use
            try:
                if self._ttft or self._tps:
                    decode = completion.completion_tokens / self._tps if self._tps else 0.0
                    await asyncio.sleep(self._ttft + decode)
                await self._forward()  # the last decode batch
            finally:
                self.stats.used_tokens -= in_use
        finally:
            scheduler.release()
        return self._finish(job, completion, cached, start, ttft)

    async def stream(self, job: Job) -> AsyncIterator[Chunk]:
        """Run a request token by token: one chunk per token, the last one carrying the result."""
        start = time.perf_counter()
        scheduler = self.scheduler
        await scheduler.acquire()
        try:
            await self._forward()  # the prefill
            completion, cached = self._complete(job)
            in_use = job.prompt_tokens + completion.completion_tokens
            self.stats.used_tokens += in_use
            try:
                if self._ttft:
                    await asyncio.sleep(self._ttft)
                ttft = time.perf_counter() - start
                pieces = completion.text.split(" ") if completion.text else []
                ids = completion.output_ids
                for index, piece in enumerate(pieces):
                    if index and self._tps:
                        await asyncio.sleep(1 / self._tps)
                    if index:
                        await self._forward()  # one decode batch per token
                    yield Chunk(piece if index == 0 else " " + piece, ids[index : index + 1])
                # Tokens generated but not shown (a stop string's tail, a stop token id).
                rest = ids[len(pieces) :]
                if rest and self._tps:
                    await asyncio.sleep(len(rest) / self._tps)
            finally:
                self.stats.used_tokens -= in_use
        finally:
            scheduler.release()
        yield Chunk("", rest, self._finish(job, completion, cached, start, ttft))
