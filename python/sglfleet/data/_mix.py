"""Build a prompt mix: read the sources, filter, dedupe, pick each source's quota, write OpenAI Batch JSONL.

Two streaming passes over each source keep memory bounded by the row count, not the text size:
pass 1 adapts, filters and dedupes every row and keeps, per surviving row, only its index and a
seeded 64-bit sampling key; the quota is the rows with the smallest keys (a seeded sample without
replacement). Near duplicates are settled between the passes, all at once (`NearDeduper.resolve`),
and taken out of the survivors before the quotas are filled. Pass 2 re-reads the sources and writes
the chosen rows in file order. Same config and seed → the same bytes. Nothing is written unless the
whole mix succeeds, and no output may be one of the inputs (checked before anything is read).
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from sglfleet.data._adapters import Message, RowError, fields_read, normalise, to_messages, user_text
from sglfleet.data._categories import classify
from sglfleet.data._dedupe import ExactDeduper, NearDeduper, frozen_hashes, normalised_hash
from sglfleet.data._errors import DataError
from sglfleet.data._existing import CategoryCache, existing_category, file_digest
from sglfleet.data._mixconfig import AUTO, ExistingConfig, MixConfig, Shortfall, SourceConfig
from sglfleet.data._outputs import check_outputs, report_paths, written
from sglfleet.data._report import MixReport, SourceReport, report_bytes
from sglfleet.data._sources import read_rows, where


@dataclass(frozen=True)
class Prompt:
    index: int
    messages: list[Message]
    text: str  # the user text
    category: str


def custom_id(source: str, index: int, text: str) -> str:
    """Stable id of a prompt: the source, the row index and a hash of source, index and text."""
    digest = hashlib.blake2b(f"{source}\0{index}\0{text}".encode(), digest_size=8).hexdigest()
    return f"{source}-{index}-{digest}"


def _sample_key(seed: int, source: str, index: int, digest: int) -> int:
    data = f"{seed}\0{source}\0{index}\0{digest}".encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def source_prompts(source: SourceConfig) -> Iterator[Prompt | tuple[int, RowError]]:
    """Adapt every row of a source; a row that does not fit yields `(index, RowError)`."""
    fixed = None if source.category == AUTO else source.category
    try:
        columns = fields_read(source.format, source.read_field)
        for index, row in read_rows(source.path, source.kind, source.split, columns):
            try:
                messages = to_messages(row, source.format, source.read_field)
            except RowError as exc:
                yield index, exc
                continue
            text = user_text(messages)
            yield Prompt(index, messages, text, fixed or classify(text))
    except DataError as exc:
        raise DataError(f"source {source.name!r}: {exc}") from None


def _filter_reason(prompt: Prompt, config: MixConfig) -> str | None:
    f = config.filters
    if not prompt.messages:  # nothing to send at all, whatever the filters say
        return "empty"
    stripped = prompt.text.strip()
    if not stripped:
        has_system = any(m["role"] == "system" and m["content"].strip() for m in prompt.messages)
        if has_system and f.drop_system_only:
            return "system_only"
        if f.drop_empty:
            return "empty"
    if len(stripped) < f.min_chars:
        return "too_short"
    if len(stripped) > f.max_chars:
        return "too_long"
    return None


def scan_existing(
    existing: ExistingConfig,
    want_hashes: bool,
    near: NearDeduper | None = None,
    cache: CategoryCache | None = None,
) -> tuple[Counter[str], np.ndarray]:
    """Category counts of the existing training set, and its prompts' text hashes (sorted, unique).

    `near`: each prompt is offered to it as an existing row. `cache`: the category counts are looked
    up there by the file's digest (and stored there when missing); every row is still checked.
    """
    cache = cache or CategoryCache(None)
    key = None
    if cache.directory is not None and existing.path.is_file():
        key = cache.key(file_digest(existing.path), existing.format, existing.field, existing.category_field)
    cached = cache.load(key) if key else None
    counts: Counter[str] = Counter()
    hashes = array("Q")
    columns = fields_read(existing.format, existing.read_field)
    if existing.category_field:
        columns += (existing.category_field,)
    rows = 0
    for index, row in read_rows(existing.path, existing.kind, existing.split, columns):
        rows += 1
        try:
            if cached is None:
                category, text = existing_category(
                    row, existing.format, existing.field, existing.category_field
                )
                counts[category] += 1
            else:
                text = user_text(to_messages(row, existing.format, existing.field))
        except RowError as exc:
            raise DataError(f"existing set: {where(existing.path, existing.kind, index)}: {exc}") from None
        if want_hashes or near is not None:
            norm = normalise(text)  # once for both dedupes
            if want_hashes:
                hashes.append(normalised_hash(norm))
            if near is not None:
                near.add(norm, existing=True, normalised=True)
    if cached is not None and cached[0] == rows:
        counts = cached[1]
    elif cached is not None:  # the file changed while it was read: classify it for real
        return scan_existing(existing, want_hashes, near=None, cache=None)
    elif key:
        cache.store(key, rows, counts, existing.path)
    return counts, frozen_hashes(hashes)


def _preflight(config: MixConfig) -> None:
    """Every source path exists and has a known type, before any reading."""
    named: list[tuple[str, Any]] = [(f"source {s.name!r}", s) for s in config.sources]
    if config.existing is not None:
        named.append(("existing set", config.existing))
    for label, item in named:
        if not item.path.exists():
            raise DataError(f"{label}: {item.path}: no such file or directory")
        try:
            _ = item.kind
        except DataError as exc:
            raise DataError(f"{label}: {exc}") from None


def _targets(config: MixConfig, quotas: dict[str, int], available: dict[str, int], notes: list[str]) -> dict:
    """Rows to take per source: the quota, or with `shortfall: fill` the gaps spread over the others."""
    short = {n: quotas[n] - available[n] for n in quotas if available[n] < quotas[n]}
    if not short:
        return dict(quotas)
    if config.shortfall is Shortfall.ERROR:
        raise DataError(
            "; ".join(
                f"source {name!r}: quota {quotas[name]} but only {available[name]} prompts are left after "
                f"filters and dedupe ({gap} short)"
                for name, gap in short.items()
            )
            + "; lower the quota or set shortfall: fill"
        )
    targets = {n: min(quotas[n], available[n]) for n in quotas}
    deficit = sum(short.values())
    spare_total = sum(available[n] - targets[n] for n in quotas)
    if spare_total < deficit:
        raise DataError(
            f"shortfall: fill cannot fill {deficit} missing prompts: the sources have only {spare_total} "
            f"prompts left beyond their quotas (short: "
            + ", ".join(f"{n!r} by {g}" for n, g in short.items())
            + ")"
        )
    caps = {n: available[n] - targets[n] for n in quotas}
    extra = _spread(deficit, {n: quotas[n] for n in quotas if n not in short}, caps)
    for n, k in extra.items():
        targets[n] += k
    notes.append(
        "shortfall: "
        + ", ".join(f"{n!r} had {available[n]} of its quota {quotas[n]}" for n in short)
        + f"; the {deficit} missing prompts were taken from "
        + ", ".join(f"{n!r} (+{k})" for n, k in extra.items() if k)
        + " in proportion to their quotas"
    )
    return targets


def _spread(amount: int, weights: dict[str, int], caps: dict[str, int]) -> dict[str, int]:
    """Split `amount` over `weights` in proportion (largest remainder), none above its cap."""
    given = dict.fromkeys(weights, 0)
    while (left := amount - sum(given.values())) > 0:
        open_ = [n for n in weights if given[n] < caps[n]]
        if not open_:
            break
        weight = {n: weights[n] for n in open_}
        if not sum(weight.values()):
            weight = dict.fromkeys(open_, 1)
        exact = {n: left * weight[n] / sum(weight.values()) for n in open_}
        step = {n: min(math.floor(exact[n]), caps[n] - given[n]) for n in open_}
        rest = left - sum(step.values())
        for n in sorted(open_, key=lambda n: (-(exact[n] - math.floor(exact[n])), n)):
            if rest == 0:
                break
            if given[n] + step[n] < caps[n]:
                step[n] += 1
                rest -= 1
        for n in open_:
            given[n] += step[n]
    return given


def _choose(keys: array, indices: array, k: int) -> set[int]:
    """The `k` row indices with the smallest sampling keys (ties broken by index)."""
    if k == 0:
        return set()
    key_arr = np.frombuffer(keys, dtype=np.uint64)
    idx_arr = np.frombuffer(indices, dtype=np.uint64)
    order = np.lexsort((idx_arr, key_arr))[:k]
    return {int(i) for i in idx_arr[order]}


def request_line(config: MixConfig, source: str, prompt: Prompt) -> bytes:
    """One OpenAI Batch input line (plus `metadata` with the source and category, for merge)."""
    generation = dict(config.generation)
    body: dict[str, Any] = {}
    if "model" in generation:
        body["model"] = generation.pop("model")
    body["messages"] = prompt.messages
    body |= generation
    line = {
        "custom_id": custom_id(source, prompt.index, prompt.text),
        "method": "POST",
        "url": config.url,
        "body": body,
        "metadata": {"source": source, "category": prompt.category},
    }
    return orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)


def _outputs(config: MixConfig, output: Path, report_path: Path | None) -> list[Path]:
    """The files the mix writes, after checking that none of them is an input (or cannot be written)."""
    inputs = {f"source {s.name!r}": s.path for s in config.sources}
    if config.existing is not None:
        inputs["existing set"] = config.existing.path
    if config.origin is not None:
        inputs["mix config"] = config.origin
    outputs = {"--output": output}
    reports = report_paths(report_path) if report_path is not None else ()
    outputs |= dict(zip(("--report", "--report (its .json)"), reports, strict=False))
    check_outputs(inputs, outputs)
    return [output, *reports]


def _drop_near(
    near: NearDeduper,
    reports: list[SourceReport],
    survivors: dict[str, tuple[array, array]],
    offered: dict[str, list[str]],
) -> None:
    """Settle the near duplicates and take them out of each source's survivors and counts."""
    verdicts = near.resolve()
    start = 0
    for rep in reports:
        categories = offered.pop(rep.name)
        mine = verdicts[start : start + len(categories)]
        start += len(categories)
        if not any(mine):
            continue
        keys, indices = survivors[rep.name]
        keep = np.fromiter((v is None for v in mine), dtype=bool, count=len(mine))
        survivors[rep.name] = (
            array("Q", np.frombuffer(keys, dtype=np.uint64)[keep].tobytes()),
            array("Q", np.frombuffer(indices, dtype=np.uint64)[keep].tobytes()),
        )
        for verdict, category in zip(mine, categories, strict=True):
            if verdict is not None:
                for tally in (rep.total, rep.tally(category)):
                    tally.duplicates[verdict.value] += 1
                    tally.available -= 1


