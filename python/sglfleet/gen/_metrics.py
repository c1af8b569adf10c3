"""Live Prometheus metrics of a running job (``sglfleet generate --metrics-port``), as ``vllm
run-batch --enable-metrics`` offers: a scrape reads the job's counters at that moment.

Served by aiohttp on the job's own event loop, rendered by prometheus-client from a registry of
this job alone (no process-global state), so nothing runs between scrapes.
"""

from __future__ import annotations

from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from sglfleet.gen._dispatch import LATENCY_BUCKETS, EndpointPool
from sglfleet.gen._progress import Stats

__all__: list[str] = []

PREFIX = "sglfleet_generate_"


class JobCollector:
    """Reads the job's :class:`Stats` and endpoints at each scrape."""

    def __init__(self, stats: Stats, pool: EndpointPool) -> None:
        self.stats = stats
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        for name, value, text in (
            ("requests_done", s.done, "requests with a result in the output (earlier runs included)"),
            ("requests_failed", s.failed, "requests failed for good in this run (OUT.errors.jsonl)"),
            ("retries", s.retries, "attempts retried in this run"),
            ("requests_resent", s.resent, "requests sent to a second endpoint because theirs stalled"),
        ):
            yield CounterMetricFamily(PREFIX + name, text, value=value)
        tokens = CounterMetricFamily(PREFIX + "tokens", "tokens of the results", labels=["kind"])
        tokens.add_metric(["prompt"], s.prompt_tokens)
        tokens.add_metric(["completion"], s.completion_tokens)
        yield tokens
        if s.exit_code is not None:  # the run has ended: what it exits with (docs/exit-codes.md)
            yield GaugeMetricFamily(
                PREFIX + "exit_code", "the run's exit code, once it has ended", value=s.exit_code
            )
        yield GaugeMetricFamily(PREFIX + "requests_total", "requests in the input", value=s.total)
        yield GaugeMetricFamily(PREFIX + "requests_remaining", "requests still to do", value=s.remaining)
        in_flight = GaugeMetricFamily(PREFIX + "in_flight", "requests in flight", labels=["endpoint"])
        up = GaugeMetricFamily(PREFIX + "endpoint_up", "1 while requests go to it", labels=["endpoint"])
        stalls = CounterMetricFamily(
            PREFIX + "endpoint_stalls", "times it was found stalled", labels=["endpoint"]
        )
        latency = HistogramMetricFamily(
            PREFIX + "request_latency_seconds", "seconds per answered attempt", labels=["endpoint"]
        )
        for ep in self.pool.endpoints:
            in_flight.add_metric([ep.url], ep.in_flight)
            up.add_metric([ep.url], float(ep.up))
            stalls.add_metric([ep.url], ep.stalls)
            cumulative, buckets = 0, []
            for bound, count in zip((*LATENCY_BUCKETS, float("inf")), ep.latency_buckets, strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            latency.add_metric([ep.url], buckets, ep.latency_sum)
        yield from (in_flight, up, stalls, latency)


def registry_for(stats: Stats, pool: EndpointPool) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobCollector(stats, pool))  # type: ignore[arg-type]
    return registry


async def start(host: str, port: int, stats: Stats, pool: EndpointPool) -> tuple[web.AppRunner, int]:
    """Serve ``/metrics`` on ``host:port`` (0: a free port); the runner to clean up, and the port."""
    registry = registry_for(stats, pool)

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    server = site._server
    bound = server.sockets[0].getsockname()[1] if server is not None and server.sockets else port  # type: ignore[union-attr]
    return runner, bound
