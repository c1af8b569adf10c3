"""Reports of the data phase: the mix report and the merge report, as JSON and as Markdown.

Both are plain data (dataclasses of counts) so that tests can recount the output and compare. A
report is deterministic: no timestamps, keys in a fixed order, so the same run writes the same bytes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson

from sglfleet.data._categories import CATEGORIES

__all__ = ["MergeReport", "MixReport"]


def _ordered(counts: Counter[str]) -> dict[str, int]:
    """Known categories first (in their usual order), then the others by name."""
    known = [c for c in CATEGORIES if c in counts]
    other = sorted(c for c in counts if c not in CATEGORIES)
    return {c: counts[c] for c in known + other}


def shares(counts: Counter[str]) -> dict[str, dict[str, float | int]]:
    total = sum(counts.values())
    return {
        c: {"rows": n, "share": round(n / total, 4) if total else 0.0} for c, n in _ordered(counts).items()
    }


@dataclass
class Tally:
    """What happened to the rows of one source (or one source and category)."""

    read: int = 0
    invalid: int = 0
    filtered: Counter[str] = field(default_factory=Counter)
    duplicates: Counter[str] = field(default_factory=Counter)
    available: int = 0
    chosen: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "invalid": self.invalid,
            "filtered": sum(self.filtered.values()),
            "filtered_by_reason": dict(sorted(self.filtered.items())),
            "duplicates": sum(self.duplicates.values()),
            "duplicates_by_kind": dict(sorted(self.duplicates.items())),
            "available": self.available,
            "chosen": self.chosen,
        }


@dataclass
class SourceReport:
    name: str
    path: str
    format: str
    quota: int
    target: int = 0
    total: Tally = field(default_factory=Tally)
    categories: dict[str, Tally] = field(default_factory=dict)

    def tally(self, category: str) -> Tally:
        return self.categories.setdefault(category, Tally())

    def as_dict(self) -> dict[str, Any]:
        cats = Counter({c: 1 for c in self.categories})
        return {
            "name": self.name,
            "path": self.path,
            "format": self.format,
            "quota": self.quota,
            "target": self.target,
            **self.total.as_dict(),
            "categories": {c: self.categories[c].as_dict() for c in _ordered(cats)},
        }


@dataclass
class MixReport:
    seed: int
    output: str
    sources: list[SourceReport]
    existing: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    config: str | None = None  # the mix config's file name, when it came from a file
    inputs: dict[str, Any] | None = None  # what it was built from (`_inputs.input_record`)

    @property
    def new(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for source in self.sources:
            counts.update({c: t.chosen for c, t in source.categories.items() if t.chosen})
        return counts

    def evidence(self) -> dict[str, Any]:
        """What the ledger records for phase prompts (role prompt_mix adds where the hosts keep them)."""
        new = self.new
        config = {} if self.config is None else {"config": self.config}
        return {
            "prompts": sum(new.values()),
            **config,
            "seed": self.seed,
            "shares": {c: v["share"] for c, v in shares(new).items()},
        }

    def as_dict(self) -> dict[str, Any]:
        new = self.new
        return {
            "seed": self.seed,
            "output": self.output,
            "prompts": sum(new.values()),
            "sources": [s.as_dict() for s in self.sources],
            "shares": {
                "existing": shares(self.existing),
                "new": shares(new),
                "merged": shares(self.existing + new),
            },
            "notes": self.notes,
            "evidence": self.evidence(),
            "inputs": self.inputs,
        }

    def markdown(self) -> str:
        new = self.new
        lines = [
            "# Prompt mix report",
            "",
            f"{sum(new.values())} prompts written to `{self.output}` (seed {self.seed}).",
            "",
            "## Sources",
            "",
            "| source | format | read | invalid | filtered | duplicates | available | quota | chosen |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for s in self.sources:
            t = s.total
            lines.append(
                f"| {s.name} | {s.format} | {t.read} | {t.invalid} | {sum(t.filtered.values())} "
                f"| {sum(t.duplicates.values())} | {t.available} | {s.quota} | {t.chosen} |"
            )
        lines += [
            "",
            "## Sources by category",
            "",
            "| source | category | read | filtered | duplicates | available | chosen |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for s in self.sources:
            for c in _ordered(Counter(dict.fromkeys(s.categories, 1))):
                t = s.categories[c]
                lines.append(
                    f"| {s.name} | {c} | {t.read} | {sum(t.filtered.values())} "
                    f"| {sum(t.duplicates.values())} | {t.available} | {t.chosen} |"
                )
        reasons = Counter[str]()
        kinds = Counter[str]()
        for s in self.sources:
            reasons.update(s.total.filtered)
            kinds.update(s.total.duplicates)
        if reasons or kinds:
            lines += ["", "Filtered: " + _inline(reasons) + ". Duplicates: " + _inline(kinds) + "."]
        lines += ["", *shares_markdown(self.existing, new)]
        if self.notes:
            lines += ["", "## Notes", "", *[f"- {n}" for n in self.notes]]
        return "\n".join(lines) + "\n"


def _inline(counts: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def shares_markdown(before: Counter[str], new: Counter[str], after_label: str = "merged") -> list[str]:
    """The skew table: category shares of the existing set, of the new rows and of both together."""
    merged = before + new
    cats = _ordered(Counter(dict.fromkeys(list(before) + list(new), 1)))

    def cell(counts: Counter[str], c: str) -> str:
        total = sum(counts.values())
        return f"{counts[c]} ({100 * counts[c] / total:.1f}%)" if total else "0"

    lines = [
        "## Category shares (skew before and after)",
        "",
        f"| category | existing | new | {after_label} |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [f"| {c} | {cell(before, c)} | {cell(new, c)} | {cell(merged, c)} |" for c in cats]
    lines.append(
        f"| **total** | {sum(before.values())} | {sum(new.values())} | {sum(merged.values())} |",
    )
    return lines


@dataclass
class MergeReport:
    output: str
    existing: Counter[str] = field(default_factory=Counter)
    new: Counter[str] = field(default_factory=Counter)
    results_read: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    prompts: int = 0
    without_result: int = 0
    min_completion_tokens: int = 17
    drop_finish_reasons: tuple[str, ...] = ("length",)
    inputs: dict[str, Any] | None = None  # what it was built from (`_inputs.input_record`)

    def evidence(self) -> dict[str, Any]:
        """What the ledger records for phase merge."""
        existing, new = sum(self.existing.values()), sum(self.new.values())
        return {
            "rows_before": existing,
            "rows_new": new,
            "rows_after": existing + new,
            "results": self.results_read,
            "dropped": sum(self.dropped.values()),
            "shares_before": {c: v["share"] for c, v in shares(self.existing).items()},
            "shares_after": {c: v["share"] for c, v in shares(self.existing + self.new).items()},
        }

    def as_dict(self) -> dict[str, Any]:
        existing, new = sum(self.existing.values()), sum(self.new.values())
        return {
            "output": self.output,
            "rows": {"existing": existing, "new": new, "total": existing + new},
            "results_read": self.results_read,
            "dropped": sum(self.dropped.values()),
            "dropped_by_reason": dict(sorted(self.dropped.items())),
            "prompts": self.prompts,
            "prompts_without_result": self.without_result,
            "min_completion_tokens": self.min_completion_tokens,
            "drop_finish_reasons": list(self.drop_finish_reasons),
            "shares": {
                "before": shares(self.existing),
                "new": shares(self.new),
                "after": shares(self.existing + self.new),
            },
            "evidence": self.evidence(),
            "inputs": self.inputs,
        }

    def markdown(self) -> str:
        existing, new = sum(self.existing.values()), sum(self.new.values())
        reasons = ", ".join(self.drop_finish_reasons) or "none"
        lines = [
            "# Merge report",
            "",
            f"`{self.output}`: {existing + new} rows = {existing} existing + {new} new.",
            "",
            "| results | kept | dropped | prompts | prompts without a result |",
            "| ---: | ---: | ---: | ---: | ---: |",
            f"| {self.results_read} | {new} | {sum(self.dropped.values())} | {self.prompts} "
            f"| {self.without_result} |",
            "",
            f"Dropped by reason: {_inline(self.dropped)} (minimum completion tokens "
            f"{self.min_completion_tokens}; finish reasons dropped: {reasons}).",
            "",
            *shares_markdown(self.existing, self.new, after_label="after"),
        ]
        return "\n".join(lines) + "\n"


def report_bytes(report: MixReport | MergeReport) -> tuple[bytes, bytes]:
    """The Markdown and the JSON report, as written."""
    data = orjson.dumps(report.as_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
    return report.markdown().encode(), data
