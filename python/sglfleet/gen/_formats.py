"""Input formats of a generation job: detection, validation, and the requests they yield.

Two JSONL formats are accepted, detected per file from its first non-blank line:

* OpenAI Batch input: ``{"custom_id", "method": "POST", "url", "body"}`` with ``url`` one of
  ``/v1/chat/completions`` or ``/v1/completions``.
* Conversation JSONL (the drafter-training format): ``{"id", "conversations": [{"role",
  "content"}, ...]}``. The last assistant turn is regenerated from the turns before it (a
  conversation without an assistant turn is sent whole and must end with a user turn).

:func:`scan_input` reads the whole file once and reports every bad line; :func:`iter_requests`
streams the requests (only call it on a file that scanned clean).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from sglfleet.gen._ids import IdSet, id_digest

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
SUPPORTED_URLS = (CHAT_URL, COMPLETIONS_URL)
ROLES = ("system", "user", "assistant", "tool")


class InputFormat(enum.StrEnum):
    BATCH = "openai-batch"
    CONVERSATION = "conversation"


@dataclass(frozen=True)
class GenParams:
    """Generation parameters filled into every request body that does not set them itself."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class Request:
    custom_id: str
    url: str
    body: bytes  # the JSON body, serialised once


@dataclass(frozen=True)
class LineError:
    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


@dataclass
class ScanResult:
    path: Path
    format: InputFormat | None
    requests: int
    sha256: str
    errors: list[LineError] = field(default_factory=list)
    ids: IdSet = field(default_factory=IdSet)

    @property
    def ok(self) -> bool:
        return not self.errors


class InvalidLine(ValueError):
    pass


