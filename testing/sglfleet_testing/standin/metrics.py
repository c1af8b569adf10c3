"""Load figures and the Prometheus exposition (`/metrics`, `sglang:*` names as SGLang uses them)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sglfleet_testing.standin.scheduler import Scheduler

THROUGHPUT_WINDOW_S = 5


class Stats:
    """Counters the engine updates per request; cheap enough for the zero-latency path."""

    def __init__(self, decode_log_interval: int = 40) -> None:
        self.decode_log_interval = decode_log_interval
        self.forward_ct_decode = 0  # the scheduler's decode batches
        self.waiting_tokens = 0  # prompt tokens of the requests waiting for a slot
        self.num_requests = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cached_tokens = 0
        self.used_tokens = 0  # prompt + completion tokens of the running requests
        self.last_hit_rate = 0.0  # cached / prompt tokens of the latest prefill
        self._buckets: deque[list[int]] = deque()  # [second, generated tokens]

    def finished(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> None:
        self.num_requests += 1
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += completion_tokens
        self.cached_tokens += cached_tokens
        second = int(time.monotonic())
        buckets = self._buckets
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += completion_tokens
        else:
            buckets.append([second, completion_tokens])
            while buckets[0][0] <= second - THROUGHPUT_WINDOW_S:
                buckets.popleft()

    def gen_throughput(self) -> float:
        """Generated tokens per second over the last few seconds."""
        floor = int(time.monotonic()) - THROUGHPUT_WINDOW_S
        return sum(tokens for second, tokens in self._buckets if second > floor) / THROUGHPUT_WINDOW_S

    def prefilled(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A request's prefill: SGLang's `cache_hit_rate` is its latest prefill batch's hit tokens
        over its hit plus new tokens (observability/scheduler_metrics_mixin.py:565-576, 0.5.12); the
        stand-in prefills one request per batch."""
        self.last_hit_rate = cached_tokens / prompt_tokens if prompt_tokens else 0.0

    def decoded(self, batches: int) -> None:
        """`batches` decode batches ran. Every `decode_log_interval`-th one logs, and the decode log sets
        the gauge to 0 (scheduler_metrics_mixin.py:646 `forward_ct_decode % decode_log_interval`, then
        :695 `cache_hit_rate = 0.0` and :748 `self.stats.cache_hit_rate = cache_hit_rate`, 0.5.12): the
        gauge shows the latest prefill's rate only until the next decode log."""
        before = self.forward_ct_decode // self.decode_log_interval
        self.forward_ct_decode += batches
        if self.forward_ct_decode // self.decode_log_interval > before:
            self.last_hit_rate = 0.0

    def cache_hit_rate(self) -> float:
        """The latest prefill's hit rate (a gauge, as SGLang's); the whole run's is the counters'
        `sglang:cached_tokens_total / sglang:prompt_tokens_total`."""
        return self.last_hit_rate


class _SglangCollector(Collector):
    def __init__(self, labels: dict[str, str], stats: Stats, scheduler: Scheduler, max_tokens: int) -> None:
        self._labels = labels
        self._stats = stats
        self._scheduler = scheduler
        self._max_tokens = max_tokens

    def _family(self, cls, name: str, doc: str, value: float) -> Metric:
        family = cls(name, doc, labels=list(self._labels))
        family.add_metric(list(self._labels.values()), value)
        return family

    def collect(self) -> Iterator[Metric]:
        stats, gauge, counter = self._stats, GaugeMetricFamily, CounterMetricFamily
        yield self._family(
            gauge, "sglang:num_running_reqs", "The number of running requests.", self._scheduler.running
        )
        yield self._family(
            gauge,
            "sglang:num_queue_reqs",
            "The number of requests in the waiting queue.",
            self._scheduler.waiting,
        )
        yield self._family(gauge, "sglang:num_used_tokens", "The number of used tokens.", stats.used_tokens)
        yield self._family(
            gauge, "sglang:token_usage", "The token usage.", stats.used_tokens / self._max_tokens
        )
        yield self._family(
            gauge, "sglang:gen_throughput", "The generation throughput (token/s).", stats.gen_throughput()
        )
        # metrics_collector.py:232 (0.5.12): a "mostrecent" gauge of the latest prefill batch
        yield self._family(
            gauge, "sglang:cache_hit_rate", "The prefix cache hit rate.", stats.cache_hit_rate()
        )
        yield self._family(
            counter, "sglang:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens
        )
        yield self._family(
            counter,
            "sglang:generation_tokens",
            "Number of generation tokens processed.",
            stats.generation_tokens,
        )
        # metrics_collector.py:1343 (0.5.12): sglang:cached_tokens_total, per finished request
        yield self._family(
            counter, "sglang:cached_tokens", "Number of cached prompt tokens.", stats.cached_tokens
        )
        yield self._family(
            counter, "sglang:num_requests", "Number of requests processed.", stats.num_requests
        )


class Metrics:
    """The registry behind `/metrics`: live gauges and counters plus latency histograms."""

    def __init__(
        self, model_name: str, stats: Stats, scheduler: Scheduler, max_total_num_tokens: int
    ) -> None:
        # The scheduler's labels, moe_ep_rank included (observability/scheduler_metrics_mixin.py:136-142).
        labels = {
            "model_name": model_name,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_SglangCollector(labels, stats, scheduler, max_total_num_tokens))
        buckets = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            list(labels),
            registry=self.registry,
            buckets=buckets,
        ).labels(**labels)
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            list(labels),
            registry=self.registry,
            buckets=buckets,
        ).labels(**labels)

    def render(self) -> bytes:
        return generate_latest(self.registry)
