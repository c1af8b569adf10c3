"""Prefix affinity: send a request to the endpoint that served its longest prompt prefix last.

SGLang keeps every prompt's KV cache in a radix tree (RadixAttention) and prefills only what its
tree does not hold, so a request that lands where its prefix was computed skips most of its
prefill: the turns of one conversation (`--turns all` sends turn k with turns 1..k-1 before it),
prompts sharing a system prompt. :class:`PrefixAffinity` remembers, for the prefixes of recent
prompts, which endpoint saw them last; the pool (:mod:`sglfleet.gen._dispatch`) asks it which
endpoint to prefer and takes that one while its load allows (a free slot, and no more than
``slack`` requests in flight above the least-loaded endpoint); a full one is waited for while its
load (in flight plus waiting for it) stays within ``slack`` of the least-loaded endpoint's, else the
request spills to the least-loaded endpoint.

A prefix is a whole number of chat messages (each message boundary is one), or for a text prompt
(`prompt`, `text`) a whole number of ``BLOCK_CHARS``-character blocks; only prefixes of at least
``min_chars`` characters count (a short shared prefix saves nothing worth unbalancing the load).
The table holds at most ``max_entries`` prefixes, least recently used dropped first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import orjson

__all__: list[str] = []

BLOCK_CHARS = 1024
POLICIES = ("least-loaded", "prefix")


class PrefixAffinity:
    def __init__(self, *, slack: int = 4, min_chars: int = 256, max_entries: int = 262_144) -> None:
        if slack < 0:
            raise ValueError("slack must be 0 or more")
        self.slack = slack
        self.min_chars = min_chars
        self.max_entries = max_entries
        self._last: OrderedDict[int, int] = OrderedDict()  # prefix key -> endpoint index
        self.hits = 0  # requests sent where their prefix was (what `matched` counts)
        self.misses = 0  # requests with a known prefix sent elsewhere (its endpoint was too busy)

    def __len__(self) -> int:
        return len(self._last)

    def keys(self, body: bytes) -> list[int]:
        """Keys of the prompt's prefixes that are long enough, shortest first ([] if none)."""
        if len(body) < self.min_chars:  # no prompt in it is long enough: not worth parsing
            return []
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError:
            return []
        if not isinstance(request, dict):
            return []
        messages = request.get("messages")
        if isinstance(messages, list):
            return self._message_keys(messages)
        prompt = request.get("prompt", request.get("text"))
        if isinstance(prompt, str):
            return self._text_keys(prompt)
        return []

    def _message_keys(self, messages: list[Any]) -> list[int]:
        out = []
        key = 0
        chars = 0
        for message in messages:
            if not isinstance(message, dict):
                break
            content = message.get("content")
            text = content if isinstance(content, str) else orjson.dumps(content).decode()
            key = hash((key, message.get("role"), text))
            chars += len(text)
            if chars >= self.min_chars:
                out.append(key)
        return out

    def _text_keys(self, prompt: str) -> list[int]:
        out = []
        key = 0
        for start in range(0, len(prompt) - BLOCK_CHARS + 1, BLOCK_CHARS):
            key = hash((key, prompt[start : start + BLOCK_CHARS]))
            if start + BLOCK_CHARS >= self.min_chars:
                out.append(key)
        return out

    def preferred(self, keys: list[int]) -> int | None:
        """The endpoint (index) that served the longest of these prefixes last, if any did."""
        last = self._last
        for key in reversed(keys):
            index = last.get(key)
            if index is not None:
                return index
        return None

    def record(self, keys: list[int], index: int) -> None:
        """``index`` now holds these prefixes (it is about to compute them)."""
        last = self._last
        for key in keys:
            last[key] = index
            last.move_to_end(key)
        while len(last) > self.max_entries:
            last.popitem(last=False)

    def forget(self, index: int) -> None:
        """Drop what ``index`` held (it restarted, or was taken out: its cache is gone or stale)."""
        stale = [k for k, i in self._last.items() if i == index]
        for key in stale:
            del self._last[key]
