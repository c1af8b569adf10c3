"""Duplicate detection: exact (hash of the normalised text) and near (MinHash LSH, confirmed).

Exact: every prompt's normalised text is hashed to 64 bits. The existing training set's hashes are
held as one sorted numpy array (8 bytes a row); the candidates seen so far in a Python set. The
first occurrence wins, in the order the caller offers texts (the mix: config order, then file order).

Near: a pair of texts is a near duplicate when the Jaccard similarity of their word 3-gram sets,
estimated from MinHash signatures, is at least the threshold. Finding the pairs:

1. Signatures: `num_perm` MinHash values per text, datasketch's "affine32" permutations computed
   for many texts at once with numpy; only the low 8 bits of each value are kept (b-bit MinHash,
   Li & König 2010), so a row costs `num_perm` bytes.
2. Candidates: LSH bands (`bands` x `rows` values). `plan_lsh` picks them for recall: a pair at
   Jaccard threshold + 0.05 shares a band with probability >= 99.9%; among those splits, the one
   with the fewest candidates below threshold - 0.1.
3. Confirmation: each candidate pair's estimated Jaccard (matching 8-bit values, corrected for the
   1/256 chance collisions) against the threshold. `num_perm` "auto" takes the fewest permutations
   for which the estimate is tight enough: expected recall >= 99.5% at threshold + 0.05 and expected
   false drops <= 0.5% at threshold - 0.1 (binomial model, `LshPlan.expected`).

The existing training set's signatures go in first: a candidate close to an existing row is
dropped as `near_existing`; one close to an earlier *kept* candidate as `near`.
"""

from __future__ import annotations

import enum
import hashlib
import math
import struct
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from sglfleet.data._adapters import normalise

__all__ = ["LshPlan", "NearDeduper", "plan_lsh"]


class Dup(enum.StrEnum):
    """Why a prompt was dropped as a duplicate."""

    EXISTING = "existing"  # same text as a prompt in the existing training set
    EXACT = "exact"  # same text as an earlier candidate (same or another source)
    NEAR = "near"  # near-duplicate of an earlier kept candidate
    NEAR_EXISTING = "near_existing"  # near-duplicate of a prompt in the existing training set


def normalised_hash(normalised: str) -> int:
    """64-bit hash of a normalised text (`normalise(text)`): what makes two prompts exact duplicates."""
    return int.from_bytes(hashlib.blake2b(normalised.encode(), digest_size=8).digest(), "big")


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


# ---- the plan: permutations, bands, confirmation ------------------------------------------------

RECALL_MARGIN = 0.05  # pairs at threshold + this must be found ...
FALSE_DROP_MARGIN = 0.10  # ... and pairs at threshold - this must not be
BAND_RECALL = 0.999  # probability that a pair at threshold + RECALL_MARGIN shares a band
TARGET_RECALL = 0.995  # what "auto" asks of the whole (bands and confirmation) at threshold + 0.05
TARGET_FALSE_DROPS = 0.005  # and at threshold - 0.1
AUTO_NUM_PERM = (128, 192, 256, 320, 384, 448, 512)
_BBITS = 8
_COLLIDE = 1.0 / (1 << _BBITS)  # chance that two different 32-bit MinHash values share their low 8 bits


def _recall_point(threshold: float) -> float:
    """Where recall is promised: threshold + 0.05 (halfway to 1 for thresholds above 0.9)."""
    return min(threshold + RECALL_MARGIN, (1.0 + threshold) / 2)


def _band_prob(jaccard: float | np.ndarray, bands: int, rows: int) -> float | np.ndarray:
    """The LSH S-curve: the probability that a pair at `jaccard` shares at least one band."""
    return 1.0 - (1.0 - np.power(jaccard, rows)) ** bands


def _binom_sf(n: int, p: float, k: int) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
        for i in range(k, n + 1)
    ]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


