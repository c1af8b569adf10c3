"""The records of a generation job, each declared once, as vLLM's ``run_batch.py`` declares
``BatchRequestInput`` / ``BatchRequestOutput``: every stage reads and writes them through here.

* the prompt (OpenAI chat ``messages``; a conversation's ``conversations``): :func:`check_messages`,
  the one rule ``sglfleet generate`` validates its input with and ``sglfleet merge`` reads its prompts
  with, so whatever generate sends, merge carries through (content parts, an assistant turn with
  ``content: null`` and ``tool_calls``, kept as the prompt had them);
* the OpenAI Batch request line: :func:`request_line` (what ``sglfleet mix`` writes);
* the OpenAI Batch output lines: :func:`result_line` (a success) and :func:`error_line` (a failure),
  written by ``generate``; :func:`result_of` reads one back. A line is a *result* only when it is a
  JSON object with a string ``custom_id``, no ``error``, ``response.status_code`` 200 and a body
  with at least one choice; an error record, an input line or anything else is not (resume sends
  that id again, merge drops it as failed). A result whose fields have the wrong type (a string
  token count, a body that is not an object) raises :class:`RecordError` naming the field;
* :class:`ResultsSummary`: what the manifest records of the results file it summarised (its size,
  the results in it, a SHA-256 of its last bytes), and :func:`results_problem`, which compares it
  with the file on disk: the results on disk are the truth, a manifest only a summary of them.

* :class:`Manifest` (``OUT.manifest.json``): the job's input, parameters, counts and timings, and the
  :class:`ResultsSummary` of its output; :mod:`sglfleet.gen` reads, writes and fills it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
SUPPORTED_URLS = (CHAT_URL, COMPLETIONS_URL)
ROLES = ("system", "user", "assistant", "tool")


class RecordError(ValueError):
    """A record of the wrong shape; the message names the field (``body.messages[2].content ...``)."""


def kind(value: Any) -> str:
    """A JSON value's type in words: ``an object``, ``a list``, ``null``, ``a int``, ..."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else f"a {type(value).__name__}"
    )


# --- the prompt -------------------------------------------------------------------------------------


def check_messages(messages: Any, where: str) -> None:
    """Raise :class:`RecordError` unless ``messages`` is a non-empty list of turns: each an object
    with a ``role`` of :data:`ROLES` and a ``content`` that is a string, a list of content parts
    (objects with a string ``type``), or null on an assistant turn (one that made tool calls)."""
    if not isinstance(messages, list):
        raise RecordError(f"{where} is {kind(messages)}, expected a list of messages")
    if not messages:
        raise RecordError(f"{where} is empty")
    for i, turn in enumerate(messages):
        if not isinstance(turn, dict):
            raise RecordError(f"{where}[{i}] is {kind(turn)}, expected an object")
        role = turn.get("role")
        if role not in ROLES:
            raise RecordError(f"{where}[{i}].role is {role!r}, expected one of {', '.join(ROLES)}")
        if "content" not in turn:
            raise RecordError(f"{where}[{i}] has no content")
        content = turn["content"]
        if isinstance(content, str) or (content is None and role == "assistant"):
            continue
        if not isinstance(content, list):
            raise RecordError(
                f"{where}[{i}].content is {kind(content)}, expected a string or a list of content parts"
            )
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise RecordError(f"{where}[{i}].content[{j}] is not a content part (an object with a type)")


