"""Merge: the existing training set + generation results → the grown training set, in conversation format.

Streams all three files. The prompts file (the mix's OpenAI Batch JSONL) is indexed by custom_id →
byte offset, so a result is joined to its prompt with one seek; memory grows with the number of
prompts (an id and an offset each), never with text sizes. The existing rows are copied through
unchanged (the existing set defines the row format); each kept result becomes
`{"id": custom_id, "conversations": prompt messages + [assistant answer]}`.

The existing set's category shares come from the cache `sglfleet mix` fills (keyed by the file's
content digest, see `_existing`): then the existing rows are only copied, as fast as a plain stream
merge. Without a cached entry they are read a second time to be checked (each must be a
conversation) and classified, and the counts are cached for the next time.

A result is dropped when it failed (an `error`, a status other than 200, no choices), when its
finish_reason is one of `drop_finish_reasons` (default: length), when the answer is empty, or when
`usage.completion_tokens` is under `min_completion_tokens` (default 17: a block-16 drafter needs at
least block + 1 supervised tokens).
"""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import re
import signal
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import orjson
from pydantic import ValidationError

from sglfleet.data._adapters import Format, RowError
from sglfleet.data._categories import classify
from sglfleet.data._defaults import DEFAULT_DROP_FINISH_REASONS, DEFAULT_MIN_COMPLETION_TOKENS
from sglfleet.data._errors import DataError
from sglfleet.data._existing import CategoryCache, existing_category
from sglfleet.data._outputs import check_outputs, data_outputs, locked, output_labels, written
from sglfleet.data._report import MergeReport, report_bytes
from sglfleet.host import die_with_parent
from sglfleet.records import (
    RecordError,
    ResultsSummary,
    check_messages,
    message_text,
    result_of,
    results_problem,
)
from sglfleet.records import kind as _kind

__all__ = ["merge", "prompts_of"]

CHUNK_LINES = 8192  # existing rows per classification task
PARALLEL_BYTES = 16 << 20  # smaller existing sets are classified in this process


def _json(line: bytes, where: str) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise DataError(f"{where}: not valid JSON: {exc}") from None


def manifest_of(results: Path) -> Path:
    """The generation manifest `sglfleet generate` writes next to its results."""
    return results.with_name(results.name + ".manifest.json")


def _manifest_input(results: Path) -> tuple[Path, str | None] | None:
    """(the prompts file, its SHA-256) as the results' generation manifest names them; None without
    a manifest. A relative `input.path` is taken relative to the manifest's own directory, never to
    the current one."""
    manifest = manifest_of(results)
    try:
        data = orjson.loads(manifest.read_bytes())
        info = data["input"]
        path = Path(info["path"])
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DataError(f"{manifest}: cannot read it: {exc.strerror}; pass --prompts") from None
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise DataError(f"{manifest}: no input.path in it ({exc}); pass --prompts") from None
    sha = info.get("sha256")
    if not path.is_absolute():
        path = manifest.parent / path
    return path, sha if isinstance(sha, str) else None


