"""One HTTP attempt at an OpenAI-compatible endpoint, and what to make of its outcome.

Kept deliberately thin (aiohttp, bytes in, bytes out, one dict parse): the client must never be
the bottleneck of a fleet. Outcomes:

* ``OK``: 200 with a completion body (a JSON object with a non-empty ``choices`` list);
* ``RETRY``: connection error, timeout, 408, 429, 5xx, or a 200 whose body is not a completion
  (not JSON, ``{"object": "error", ...}``, no ``choices``, a choice without text: ``{}``,
  ``message.content`` null, a field of the wrong type: ``usage.prompt_tokens: "abc"``; see
  :func:`sglfleet.records.answer_problem`, the one definition of an answer): worth another
  attempt, with backoff
  (``Retry-After`` honoured when the server sends one);
* ``AUTH``: 401 or 403: the API key is wrong or missing, a configuration error of the whole job;
* ``PERMANENT``: any other status (4xx): the request itself is wrong; the server's message is kept.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
import enum
import math
import random
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from sglfleet.records import answer_problem

__all__ = ["completion_problem"]

# the public name of the one answer check (`sglfleet.gen.completion_problem`), defined in records
completion_problem = answer_problem

RETRY_STATUSES = frozenset({408, 429})
DOWN_STATUSES = frozenset({502, 503, 504})
JSON_HEADERS = {"Content-Type": "application/json"}


class Kind(enum.Enum):
    OK = "ok"
    RETRY = "retry"
    AUTH = "auth"
    PERMANENT = "permanent"


AUTH_STATUSES = frozenset({401, 403})
RETRY_AFTER_CAP_S = 300.0


@dataclass(slots=True)
class Attempt:
    kind: Kind
    status: int | None = None  # None: no HTTP answer at all
    body: Any = None
    raw: bytes = b""
    request_id: str = ""
    message: str = ""
    endpoint_down: bool = False  # the failure says the endpoint is not answering
    retry_after: float | None = None  # seconds the server asked us to wait (Retry-After)
    invalid_body: bool = False  # a 200 whose body is not a completion


def make_session(total_connections: int, api_key: str | None = None) -> aiohttp.ClientSession:
    """A session with enough pooled keep-alive connections for every slot of every endpoint."""
    headers = dict(JSON_HEADERS)
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    connector = aiohttp.TCPConnector(limit=total_connections, limit_per_host=0, ttl_dns_cache=300)
    # no skip_auto_headers: skipping one makes aiohttp build a header multidict per request
    return aiohttp.ClientSession(connector=connector, headers=headers, auto_decompress=True)


def _server_message(status: int, raw: bytes, body: Any) -> str:
    if isinstance(body, dict):
        msg = body.get("message")
        err = body.get("error")
        if isinstance(err, dict):
            msg = msg or err.get("message")
        elif isinstance(err, str):
            msg = msg or err
        detail = body.get("detail")
        msg = msg or (detail if isinstance(detail, str) else None)
        if msg:
            return f"HTTP {status}: {msg}"
    text = raw[:500].decode("utf-8", "replace").strip()
    return f"HTTP {status}: {text}" if text else f"HTTP {status}"


def retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date), capped; None if absent."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, OverflowError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        seconds = (when - dt.datetime.now(dt.UTC)).total_seconds()
    if math.isnan(seconds):  # "nan": no wait asked for
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_CAP_S)


async def post(
    session: aiohttp.ClientSession, url: str, body: bytes, limit: aiohttp.ClientTimeout
) -> Attempt:
    """POST ``body`` to ``url`` once and classify the outcome (never raises for network trouble)."""
    try:
        async with session.post(url, data=body, timeout=limit) as resp:
            raw = await resp.read()
            status = resp.status
            headers = resp.headers
    except TimeoutError:
        return Attempt(Kind.RETRY, message=f"timed out after {limit.total} s", endpoint_down=True)
    except aiohttp.ClientError as exc:
        return Attempt(Kind.RETRY, message=f"{type(exc).__name__}: {exc}", endpoint_down=True)
    except OSError as exc:
        return Attempt(Kind.RETRY, message=f"{type(exc).__name__}: {exc}", endpoint_down=True)
    try:
        parsed = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        parsed = None
    if status == 200:
        if not isinstance(parsed, dict):
            return Attempt(
                Kind.RETRY,
                status,
                None,
                raw,
                message="HTTP 200 with a body that is not a JSON object",
                invalid_body=True,
            )
        problem = answer_problem(parsed)
        if problem is None:
            request_id = headers.get("x-request-id") or str(parsed.get("id", ""))
            return Attempt(Kind.OK, status, parsed, raw, request_id)
        return Attempt(
            Kind.RETRY,
            status,
            parsed,
            raw,
            message=f"HTTP 200 with a body that is not a completion ({problem})",
            invalid_body=True,
        )
    message = _server_message(status, raw, parsed)
    if status in AUTH_STATUSES:
        return Attempt(Kind.AUTH, status, parsed, raw, message=message)
    if status in RETRY_STATUSES or status >= 500:
        return Attempt(
            Kind.RETRY,
            status,
            parsed,
            raw,
            message=message,
            endpoint_down=status in DOWN_STATUSES,
            retry_after=retry_after(headers.get("Retry-After")),
        )
    return Attempt(Kind.PERMANENT, status, parsed, raw, message=message)


async def probe_health(
    session: aiohttp.ClientSession, base_url: str, seconds: float, path: str = "/health"
) -> bool:
    """True when ``base_url + path`` answers 200 (SGLang's /health: the engine can generate; a
    router's /readiness: at least one worker is healthy)."""
    try:
        async with session.get(base_url + path, timeout=aiohttp.ClientTimeout(total=seconds)) as resp:
            await resp.read()
            return resp.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False


def backoff(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Exponential backoff with jitter: uniform in [1/2, 1] * min(cap, base * 2**(attempt-1))."""
    return min(cap, base * (2 ** (attempt - 1))) * rng.uniform(0.5, 1.0)


async def sleep(seconds: float, stop: asyncio.Event) -> bool:
    """Sleep, unless ``stop`` is set first; True when the sleep ran to its end."""
    if stop.is_set():
        return False
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return True
    return False