@dataclass(frozen=True)
class LshPlan:
    """How near duplicates are found for one threshold: signature size, bands, confirmation cutoff."""

    threshold: float
    num_perm: int
    bands: int
    rows: int
    min_matches: int  # a candidate pair is confirmed when this many 8-bit values agree

    def expected(self, jaccard: float) -> float:
        """The probability that a pair at `jaccard` is dropped (found by a band, then confirmed)."""
        matching = jaccard + (1.0 - jaccard) * _COLLIDE
        return float(_band_prob(jaccard, self.bands, self.rows)) * _binom_sf(
            self.num_perm, matching, self.min_matches
        )

    @property
    def recall_point(self) -> float:
        return _recall_point(self.threshold)

    @property
    def false_drop_point(self) -> float:
        return max(0.0, self.threshold - FALSE_DROP_MARGIN)

    @property
    def expected_recall(self) -> float:
        """Expected share of pairs at threshold + 0.05 that are dropped (see `_recall_point`)."""
        return self.expected(self.recall_point)

    @property
    def expected_false_drops(self) -> float:
        """Expected share of pairs at threshold - 0.1 that are dropped."""
        return self.expected(self.false_drop_point)

    @property
    def bytes_per_row(self) -> int:
        """What the deduper keeps per row until `resolve`: its signature, one byte a permutation."""
        return self.num_perm


def _bands_for(threshold: float, num_perm: int) -> tuple[int, int]:
    """The band split of `num_perm` for recall: the pair at threshold + 0.05 shares a band with
    probability >= BAND_RECALL (or as near as `num_perm` allows), and among those splits the one
    with the least S-curve area below threshold - 0.1 (fewest candidates to confirm)."""
    high = _recall_point(threshold)
    low = np.linspace(0.0, max(threshold - FALSE_DROP_MARGIN, 0.01), 101)
    best_key: tuple[bool, float] | None = None
    best = (num_perm, 1)
    for rows in range(1, num_perm + 1):
        bands = num_perm // rows
        recall = float(_band_prob(high, bands, rows))
        area = float(np.trapezoid(_band_prob(low, bands, rows), low))
        key = (recall < BAND_RECALL, -recall if recall < BAND_RECALL else area)
        if best_key is None or key < best_key:
            best_key, best = key, (bands, rows)
    return best


@lru_cache(maxsize=64)
def plan_lsh(threshold: float, num_perm: int | None = None) -> LshPlan:
    """The plan for `threshold`; `num_perm=None` picks the fewest of AUTO_NUM_PERM that meet the
    targets (the largest when none does)."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), not {threshold}")

    # matches needed: estimated Jaccard (m/k - c) / (1 - c) >= threshold
    def make(k: int) -> LshPlan:
        bands, rows = _bands_for(threshold, k)
        need = math.ceil((threshold * (1.0 - _COLLIDE) + _COLLIDE) * k - 1e-9)
        return LshPlan(threshold, k, bands, rows, need)

    if num_perm is not None:
        return make(num_perm)
    plan = make(AUTO_NUM_PERM[-1])
    for k in AUTO_NUM_PERM:
        candidate = make(k)
        if (
            candidate.expected_recall >= TARGET_RECALL
            and candidate.expected_false_drops <= TARGET_FALSE_DROPS
        ):
            return candidate
    return plan


# ---- signatures ---------------------------------------------------------------------------------

_FMIX = (np.uint32(16), np.uint32(0x85EBCA6B), np.uint32(13), np.uint32(0xC2B2AE35), np.uint32(16))
_FMIX64 = (np.uint64(33), np.uint64(0xFF51AFD7ED558CCD), np.uint64(33), np.uint64(0xC4CEB9FE1A85EC53))
_SECOND, _THIRD = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD6E8FEB86659FD93)


def _fmix32(hv: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer, as datasketch's affine32 scheme pre-mixes each input hash."""
    s1, m1, s2, m2, s3 = _FMIX
    hv = hv ^ (hv >> s1)
    hv = hv * m1
    hv = hv ^ (hv >> s2)
    hv = hv * m2
    return hv ^ (hv >> s3)


def _fmix64(hv: np.ndarray) -> np.ndarray:
    s1, m1, s2, m2 = _FMIX64
    with np.errstate(over="ignore"):
        hv = (hv ^ (hv >> s1)) * m1
        hv = (hv ^ (hv >> s2)) * m2
    return hv ^ (hv >> s1)


def _sha1_32(data: bytes) -> int:
    # datasketch.hashfunc.sha1_hash32: the first 4 bytes of SHA-1, little-endian
    return struct.unpack("<I", hashlib.sha1(data).digest()[:4])[0]


def _word_hash(word: str) -> int:
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")


