"""The stand-in's prefix cache: SGLang's RadixAttention reduced to what a client can measure.

SGLang keeps the KV cache of every prompt (and its output) in a radix tree
(sglang/srt/mem_cache/radix_cache.py, 0.5.12): a new request reuses the longest cached prefix of its
tokens (`match_prefix`, :360) and prefills only the rest; the tree lives in the KV pool, and when
room is needed `evict` (:560) frees least-recently-used leaves first (`eviction_policy` "lru" by
default, :294). At least the last prompt token is always computed, so a repeated prompt reports
`cached_tokens == prompt_tokens - 1`.

Here the tree is a chain of pages of ``PAGE_WORDS`` whitespace words (the stand-in's tokenizer cuts
words into tokens, so a page is a whole number of tokens): page i's key hashes page i's words and
page i-1's key, so two prompts share page i exactly when they share every word up to its end, as
radix-tree paths do. Pages live in one LRU order with a token budget; a path is touched leaf first,
root last, so eviction takes leaves before the prefixes they hang off, as SGLang's does. Not
modelled: locking the pages of running requests against eviction, and matching inside a page
(SGLang matches per token, or per `--page-size` tokens).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from sglfleet_testing.standin.tokenizer import PIECE_CHARS

PAGE_WORDS = 16


def _pages(words: Sequence[str]) -> list[tuple[int, int]]:
    """(key, tokens) of each page of ``words``; the last page may be short."""
    out = []
    key = 0
    for start in range(0, len(words), PAGE_WORDS):
        page = words[start : start + PAGE_WORDS]
        key = hash((key, *page))
        out.append((key, sum((len(w) + PIECE_CHARS - 1) // PIECE_CHARS for w in page)))
    return out


class PrefixCache:
    """Pages of prompts seen, least recently used first, at most ``budget`` tokens (0: disabled)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.size = 0  # tokens held
        self.evicted = 0  # tokens evicted so far
        self._pages: OrderedDict[int, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pages)

    def match_insert(self, words: Sequence[str]) -> int:
        """Tokens of the longest cached prefix of ``words``; then ``words`` is cached (all of it)."""
        return self._walk(_pages(words), count=True)

    def insert(self, words: Sequence[str]) -> None:
        """Cache ``words`` (a finished request's prompt and output, as SGLang's cache_finished_req)."""
        self._walk(_pages(words), count=False)

    def clear(self) -> None:
        self._pages.clear()
        self.size = 0

    def _walk(self, pages: list[tuple[int, int]], *, count: bool) -> int:
        if self.budget <= 0:
            return 0
        cache = self._pages
        matched = 0
        hit = count
        for key, tokens in pages:
            if hit and key in cache:
                matched += tokens
                continue
            hit = False
            if key not in cache:
                cache[key] = tokens
                self.size += tokens
        for key, _ in reversed(pages):  # leaf first, root last: roots are the most recently used
            cache.move_to_end(key)
        while self.size > self.budget and cache:
            _, tokens = cache.popitem(last=False)
            self.size -= tokens
            self.evicted += tokens
        return matched
