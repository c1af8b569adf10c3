"""Build a prompt mix: read the sources, filter, dedupe, pick each source's quota, write OpenAI Batch JSONL.

`build_mix` is a pipeline of named stages, each a function with typed input and output that takes
only its part of the config: scan existing (`scan_stage` → `Existing`) → read sources (`read_stage`)
→ filter (`filter_stage`) → dedupe (`dedupe_stage` → `Survivors`, then `near_stage`) → fill quotas
(`quota_stage` → `Pick`) → write (`write_stage`).

Two streaming passes over each source keep memory bounded by the row count, not the text size:
pass 1 (read → filter → dedupe, chained generators) adapts, filters and dedupes every row and keeps,
per surviving row, only its index and a seeded 64-bit sampling key; the quota is the rows with the
smallest keys (a seeded sample without replacement). Near duplicates are settled between the passes,
all at once (`NearDeduper.resolve`), and taken out of the survivors before the quotas are filled.
Pass 2 (write) re-reads the sources and writes the chosen rows in file order. Same config and seed →
the same bytes. Nothing is written unless the whole mix succeeds, and no output may be one of the
inputs (checked before anything is read).
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from sglfleet import records
from sglfleet.data._adapters import Message, RowError, fields_read, normalise, to_messages, user_text
from sglfleet.data._categories import classify
from sglfleet.data._dedupe import ExactDeduper, NearDeduper, frozen_hashes, normalised_hash
from sglfleet.data._errors import DataError
from sglfleet.data._existing import CategoryCache, existing_category, file_digest
from sglfleet.data._mixconfig import (
    AUTO,
    DedupeConfig,
    ExistingConfig,
    Filters,
    MixConfig,
    Shortfall,
    SourceConfig,
)
from sglfleet.data._outputs import check_outputs, data_outputs, locked, output_labels, written
from sglfleet.data._report import MixReport, SourceReport, report_bytes
from sglfleet.data._sources import read_rows, where

__all__ = ["build_mix", "custom_id"]


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


def _filter_reason(prompt: Prompt, f: Filters) -> str | None:
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


def _targets(
    shortfall: Shortfall, quotas: dict[str, int], available: dict[str, int], notes: list[str]
) -> dict[str, int]:
    """Rows to take per source: the quota, or with `shortfall: fill` the gaps spread over the others."""
    short = {n: quotas[n] - available[n] for n in quotas if available[n] < quotas[n]}
    if not short:
        return dict(quotas)
    if shortfall is Shortfall.ERROR:
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


def _choose(keys: array, indices: array, k: int) -> frozenset[int]:
    """The `k` row indices with the smallest sampling keys (ties broken by index)."""
    if k == 0:
        return frozenset()
    key_arr = np.frombuffer(keys, dtype=np.uint64)
    idx_arr = np.frombuffer(indices, dtype=np.uint64)
    order = np.lexsort((idx_arr, key_arr))[:k]
    return frozenset(int(i) for i in idx_arr[order])


def request_line(generation: dict[str, Any], url: str, source: str, prompt: Prompt) -> bytes:
    """One OpenAI Batch input line (plus `metadata` with the source and category, for merge);
    `generation` (the config's) goes into the body, its `model` first."""
    generation = dict(generation)
    body: dict[str, Any] = {}
    if "model" in generation:
        body["model"] = generation.pop("model")
    body["messages"] = prompt.messages
    body |= generation
    metadata = {"source": source, "category": prompt.category}
    return records.request_line(custom_id(source, prompt.index, prompt.text), url, body, metadata)


def _outputs(config: MixConfig, output: Path, report_path: Path | None) -> list[Path]:
    """The files the mix writes, after checking that none of them is an input (or cannot be written)."""
    inputs = {f"source {s.name!r}": s.path for s in config.sources}
    if config.existing is not None:
        inputs["existing set"] = config.existing.path
    if config.origin is not None:
        inputs["mix config"] = config.origin
    outputs = output_labels(output, report_path)
    check_outputs(inputs, outputs)
    return data_outputs(outputs)


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


# ---- the pipeline: scan existing → read sources → filter → dedupe → fill quotas → write -----------
#
# Each stage takes the part of the config it needs and hands the next one typed data; `build_mix`
# reads the config once and runs them in order. Read, filter and dedupe are generators chained per
# source (pass 1 streams); the near duplicates are settled once every source has been offered.


@dataclass(frozen=True)
class Existing:
    """Scan existing → the existing set's category counts and the dedupers primed with its prompts."""

    counts: Counter[str]
    exact: ExactDeduper
    near: NearDeduper | None


@dataclass
class Survivors:
    """Dedupe → one source's report (its counts so far) and, per prompt left after filters and dedupe,
    its seeded sampling key and row index, in file order; `offered`: the category of each prompt
    offered to the near deduper, in the order offered (its verdicts come back in that order)."""

    source: SourceConfig
    report: SourceReport
    keys: array = field(default_factory=lambda: array("Q"))
    indices: array = field(default_factory=lambda: array("Q"))
    offered: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Pick:
    """Fill quotas → the row indices of one source that go into the mix, and its report."""

    source: SourceConfig
    report: SourceReport
    chosen: frozenset[int]


def scan_stage(
    existing: ExistingConfig | None, dedupe: DedupeConfig, cache: CategoryCache | None
) -> Existing:
    """Stage 1, scan existing: count the existing set's categories and prime the dedupers with it."""
    near = NearDeduper(dedupe.near.threshold, dedupe.near.plan_num_perm()) if dedupe.near.enabled else None
    counts: Counter[str] = Counter()
    hashes = None
    if existing is not None:
        counts, hashes = scan_existing(
            existing, dedupe.against_existing, near=near if dedupe.against_existing else None, cache=cache
        )
    exact = ExactDeduper(hashes if dedupe.against_existing else None, remember=dedupe.exact)
    return Existing(counts, exact, near)


def read_stage(source: SourceConfig, report: SourceReport) -> Iterator[Prompt]:
    """Stage 2, read sources: the source's prompts; a row that does not fit the format fails the mix,
    or with `skip_bad_rows` is counted as invalid."""
    for item in source_prompts(source):
        if isinstance(item, tuple):
            index, exc = item
            if not source.skip_bad_rows:
                raise DataError(
                    f"source {source.name!r}: {where(source.path, source.kind, index)}: {exc} "
                    f"(format {source.format.value}; set field: or skip_bad_rows: true)"
                )
            report.total.read += 1
            report.total.invalid += 1
            report.tally("invalid").read += 1
            report.tally("invalid").invalid += 1
            continue
        tally = report.tally(item.category)
        report.total.read += 1
        tally.read += 1
        yield item


def filter_stage(prompts: Iterator[Prompt], filters: Filters, report: SourceReport) -> Iterator[Prompt]:
    """Stage 3, filter: the prompts the filters keep; the others are counted by reason."""
    for prompt in prompts:
        reason = _filter_reason(prompt, filters)
        if reason is None:
            yield prompt
            continue
        report.total.filtered[reason] += 1
        report.tally(prompt.category).filtered[reason] += 1


def dedupe_stage(prompts: Iterator[Prompt], existing: Existing, seed: int, survivors: Survivors) -> Survivors:
    """Stage 4, dedupe (exact now, near offered for later): each prompt not an exact duplicate survives
    with its seeded sampling key."""
    report, name = survivors.report, survivors.source.name
    for prompt in prompts:
        tally = report.tally(prompt.category)
        norm = normalise(prompt.text)  # once for both dedupes
        digest = normalised_hash(norm)
        dup = existing.exact.check(digest)
        if dup is not None:
            report.total.duplicates[dup.value] += 1
            tally.duplicates[dup.value] += 1
            continue
        if existing.near is not None:
            existing.near.add(norm, normalised=True)
            survivors.offered.append(prompt.category)
        report.total.available += 1
        tally.available += 1
        survivors.keys.append(_sample_key(seed, name, prompt.index, digest))
        survivors.indices.append(prompt.index)
    return survivors


def near_stage(near: NearDeduper, survivors: list[Survivors]) -> str:
    """Stage 4, dedupe (near): settle the near duplicates of every source at once and take them out of
    each source's survivors and counts; the note that says how."""
    verdicts = near.resolve()
    start = 0
    for group in survivors:
        mine = verdicts[start : start + len(group.offered)]
        categories, group.offered = group.offered, []
        start += len(categories)
        if not any(mine):
            continue
        keep = np.fromiter((v is None for v in mine), dtype=bool, count=len(mine))
        group.keys = array("Q", np.frombuffer(group.keys, dtype=np.uint64)[keep].tobytes())
        group.indices = array("Q", np.frombuffer(group.indices, dtype=np.uint64)[keep].tobytes())
        for verdict, category in zip(mine, categories, strict=True):
            if verdict is not None:
                for tally in (group.report.total, group.report.tally(category)):
                    tally.duplicates[verdict.value] += 1
                    tally.available -= 1
    return _near_note(near)


def quota_stage(
    survivors: list[Survivors], quotas: dict[str, int], shortfall: Shortfall, notes: list[str]
) -> list[Pick]:
    """Stage 5, fill quotas: each source's target (its quota, or the gaps spread with `shortfall: fill`)
    and the rows with the smallest sampling keys up to it (a seeded sample without replacement)."""
    available = {s.source.name: s.report.total.available for s in survivors}
    targets = _targets(shortfall, quotas, available, notes)
    picks = []
    for group in survivors:
        group.report.target = targets[group.source.name]
        picks.append(
            Pick(group.source, group.report, _choose(group.keys, group.indices, group.report.target))
        )
        group.keys, group.indices = array("Q"), array("Q")  # only the pick is needed from here on
    return picks


def write_stage(picks: list[Pick], generation: dict[str, Any], url: str, out: BinaryIO) -> None:
    """Stage 6, write: read each source again and write its chosen prompts in file order, as OpenAI
    Batch input lines; a source that changed since it was first read fails the mix."""
    for pick in picks:
        source, report = pick.source, pick.report
        last = max(pick.chosen, default=-1)
        for item in source_prompts(source):
            if isinstance(item, tuple):
                continue
            if item.index > last:
                break
            if item.index in pick.chosen:
                out.write(request_line(generation, url, source.name, item))
                report.total.chosen += 1
                report.tally(item.category).chosen += 1
        if report.total.chosen != report.target:  # a source that changed between the two passes
            raise DataError(
                f"source {source.name!r}: {source.path} changed while the mix ran "
                f"(wrote {report.total.chosen} of {report.target} prompts); run it again"
            )


def build_mix(
    config: MixConfig,
    output: Path,
    report_path: Path | None = None,
    *,
    cache: CategoryCache | None = None,
    inputs: dict[str, Any] | None = None,
) -> MixReport:
    """Run the mix; write `output` (and the report, Markdown + JSON) only when all of it succeeds.

    `cache`: where the existing set's category counts are looked up and left for `merge`. `inputs`:
    what the mix is built from (`_inputs.input_record`), kept in the report JSON. Another mix or
    merge writing the same output meanwhile is refused (`DataError`) before anything is read.
    """
    with locked(output_labels(output, report_path), "sglfleet mix"):
        return _build_mix(config, output, report_path, cache=cache, inputs=inputs)


def _build_mix(
    config: MixConfig,
    output: Path,
    report_path: Path | None,
    *,
    cache: CategoryCache | None,
    inputs: dict[str, Any] | None,
) -> MixReport:
    _preflight(config)
    paths = _outputs(config, output, report_path)
    quotas = config.quotas()
    existing = scan_stage(config.existing, config.dedupe, cache)
    survivors = []
    for source in config.sources:
        report = SourceReport(source.name, str(source.path), source.format.value, quotas[source.name])
        prompts = filter_stage(read_stage(source, report), config.filters, report)
        survivors.append(dedupe_stage(prompts, existing, config.seed, Survivors(source, report)))
    notes: list[str] = []
    if existing.near is not None:
        notes.append(near_stage(existing.near, survivors))
    picks = quota_stage(survivors, quotas, config.shortfall, notes)
    del survivors
    origin = None if config.origin is None else config.origin.name
    report = MixReport(
        config.seed, str(output), [p.report for p in picks], existing.counts, notes, origin, inputs
    )
    with written(paths) as (fh, *report_files):
        write_stage(picks, config.generation, config.url, fh)
        for handle, data in zip(report_files, report_bytes(report) if report_files else (), strict=True):
            handle.write(data)
    return report