class Signer:
    """MinHash signatures of many texts at once (numpy, no per-shingle Python work).

    A shingle (word 3-gram of the normalised text, or the whole text when it has fewer than three
    words) hashes to 32 bits from its words' 64-bit hashes (blake2b, cached per word); the
    permutations are datasketch's "affine32" ones (`MinHash(num_perm, seed).permutations`, the
    MurmurHash3 pre-mix, then a*h+b mod 2^32), so that `from_hashes` equals datasketch's
    `MinHash.update_batch` given the same 32-bit shingle hashes.
    """

    WORD_CACHE = 200_000  # cached word hashes (a few tens of MiB at most); emptied when full

    def __init__(self, num_perm: int, seed: int = 1) -> None:
        from datasketch import MinHash

        a, b = MinHash(num_perm=num_perm, seed=seed, scheme="affine32").permutations
        self._a = np.asarray(a, dtype=np.uint32)
        self._b = np.asarray(b, dtype=np.uint32)
        self.num_perm = num_perm
        self._words: dict[str, int] = {}

    def shingle_hashes(self, texts: list[str], normalised: bool = False) -> list[np.ndarray]:
        """Each text's shingle hashes (uint32; as many as shingles() has, duplicates included);
        `normalised`: the texts are `normalise`d already."""
        cache = self._words
        if len(cache) > self.WORD_CACHE:
            cache.clear()
        all_words: list[str] = []
        counts: list[int] = []
        for text in texts:
            words = (text if normalised else normalise(text)).split()
            counts.append(len(words))
            all_words.extend(words)
        for word in set(all_words).difference(cache):
            cache[word] = _word_hash(word)
        words_arr = np.fromiter(map(cache.__getitem__, all_words), dtype=np.uint64, count=len(all_words))
        with np.errstate(over="ignore"):
            if len(words_arr) >= 3:
                grams = _fmix64(words_arr[:-2] ^ _fmix64(words_arr[1:-1] * _SECOND ^ words_arr[2:] * _THIRD))
            else:
                grams = np.zeros(0, dtype=np.uint64)
        high = (grams >> np.uint64(32)).astype(np.uint32)
        out: list[np.ndarray] = []
        start = 0
        for count in counts:
            if count >= 3:
                out.append(high[start : start + count - 2])
            else:  # the whole (short) text is the one shingle
                short = " ".join(all_words[start : start + count]).encode()
                out.append(np.asarray([_sha1_32(short)], dtype=np.uint32))
            start += count
        return out

    def from_hashes(self, rows: list[np.ndarray]) -> np.ndarray:
        """(len(rows), num_perm) uint32 MinHash values of sets given as 32-bit hashes."""
        lengths = np.asarray([len(r) for r in rows], dtype=np.intp)
        order = np.argsort(-lengths, kind="stable")  # longest first: rows still open at step j are a prefix
        flat = np.concatenate([rows[i] for i in order]) if rows else np.zeros(0, np.uint32)
        mixed = _fmix32(flat).reshape(-1, 1)
        sorted_lengths = lengths[order]
        starts = np.concatenate(([0], np.cumsum(sorted_lengths)[:-1])).astype(np.intp)
        result = np.full((len(rows), self.num_perm), np.uint32(0xFFFFFFFF), dtype=np.uint32)
        scratch = np.empty_like(result)
        open_rows = len(rows)
        for step in range(int(sorted_lengths[0]) if len(rows) else 0):
            while open_rows and sorted_lengths[open_rows - 1] <= step:
                open_rows -= 1
            part = scratch[:open_rows]
            np.multiply(mixed[starts[:open_rows] + step], self._a, out=part)  # wraps: mod 2^32
            np.add(part, self._b, out=part)
            np.minimum(result[:open_rows], part, out=result[:open_rows])
        unsorted = np.empty_like(result)
        unsorted[order] = result
        return unsorted

    def full(self, texts: list[str], normalised: bool = False) -> np.ndarray:
        """(len(texts), num_perm) uint32 MinHash values."""
        return self.from_hashes(self.shingle_hashes(texts, normalised))

    def bbit(self, texts: list[str], normalised: bool = False) -> np.ndarray:
        """(len(texts), num_perm) uint8: the low 8 bits of each value (what the deduper keeps)."""
        return (self.full(texts, normalised) & np.uint32(0xFF)).astype(np.uint8)


# ---- the deduper --------------------------------------------------------------------------------

_KEEP, _NEAR, _NEAR_EXISTING = 0, 1, 2
_BATCH_ROWS = 1024  # texts per numpy batch: (batch x num_perm) uint32, 2 MiB at 512
_BLOCK_ROWS = 1 << 16  # signatures are kept in blocks of this many rows (24 MiB at 384)
# An LSH bucket of at most this many rows gives every pair of its rows as a candidate; a bigger one
# (a cluster of near copies, any size) is settled row by row against the rows it kept so far.
_SMALL_BUCKET = 64


