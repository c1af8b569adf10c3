"""Health of a fleet of SGLang instances, probed concurrently.

One probe of one instance sends, at the same time, ``GET /health_generate`` (readiness: 200 once
the engine answers a 1-token generation, 503 while it starts), ``GET /model_info`` (the model
path), ``GET /v1/models`` (the served name) and ``GET /v1/loads`` (running and waiting
requests, token usage, generation throughput).  Every instance is probed at once, so probing
eight instances costs about one round trip.  The API key, when given, goes to every endpoint
but the health one, as SGLang wants it.

An instance is healthy when ``/health_generate`` answers 200 and, when an expected model is
given, the instance serves it (by served name or model path).  Otherwise `reason` says why:
``refused`` (nothing listens), ``starting`` (503), ``timeout``, ``unexpected model``,
``http <code>`` or ``error: <what>``.

SGLang's router (`sglang-router`) answers the same probe in front of the fleet: it serves
``/health_generate``, ``/v1/models`` and the old names ``/get_model_info`` and ``/get_server_info``
but 404 on ``/model_info``, ``/server_info`` and ``/v1/loads``; a 404 on ``/model_info`` is asked
again at ``/get_model_info``, and the load fields stay unknown.

A router is told by its ``/readiness``, asked with the rest (SGLang 0.5.12 has no such route: 404).
In sglang-router 0.3.2 (sgl-router/src/server.rs:98-140 of its PyPI source distribution) it answers 200
``{"status": "ready", "healthy_workers": N, "total_workers": M}`` while at least one registered
worker is healthy, else 503 ``{"status": "not ready", "reason": "insufficient healthy workers"}``;
``/liveness`` and ``/health`` (server.rs:94-96, 142-144: ``health`` calls ``liveness()``) answer
200 "OK" as long as the process runs, workers or none. So a router is healthy only when it is ready
(``router``: True, ``reason`` "not ready" otherwise, the workers counted in ``detail``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from pydantic import BaseModel, ConfigDict, Field

from sglfleet.fleet._defaults import DEFAULT_INTERVAL_S, DEFAULT_TIMEOUT_S

__all__ = [
    "Endpoint",
    "FleetHealth",
    "InstanceHealth",
    "check_fleet",
    "endpoint_from_url",
    "endpoints_from_range",
    "endpoints_from_urls",
    "parse_loads",
    "probe_fleet_async",
]


class Endpoint(BaseModel):
    """One SGLang instance: its base URL, port, and the GPU it runs on when known."""

    model_config = ConfigDict(frozen=True)

    url: str
    port: int
    gpu: int | None = None


class InstanceHealth(BaseModel):
    """One row of the health table."""

    model_config = ConfigDict(frozen=True)

    url: str
    port: int
    gpu: int | None
    healthy: bool
    status_code: int | None
    reason: str | None
    model: str | None = None
    model_path: str | None = None
    running_requests: int | None = None
    waiting_requests: int | None = None
    token_usage: float | None = None
    gen_throughput: float | None = None
    latency_s: float
    detail: str | None = None
    # /model_info answered 401: the API key is wrong or missing (said in detail; not in the table's JSON)
    key_refused: bool = Field(default=False, exclude=True)
    router: bool = False  # an sglang-router (it answers /readiness)


class FleetHealth(BaseModel):
    """Every instance's row, and whether (and after how long) they were all healthy."""

    model_config = ConfigDict(frozen=True)

    instances: tuple[InstanceHealth, ...]
    all_healthy: bool
    healthy_count: int
    waited_s: float
    attempts: int

    @property
    def unhealthy(self) -> tuple[InstanceHealth, ...]:
        return tuple(i for i in self.instances if not i.healthy)

    def summary(self) -> str:
        if self.all_healthy:
            return f"all {len(self.instances)} instances healthy"
        bad = ", ".join(f"{i.url} ({i.reason})" for i in self.unhealthy)
        return f"{self.healthy_count}/{len(self.instances)} instances healthy; unhealthy: {bad}"