def message_text(content: Any) -> str:
    """The text of a turn's ``content``: the string, or its text parts joined (images are no text)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p.get("text"), str))
    return ""


# --- the request line ------------------------------------------------------------------------------


def request_line(
    custom_id: str, url: str, body: dict[str, Any], metadata: dict[str, Any] | None = None
) -> bytes:
    """One OpenAI Batch input line, ``{"custom_id", "method": "POST", "url", "body"}`` (what
    ``sglfleet mix`` writes and ``generate`` reads), with ``metadata`` when given (merge reads its
    ``category``)."""
    line: dict[str, Any] = {"custom_id": custom_id, "method": "POST", "url": url, "body": body}
    if metadata is not None:
        line["metadata"] = metadata
    return orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)


# --- the output lines -------------------------------------------------------------------------------


def _compact(raw: bytes) -> bytes | None:
    """``raw`` as is when it is a single-line JSON object (the common case), else None."""
    raw = raw.strip()
    if raw[:1] == b"{" and raw[-1:] == b"}" and b"\n" not in raw and b"\r" not in raw:
        return raw
    return None


def result_line(
    custom_id: str,
    request_id: str,
    body: Any,
    raw_body: bytes | None,
    line_id: str,
    *,
    conversations: list[dict[str, Any]] | None = None,
) -> bytes:
    """A success line. ``raw_body`` (the server's bytes for ``body``) is spliced in when compact."""
    spliced = _compact(raw_body) if raw_body is not None else None
    tail = b"}\n" if conversations is None else b',"conversations":' + orjson.dumps(conversations) + b"}\n"
    return b"".join(
        (
            b'{"id":"',
            line_id.encode(),
            b'","custom_id":',
            orjson.dumps(custom_id),
            b',"response":{"status_code":200,"request_id":',
            orjson.dumps(request_id),
            b',"body":',
            spliced or orjson.dumps(body),
            b'},"error":null',
            tail,
        )
    )


def error_line(
    custom_id: str, code: str, message: str, *, status_code: int | None, body: Any, line_id: str
) -> bytes:
    """A failure line: ``response`` holds the server's answer when there was one."""
    record = {
        "id": line_id,
        "custom_id": custom_id,
        "response": None if status_code is None else {"status_code": status_code, "body": body},
        "error": {"code": code, "message": message},
    }
    return orjson.dumps(record) + b"\n"


@dataclass(frozen=True, slots=True)
class Result:
    """A success line, read back: its id, the answer's first choice, the usage counts (None: absent)."""

    custom_id: str
    body: dict[str, Any]
    choice: dict[str, Any]
    prompt_tokens: int | None
    completion_tokens: int | None


def _expect(field: str, value: Any, typ: type, expected: str) -> Any:
    if value is not None and (not isinstance(value, typ) or isinstance(value, bool)):
        raise RecordError(f"{field} is {kind(value)}, expected {expected}")
    return value


def _count(usage: dict[str, Any], name: str) -> int | None:
    value = _expect(f"response.body.usage.{name}", usage.get(name), int, "an integer")
    if value is not None and value < 0:
        raise RecordError(f"response.body.usage.{name} is {value}, expected an integer >= 0")
    return value


def result_of(record: Any) -> Result | None:
    """The success line ``record`` (a parsed output line) as a :class:`Result`; None when it is not a
    success (an error record, a status other than 200, no choices, not an output line at all).
    :class:`RecordError` when it is a success whose fields have the wrong type."""
    if not isinstance(record, dict):
        return None
    cid = record.get("custom_id")
    if not isinstance(cid, str) or not cid or record.get("error") is not None:
        return None
    response = _expect("response", record.get("response"), dict, "an object")
    if response is None:
        return None
    status = response.get("status_code")
    if type(status) is not int or status != 200:  # not 200.0, not true
        return None
    body = _expect("response.body", response.get("body"), dict, "an object")
    if body is None:
        return None
    choices = _expect("response.body.choices", body.get("choices"), list, "a list")
    if not choices:
        return None
    choice = _expect("response.body.choices[0]", choices[0], dict, "an object")
    if choice is None:
        return None
    _expect("response.body.choices[0].message", choice.get("message"), dict, "an object")
    usage = _expect("response.body.usage", body.get("usage"), dict, "an object") or {}
    return Result(cid, body, choice, _count(usage, "prompt_tokens"), _count(usage, "completion_tokens"))


# orjson writes integers of at most 64 bits: a larger count could not even be written back
_MAX_COUNT = 2**63 - 1
_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")


def answer_problem(body: Any) -> str | None:
    """Why a 200 answer's ``body`` is not a chat/text completion that can be stored as it is, in words
    naming the field (``response.body.usage.prompt_tokens is 'abc', ...``); None when it is one. The
    one definition of an answer: the request path checks every answer with it before anything is
    stored (one it rejects is that request's ``invalid_response``: retried, then the errors file), and
    whatever it accepts, stored by :func:`result_line`, :func:`result_of` reads back as a result
    (resume counts it done, merge reads it; a test holds the two together).

    Checked: the body an object, not an error object; ``choices`` a non-empty list of objects; the
    first one's answer (``message.content`` a string, or ``text`` a string for a text completion),
    ``message.role`` / ``reasoning_content`` and ``finish_reason`` strings or absent; ``usage`` an
    object or absent, its ``prompt_tokens`` / ``completion_tokens`` / ``total_tokens`` integers
    (not bools), 0 to 2**63-1, or absent; ``id`` a string or absent."""
    if not isinstance(body, dict):
        return (
            "response.body is null" if body is None else f"response.body is {kind(body)}, expected an object"
        )
    choices = body.get("choices")
    if body.get("object") == "error" or ("error" in body and not choices):
        return f"an error object: {_error_message(body)}"
    if not isinstance(choices, list) or not choices:
        if choices is None or choices == []:
            return "response.body has no choices"
        return f"response.body.choices is {kind(choices)}, expected a list"
    for i, choice in enumerate(choices):
        if not isinstance(choice, dict):
            return f"response.body.choices[{i}] is {kind(choice)}, expected an object"
    return _choice_problem(choices[0]) or _usage_problem(body.get("usage")) or _id_problem(body.get("id"))


def _error_message(body: dict[str, Any]) -> str:
    err = body.get("error")
    found = (
        body.get("message") or (err.get("message") if isinstance(err, dict) else err) or body.get("detail")
    )
    return found if isinstance(found, str) and found else orjson.dumps(body)[:500].decode("utf-8", "replace")


def _choice_problem(choice: dict[str, Any]) -> str | None:
    where = "response.body.choices[0]"
    message = choice.get("message")
    if message is not None:  # a chat completion: the answer is message.content
        if not isinstance(message, dict):
            return f"{where}.message is {kind(message)}, expected an object"
        if not isinstance(message.get("content"), str):
            # SGLang answers content null when nothing is left after the reasoning (a thinking model
            # cut by max_tokens): not an answer to train on, retried, then reported
            return f"{where}.message.content is {kind(message.get('content'))}, expected a string"
        for key in ("role", "reasoning_content"):
            if message.get(key) is not None and not isinstance(message[key], str):
                return f"{where}.message.{key} is {kind(message[key])}, expected a string"
    elif not isinstance(choice.get("text"), str):  # a text completion: choices[0].text
        return f"{where} has neither message.content nor text"
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        return f"{where}.finish_reason is {kind(finish)}, expected a string"
    return None


def _usage_problem(usage: Any) -> str | None:
    if usage is None:
        return None
    if not isinstance(usage, dict):
        return f"response.body.usage is {kind(usage)}, expected an object"
    for key in _COUNTS:
        value = usage.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
            shown = repr(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            return f"response.body.usage.{key} is {shown}, not a token count (an integer, 0 or more)"
    return None


def _id_problem(value: Any) -> str | None:
    return (
        None
        if value is None or isinstance(value, str)
        else f"response.body.id is {kind(value)}, expected a string"
    )


def done_of(raw: bytes) -> tuple[str, int, int] | None:
    """(custom_id, prompt tokens, completion tokens) of an output line that is a well-formed success;
    None for any other line (resume sends that id again). ``orjson.JSONDecodeError`` when it is not
    JSON at all.

    Resume reads every line of the output with it, so the shape ``generate`` writes is checked inline
    first (the same rules as :func:`result_of`, without its calls); any other line takes
    :func:`full_done_of`, and a test holds both to the same answer on adversarial lines."""
    record = orjson.loads(raw)
    if type(record) is dict and record.get("error") is None:
        cid, response = record.get("custom_id"), record.get("response")
        if type(cid) is str and cid and type(response) is dict and type(response.get("status_code")) is int:
            body = response.get("body") if response["status_code"] == 200 else None
            choices = body.get("choices") if type(body) is dict else None
            if type(choices) is list and choices and type(choices[0]) is dict:
                usage = body.get("usage") if type(choices[0].get("message", {})) is dict else None  # type: ignore[union-attr]
                if type(usage) is dict:
                    p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
                    if type(p) is int and type(c) is int and p >= 0 and c >= 0:
                        return cid, p, c
    return _done(record)


def full_done_of(raw: bytes) -> tuple[str, int, int] | None:
    """:func:`done_of` without its fast path: :func:`result_of` of the parsed line."""
    return _done(orjson.loads(raw))


def _done(record: Any) -> tuple[str, int, int] | None:
    try:
        found = result_of(record)
    except RecordError:
        return None
    if found is None:
        return None
    return found.custom_id, found.prompt_tokens or 0, found.completion_tokens or 0


# --- what the manifest records of the results -------------------------------------------------------

TAIL_BYTES = 1 << 16  # the fingerprint covers the results file's last this many bytes


class ResultsSummary(BaseModel):
    """The results file as the run that wrote the manifest left it: its size in bytes, the results in
    it (ids of the input answered), and the SHA-256 of its last :data:`TAIL_BYTES` bytes."""

    size: int
    results: int
    tail_sha256: str


def tail_sha256(fd: int, size: int) -> str:
    """SHA-256 of the ``TAIL_BYTES`` bytes of the open file ``fd`` that end at ``size``."""
    start = max(0, size - TAIL_BYTES)
    data = os.pread(fd, size - start, start)
    return hashlib.sha256(data).hexdigest()


def summarize(fd: int, size: int, results: int) -> ResultsSummary:
    return ResultsSummary(size=size, results=results, tail_sha256=tail_sha256(fd, size))


RESULTS_MISSING = "results missing or short: rerun resumes"


def results_problem(output: Path, summary: ResultsSummary | None, done: int = 0) -> str | None:
    """Why the results file on disk is not the one ``summary`` describes, in words that start with
    :data:`RESULTS_MISSING`; None when it is. Without a summary (a manifest from before it was kept),
    a file absent or empty while ``done`` results were reported is the only thing told."""
    try:
        fd = os.open(output, os.O_RDONLY)
    except FileNotFoundError:
        return None if summary is None and done == 0 else f"{RESULTS_MISSING} ({output} does not exist)"
    except OSError as exc:
        return f"{RESULTS_MISSING} ({output}: {exc.strerror})"
    try:
        size = os.fstat(fd).st_size
        if summary is None:
            return f"{RESULTS_MISSING} ({output} is empty)" if size == 0 and done > 0 else None
        if size < summary.size:
            return f"{RESULTS_MISSING} ({output} holds {size} bytes, the manifest summarised {summary.size})"
        if tail_sha256(fd, summary.size) != summary.tail_sha256:
            return f"{RESULTS_MISSING} ({output} is not the file the manifest summarised: its bytes differ)"
        return None
    finally:
        os.close(fd)


# --- the manifest -----------------------------------------------------------------------------------
# ``OUT.manifest.json``: what a job was asked, how far it got, and what its results file held when it
# was written (read, written and filled by :mod:`sglfleet.gen`'s manifest module).

Status = Literal["running", "complete", "complete_with_failures", "interrupted", "failed"]


class Counts(BaseModel):
    total: int = 0
    done: int = 0
    failed: int = 0
    remaining: int = 0
    sent_this_run: int = 0
    retries_this_run: int = 0
    resent_this_run: int = 0  # requests sent to a second endpoint because theirs stalled


class Tokens(BaseModel):
    prompt: int = 0
    completion: int = 0


class Throughput(BaseModel):
    requests_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    eta_s: float | None = None  # seconds left at the recent rate; None: unknown (nothing answering lately)


class Timings(BaseModel):
    first_started_at: str
    run_started_at: str
    updated_at: str
    run_elapsed_s: float = 0.0
    total_elapsed_s: float = 0.0
    runs: int = 1


class InputInfo(BaseModel):
    path: str
    sha256: str
    format: str
    requests: int
    size: int | None = None  # bytes validated and sent from (None: a manifest from before it was kept)


class Manifest(BaseModel):
    version: Literal[1] = 1
    status: Status
    input: InputInfo
    params: dict[str, Any]
    endpoints: list[str]
    counts: Counts
    tokens: Tokens
    throughput: Throughput
    timings: Timings
    errors_file: str
    message: str = ""
    endpoint_stats: dict[str, dict[str, float]] = Field(default_factory=dict)
    pid: int | None = None  # of the run that wrote it
    results: ResultsSummary | None = None  # the output as it was when written (None: an older manifest)
