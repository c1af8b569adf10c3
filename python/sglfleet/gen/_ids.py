"""A compact set of request ids: 8 bytes per id, whatever the ids' length.

A generation job holds two sets of ids for its whole life: the ids of the input (to find
duplicates) and the ids already written to the output (to skip them on resume). With 200K ids a
Python ``set[str]`` costs tens of MiB; this set stores a 64-bit digest of each id in a sorted
``array('Q')`` (1.6 MB for 200K ids) and answers membership by binary search.

The digest is the interpreter's own string hash (SipHash, 64 bits on 64-bit builds, keyed afresh by
each process): a C call, cached on the string, several times cheaper than a BLAKE2b digest, and
digests are only ever compared within one process (one run), never stored. Two different ids share
a digest with probability about n²/2⁶⁵ (1e-9 for 200K ids); the input's duplicate check compares the
actual strings, so only resume could ever be fooled, by skipping one id.
"""

from __future__ import annotations

import bisect
import sys
from array import array
from collections.abc import Iterable

__all__: list[str] = []

_MASK = (1 << 64) - 1
assert sys.hash_info.width == 64, "a 64-bit interpreter is needed for 64-bit id digests"


def id_digest(custom_id: str) -> int:
    """The 64-bit digest an id is stored under (valid within this process only)."""
    return hash(custom_id) & _MASK


class IdSet:
    """Add ids (or their digests), then :meth:`freeze` once, then ask ``in``.

    Digests are gathered in 256 buckets by their top byte, so that freezing sorts one small bucket
    at a time: the peak memory stays near 8 bytes per id instead of a list of Python ints (~40).
    """

    __slots__ = ("_buckets", "_digests", "_frozen", "repeated")

    def __init__(self, digests: Iterable[int] = ()) -> None:
        self._buckets: list[array[int]] = [array("Q") for _ in range(256)]
        self._digests = array("Q")
        self._frozen = False
        self.repeated: set[int] = set()  # digests added more than once (known after freeze)
        for d in digests:
            self.add_digest(d)

    def add(self, custom_id: str) -> None:
        self.add_digest(id_digest(custom_id))

    def add_digest(self, digest: int) -> None:
        if self._frozen:
            raise RuntimeError("IdSet is frozen")
        self._buckets[digest >> 56].append(digest)

    def freeze(self) -> IdSet:
        """Sort the digests, note those added more than once and drop the repeats; afterwards the
        set only answers queries."""
        out = self._digests
        for i, bucket in enumerate(self._buckets):
            ordered = sorted(bucket)
            self._buckets[i] = array("Q")  # free the bucket before the next one is sorted
            last = -1
            for d in ordered:
                if d == last:
                    self.repeated.add(d)
                else:
                    out.append(d)
                    last = d
        self._buckets = []
        self._frozen = True
        return self

    def __contains__(self, custom_id: object) -> bool:
        return isinstance(custom_id, str) and self.has_digest(id_digest(custom_id))

    def has_digest(self, digest: int) -> bool:
        if not self._frozen:
            raise RuntimeError("IdSet must be frozen before queries")
        i = bisect.bisect_left(self._digests, digest)
        return i < len(self._digests) and self._digests[i] == digest

    def __len__(self) -> int:
        return len(self._digests)