def endpoint_from_url(url: str, gpu: int | None = None, *, where: str = "url") -> Endpoint:
    """Parse `http://host:port` (no path); `where` names the input in the error message."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{where}: {url!r} is not an http(s)://HOST:PORT URL")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{where}: {url!r} must be a base URL without path or query")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"{where}: {url!r} has an invalid port") from None
    return Endpoint(url=f"{parts.scheme}://{parts.netloc}", port=port, gpu=gpu)


def endpoints_from_urls(urls: Sequence[str]) -> list[Endpoint]:
    """One endpoint per URL (GPU unknown); duplicates are an error."""
    endpoints = [endpoint_from_url(u, where=f"urls[{i}]") for i, u in enumerate(urls)]
    seen: dict[str, int] = {}
    for i, ep in enumerate(endpoints):
        if ep.url in seen:
            raise ValueError(f"urls[{i}]: {ep.url} is listed twice (also urls[{seen[ep.url]}])")
        seen[ep.url] = i
    return endpoints


def endpoints_from_range(
    host: str, port_base: int, count: int, gpu_ids: Sequence[int] = (), scheme: str = "http"
) -> list[Endpoint]:
    """Instances 0..count-1 on `host`, instance i on port `port_base + i` and GPU i (the fleet layout).

    `gpu_ids`, when given, names the GPU of each instance instead (one entry per instance).
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    if not 1 <= port_base <= 65535 or port_base + count - 1 > 65535:
        raise ValueError(f"ports {port_base}..{port_base + count - 1} are not all within 1..65535")
    if gpu_ids and len(gpu_ids) != count:
        raise ValueError(f"gpu_ids has {len(gpu_ids)} entries for {count} instances")
    gpus = list(gpu_ids) if gpu_ids else list(range(count))
    netloc = f"[{host}]" if ":" in host else host
    return [
        Endpoint(url=f"{scheme}://{netloc}:{port_base + i}", port=port_base + i, gpu=gpus[i])
        for i in range(count)
    ]


def parse_loads(data: Any) -> dict[str, float | int | None]:
    """`/v1/loads` → running and waiting requests (summed over ranks), token usage (mean), tokens/s (sum)."""
    ranks = data.get("loads") if isinstance(data, dict) else data
    if isinstance(ranks, list) and ranks and all(isinstance(r, dict) for r in ranks):

        def total(key: str) -> float | None:
            values = [r[key] for r in ranks if isinstance(r.get(key), int | float)]
            return sum(values) if values else None

        usage = total("token_usage")
        running, waiting = total("num_running_reqs"), total("num_waiting_reqs")
        return {
            "running_requests": None if running is None else int(running),
            "waiting_requests": None if waiting is None else int(waiting),
            "token_usage": None if usage is None else round(usage / len(ranks), 4),
            "gen_throughput": total("gen_throughput"),
        }
    agg = data.get("aggregate") if isinstance(data, dict) else None
    if isinstance(agg, dict):
        return {
            "running_requests": agg.get("total_running_reqs"),
            "waiting_requests": agg.get("total_waiting_reqs"),
            "token_usage": agg.get("avg_token_usage"),
            "gen_throughput": agg.get("avg_throughput"),
        }
    return {"running_requests": None, "waiting_requests": None, "token_usage": None, "gen_throughput": None}


async def _get(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], want_json: bool
) -> tuple[int, Any]:
    async with session.get(url, headers=headers) as resp:
        if want_json and resp.status == 200:
            return resp.status, await resp.json(content_type=None)
        await resp.read()
        return resp.status, None


