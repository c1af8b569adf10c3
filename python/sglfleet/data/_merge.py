"""Merge: the existing training set + generation results → the grown training set, in conversation format.

Streams all three files. The prompts file (the mix's OpenAI Batch JSONL) is indexed by custom_id →
byte offset, so a result is joined to its prompt with one seek; memory grows with the number of
prompts (an id and an offset each), never with text sizes. The existing rows are copied through
unchanged (the existing set defines the row format); each kept result becomes
`{"id": custom_id, "conversations": prompt messages + [assistant answer]}`.

A result is dropped when it failed (an `error`, a status other than 200, no choices), when its
finish_reason is one of `drop_finish_reasons` (default: length), when the answer is empty, or when
`usage.completion_tokens` is under `min_completion_tokens` (default 17: a block-16 drafter needs at
least block + 1 supervised tokens).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

from sglfleet.atomicio import atomic_write
from sglfleet.data._adapters import Format, RowError, to_messages, user_text
from sglfleet.data._categories import classify
from sglfleet.data._errors import DataError
from sglfleet.data._report import MergeReport, write_report

DEFAULT_MIN_COMPLETION_TOKENS = 17
DEFAULT_DROP_FINISH_REASONS = ("length",)


def _json(line: bytes, where: str) -> Any:
    try:
        return json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{where}: not valid JSON: {exc}") from None


def prompts_of(results: Path) -> Path:
    """The prompts file a results file answers, from the manifest `sglfleet generate` writes next to it
    (`RESULTS.manifest.json`, `input.path`)."""
    manifest = results.with_name(results.name + ".manifest.json")
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        path = Path(data["input"]["path"])
    except FileNotFoundError:
        raise DataError(
            f"{results}: no {manifest.name} next to it to name the prompts file; pass --prompts"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise DataError(f"{manifest}: no input.path in it ({exc}); pass --prompts") from None
    if not path.is_absolute() and not path.exists():
        path = manifest.parent / path
    return path


def index_prompts(path: Path) -> dict[str, int]:
    """custom_id → byte offset of its line in the prompts file."""
    offsets: dict[str, int] = {}
    offset = 0
    with path.open("rb") as fh:
        for number, line in enumerate(fh, 1):
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


def _prompt_at(fh: BinaryIO, offset: int, path: Path) -> tuple[list[dict[str, str]], str]:
    """The messages and category of the prompt line at `offset`."""
    fh.seek(offset)
    row = _json(fh.readline(), f"{path} at byte {offset}")
    messages = (row.get("body") or {}).get("messages")
    if messages is None and isinstance(row.get("conversations"), list):  # conversation JSONL prompts
        messages = [t for t in row["conversations"] if isinstance(t, dict) and t.get("role") != "assistant"]
    if not isinstance(messages, list):
        raise DataError(f"{path} at byte {offset}: custom_id {row.get('custom_id')!r} has no body.messages")
    category = (row.get("metadata") or {}).get("category")
    if not isinstance(category, str) or not category:
        category = classify(user_text(messages))
    return messages, category


def _outcome(result: Any, drop_finish_reasons: Iterable[str], min_tokens: int) -> tuple[str | None, str]:
    """(why the result is dropped or None, the answer text)."""
    if result.get("error"):
        return "failed", ""
    response = result.get("response")
    if not isinstance(response, dict) or response.get("status_code") != 200:
        return "failed", ""
    body = response.get("body") or {}
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "failed", ""
    choice = choices[0]
    reason = choice.get("finish_reason")
    if isinstance(reason, dict):  # SGLang's native shape {"type": "length", ...}
        reason = reason.get("type")
    if reason in drop_finish_reasons:
        return f"finish_reason_{reason}", ""
    content = (choice.get("message") or {}).get("content")
    if not isinstance(content, str) or not content.strip():
        return "empty", ""
    tokens = (body.get("usage") or {}).get("completion_tokens")
    if not isinstance(tokens, int):
        return "no_usage", ""
    if tokens < min_tokens:
        return "too_short", ""
    return None, content


def _existing_category(row: Any, where: str, category_field: str | None) -> str:
    label = row.get(category_field) if category_field and isinstance(row, dict) else None
    if isinstance(label, str) and label:
        return label
    try:
        messages = to_messages(row, Format.SHAREGPT)
    except RowError as exc:
        raise DataError(f"{where}: {exc} (the existing set must be in conversation format)") from None
    return classify(user_text(messages))


def merge(
    existing: Path,
    results: Path,
    prompts: Path | None,
    output: Path,
    report_path: Path | None = None,
    *,
    min_completion_tokens: int = DEFAULT_MIN_COMPLETION_TOKENS,
    drop_finish_reasons: Iterable[str] = DEFAULT_DROP_FINISH_REASONS,
    category_field: str | None = "category",
) -> MergeReport:
    """Write `output` = the existing rows + the kept results (and the report); nothing on error.

    `prompts=None`: the prompts file named by the results' generation manifest.
    """
    if prompts is None:
        prompts = prompts_of(results)
    for label, path in (("existing set", existing), ("results", results), ("prompts", prompts)):
        if not path.is_file():
            raise DataError(f"{label}: {path}: no such file")
    if output.resolve() in {existing.resolve(), results.resolve(), prompts.resolve()}:
        raise DataError(f"{output}: the output must not be one of the input files")
    drop = tuple(drop_finish_reasons)
    report = MergeReport(str(output), min_completion_tokens=min_completion_tokens, drop_finish_reasons=drop)
    offsets = index_prompts(prompts)
    report.prompts = len(offsets)
    seen: set[str] = set()
    kept: set[str] = set()
    with atomic_write(output) as out, existing.open("rb") as src:
        for number, line in enumerate(src, 1):
            if not line.strip():
                continue
            where = f"{existing}:{number}"
            report.existing[_existing_category(_json(line, where), where, category_field)] += 1
            out.write(line if line.endswith(b"\n") else line + b"\n")
        with results.open("rb") as res, prompts.open("rb") as prm:
            for number, line in enumerate(res, 1):
                if not line.strip():
                    continue
                where = f"{results}:{number}"
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
                reason, content = _outcome(result, drop, min_completion_tokens)
                if reason is not None:
                    report.dropped[reason] += 1
                    continue
                messages, category = _prompt_at(prm, offsets[cid], prompts)
                turns = result.get("conversations")  # sglfleet generate on conversation input: the
                if not isinstance(turns, list):  # regenerated conversation, every turn of it
                    turns = [*messages, {"role": "assistant", "content": content}]
                row = {"id": cid, "conversations": turns}
                out.write((json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n").encode())
                kept.add(cid)
                report.new[category] += 1
        report.without_result = len(offsets) - len(seen)
        if report_path is not None:
            write_report(report, report_path)
    return report