def _near_note(near: NearDeduper) -> str:
    plan = near.plan
    return (
        f"near dedupe: threshold {plan.threshold:g}, {plan.num_perm} permutations "
        f"({plan.bands} bands x {plan.rows} rows, confirmed by estimated Jaccard); expected recall "
        f"{100 * plan.expected_recall:.2f}% at Jaccard {plan.recall_point:.2f}, "
        f"false drops {100 * plan.expected_false_drops:.2f}% at {plan.false_drop_point:.2f}; "
        f"{near.existing} existing and {near.candidates} candidate prompts compared, "
        f"{plan.bytes_per_row} bytes per prompt"
    )


def build_mix(
    config: MixConfig, output: Path, report_path: Path | None = None, *, cache: CategoryCache | None = None
) -> MixReport:
    """Run the mix; write `output` (and the report, Markdown + JSON) only when all of it succeeds.

    `cache`: where the existing set's category counts are looked up and left for `merge`.
    """
    _preflight(config)
    paths = _outputs(config, output, report_path)
    quotas = config.quotas()
    dedupe = config.dedupe
    near = None
    if dedupe.near.enabled:
        near = NearDeduper(dedupe.near.threshold, dedupe.near.plan_num_perm())
    existing_counts: Counter[str] = Counter()
    existing_hashes = None
    if config.existing is not None:
        existing_counts, existing_hashes = scan_existing(
            config.existing,
            dedupe.against_existing,
            near=near if dedupe.against_existing else None,
            cache=cache,
        )
    exact = ExactDeduper(existing_hashes if dedupe.against_existing else None, remember=dedupe.exact)

    reports: list[SourceReport] = []
    survivors: dict[str, tuple[array, array]] = {}
    offered: dict[str, list[str]] = {}  # per source, the category of each prompt offered to `near`
    for source in config.sources:
        rep = SourceReport(source.name, str(source.path), source.format.value, quotas[source.name])
        keys, indices = array("Q"), array("Q")
        categories: list[str] = []
        for item in source_prompts(source):
            if isinstance(item, tuple):
                index, exc = item
                if not source.skip_bad_rows:
                    raise DataError(
                        f"source {source.name!r}: {where(source.path, source.kind, index)}: {exc} "
                        f"(format {source.format.value}; set field: or skip_bad_rows: true)"
                    )
                rep.total.read += 1
                rep.total.invalid += 1
                rep.tally("invalid").read += 1
                rep.tally("invalid").invalid += 1
                continue
            tally = rep.tally(item.category)
            rep.total.read += 1
            tally.read += 1
            reason = _filter_reason(item, config)
            if reason is not None:
                rep.total.filtered[reason] += 1
                tally.filtered[reason] += 1
                continue
            norm = normalise(item.text)  # once for both dedupes
            digest = normalised_hash(norm)
            dup = exact.check(digest)
            if dup is not None:
                rep.total.duplicates[dup.value] += 1
                tally.duplicates[dup.value] += 1
                continue
            if near is not None:
                near.add(norm, normalised=True)
                categories.append(item.category)
            rep.total.available += 1
            tally.available += 1
            keys.append(_sample_key(config.seed, source.name, item.index, digest))
            indices.append(item.index)
        survivors[source.name] = (keys, indices)
        offered[source.name] = categories
        reports.append(rep)

    notes: list[str] = []
    if near is not None:
        _drop_near(near, reports, survivors, offered)
        notes.append(_near_note(near))
    available = {r.name: r.total.available for r in reports}
    targets = _targets(config, quotas, available, notes)
    report = MixReport(config.seed, str(output), reports, existing_counts, notes)
    with written(paths) as (fh, *report_files):
        for source, rep in zip(config.sources, reports, strict=True):
            rep.target = targets[source.name]
            chosen = _choose(*survivors.pop(source.name), rep.target)
            last = max(chosen, default=-1)
            for item in source_prompts(source):
                if isinstance(item, tuple):
                    continue
                if item.index > last:
                    break
                if item.index in chosen:
                    fh.write(request_line(config, source.name, item))
                    rep.total.chosen += 1
                    rep.tally(item.category).chosen += 1
            if rep.total.chosen != rep.target:  # a source that changed between the two passes
                raise DataError(
                    f"source {source.name!r}: {source.path} changed while the mix ran "
                    f"(wrote {rep.total.chosen} of {rep.target} prompts); run it again"
                )
        for handle, data in zip(report_files, report_bytes(report) if report_files else (), strict=True):
            handle.write(data)
    return report
