"""Duplicate detection: exact (hash of the normalised text) and near (MinHash LSH).

Exact: every prompt's normalised text is hashed to 64 bits. The existing training set's hashes are
held as one sorted numpy array (8 bytes a row); the candidates seen so far in a Python set. The
first occurrence wins, in the order the caller offers texts (the mix: config order, then file order).

Near: MinHash signatures (datasketch) of word 3-gram shingles, banded as in LSH; a text that
shares a band with an earlier one (estimated Jaccard similarity about the threshold or more) is a
near duplicate.
"""

from __future__ import annotations

import enum
import hashlib
from array import array
from collections.abc import Iterable

import numpy as np

from sglfleet.data._adapters import normalise


class Dup(enum.StrEnum):
    """Why a prompt was dropped as a duplicate."""

    EXISTING = "existing"  # same text as a prompt in the existing training set
    EXACT = "exact"  # same text as an earlier candidate (same or another source)
    NEAR = "near"  # near-duplicate of an earlier candidate


def text_hash(text: str) -> int:
    """64-bit hash of the normalised text (what makes two prompts exact duplicates)."""
    return int.from_bytes(hashlib.blake2b(normalise(text).encode(), digest_size=8).digest(), "big")


def frozen_hashes(hashes: Iterable[int]) -> np.ndarray:
    """A sorted, unique uint64 array of hashes, for `ExactDeduper(existing=...)`."""
    buffer = array("Q", hashes)
    return np.unique(np.frombuffer(buffer, dtype=np.uint64)) if buffer else np.zeros(0, dtype=np.uint64)


class ExactDeduper:
    """Remembers text hashes; `check` says whether a hash was seen before, and remembers it."""

    def __init__(self, existing: np.ndarray | None = None, remember: bool = True) -> None:
        """`existing`: hashes from `frozen_hashes`; `remember=False` checks only against `existing`."""
        self._existing = existing if existing is not None else np.zeros(0, dtype=np.uint64)
        self._remember = remember
        self._seen: set[int] = set()

    def check(self, digest: int) -> Dup | None:
        if self._existing.size:
            value = np.uint64(digest)
            pos = int(np.searchsorted(self._existing, value))
            if pos < self._existing.size and self._existing[pos] == value:
                return Dup.EXISTING
        if not self._remember:
            return None
        if digest in self._seen:
            return Dup.EXACT
        self._seen.add(digest)
        return None


def shingles(text: str, size: int = 3) -> set[bytes]:
    """Word `size`-grams of the normalised text (the text itself when it has fewer words)."""
    words = normalise(text).split()
    if len(words) <= size:
        return {" ".join(words).encode()}
    return {" ".join(words[i : i + size]).encode() for i in range(len(words) - size + 1)}


def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """Bands and rows per band for MinHash LSH: the split of `num_perm` that minimises the (equally
    weighted) false-positive and false-negative areas under the S-curve around `threshold`, as
    datasketch's MinHashLSH chooses them."""
    low = np.linspace(0.0, threshold, 201)
    high = np.linspace(threshold, 1.0, 201)
    best, params = float("inf"), (1, num_perm)
    for bands in range(1, num_perm + 1):
        for rows in range(1, num_perm // bands + 1):
            false_pos = np.trapezoid(1 - (1 - low**rows) ** bands, low)
            false_neg = np.trapezoid((1 - high**rows) ** bands, high)
            if false_pos + false_neg < best:
                best, params = false_pos + false_neg, (bands, rows)
    return params


class NearDeduper:
    """MinHash LSH over the texts offered so far; `check` says whether a text is a near duplicate.

    A text is a near duplicate when one of its LSH bands equals a band of an earlier text (what
    datasketch's MinHashLSH.query reports). Only the band keys are kept, one 64-bit hash per band
    and text, not the signatures: a few hundred bytes per text.
    """

    SCHEME = "affine32"  # datasketch >= 2 permutation scheme

    def __init__(self, threshold: float, num_perm: int = 64, seed: int = 1) -> None:
        from datasketch import MinHash

        self._minhash = MinHash
        self._template = MinHash(num_perm=num_perm, seed=seed, scheme=self.SCHEME)
        self._num_perm = num_perm
        self._seed = seed
        self.bands, self.rows = lsh_params(threshold, num_perm)
        self._keys: set[int] = set()

    def signature(self, text: str) -> np.ndarray:
        sig = self._minhash(
            num_perm=self._num_perm,
            seed=self._seed,
            permutations=self._template.permutations,
            scheme=self.SCHEME,
        )
        sig.update_batch(sorted(shingles(text)))
        return sig.hashvalues

    def check(self, text: str) -> Dup | None:
        values = self.signature(text)
        r = self.rows
        keys = [
            int.from_bytes(
                hashlib.blake2b(
                    values[i * r : (i + 1) * r].tobytes(), digest_size=8, salt=i.to_bytes(2, "big")
                ).digest()
            )
            for i in range(self.bands)
        ]
        if any(k in self._keys for k in keys):
            return Dup.NEAR
        self._keys.update(keys)
        return None