def _results_mismatch(results: Path) -> str | None:
    """Why `results` is not the file its generation manifest summarised (cut short, emptied,
    replaced), in words; None when it is, or when there is no manifest to compare with."""
    try:
        data = orjson.loads(manifest_of(results).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None  # no manifest (or one _manifest_input already reported)
    if not isinstance(data, dict):
        return None
    try:
        summary = ResultsSummary.model_validate(data["results"]) if data.get("results") else None
    except ValidationError as exc:
        raise DataError(f"{manifest_of(results)}: results: {exc.errors()[0]['msg']}") from None
    counts = data.get("counts")
    done = counts.get("done") if isinstance(counts, dict) else 0
    return results_problem(results, summary, done if isinstance(done, int) else 0)


def prompts_of(results: Path) -> Path:
    """The prompts file a results file answers, from the manifest `sglfleet generate` writes next to it
    (`RESULTS.manifest.json`, `input.path`, relative to the manifest's directory)."""
    found = _manifest_input(results)
    if found is None:
        raise DataError(
            f"{results}: no {manifest_of(results).name} next to it to name the prompts file; pass --prompts"
        )
    return found[0]


def _check_last_line(line: bytes, where: str) -> None:
    """A last line without its newline that does not parse is a write cut short (a generate killed
    mid-line): the rerun of that generate cuts it and regenerates the request."""
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        raise DataError(
            f"{where}: the results file ends with a torn line (its writer was killed mid-write); rerun the "
            "same `sglfleet generate` command: it cuts the torn line and sends that request again, then merge"
        ) from None


def _start_worker(parent: int) -> None:
    """A classification worker ends (SIGKILL) when the merge does, even by kill -9, as the launcher's
    servers do: an orphaned worker would wait for work for ever. SIGTERM ends it too (the CLI turns
    SIGTERM into KeyboardInterrupt in the parent, a handler a forked worker must not keep)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent(parent)


def index_prompts(path: Path, digest: Any = None) -> dict[str, int]:
    """custom_id → byte offset of its line in the prompts file; `digest` (a hashlib object) is fed
    every byte of it on the way."""
    offsets: dict[str, int] = {}
    offset = 0
    with path.open("rb") as fh:
        for number, line in enumerate(fh, 1):
            if digest is not None:
                digest.update(line)
            if line.strip():
                row = _json(line, f"{path}:{number}")
                cid = row.get("custom_id") if isinstance(row, dict) else None
                if cid is None and isinstance(row, dict) and "conversations" in row:
                    cid = None if row.get("id") is None else str(row["id"])  # conversation JSONL
                if not isinstance(cid, str):
                    raise DataError(
                        f"{path}:{number}: no custom_id (is this an OpenAI Batch input or conversation file?)"
                    )
                if cid in offsets:
                    raise DataError(f"{path}:{number}: custom_id {cid!r} appears twice")
                offsets[cid] = offset
            offset += len(line)
    return offsets


def _line_at(path: Path, offset: int) -> int:
    """The line number of the byte at `offset` (for errors only: it reads the file up to there)."""
    with path.open("rb") as fh:
        return fh.read(offset).count(b"\n") + 1


def _prompt_at(fh: BinaryIO, offset: int, path: Path) -> tuple[list[dict[str, Any]], str]:
    """The messages and category of the prompt line at `offset`."""
    fh.seek(offset)
    try:
        row = orjson.loads(fh.readline())
    except orjson.JSONDecodeError as exc:  # the file changed since it was indexed
        raise DataError(f"{path}:{_line_at(path, offset)}: not valid JSON: {exc}") from None

    def bad(field: str, value: Any, expected: str) -> DataError:
        return DataError(f"{path}:{_line_at(path, offset)}: {field} is {_kind(value)}, expected {expected}")

    body = row.get("body")
    if body is None and isinstance(row.get("conversations"), list):  # conversation JSONL prompts (SpecForge)
        field = "conversations"
        messages = [
            t for t in row["conversations"] if not isinstance(t, dict) or t.get("role") != "assistant"
        ]
    else:
        if not isinstance(body, dict):
            raise bad("body", body, "an object with messages")
        field = "body.messages"
        messages = body.get("messages")
    try:  # the prompt as generate validated it (sglfleet.records): content parts, tool calls kept
        check_messages(messages, field)
    except RecordError as exc:
        raise DataError(f"{path}:{_line_at(path, offset)}: {exc}") from None
    metadata = row.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise bad("metadata", metadata, "an object")
    category = (metadata or {}).get("category")
    if category is not None and not isinstance(category, str):
        raise bad("metadata.category", category, "a string")
    if not category:
        category = classify("\n".join(message_text(m["content"]) for m in messages if m["role"] == "user"))
    return messages, category


def _outcome(result: dict, drop_finish_reasons: Iterable[str], min_tokens: int) -> tuple[str | None, str]:
    """(why the result is dropped or None, the answer text). What a result is, is
    `sglfleet.records.result_of`'s (a field of the wrong type raises `RecordError` naming it); a
    line that is not a success is dropped as failed, as resume sends its id again."""
    found = result_of(result)
    if found is None:
        return "failed", ""
    reason = found.choice.get("finish_reason")
    if isinstance(reason, dict):  # SGLang's native shape {"type": "length", ...}
        reason = reason.get("type")
    if reason in drop_finish_reasons:
        return f"finish_reason_{reason}", ""
    message = found.choice.get("message") or {}
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise RecordError(f"response.body.choices[0].message.content is {_kind(content)}, expected a string")
    if not content or not content.strip():
        return "empty", ""
    if found.completion_tokens is None:
        return "no_usage", ""
    if found.completion_tokens < min_tokens:
        return "too_short", ""
    return None, content


_BLANK_LINE = re.compile(rb"\n[ \t\r\x0b\x0c]*\n")  # searched in b"\n" + whole lines
_BLOCK = 1 << 20


def _copy_existing(src: Path, out: BinaryIO, known_sha256: str | None = None) -> tuple[int, str]:
    """Copy the non-blank lines of `src` to `out` (each ending in a newline): (rows, content digest).
    `known_sha256`: the digest the caller already took (the input record's), not taken again.

    Block by block: a block of whole lines without a blank one (the usual case) is written as it is."""
    digest = _Sha256(known_sha256)
    rows = 0
    rest = b""
    with src.open("rb") as fh:
        while block := fh.read(_BLOCK):
            digest.update(block)
            cut = block.rfind(b"\n") + 1
            if not cut:
                rest += block
                continue
            lines, rest = rest + block[:cut], block[cut:]
            if _BLANK_LINE.search(b"\n" + lines) is None:
                out.write(lines)
                rows += lines.count(b"\n")
                continue
            for line in io.BytesIO(lines):  # lines end at b"\n" only, as in the file
                if not line.isspace():
                    out.write(line)
                    rows += 1
    if rest and not rest.isspace():
        out.write(rest + b"\n")
        rows += 1
    return rows, digest.hexdigest()


class _Sha256:
    """hashlib.sha256, or the digest already known (then fed nothing: each input is hashed once)."""

    def __init__(self, known: str | None = None) -> None:
        self._known = known
        self._sha = None if known else hashlib.sha256()

    def update(self, data: bytes) -> None:
        if self._sha is not None:
            self._sha.update(data)

    def hexdigest(self) -> str:
        return self._known if self._sha is None else self._sha.hexdigest()


def _recorded_sha256(inputs: dict[str, Any] | None, label: str, path: Path) -> str | None:
    """The SHA-256 the input record took of `path` under `label` (`_inputs.input_record`), if any."""
    entry = ((inputs or {}).get("files") or {}).get(label)
    if isinstance(entry, dict) and entry.get("path") == os.path.abspath(path):
        sha = entry.get("sha256")
        return sha if isinstance(sha, str) else None
    return None


def _count_lines(path: str, first: int, lines: list[bytes], category_field: str | None) -> Counter[str]:
    """Category counts of some lines of the existing set (`first`: the first one's line number)."""
    counts: Counter[str] = Counter()
    for number, line in enumerate(lines, first):
        if not line or line.isspace():
            continue
        where = f"{path}:{number}"
        try:
            category, _ = existing_category(_json(line, where), Format.SHAREGPT, None, category_field)
        except RowError as exc:
            raise DataError(
                f"{where}: {exc} (the existing set must hold conversations: "
                '{"conversations": [{"role": "user", "content": ...}, ...]})'
            ) from None
        counts[category] += 1
    return counts


def _count_block(path: str, first: int, block: bytes, category_field: str | None) -> Counter[str]:
    """`_count_lines` of whole lines sent as one bytes object (one buffer to pickle, not thousands)."""
    return _count_lines(path, first, block.split(b"\n"), category_field)


def _chunks(path: Path, size: int) -> Iterator[tuple[int, list[bytes]]]:
    with path.open("rb") as fh:
        first = 1
        while lines := list(itertools.islice(fh, size)):
            yield first, lines
            first += len(lines)


def classify_existing(path: Path, category_field: str | None, workers: int | None = None) -> Counter[str]:
    """Category counts of an existing set (JSONL conversations); `DataError` at the first bad row.

    Big files are classified by `workers` processes (default: the CPUs, at most 8), chunk by chunk
    with a bounded number of chunks in flight, so memory stays bounded; the first bad row (in file
    order) is the one reported.
    """
    workers = workers or min(8, len(os.sched_getaffinity(0)))
    if workers <= 1 or path.stat().st_size < PARALLEL_BYTES:
        return sum(
            (_count_lines(str(path), f, lines, category_field) for f, lines in _chunks(path, CHUNK_LINES)),
            Counter(),
        )
    counts: Counter[str] = Counter()
    with ProcessPoolExecutor(workers, initializer=_start_worker, initargs=(os.getpid(),)) as pool:
        pending: deque[Future[Counter[str]]] = deque()
        try:
            for first, lines in _chunks(path, CHUNK_LINES):
                block = b"".join(lines)
                pending.append(pool.submit(_count_block, str(path), first, block, category_field))
                if len(pending) >= 2 * workers:
                    counts += pending.popleft().result()
            while pending:
                counts += pending.popleft().result()
        except BaseException:
            for future in pending:
                future.cancel()
            raise
    return counts


def merge(
    existing: Path,
    results: Path,
    prompts: Path | None,
    output: Path,
    report_path: Path | None = None,
    **options: Any,
) -> MergeReport:
    """Write `output` = the existing rows + the kept results (and the report); nothing on error.

    `prompts=None`: the prompts file named by the results' generation manifest. `options` (keywords
    of `_merge`): `min_completion_tokens`, `drop_finish_reasons`, `category_field`; `cache`: where the
    existing set's category counts are looked up and stored (None: classify every time); `inputs`:
    what the merge is built from (`_inputs.input_record`), kept in the report JSON. Another merge or
    mix writing the same output meanwhile is refused (`DataError`) before anything is read.
    """
    with locked(output_labels(output, report_path), "sglfleet merge"):
        return _merge(existing, results, prompts, output, report_path, **options)


def _merge(
    existing: Path,
    results: Path,
    prompts: Path | None,
    output: Path,
    report_path: Path | None = None,
    *,
    min_completion_tokens: int = DEFAULT_MIN_COMPLETION_TOKENS,
    drop_finish_reasons: Iterable[str] = DEFAULT_DROP_FINISH_REASONS,
    category_field: str | None = "category",
    cache: CategoryCache | None = None,
    inputs: dict[str, Any] | None = None,
) -> MergeReport:
    """`merge`, its outputs locked."""
    generated = _manifest_input(results) if results.is_file() else None
    named = prompts is None
    if prompts is None:
        prompts = prompts_of(results)
    files = {"existing set": existing, "results": results, "prompts": prompts}
    for label, path in files.items():
        if not path.is_file():
            where = (
                f" (input.path of {manifest_of(results)}; pass --prompts)"
                if named and label == "prompts"
                else ""
            )
            raise DataError(f"{label}: {path}: no such file{where}")
    manifest = manifest_of(results)
    if manifest.exists():
        files["generation manifest"] = manifest
        mismatch = _results_mismatch(results)
        if mismatch is not None:
            raise DataError(
                f"{results}: {mismatch}; rerun the same `sglfleet generate` command (it sends what is "
                "missing), then merge"
            )
    outputs = output_labels(output, report_path)
    reports = data_outputs(outputs)[1:]  # the output first, then the report's Markdown and JSON
    check_outputs(files, outputs)
    cache = cache or CategoryCache(None)
    drop = tuple(drop_finish_reasons)
    report = MergeReport(
        str(output), min_completion_tokens=min_completion_tokens, drop_finish_reasons=drop, inputs=inputs
    )
    # The input record (--skip-unchanged, --check) hashed the prompts and the existing set already.
    prompts_sha = _Sha256(_recorded_sha256(inputs, "prompts", prompts))
    offsets = index_prompts(prompts, prompts_sha)
    if generated is not None and generated[1] is not None and prompts_sha.hexdigest() != generated[1]:
        raise DataError(
            f"the prompts {prompts} (sha256 {prompts_sha.hexdigest()}) are not the input the results were "
            f"generated from: {manifest} names {generated[0]} (sha256 {generated[1]}); results joined to "
            "other prompts by custom_id would pair answers with the wrong questions. Pass the input "
            "generate ran on as --prompts"
        )
    report.prompts = len(offsets)
    seen: set[str] = set()
    kept: set[str] = set()
    with written([output, *reports]) as (out, *report_files):
        rows, digest = _copy_existing(existing, out, _recorded_sha256(inputs, "existing set", existing))
        key = cache.key(digest, Format.SHAREGPT, None, category_field)
        cached = cache.load(key)
        if cached is not None and cached[0] == rows:
            report.existing = cached[1]
        else:
            report.existing = classify_existing(existing, category_field)
            cache.store(key, rows, report.existing, existing)
        with results.open("rb") as res, prompts.open("rb") as prm:
            for number, line in enumerate(res, 1):
                if line.isspace():
                    continue
                where = f"{results}:{number}"
                if not line.endswith(b"\n"):
                    _check_last_line(line, where)
                result = _json(line, where)
                cid = result.get("custom_id") if isinstance(result, dict) else None
                if not isinstance(cid, str):
                    raise DataError(f"{where}: no custom_id (is this an OpenAI Batch output file?)")
                if cid not in offsets:
                    raise DataError(f"{where}: custom_id {cid!r} is not in the prompts file {prompts}")
                report.results_read += 1
                seen.add(cid)
                if cid in kept:
                    report.dropped["duplicate"] += 1
                    continue
                try:
                    reason, content = _outcome(result, drop, min_completion_tokens)
                except RecordError as exc:
                    raise DataError(f"{where}: custom_id {cid!r}: {exc}") from None
                if reason is not None:
                    report.dropped[reason] += 1
                    continue
                messages, category = _prompt_at(prm, offsets[cid], prompts)
                turns = result.get("conversations")  # sglfleet generate on conversation input: the
                if not isinstance(turns, list):  # regenerated conversation, every turn of it
                    turns = [*messages, {"role": "assistant", "content": content}]
                row = {"id": cid, "conversations": turns}
                out.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
                kept.add(cid)
                report.new[category] += 1
        report.without_result = len(offsets) - len(seen)
        for handle, data in zip(report_files, report_bytes(report) if reports else (), strict=True):
            handle.write(data)
    return report