class NearDeduper:
    """Near duplicates among candidates, and of candidates against an existing set.

    Offer texts with `add` (the existing set first, `existing=True`), then `resolve()` once: for each
    candidate, in the order offered, `None` (kept), `Dup.NEAR` or `Dup.NEAR_EXISTING`. A candidate is
    dropped when its estimated Jaccard similarity with an existing row, or with an earlier kept
    candidate, is at least the threshold.
    """

    def __init__(self, threshold: float, num_perm: int | None = None, seed: int = 1) -> None:
        self.plan = plan_lsh(threshold, num_perm)
        self._signer = Signer(self.plan.num_perm, seed)
        self._blocks: list[np.ndarray] = []
        self._filled = 0  # rows in the last block
        self._pending: list[str] = []
        self.existing = 0
        self.candidates = 0

    @property
    def num_perm(self) -> int:
        return self.plan.num_perm

    def add(self, text: str, existing: bool = False, *, normalised: bool = False) -> None:
        """Offer a text (`normalised`: given as `normalise(text)`, which the mix has at hand)."""
        if existing and self.candidates:
            raise ValueError("offer the existing rows before the candidates")
        if existing:
            self.existing += 1
        else:
            self.candidates += 1
        self._pending.append(text if normalised else normalise(text))
        if len(self._pending) >= _BATCH_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        signatures = self._signer.bbit(self._pending, normalised=True)
        self._pending = []
        done = 0
        while done < len(signatures):  # into blocks: no copy of everything as it grows
            if not self._blocks or self._filled == _BLOCK_ROWS:
                self._blocks.append(np.empty((_BATCH_ROWS, self.num_perm), dtype=np.uint8))
                self._filled = 0
            last = self._blocks[-1]
            if self._filled == len(last):  # the last block doubles until it is a whole block
                grown = np.empty((min(_BLOCK_ROWS, 2 * len(last)), self.num_perm), dtype=np.uint8)
                grown[: self._filled] = last[: self._filled]
                self._blocks[-1] = grown
            take = min(len(self._blocks[-1]) - self._filled, len(signatures) - done)
            self._blocks[-1][self._filled : self._filled + take] = signatures[done : done + take]
            self._filled += take
            done += take

    @property
    def nbytes(self) -> int:
        """Bytes of the signatures kept (whole blocks: up to one block more than the rows need)."""
        return sum(b.nbytes for b in self._blocks)

    def _rows(self, index: np.ndarray) -> np.ndarray:
        """The signatures of rows `index` (any order), gathered from their blocks."""
        out = np.empty((len(index), self.num_perm), dtype=np.uint8)
        block_of, offset = np.divmod(index, _BLOCK_ROWS)
        for block in np.unique(block_of).tolist():
            mine = block_of == block
            out[mine] = self._blocks[block][offset[mine]]
        return out

    def _band_keys(self, n: int, band: int) -> np.ndarray:
        """One 64-bit key per row for one band: FNV-1a over the band's bytes, block by block (a
        collision only adds a candidate, which the confirmation then refuses)."""
        rows = self.plan.rows
        keys = np.empty(n, dtype=np.uint64)
        for number, block in enumerate(self._blocks):
            start = number * _BLOCK_ROWS
            part = block[: min(_BLOCK_ROWS, n - start), band * rows : (band + 1) * rows]
            key = np.full(len(part), 0xCBF29CE484222325 ^ band, dtype=np.uint64)
            with np.errstate(over="ignore"):
                for j in range(rows):
                    key ^= part[:, j]
                    key *= np.uint64(0x100000001B3)
            keys[start : start + len(part)] = key
        return keys

    def _candidate_pairs(self, n: int) -> tuple[np.ndarray, list[np.ndarray]]:
        """(earlier, later) row pairs that share a small bucket of a band, later a candidate (unique,
        sorted by later); and the big buckets (more than _SMALL_BUCKET rows), each its rows in order."""
        found: list[np.ndarray] = []
        big: list[np.ndarray] = []
        for band in range(self.plan.bands):
            keys = self._band_keys(n, band)
            order = np.argsort(keys, kind="stable")  # stable: within a bucket, rows in offer order
            ranked = keys[order]
            starts = np.flatnonzero(np.concatenate(([True], ranked[1:] != ranked[:-1])))
            sizes = np.diff(np.append(starts, n))
            for i in np.flatnonzero(sizes > _SMALL_BUCKET).tolist():
                start, end = int(starts[i]), int(starts[i] + sizes[i])
                if order[end - 1] >= self.existing:  # else all existing: an existing row is never dropped
                    big.append(order[start:end])
            small = np.repeat(sizes <= _SMALL_BUCKET, sizes)  # per sorted position
            for gap in range(1, _SMALL_BUCKET):
                same = (ranked[:-gap] == ranked[gap:]) & small[gap:]
                if not same.any():
                    break
                later = order[gap:][same]
                earlier = order[:-gap][same]
                useful = later >= self.existing
                if useful.any():
                    found.append(later[useful].astype(np.uint64) * np.uint64(n) + earlier[useful])
            if len(found) > 64:
                found = [np.unique(np.concatenate(found))]
        if not found:
            return np.zeros((0, 2), dtype=np.int64), big
        codes = np.unique(np.concatenate(found))  # sorted by later, then earlier
        pairs = np.stack(
            [(codes % np.uint64(n)).astype(np.int64), (codes // np.uint64(n)).astype(np.int64)], 1
        )
        return pairs, big

    def resolve(self) -> list[Dup | None]:
        """The verdict for every candidate, in the order they were offered."""
        self._flush()
        n = self.existing + self.candidates
        pairs, big = self._candidate_pairs(n)
        confirmed: list[np.ndarray] = []
        for start in range(0, len(pairs), 65536):
            chunk = pairs[start : start + 65536]
            matches = (self._rows(chunk[:, 0]) == self._rows(chunk[:, 1])).sum(axis=1)
            confirmed.append(chunk[matches >= self.plan.min_matches])
        found = np.concatenate(confirmed) if confirmed else pairs
        verdict = np.zeros(n, dtype=np.int8)
        if big:
            self._settle(found, big, verdict)
        else:
            for earlier, later in found.tolist():
                if verdict[later] == _KEEP and verdict[earlier] == _KEEP:
                    verdict[later] = _NEAR_EXISTING if earlier < self.existing else _NEAR
        names = {_KEEP: None, _NEAR: Dup.NEAR, _NEAR_EXISTING: Dup.NEAR_EXISTING}
        return [names[v] for v in verdict[self.existing :].tolist()]

    def _settle(self, found: np.ndarray, big: list[np.ndarray], verdict: np.ndarray) -> None:
        """Rows in offer order: a candidate is dropped when a confirmed pair names an earlier kept row,
        or when a big bucket it is in holds an earlier kept row that confirms. Each big bucket keeps
        the signatures of its kept rows only (a cluster of near copies: one), so any cluster size
        costs a comparison or two per row and band."""
        member: dict[int, list[int]] = {}
        for b, rows in enumerate(big):
            for row in rows.tolist():
                member.setdefault(row, []).append(b)
        kept: list[np.ndarray] = [np.empty((4, self.num_perm), dtype=np.uint8) for _ in big]
        kept_rows: list[list[int]] = [[] for _ in big]  # kept[b][: len(kept_rows[b])] are theirs
        by_later: dict[int, list[int]] = {}
        for earlier, later in found.tolist():
            by_later.setdefault(later, []).append(earlier)
        need = self.plan.min_matches
        for row in sorted(member.keys() | by_later.keys()):
            drop = -1
            if row >= self.existing:
                for earlier in by_later.get(row, ()):
                    if verdict[earlier] == _KEEP:
                        drop = earlier
                        break
            buckets = member.get(row, ())
            signature = self._rows(np.asarray([row]))[0] if buckets else None
            if drop < 0 and row >= self.existing:
                for b in buckets:
                    if kept_rows[b]:
                        sigs = kept[b][: len(kept_rows[b])]
                        hits = np.flatnonzero((sigs == signature).sum(axis=1) >= need)
                        if len(hits):
                            drop = kept_rows[b][int(hits[0])]
                            break
            if drop >= 0:
                verdict[row] = _NEAR_EXISTING if drop < self.existing else _NEAR
                continue
            for b in buckets:
                count = len(kept_rows[b])
                if row < self.existing and count and (kept[b][:count] == signature).all(axis=1).any():
                    continue  # the same signature is kept already: it would confirm the same rows
                if count == len(kept[b]):
                    kept[b] = np.concatenate((kept[b], np.empty_like(kept[b])))
                kept[b][count] = signature
                kept_rows[b].append(row)
