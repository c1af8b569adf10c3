"""The existing training set's category counts, computed once per file content and cached.

Classifying every row of a million-row training set takes longer than copying it, and `mix` and
`merge` both need its category shares for their reports. The counts are cached under the file's
content digest (SHA-256), the way the rows are read (format, field, category field) and the
classifier's own digest (its rules change → a new key), so that:

- `sglfleet mix` (which reads the set anyway) leaves the counts for `sglfleet merge`, and a second
  merge into the same set does not classify it again;
- a file that changed (another digest) or a classifier that changed is classified afresh.

An entry is a small JSON file in `cache_dir()/existing/`; an unreadable entry is a miss, and a
cache that cannot be written is skipped: the cache never fails a run, it only makes it faster.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

import orjson

from sglfleet.atomicio import atomic_write
from sglfleet.data import _adapters, _categories
from sglfleet.data._adapters import Format, to_messages, user_text
from sglfleet.data._categories import classify

__all__ = ["CategoryCache", "cache_dir"]

CACHE_ENV = "SGLFLEET_CACHE_DIR"
_CHUNK = 1 << 20


def cache_dir() -> Path:
    """$SGLFLEET_CACHE_DIR, else $XDG_CACHE_HOME/sglfleet, else ~/.cache/sglfleet."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sglfleet"


@lru_cache(maxsize=1)
def classifier_digest() -> str:
    """Changes whenever the classifier's rules or the format adapters change."""
    digest = hashlib.blake2b(digest_size=8)
    for module in (_categories, _adapters):
        digest.update(Path(module.__file__ or "").read_bytes())
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    """SHA-256 of the file's bytes (what `merge` computes while it copies the set)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def existing_category(
    row: Any, fmt: Format, field: str | None, category_field: str | None
) -> tuple[str, str]:
    """(category, user text) of an existing row; `RowError` when it is not a conversation in `fmt`.

    The row's own `category_field` wins when it holds a non-empty string; else the classifier decides.
    """
    text = user_text(to_messages(row, fmt, field))
    label = row.get(category_field) if category_field else None
    if isinstance(label, str) and label:
        return label, text
    return classify(text), text


class CategoryCache:
    """Category counts of existing sets, by content digest; `directory=None` caches nothing."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory / "existing" if directory is not None else None

    @staticmethod
    def key(digest: str, fmt: Format, field: str | None, category_field: str | None) -> str:
        how = f"{fmt.value}\0{field or ''}\0{category_field or ''}\0{classifier_digest()}"
        return f"{digest}-{hashlib.blake2b(how.encode(), digest_size=8).hexdigest()}"

    def load(self, key: str) -> tuple[int, Counter[str]] | None:
        """(rows, counts per category) or None."""
        if self.directory is None:
            return None
        try:
            data = orjson.loads((self.directory / f"{key}.json").read_bytes())
            counts = Counter({str(c): int(n) for c, n in data["categories"].items()})
            rows = int(data["rows"])
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            return None
        return (rows, counts) if sum(counts.values()) == rows else None

    def store(self, key: str, rows: int, counts: Counter[str], source: Path) -> None:
        if self.directory is None:
            return
        entry = {"rows": rows, "categories": dict(sorted(counts.items())), "path": str(source)}
        try:
            with atomic_write(self.directory / f"{key}.json") as fh:
                fh.write(orjson.dumps(entry, option=orjson.OPT_INDENT_2))
        except OSError:
            pass  # a cache that cannot be written only costs time
