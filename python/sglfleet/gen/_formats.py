"""Input formats of a generation job: detection, validation, and the requests they yield.

Two JSONL formats are accepted, detected per file from its first non-blank line:

* OpenAI Batch input: ``{"custom_id", "method": "POST", "url", "body"}`` with ``url`` one of
  ``/v1/chat/completions`` or ``/v1/completions``.
* Conversation JSONL (the drafter-training format, SpecForge's ``regenerate_train_data.py``
  input): ``{"id", "conversations": [{"role", "content"}, ...]}``. By default the last assistant
  turn is regenerated from the turns before it (a conversation without an assistant turn is sent
  whole and must end with a user turn); with ``turns="all"`` every assistant turn is regenerated in
  order, each from the regenerated turns before it, as SpecForge does.

:func:`scan_input` reads the whole file once, reports every bad line and remembers where each
request is (offset, length, digest of its bytes); :func:`read_requests` then reads exactly those
bytes again and refuses any line that changed since (:class:`InputChanged`), so what is sent is
what was validated, whatever happens to the file meanwhile. :func:`iter_requests` streams a file
that scanned clean (tests, benchmarks).
"""

from __future__ import annotations

import enum
import hashlib
import os
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from sglfleet.gen._config import GenParams
from sglfleet.gen._ids import IdSet, id_digest
from sglfleet.records import CHAT_URL, COMPLETIONS_URL, SUPPORTED_URLS, RecordError, check_messages

__all__ = ["InputFormat", "iter_requests", "scan_input"]


class InputFormat(enum.StrEnum):
    BATCH = "openai-batch"
    CONVERSATION = "conversation"


@dataclass(frozen=True)
class Request:
    custom_id: str
    url: str
    body: bytes  # the JSON body, serialised once (all turns: without messages, see ``turns``)
    line: int = 0
    # conversation input: the turns the answer is regenerated from (last turn), or every turn of
    # the conversation (all turns); None for OpenAI Batch input
    turns: tuple[dict[str, Any], ...] | None = None
    all_turns: bool = False


@dataclass(frozen=True)
class LineError:
    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


@dataclass
class Lines:
    """Where each request of a scanned input is: 8 + 4 + 4 + 8 + 8 bytes per request."""

    offsets: array[int] = field(default_factory=lambda: array("Q"))
    lengths: array[int] = field(default_factory=lambda: array("L"))
    numbers: array[int] = field(default_factory=lambda: array("L"))
    digests: array[int] = field(default_factory=lambda: array("q"))  # of the line's bytes
    ids: array[int] = field(default_factory=lambda: array("Q"))  # id_digest of its custom_id

    def add(self, offset: int, raw: bytes, number: int, id_dig: int) -> None:
        self.offsets.append(offset)
        self.lengths.append(len(raw))
        self.numbers.append(number)
        self.digests.append(line_digest(raw))
        self.ids.append(id_dig)

    def __len__(self) -> int:
        return len(self.offsets)


@dataclass
class ScanResult:
    path: Path
    format: InputFormat | None
    requests: int
    sha256: str
    size: int = 0  # bytes validated (what is sent is read from these bytes only)
    text_requests: int = 0  # /v1/completions lines (validated scans only): no reasoning_content there
    errors: list[LineError] = field(default_factory=list)
    ids: IdSet = field(default_factory=IdSet)
    lines: Lines = field(default_factory=Lines)
    prefix_sha256: str | None = None  # of the first ``prefix_size`` bytes, when asked

    @property
    def ok(self) -> bool:
        return not self.errors

    def pending(self, done: IdSet) -> list[int]:
        """Indexes (into ``lines``) of the requests whose id ``done`` does not hold, in file order."""
        if not len(done):
            return list(range(len(self.lines)))
        has = done.has_digest
        return [i for i, d in enumerate(self.lines.ids) if not has(d)]


class InvalidLine(ValueError):
    pass


class InputChanged(RuntimeError):
    """A line of the input differs from what was validated at the start of the run."""


def line_digest(raw: bytes) -> int:
    """A 64-bit digest of a line, compared only within one process (the run that scanned it): the
    interpreter's keyed SipHash of the bytes, a C call, seeded afresh by each process."""
    return hash(raw)


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
    """The prompt's shape, as :func:`sglfleet.records.check_messages` (merge reads it the same way)."""
    try:
        check_messages(messages, where)
    except RecordError as exc:
        raise InvalidLine(str(exc)) from None


