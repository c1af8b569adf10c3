"""The engine: admission, the deterministic model, the latency model and the load figures.

Latency model: a request holds a running slot for `prefill + ttft + completion_tokens / decode_tps`
seconds (asyncio sleeps, no CPU); with all of them at 0 it never sleeps at all. Prefill is the
prompt tokens the prefix cache does not hold, at `prefill_tps` tokens per second, one request's
prefill at a time (a GPU's prefill is compute-bound: two prefills share its throughput); cached
tokens cost nothing, which is what SGLang's RadixAttention saves.
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
from sglfleet_testing.standin.prefix_cache import PrefixCache
from sglfleet_testing.standin.scheduler import Scheduler

log = logging.getLogger("sglfleet_testing.standin")


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
        self.stats = Stats(config.decode_log_interval)
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
        self._prefill_tps = config.prefill_tokens_per_second
        self._prefill_lane = asyncio.Lock()
        self.prefix_cache = PrefixCache(config.prefix_cache_budget)

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
        self.prefix_cache.clear()
        return True

    def _complete(self, job: Job) -> tuple[Completion, int]:
        """The completion, and the prompt tokens the prefix cache held (at most all but the last)."""
        completion = self.model.complete(
            job.prompt,
            max_new_tokens=job.max_new_tokens,
            stop=job.stop,
            stop_token_ids=job.stop_token_ids,
            ignore_eos=job.ignore_eos,
            request_seed=job.seed,
        )
        cached = min(self.prefix_cache.match_insert(job.prompt.split()), max(job.prompt_tokens - 1, 0))
        self.stats.prefilled(job.prompt_tokens, cached)
        return completion, cached

    async def _prefill(self, job: Job, cached: int) -> None:
        """Compute the uncached prompt tokens: one prefill at a time, at `prefill_tps` tokens/s."""
        if self._prefill_tps and job.prompt_tokens > cached:
            async with self._prefill_lane:
                await asyncio.sleep((job.prompt_tokens - cached) / self._prefill_tps)

    def _cache_output(self, job: Job, completion: Completion) -> None:
        """SGLang caches a finished request's prompt and output (cache_finished_req): the next turn
        of a conversation finds both."""
        if self.prefix_cache.budget > 0 and completion.text:
            self.prefix_cache.insert(f"{job.prompt} {completion.text}".split())

    def _finish(self, job: Job, completion: Completion, cached: int, start: float, ttft: float) -> Result:
        e2e = time.perf_counter() - start
        self.stats.finished(job.prompt_tokens, completion.completion_tokens, cached)
        if self.metrics is not None:
            self.metrics.ttft.observe(ttft)
            self.metrics.e2e.observe(e2e)
        return Result(completion, job.prompt_tokens, cached, e2e)

    async def _acquire(self, job: Job) -> None:
        """Wait for a slot; meanwhile the prompt counts in /v1/loads' num_total_tokens (the waiting
        queue's seqlen on top of the used tokens, scheduler_metrics_mixin.py:1010-1012, 0.5.12)."""
        self.stats.waiting_tokens += job.prompt_tokens
        try:
            await self.scheduler.acquire()
        finally:
            self.stats.waiting_tokens -= job.prompt_tokens

    async def generate(self, job: Job) -> Result:
        """Run a request to completion: wait for a slot, 'decode', answer."""
        start = time.perf_counter()
        scheduler = self.scheduler
        await self._acquire(job)
        try:
            await self._forward()  # the prefill
            completion, cached = self._complete(job)
            in_use = job.prompt_tokens + completion.completion_tokens
            self.stats.used_tokens += in_use
            try:
                await self._prefill(job, cached)
                # Time to first token: the wait for a slot, the prefill, then --standin-ttft.
                ttft = time.perf_counter() - start + self._ttft
                if self._ttft or self._tps:
                    decode = completion.completion_tokens / self._tps if self._tps else 0.0
                    await asyncio.sleep(self._ttft + decode)
                await self._forward()  # the last decode batch
                self.stats.decoded(
                    max(completion.completion_tokens - 1, 0)
                )  # the first came with the prefill
                self._cache_output(job, completion)
            finally:
                self.stats.used_tokens -= in_use
        finally:
            scheduler.release()
        return self._finish(job, completion, cached, start, ttft)

    async def stream(self, job: Job) -> AsyncIterator[Chunk]:
        """Run a request token by token: one chunk per token, the last one carrying the result."""
        start = time.perf_counter()
        scheduler = self.scheduler
        await self._acquire(job)
        try:
            await self._forward()  # the prefill
            completion, cached = self._complete(job)
            in_use = job.prompt_tokens + completion.completion_tokens
            self.stats.used_tokens += in_use
            try:
                await self._prefill(job, cached)
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
                        self.stats.decoded(1)
                    yield Chunk(piece if index == 0 else " " + piece, ids[index : index + 1])
                # Tokens generated but not shown (a stop string's tail, a stop token id).
                rest = ids[len(pieces) :]
                if rest and self._tps:
                    await asyncio.sleep(len(rest) / self._tps)
                self._cache_output(job, completion)
            finally:
                self.stats.used_tokens -= in_use
        finally:
            scheduler.release()
        yield Chunk("", rest, self._finish(job, completion, cached, start, ttft))
