"""The doctor's rows and the one table a user pastes when asking for help."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum

__all__ = ["Row", "Status", "blockers", "render"]


class Status(StrEnum):
    OK = "ok"
    BLOCKER = "BLOCKER"
    WARN = "warn"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Row:
    """One check on one host: what was found, and for anything but ok, what fixes it. A skipped row's
    `found` says why it was skipped (a decision of the inventory, or a check that cannot run yet)."""

    check: str
    host: str
    status: Status
    found: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}


HEADERS = ("check", "host", "status", "found", "fix")


def blockers(rows: Iterable[Row]) -> list[Row]:
    return [row for row in rows if row.status is Status.BLOCKER]


def render(rows: Sequence[Row]) -> list[str]:
    """The table, one line per row (columns padded, never cut: it is pasted whole), then a summary line."""
    cells = [HEADERS, *((r.check, r.host, str(r.status), r.found, r.fix or "-") for r in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(HEADERS) - 1)]

    def line(values: Sequence[str]) -> str:
        head = "  ".join(value.ljust(width) for value, width in zip(values, widths, strict=False))
        return f"{head}  {values[-1]}".rstrip()

    out = [line(HEADERS), line(["-" * w for w in widths] + ["---"])]
    out += [line(values) for values in cells[1:]]
    counts = {status: sum(1 for r in rows if r.status is status) for status in Status}
    verdict = "blocked" if counts[Status.BLOCKER] else "no blocker found"
    out.append(
        f"{verdict}: {counts[Status.BLOCKER]} BLOCKER, {counts[Status.WARN]} warn, "
        f"{counts[Status.OK]} ok, {counts[Status.SKIPPED]} skipped ({len(rows)} checks)"
    )
    return out