def _object(raw: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidLine(f"bad JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise InvalidLine(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def detect(obj: dict[str, Any]) -> InputFormat:
    if "custom_id" in obj or "body" in obj:
        return InputFormat.BATCH
    if "conversations" in obj:
        return InputFormat.CONVERSATION
    raise InvalidLine(
        "neither OpenAI Batch (custom_id, method, url, body) nor conversation (id, conversations) format"
    )


def _check_messages(messages: Any, where: str) -> None:
    if not isinstance(messages, list):
        raise InvalidLine(f"{where} must be a list of {{role, content}}")
    if not messages:
        raise InvalidLine(f"{where} is empty")
    for i, turn in enumerate(messages):
        if not isinstance(turn, dict):
            raise InvalidLine(f"{where}[{i}] is not an object")
        role = turn.get("role")
        if role not in ROLES:
            raise InvalidLine(f"{where}[{i}].role is {role!r}, expected one of {', '.join(ROLES)}")
        if "content" not in turn:
            raise InvalidLine(f"{where}[{i}] has no content")
        content = turn["content"]
        if not isinstance(content, str | list) and not (content is None and role == "assistant"):
            raise InvalidLine(f"{where}[{i}].content must be a string")


def _batch(obj: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    missing = [k for k in ("custom_id", "method", "url", "body") if k not in obj]
    if missing:
        raise InvalidLine(f"missing field {', '.join(missing)}")
    cid = obj["custom_id"]
    if not isinstance(cid, str) or not cid:
        raise InvalidLine("custom_id must be a non-empty string")
    if obj["method"] != "POST":
        raise InvalidLine(f"unsupported method {obj['method']!r}, only POST")
    url = obj["url"]
    if url not in SUPPORTED_URLS:
        raise InvalidLine(f"unsupported url {url!r}, expected {' or '.join(SUPPORTED_URLS)}")
    body = obj["body"]
    if not isinstance(body, dict):
        raise InvalidLine("body must be an object")
    if url == CHAT_URL:
        if "messages" not in body:
            raise InvalidLine("missing field body.messages")
        _check_messages(body["messages"], "body.messages")
    else:
        prompt = body.get("prompt")
        if prompt is None:
            raise InvalidLine("missing field body.prompt")
        if prompt in ("", []):
            raise InvalidLine("body.prompt is empty")
    return cid, url, body


def _conversation(obj: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    if "id" not in obj:
        raise InvalidLine("missing field id")
    cid = obj["id"]
    if isinstance(cid, bool) or not isinstance(cid, str | int) or cid == "":
        raise InvalidLine("id must be a non-empty string or an integer")
    turns = obj["conversations"]
    _check_messages(turns, "conversations")
    prompt = _prompt_turns(turns)
    if not prompt:
        raise InvalidLine("no turns before the assistant turn to regenerate it from")
    if prompt[-1]["role"] != "user":
        raise InvalidLine(
            f"the turn before the regenerated assistant turn is {prompt[-1]['role']!r}, not user"
        )
    return str(cid), CHAT_URL, {"messages": prompt}


def _prompt_turns(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The turns the last assistant turn is regenerated from (all of them if there is none)."""
    for i in range(len(turns) - 1, -1, -1):
        if turns[i]["role"] == "assistant":
            turns = turns[:i]
            break
    return [{"role": t["role"], "content": t["content"]} for t in turns]


def parse_line(raw: bytes, fmt: InputFormat | None) -> tuple[InputFormat, str, str, dict[str, Any]]:
    """Validate one line; return (format, custom_id, url, body). Raises :class:`InvalidLine`."""
    obj = _object(raw)
    found = detect(obj)
    if fmt is not None and found is not fmt:
        raise InvalidLine(f"line is {found} format but the file is {fmt} (detected from its first line)")
    cid, url, body = _batch(obj) if found is InputFormat.BATCH else _conversation(obj)
    return found, cid, url, body


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as fh:
        yield from enumerate(fh, start=1)


def scan_input(path: Path) -> ScanResult:
    """Read the whole input once: its hash, format, request count and every bad line."""
    path = Path(path)
    sha = hashlib.sha256()
    result = ScanResult(path=path, format=None, requests=0, sha256="")
    for number, raw in _lines(path):
        sha.update(raw)
        if not raw.strip():
            continue
        try:
            fmt, cid, _, _ = parse_line(raw, result.format)
        except InvalidLine as exc:
            result.errors.append(LineError(number, str(exc)))
            continue
        result.format = result.format or fmt
        result.requests += 1
        result.ids.add(cid)
    result.sha256 = sha.hexdigest()
    result.ids.freeze()
    if result.ids.repeated:
        result.errors.extend(_duplicates(path, result.format, result.ids.repeated))
        result.errors.sort(key=lambda e: e.line)
    if result.format is None and not result.errors:
        result.errors.append(LineError(0, "the input has no requests"))
    return result


def _duplicates(path: Path, fmt: InputFormat | None, digests: set[int]) -> list[LineError]:
    first_seen: dict[str, int] = {}
    errors = []
    for number, raw in _lines(path):
        if not raw.strip():
            continue
        try:
            _, cid, _, _ = parse_line(raw, fmt)
        except InvalidLine:
            continue
        if id_digest(cid) not in digests:
            continue
        if cid in first_seen:
            errors.append(LineError(number, f"duplicate id {cid!r} (first on line {first_seen[cid]})"))
        else:
            first_seen[cid] = number
    return errors


def iter_requests(
    path: Path, fmt: InputFormat, params: GenParams, skip: Callable[[str], bool] | None = None
) -> Iterator[Request]:
    """Stream the requests of a file that scanned clean, defaults from ``params`` filled in.

    ``skip(custom_id)`` true drops a request (the ids already done, on resume).
    """
    defaults = params.as_dict()
    for _, raw in _lines(Path(path)):
        if not raw.strip():
            continue
        obj = orjson.loads(raw)  # validated by scan_input: no second check
        cid = obj["custom_id"] if fmt is InputFormat.BATCH else str(obj["id"])
        if skip is not None and skip(cid):
            continue
        if fmt is InputFormat.BATCH:
            url, body = obj["url"], obj["body"]
        else:
            url, body = CHAT_URL, {"messages": _prompt_turns(obj["conversations"])}
        for key, value in defaults.items():
            body.setdefault(key, value)
        yield Request(cid, url, orjson.dumps(body))
