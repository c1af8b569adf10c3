"""Reading dataset files row by row: JSONL, JSON arrays, Parquet and saved Hugging Face datasets.

Every reader yields `(index, row)` with a 0-based row index, streaming: JSONL line by line, Parquet
and HF datasets batch by batch. (A JSON array is parsed whole: use JSONL or Parquet for big files.)
`where(path, kind, index)` names a row the way errors should: `file.jsonl:12` (line) or `file#12` (row).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from sglfleet.data._errors import DataError

__all__ = ["SourceType", "read_rows"]


class SourceType(enum.StrEnum):
    JSONL = "jsonl"
    JSON = "json"
    PARQUET = "parquet"
    HF = "hf"


_SUFFIXES = {".jsonl": SourceType.JSONL, ".ndjson": SourceType.JSONL, ".json": SourceType.JSON}
_SUFFIXES |= {".parquet": SourceType.PARQUET, ".pq": SourceType.PARQUET}

PARQUET_BATCH = 2048


def detect_type(path: Path) -> SourceType:
    """The type of a source path: a directory is a saved HF dataset, a file goes by its suffix."""
    if path.is_dir():
        return SourceType.HF
    try:
        return _SUFFIXES[path.suffix.lower()]
    except KeyError:
        raise DataError(
            f"{path}: cannot tell the file type from the suffix {path.suffix!r}; "
            f"set type: to one of {', '.join(t.value for t in SourceType)}"
        ) from None


def where(path: Path, kind: SourceType, index: int) -> str:
    """How an error names a row: the line of a JSONL file, else the row number."""
    if kind is SourceType.JSONL:
        return f"{path}:{index + 1}"
    return f"{path} row {index}"


def read_rows(
    path: Path, kind: SourceType, split: str | None = None, columns: tuple[str, ...] = ()
) -> Iterator[tuple[int, Any]]:
    """Yield `(index, row)` for every row of the source, in file order.

    `columns`: for Parquet, read only these (the first one is the one the format needs: when the
    file lacks it, every column is read so that the error can list them).
    """
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    if kind is SourceType.JSONL:
        yield from _jsonl(path)
    elif kind is SourceType.JSON:
        yield from _json(path)
    elif kind is SourceType.PARQUET:
        yield from _parquet(path, columns)
    else:
        yield from _hf(path, split)


def _open(path: Path) -> Any:
    try:
        return path.open("rb")
    except OSError as exc:
        raise DataError(f"{path}: cannot read it: {exc.strerror}") from None


def _jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    with _open(path) as fh:
        for index, line in enumerate(fh):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise DataError(f"{path}:{index + 1}: not valid JSON: {exc}") from None
            yield index, row


def _json(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        with _open(path) as fh:
            data = orjson.loads(fh.read())
    except orjson.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON: {exc}") from None
    if isinstance(data, dict):
        # {"data": [...]} / {"rows": [...]}: the one list-valued key holds the rows.
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise DataError(f"{path}: expected a JSON array of rows (or an object with one list of rows)")
        data = lists[0]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON array of rows, found a {type(data).__name__}")
    yield from enumerate(data)


def _parquet(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise DataError(f"{path}: not a readable Parquet file: {exc}") from None
    names = parquet.schema_arrow.names
    wanted = [c for c in columns if c in names] if columns and columns[0] in names else None
    index = 0
    for batch in parquet.iter_batches(batch_size=PARQUET_BATCH, columns=wanted):
        for row in batch.to_pylist():
            yield index, row
            index += 1


def _hf(path: Path, split: str | None) -> Iterator[tuple[int, Any]]:
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{path}: reading a saved Hugging Face dataset needs the `datasets` package: "
            "pip install 'sglfleet[hf]' (or pip install datasets)"
        ) from None
    try:
        loaded = datasets.load_from_disk(os.fspath(path))
    except (FileNotFoundError, ValueError) as exc:
        raise DataError(f"{path}: not a dataset saved with save_to_disk: {exc}") from None
    if isinstance(loaded, datasets.DatasetDict):
        if split is None:
            raise DataError(f"{path}: a DatasetDict with splits {sorted(loaded)}; set split: to one of them")
        if split not in loaded:
            raise DataError(f"{path}: no split {split!r} (splits: {', '.join(sorted(loaded))})")
        loaded = loaded[split]
    elif split is not None:
        raise DataError(f"{path}: split: {split!r} is set but the dataset has no splits")
    index = 0
    for batch in loaded.iter(batch_size=PARQUET_BATCH):
        columns = list(batch)
        for values in zip(*(batch[c] for c in columns), strict=True):
            yield index, dict(zip(columns, values, strict=True))
            index += 1