async def _get_json_any(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    """GET ``url``: its status and its JSON body, whatever the status (None when not JSON)."""
    async with session.get(url) as resp:
        raw = await resp.read()
        try:
            return resp.status, json.loads(raw) if raw else None
        except ValueError:
            return resp.status, None


def _readiness_note(body: dict[str, Any]) -> str:
    """A router's /readiness body in words."""
    if body.get("status") == "ready":
        return f"router: {body.get('healthy_workers')}/{body.get('total_workers')} workers healthy"
    return f"router not ready: {body.get('reason') or body.get('status')}"


def _failure(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        os_error = exc.os_error
        if isinstance(os_error, ConnectionRefusedError):
            return "refused"
        return f"error: cannot connect: {os_error.strerror or os_error}"
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError):
        return "error: connection closed"
    return f"error: {type(exc).__name__}: {exc}"


async def probe_instance(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    *,
    api_key: str | None = None,
    expected_model: str | None = None,
) -> InstanceHealth:
    """Probe one instance: the health, model and load endpoints at once."""
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    start = time.monotonic()
    health, info, models, loads, ready = await asyncio.gather(
        _get(session, f"{endpoint.url}/health_generate", {}, want_json=False),
        _get(session, f"{endpoint.url}/model_info", auth, want_json=True),
        _get(session, f"{endpoint.url}/v1/models", auth, want_json=True),
        _get(session, f"{endpoint.url}/v1/loads", auth, want_json=True),
        _get_json_any(session, f"{endpoint.url}/readiness"),
        return_exceptions=True,
    )
    if not isinstance(info, BaseException) and info[0] == 404:
        # the old name: what SGLang's router (sglang-router 0.3.2) answers, /model_info is 404 there
        try:
            info = await _get(session, f"{endpoint.url}/get_model_info", auth, want_json=True)
        except Exception as exc:
            info = exc
    latency = round(time.monotonic() - start, 4)
    base = {"url": endpoint.url, "port": endpoint.port, "gpu": endpoint.gpu, "latency_s": latency}
    if isinstance(health, BaseException):
        if not isinstance(health, Exception):
            raise health
        return InstanceHealth(**base, healthy=False, status_code=None, reason=_failure(health))
    code = health[0]
    fields: dict[str, Any] = {}
    notes = []
    if not isinstance(info, BaseException) and info[0] == 200 and isinstance(info[1], dict):
        fields["model_path"] = info[1].get("model_path")
    elif not isinstance(info, BaseException) and info[0] == 401:
        notes.append("401 from /model_info: wrong or missing API key")
        fields["key_refused"] = True
    if not isinstance(models, BaseException) and models[0] == 200 and isinstance(models[1], dict):
        data = models[1].get("data") or []
        if data and isinstance(data[0], dict):
            fields["model"] = data[0].get("id")
    fields.setdefault("model", fields.get("model_path"))
    if not isinstance(loads, BaseException) and loads[0] == 200:
        fields.update(parse_loads(loads[1]))
    router = not isinstance(ready, BaseException) and ready[0] in (200, 503) and isinstance(ready[1], dict)
    if router:
        assert not isinstance(ready, BaseException)
        fields["router"] = True
        notes.append(_readiness_note(ready[1]))
        if ready[0] == 503 and code == 200:
            code = 503
    if code == 200:
        served = {fields.get("model"), fields.get("model_path")} - {None}
        if expected_model is not None and expected_model not in served:
            shown = " / ".join(sorted(served)) or "unknown (model endpoints did not answer)"
            notes.insert(0, f"serves {shown}, expected {expected_model}")
            reason = "unexpected model"
        else:
            reason = None
    elif code == 503:
        reason = "not ready" if router else "starting"
    else:
        reason = f"http {code}"
    return InstanceHealth(
        **base,
        healthy=reason is None,
        status_code=code,
        reason=reason,
        detail="; ".join(notes) or None,
        **fields,
    )


async def probe_fleet_async(
    endpoints: Sequence[Endpoint],
    *,
    api_key: str | None = None,
    expected_model: str | None = None,
    probe_timeout: float = DEFAULT_TIMEOUT_S,
) -> list[InstanceHealth]:
    """Probe every endpoint concurrently (one session, one connection pool)."""
    client_timeout = aiohttp.ClientTimeout(total=probe_timeout)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(timeout=client_timeout, connector=connector) as session:
        return list(
            await asyncio.gather(
                *(
                    probe_instance(session, ep, api_key=api_key, expected_model=expected_model)
                    for ep in endpoints
                )
            )
        )


async def wait_fleet_async(
    endpoints: Sequence[Endpoint],
    *,
    api_key: str | None = None,
    expected_model: str | None = None,
    probe_timeout: float = DEFAULT_TIMEOUT_S,
    wait: float = 0.0,
    interval: float = DEFAULT_INTERVAL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> FleetHealth:
    """Probe until every instance is healthy or `wait` seconds have passed (0: probe once); `clock` and
    `sleep` measure and spend the wait (tests give a fake pair)."""
    if not endpoints:
        raise ValueError("no instances to probe")
    if probe_timeout <= 0 or wait < 0 or interval <= 0:
        raise ValueError(
            f"need timeout > 0, wait >= 0, interval > 0 (got {probe_timeout}, {wait}, {interval})"
        )
    start = clock()
    deadline = start + wait
    attempts = 0
    while True:
        attempts += 1
        rows = await probe_fleet_async(
            endpoints, api_key=api_key, expected_model=expected_model, probe_timeout=probe_timeout
        )
        healthy = sum(r.healthy for r in rows)
        now = clock()
        if healthy == len(rows) or now + interval > deadline:
            return FleetHealth(
                instances=tuple(rows),
                all_healthy=healthy == len(rows),
                healthy_count=healthy,
                waited_s=round(now - start, 3),
                attempts=attempts,
            )
        await sleep(interval)


def check_fleet(
    endpoints: Sequence[Endpoint],
    *,
    api_key: str | None = None,
    expected_model: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    wait: float = 0.0,
    interval: float = DEFAULT_INTERVAL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> FleetHealth:
    """Blocking `wait_fleet_async` (for the CLI and the Ansible module)."""
    return asyncio.run(
        wait_fleet_async(
            endpoints,
            api_key=api_key,
            expected_model=expected_model,
            probe_timeout=timeout,
            wait=wait,
            interval=interval,
            clock=clock,
            sleep=sleep,
        )
    )
