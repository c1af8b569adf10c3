"""One HTTP attempt at an OpenAI-compatible endpoint, and what to make of its outcome.

Kept deliberately thin (aiohttp, bytes in, bytes out, one dict parse): the client must never be
the bottleneck of a fleet. Outcomes:

* ``OK``: 200 with a completion body (a JSON object with a non-empty ``choices`` list);
* ``RETRY``: connection error, timeout, 408, 429, 5xx, or a 200 whose body is not a completion
  (not JSON, ``{"object": "error", ...}``, no ``choices``, a choice without text: ``{}``,
  ``message.content`` null, a field of the wrong type: ``usage.prompt_tokens: "abc"``; see
  :func:`completion_problem`): worth another attempt, with backoff
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


# orjson writes integers of at most 64 bits: a larger count could not even be written back
_MAX_COUNT = 2**63 - 1
_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")


def completion_problem(body: dict[str, Any]) -> str | None:
    """Why a 200 body is not a chat/text completion that can be stored as it is (None when it is
    one). Every field that is read or written back is checked here, before anything is stored: the
    choices and the first one's answer (``message.content``/``text``, ``role``, ``reasoning_content``,
    ``finish_reason``), the ``usage`` counts (non-negative integers, not bools, strings or lists), and
    ``id``. Fields the server may leave out (``usage``, ``finish_reason``, ...) may be absent or null."""
    if body.get("object") == "error" or ("error" in body and not body.get("choices")):
        return f"an error object: {_server_message(200, b'', body).removeprefix('HTTP 200: ')}"
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        return "no choices" if choices is None or choices == [] else f"choices is {_kind(choices)}"
    for i, choice in enumerate(choices):
        if not isinstance(choice, dict):
            return f"choices[{i}] is {_kind(choice)}"
    return _choice_problem(choices[0]) or _usage_problem(body.get("usage")) or _id_problem(body.get("id"))


def _choice_problem(choice: dict[str, Any]) -> str | None:
    message = choice.get("message")
    if message is not None:  # a chat completion: the answer is message.content
        if not isinstance(message, dict):
            return f"choices[0].message is {_kind(message)}"
        if not isinstance(message.get("content"), str):
            # SGLang answers content null when nothing is left after the reasoning (a thinking model
            # cut by max_tokens): not an answer to train on, retried, then reported
            return f"choices[0].message.content is {_kind(message.get('content'))}"
        for key in ("role", "reasoning_content"):
            if message.get(key) is not None and not isinstance(message[key], str):
                return f"choices[0].message.{key} is {_kind(message[key])}"
    elif not isinstance(choice.get("text"), str):  # a text completion: choices[0].text
        return "choices[0] has neither message.content nor text"
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        return f"choices[0].finish_reason is {_kind(finish)}"
    return None


def _usage_problem(usage: Any) -> str | None:
    if usage is None:
        return None
    if not isinstance(usage, dict):
        return f"usage is {_kind(usage)}"
    for key in _COUNTS:
        value = usage.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
            shown = repr(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            return f"usage.{key} is {shown}, not a token count (an integer, 0 or more)"
    return None


def _id_problem(value: Any) -> str | None:
    return None if value is None or isinstance(value, str) else f"id is {_kind(value)}"


def _kind(value: Any) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


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
        problem = completion_problem(parsed)
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
