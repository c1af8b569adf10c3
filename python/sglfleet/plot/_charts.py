"""The charts, drawn with matplotlib's object API (a Figure and an Agg canvas of their own: no pyplot,
no global state), written as PNG with no timestamp in it, so the same data gives the same bytes."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sglfleet.atomicio import atomic_write

__all__ = ["job_chart", "job_series", "shares_chart"]

BEFORE, AFTER, NEW = "#8c8c8c", "#1f77b4", "#ff7f0e"


def _save(fig: Figure, path: Path) -> None:
    FigureCanvasAgg(fig)
    with atomic_write(Path(path)) as fh:
        fig.savefig(fh, format="png", dpi=100, metadata={"Software": None})


def _percent(counts: Counter[str], category: str) -> float:
    total = sum(counts.values())
    return 100.0 * counts[category] / total if total else 0.0


def shares_chart(
    before: Counter[str],
    new: Counter[str],
    path: Path,
    *,
    title: str,
    before_label: str = "existing",
    after_label: str = "after",
) -> Path:
    """Horizontal bars: each category's share (%) of the existing set, of the new rows and of both
    together, categories in the report's order; written to `path` (PNG)."""
    after = before + new
    categories = [c for c in dict.fromkeys([*before, *new]) if before[c] or new[c]]
    categories.sort(key=lambda c: -after[c])
    height = 1.2 + 0.55 * max(len(categories), 1)
    fig = Figure(figsize=(8.5, height), layout="constrained")
    ax = fig.add_subplot()
    bar = 0.27
    rows = [
        (f"{before_label} ({sum(before.values()):,} rows)", before, BEFORE, -bar),
        (f"new ({sum(new.values()):,} rows)", new, NEW, 0.0),
        (f"{after_label} ({sum(after.values()):,} rows)", after, AFTER, bar),
    ]
    for label, counts, color, offset in rows:
        values = [_percent(counts, c) for c in categories]
        positions = [i + offset for i in range(len(categories))]
        bars = ax.barh(positions, values, height=bar, color=color, label=label)
        ax.bar_label(bars, labels=[f"{v:.1f}%" if v else "" for v in values], padding=2, fontsize=8)
    ax.set_yticks(range(len(categories)), categories)
    ax.invert_yaxis()  # the largest category on top
    ax.set_xlabel("share of rows (%)")
    ax.set_xlim(0, min(100.0, max([_percent(c, k) for _, c, _, _ in rows for k in categories] or [1]) * 1.18))
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    _save(fig, path)
    return Path(path)


def job_series(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What the job chart draws, from OUT.timeline.jsonl's samples: the time since the first sample (in
    seconds, minutes or hours, `unit`, whichever reads best for the job's length);
    done and failed; requests/s per endpoint and output tokens/s over a moving window within one run
    (a run's counters start again at 0, so no rate spans two runs)."""
    times = [dt.datetime.fromisoformat(s["t"]) for s in samples]
    t0 = times[0]
    span = (times[-1] - t0).total_seconds()
    unit, per = (
        ("seconds", 1.0) if span < 180 else ("minutes", 60.0) if span < 3 * 3600 else ("hours", 3600.0)
    )
    minutes = [(t - t0).total_seconds() / per for t in times]
    series: dict[str, Any] = {
        "unit": unit,
        "minutes": minutes,
        "done": [int(s["done"]) for s in samples],
        "failed": [int(s.get("failed", 0)) for s in samples],
        "total": int(samples[-1]["total"]),
        "rate_minutes": [],
        "tokens_per_s": [],
        "endpoints": {},
    }
    urls = list(dict.fromkeys(url for s in samples for url in s.get("endpoints", {})))
    rates: dict[str, list[float | None]] = {url: [] for url in urls}
    # a rate over a window of about a 12th of the job (a sample's own gap when longer), so that a
    # one-answer step between two samples 1 s apart does not read as noise
    window = span / 12
    start = 0
    for i in range(1, len(samples)):
        cur = samples[i]
        if cur.get("run") != samples[start].get("run"):
            start = i
            continue
        j = start
        while j < i - 1 and (times[i] - times[j + 1]).total_seconds() >= window:
            j += 1
        prev, gap = samples[j], (times[i] - times[j]).total_seconds()
        if gap <= 0:
            continue
        series["rate_minutes"].append(minutes[i])
        tokens = int(cur.get("completion_tokens", 0)) - int(prev.get("completion_tokens", 0))
        series["tokens_per_s"].append(max(0, tokens) / gap)
        for url in urls:
            a, b = prev.get("endpoints", {}).get(url), cur.get("endpoints", {}).get(url)
            rates[url].append(None if a is None or b is None else max(0, b["ok"] - a["ok"]) / gap)
    series["endpoints"] = rates
    return series


def job_chart(samples: Sequence[dict[str, Any]], path: Path, *, title: str) -> Path:
    """Three panels over time: requests done (and failed) of the total; requests/s per endpoint;
    output tokens/s of the whole job; written to `path` (PNG)."""
    s = job_series(samples)
    fig = Figure(figsize=(10, 9), layout="constrained")
    progress, per_endpoint, tokens = fig.subplots(3, 1, sharex=True)
    fig.suptitle(f"Generation job {title}", fontsize=12)

    progress.plot(s["minutes"], s["done"], color=AFTER, label="done")
    if any(s["failed"]):
        progress.plot(s["minutes"], s["failed"], color="#d62728", label="failed")
    progress.axhline(s["total"], color="black", linestyle="--", linewidth=1, label=f"total ({s['total']:,})")
    progress.set_ylabel("requests")
    progress.set_ylim(0, s["total"] * 1.05 or 1)
    progress.set_title(f"Progress: {s['done'][-1]:,} of {s['total']:,} done", fontsize=10, loc="left")
    progress.legend(loc="lower right", fontsize=8)

    # a short job has a few rates: a line through one point draws nothing, so each point gets a dot
    dots = {"marker": "o", "markersize": 4} if len(s["rate_minutes"]) < 24 else {}
    for url, rates in s["endpoints"].items():
        per_endpoint.plot(
            s["rate_minutes"], [float("nan") if r is None else r for r in rates], label=url, **dots
        )
    per_endpoint.set_ylabel("requests/s")
    per_endpoint.set_title("Throughput per endpoint (answers over a moving window)", fontsize=10, loc="left")
    if s["endpoints"]:
        per_endpoint.legend(loc="upper left", fontsize=7, ncol=2 if len(s["endpoints"]) > 4 else 1)
    per_endpoint.set_ylim(bottom=0)

    tokens.plot(s["rate_minutes"], s["tokens_per_s"], color=NEW, **dots)
    tokens.set_ylabel("output tokens/s")
    tokens.set_title("Output tokens/s, whole job", fontsize=10, loc="left")
    tokens.set_xlabel(f"time since the job's first sample ({s['unit']})")
    tokens.set_ylim(bottom=0)
    for ax in (progress, per_endpoint, tokens):
        ax.grid(alpha=0.3)
    _save(fig, path)
    return Path(path)
