"""Texts with a known near-duplicate similarity, for the dedupe tests and bench/bench_mix_merge.py."""

from __future__ import annotations

import math
import random


class Words:
    """Words never used before: every 3-gram of a text built from them is unique to it."""

    def __init__(self) -> None:
        self.n = 0

    def take(self, k: int) -> list[str]:
        out = []
        for _ in range(k):
            n, word = self.n, ""
            self.n += 1
            while True:
                n, r = divmod(n, 26)
                word += "abcdefghijklmnopqrstuvwxyz"[r]
                if not n:
                    break
            out.append("q" + word)
        return out


def planted_pair(rng: random.Random, words: Words, jaccard: float, at_least: bool) -> tuple[str, str, float]:
    """Two texts whose word 3-gram sets have a Jaccard similarity of at least (or at most) `jaccard`,
    and the exact value: the second is the first with its last m words replaced by fresh ones."""
    n = rng.randint(40, 240)
    shingles = n - 2
    share = shingles * (1 - jaccard) / (1 + jaccard)
    m = max(1, math.floor(share) if at_least else math.ceil(share))
    base = words.take(n)
    other = base[: n - m] + words.take(m)
    return " ".join(base), " ".join(other), (shingles - m) / (shingles + m)