def _batch(obj: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    missing = [k for k in ("custom_id", "method", "url", "body") if k not in obj]
    if missing:
        raise InvalidLine(f"missing field {', '.join(missing)}")
    cid = obj["custom_id"]
    if not isinstance(cid, str) or not cid:
        raise InvalidLine("custom_id must be a non-empty string")
    if obj["method"] != "POST":
        raise InvalidLine(f"unsupported method {obj['method']!r}, only POST")
    if isinstance(obj.get("body"), dict) and obj["body"].get("stream"):
        raise InvalidLine('body.stream is true: a batch job needs whole answers, remove "stream"')
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


def _conversation(obj: dict[str, Any], all_turns: bool = False) -> tuple[str, str, dict[str, Any]]:
    if "id" not in obj:
        raise InvalidLine("missing field id")
    cid = obj["id"]
    if isinstance(cid, bool) or not isinstance(cid, str | int) or cid == "":
        raise InvalidLine("id must be a non-empty string or an integer")
    turns = obj["conversations"]
    _check_messages(turns, "conversations")
    if all_turns:
        # SpecForge's regenerate_train_data.py: system and user turns are kept, every assistant
        # turn is regenerated after the user turn before it; it refuses a conversation that starts
        # with an assistant turn and any other role.
        if turns[0]["role"] == "assistant":
            raise InvalidLine("conversations[0] is an assistant turn: nothing to regenerate it from")
        for i, turn in enumerate(turns):
            if turn["role"] == "tool":
                raise InvalidLine(f"conversations[{i}].role is 'tool': not supported with all turns")
        if not any(t["role"] == "user" for t in turns):
            raise InvalidLine("no user turn to answer")
        return str(cid), CHAT_URL, {}
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


def parse_line(
    raw: bytes, fmt: InputFormat | None, all_turns: bool = False
) -> tuple[InputFormat, str, str, dict[str, Any]]:
    """Validate one line; return (format, custom_id, url, body). Raises :class:`InvalidLine`."""
    obj = _object(raw)
    found = detect(obj)
    if fmt is not None and found is not fmt:
        raise InvalidLine(f"line is {found} format but the file is {fmt} (detected from its first line)")
    cid, url, body = _batch(obj) if found is InputFormat.BATCH else _conversation(obj, all_turns)
    return found, cid, url, body


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as fh:
        yield from enumerate(fh, start=1)


def scan_input(
    path: Path,
    *,
    all_turns: bool = False,
    prefix_size: int | None = None,
    index: bool = True,
    trusted_sha256: str | None = None,
) -> ScanResult:
    """Read the whole input once: its hash, size, format, request count, every bad line, and where
    each request is (``index``). ``prefix_size``: also hash the first that many bytes (to tell an
    input that grew from one that was edited).

    ``trusted_sha256``: the hash of an input an earlier run validated with the same settings (a
    resume): the lines are then only parsed for their ids, not checked again, and should the bytes
    read turn out not to hash to it, the input is scanned again with every check."""
    if trusted_sha256 is not None:
        quick = _scan(Path(path), all_turns, prefix_size, index, validate=False)
        if quick is not None and quick.sha256 == trusted_sha256:
            return quick
    result = _scan(Path(path), all_turns, prefix_size, index, validate=True)
    assert result is not None
    return result


def _quick_id(raw: bytes, fmt: InputFormat | None) -> tuple[InputFormat, str]:
    """The format and id of a line known to be valid (KeyError/ValueError/TypeError otherwise)."""
    obj = orjson.loads(raw)
    found = InputFormat.BATCH if "custom_id" in obj else InputFormat.CONVERSATION
    if fmt is not None and found is not fmt:
        raise ValueError("format changed")
    return found, obj["custom_id"] if found is InputFormat.BATCH else str(obj["id"])


def _scan(
    path: Path, all_turns: bool, prefix_size: int | None, index: bool, *, validate: bool
) -> ScanResult | None:
    sha = hashlib.sha256()
    prefix = hashlib.sha256() if prefix_size is not None else None
    result = ScanResult(path=path, format=None, requests=0, sha256="")
    offset = 0
    for number, raw in _lines(path):
        sha.update(raw)
        start, offset = offset, offset + len(raw)
        if prefix is not None and prefix_size is not None and start < prefix_size:
            prefix.update(raw if offset <= prefix_size else raw[: prefix_size - start])
        if not raw.strip():
            continue
        if validate:
            try:
                fmt, cid, url, _ = parse_line(raw, result.format, all_turns)
            except InvalidLine as exc:
                result.errors.append(LineError(number, str(exc)))
                continue
            if url == COMPLETIONS_URL:
                result.text_requests += 1
        else:
            try:
                fmt, cid = _quick_id(raw, result.format)
            except (orjson.JSONDecodeError, KeyError, ValueError, TypeError):
                return None  # not what was validated before: check everything
        result.format = result.format or fmt
        result.requests += 1
        digest = id_digest(cid)
        if validate:  # the duplicate check; a trusted input was checked by the run that validated it
            result.ids.add_digest(digest)
        if index:
            result.lines.add(start, raw, number, digest)
    result.sha256 = sha.hexdigest()
    result.size = offset
    if prefix is not None and prefix_size is not None and offset >= prefix_size:
        result.prefix_sha256 = prefix.hexdigest()
    result.ids.freeze()
    if result.ids.repeated:
        if not validate:
            return None
        result.errors.extend(_duplicates(path, result.format, result.ids.repeated))
        result.errors.sort(key=lambda e: e.line)
    if result.format is None and not result.errors:
        if not validate:
            return None
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


def make_request(
    obj: dict[str, Any], fmt: InputFormat, defaults: dict[str, Any], params: GenParams, line: int
) -> Request:
    """The request of a validated line, ``defaults`` filled into its body."""
    if fmt is InputFormat.BATCH:
        body = obj["body"]
        body.update(defaults)  # what the command line gives wins over the body
        turns = None
        if params.keep_reasoning and obj["url"] == CHAT_URL:  # the conversation, reasoning kept
            turns = tuple(body["messages"])
        return Request(obj["custom_id"], obj["url"], orjson.dumps(body), line, turns)
    cid = str(obj["id"])
    if params.turns == "all":
        turns = tuple({"role": t["role"], "content": t["content"]} for t in obj["conversations"])
        return Request(cid, CHAT_URL, orjson.dumps(defaults), line, turns, all_turns=True)
    prompt = _prompt_turns(obj["conversations"])
    body = {"messages": prompt, **defaults}
    return Request(cid, CHAT_URL, orjson.dumps(body), line, tuple(prompt))


SPAN_BYTES = 4 << 20  # a batch whose lines lie within this many bytes is read with one pread


def read_requests(
    path: Path, scan: ScanResult, indexes: list[int], params: GenParams, batch: int = 256
) -> Iterator[list[Request]]:
    """The requests at ``indexes`` of a scanned input, in batches, read back from exactly the bytes
    that were validated. Raises :class:`InputChanged` (naming the line) when a line's bytes differ."""
    assert scan.format is not None
    defaults = params.as_dict()
    lines = scan.lines
    offsets, lengths = lines.offsets, lines.lengths
    fd = os.open(path, os.O_RDONLY)
    try:
        for start in range(0, len(indexes), batch):
            out = []
            chunk = indexes[start : start + batch]
            first, last = offsets[chunk[0]], offsets[chunk[-1]] + lengths[chunk[-1]]
            span = b""
            if 0 <= last - first <= SPAN_BYTES:  # the lines close together (a fresh run: all): one read
                span = os.pread(fd, last - first, first)
            for i in chunk:
                at = offsets[i] - first
                if len(span) >= at + lengths[i] > at >= 0:
                    raw = span[at : at + lengths[i]]
                else:
                    raw = os.pread(fd, lengths[i], offsets[i])
                if line_digest(raw) != lines.digests[i]:
                    raise InputChanged(
                        f"{path} line {lines.numbers[i]} changed during the run (it differs from what "
                        "was validated at the start); nothing of it was sent"
                    )
                out.append(make_request(orjson.loads(raw), scan.format, defaults, params, lines.numbers[i]))
            yield out
    finally:
        os.close(fd)


def iter_requests(
    path: Path, fmt: InputFormat, params: GenParams, skip: Callable[[str], bool] | None = None
) -> Iterator[Request]:
    """Stream the requests of a file that scanned clean, defaults from ``params`` filled in.

    ``skip(custom_id)`` true drops a request (the ids already done, on resume).
    """
    defaults = params.as_dict()
    for number, raw in _lines(Path(path)):
        if not raw.strip():
            continue
        obj = orjson.loads(raw)  # validated by scan_input: no second check
        cid = obj["custom_id"] if fmt is InputFormat.BATCH else str(obj["id"])
        if skip is not None and skip(cid):
            continue
        yield make_request(obj, fmt, defaults, params, number)
