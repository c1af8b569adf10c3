"""Format adapters: one dataset row (ShareGPT, OpenAI messages, Alpaca, plain prompt) → chat messages.

An adapter returns the *prompt* of a row: the messages up to and including the last user turn (the
assistant answers after it are what the target model regenerates). A row that lacks the mapped field,
or whose field has the wrong shape, raises `RowError` with the reason; the caller adds where it was.
"""

from __future__ import annotations

import enum
import re
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Format", "RowError", "to_messages", "user_text"]

Message = dict[str, str]


class RowError(ValueError):
    """A row does not fit its format; the message says which field and why."""


class Format(enum.StrEnum):
    SHAREGPT = "sharegpt"
    OPENAI = "openai"
    ALPACA = "alpaca"
    PROMPT = "prompt"


# The field each format reads when the config does not name one.
DEFAULT_FIELD: dict[Format, str] = {
    Format.SHAREGPT: "conversations",
    Format.OPENAI: "messages",
    Format.ALPACA: "instruction",
    Format.PROMPT: "prompt",
}

# ShareGPT speaker names (and OpenAI role names, which ShareGPT-style files use too) → OpenAI roles.
_ROLES: dict[str, str] = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
    "developer": "system",
}


def _text(content: Any, where: str) -> str:
    """Message content as text: a string, or OpenAI content parts whose text parts are joined."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    raise RowError(f"{where}: content is a {type(content).__name__}, expected text")


def _turns(
    row: Mapping[str, Any], field: str, role_keys: tuple[str, str], text_keys: tuple[str, str]
) -> list:
    if field not in row:
        raise RowError(f"row has no field {field!r} (fields: {', '.join(sorted(map(str, row))) or 'none'})")
    turns = row[field]
    if not isinstance(turns, list):
        raise RowError(f"field {field!r} is a {type(turns).__name__}, expected a list of turns")
    messages: list[Message] = []
    role_a, role_b = role_keys
    text_a, text_b = text_keys
    for i, turn in enumerate(turns):  # runs over every row of a million-row set: no work but checks
        if not isinstance(turn, dict) and not isinstance(turn, Mapping):
            raise RowError(f"{field}[{i}] is a {type(turn).__name__}, expected an object")
        speaker = turn[role_a] if role_a in turn else turn.get(role_b)
        if not isinstance(speaker, str):
            raise RowError(f"{field}[{i}] has no {' or '.join(repr(k) for k in role_keys)}")
        role = _ROLES.get(speaker) or _ROLES.get(speaker.strip().lower())
        if role is None:
            raise RowError(f"{field}[{i}]: unknown speaker {speaker!r}")
        key = text_a if text_a in turn else text_b if text_b in turn else None
        if key is None:
            raise RowError(f"{field}[{i}] has no {' or '.join(repr(k) for k in text_keys)}")
        content = turn[key]
        messages.append(
            {"role": role, "content": content if type(content) is str else _text(content, f"{field}[{i}]")}
        )
    return messages


def _prompt_part(messages: list[Message]) -> list[Message]:
    """The messages up to and including the last user turn ([] when there is no user turn)."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    if last_user < 0:
        # Keep the system turns so that "system-only" can be told apart from "empty".
        return [m for m in messages if m["role"] == "system"]
    return messages[: last_user + 1]


def sharegpt(row: Mapping[str, Any], field: str) -> list[Message]:
    return _prompt_part(_turns(row, field, ("from", "role"), ("value", "content")))


def openai(row: Mapping[str, Any], field: str) -> list[Message]:
    return _prompt_part(_turns(row, field, ("role", "from"), ("content", "value")))


def alpaca(row: Mapping[str, Any], field: str) -> list[Message]:
    if field not in row:
        raise RowError(f"row has no field {field!r} (fields: {', '.join(sorted(map(str, row))) or 'none'})")
    instruction = row[field]
    if not isinstance(instruction, str):
        raise RowError(f"field {field!r} is a {type(instruction).__name__}, expected text")
    extra = row.get("input") or ""
    if not isinstance(extra, str):
        raise RowError(f"field 'input' is a {type(extra).__name__}, expected text")
    content = f"{instruction.strip()}\n\n{extra.strip()}" if extra.strip() else instruction
    messages: list[Message] = []
    system = row.get("system")
    if isinstance(system, str) and system.strip():
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": content})
    return messages


def prompt(row: Mapping[str, Any], field: str) -> list[Message]:
    if field not in row:
        raise RowError(f"row has no field {field!r} (fields: {', '.join(sorted(map(str, row))) or 'none'})")
    value = row[field]
    if not isinstance(value, str):
        raise RowError(f"field {field!r} is a {type(value).__name__}, expected text")
    return [{"role": "user", "content": value}]


ADAPTERS: dict[Format, Callable[[Mapping[str, Any], str], list[Message]]] = {
    Format.SHAREGPT: sharegpt,
    Format.OPENAI: openai,
    Format.ALPACA: alpaca,
    Format.PROMPT: prompt,
}


def fields_read(fmt: Format, field: str | None = None) -> tuple[str, ...]:
    """The row fields an adapter reads, the mapped one first."""
    main = field or DEFAULT_FIELD[fmt]
    return (main, "input", "system") if fmt is Format.ALPACA else (main,)


def to_messages(row: Any, fmt: Format, field: str | None = None) -> list[Message]:
    """The prompt messages of `row` read as `fmt` (field defaults to the format's usual one)."""
    if not isinstance(row, Mapping):
        raise RowError(f"row is a {type(row).__name__}, expected an object")
    return ADAPTERS[fmt](row, field or DEFAULT_FIELD[fmt])


def user_text(messages: list[Message]) -> str:
    """What the user asked: the user turns joined. Dedupe, length filters and categories use it."""
    return "\n".join(m["content"] for m in messages if m["role"] == "user")


_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    """Text as compared for exact duplicates: NFKC, case-folded, whitespace runs collapsed."""
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()
