"""`sglfleet merge`: the existing training set + generation results → the grown training set."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglfleet.cli import HELP
from sglfleet.cli.mix import (
    add_cache_arguments,
    add_unchanged_arguments,
    cache_of,
    chart_lines,
    needs_record,
    outcome,
    unchanged_outcome,
)
from sglfleet.data import DEFAULT_DROP_FINISH_REASONS, DEFAULT_MIN_COMPLETION_TOKENS, DataError


def _reasons(value: str) -> tuple[str, ...]:
    return tuple(r.strip() for r in value.split(",") if r.strip())


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "merge",
        help=HELP["merge"],
        description="Copy the existing training set and append one conversation per kept result; "
        "results are joined to their prompts by custom_id.",
    )
    parser.add_argument("--existing", type=Path, required=True, help="existing training set (JSONL)")
    parser.add_argument("--results", type=Path, required=True, help="generation results (Batch output JSONL)")
    parser.add_argument(
        "--prompts",
        type=Path,
        help="the prompts the results answer (`sglfleet mix` output); default: the input named in "
        "RESULTS.manifest.json, which `sglfleet generate` writes",
    )
    parser.add_argument(
        "-o", "--output", type=Path, required=True, help="merged training set to write (JSONL)"
    )
    parser.add_argument(
        "--report",
        type=Path,
        help="report to write (Markdown; JSON next to it, and the shares chart as .png with the plot extra)",
    )
    parser.add_argument(
        "--min-completion-tokens",
        type=int,
        default=DEFAULT_MIN_COMPLETION_TOKENS,
        help="drop answers shorter than this (usage.completion_tokens; default %(default)s)",
    )
    parser.add_argument(
        "--drop-finish-reasons",
        type=_reasons,
        default=DEFAULT_DROP_FINISH_REASONS,
        metavar="R1,R2",
        help="finish reasons whose answers are dropped (default: length; '' keeps all)",
    )
    add_cache_arguments(parser)
    add_unchanged_arguments(parser)
    parser.set_defaults(func=run)


def _record(args: argparse.Namespace) -> dict:
    """What the merge is built from: the three files (the prompts the manifest names, without
    --prompts; null when it names none) and the options."""
    from sglfleet.data import input_record, prompts_of

    prompts = args.prompts
    if prompts is None:
        try:
            prompts = prompts_of(args.results)
        except DataError:  # the merge itself says what is wrong (or --check: it would run)
            prompts = None
    files = {"existing set": args.existing, "results": args.results, "prompts": prompts}
    options = {
        "min_completion_tokens": args.min_completion_tokens,
        "drop_finish_reasons": list(args.drop_finish_reasons),
    }
    return input_record(files, options)


def run(args: argparse.Namespace) -> int:
    from sglfleet.data import merge

    try:
        record = None
        if needs_record(args):
            record = _record(args)
            done = unchanged_outcome(args, record)
            if done is not None:
                return done
        report = merge(
            args.existing,
            args.results,
            args.prompts,
            args.output,
            args.report,
            min_completion_tokens=args.min_completion_tokens,
            drop_finish_reasons=args.drop_finish_reasons,
            cache=cache_of(args),
            inputs=record,
        )
    except DataError as exc:
        print(f"sglfleet merge: error: {exc}", file=sys.stderr)
        return int(exc.code)  # docs/exit-codes.md
    rows = report.as_dict()["rows"]
    message = (
        f"{rows['total']} rows written to {args.output} ({rows['existing']} existing + {rows['new']} new; "
        f"{sum(report.dropped.values())} results dropped)"
    )
    lines: tuple[str, ...] = ()
    if args.report:
        lines = (f"report: {args.report} and {args.report.with_suffix('.json')}",)
        lines += chart_lines(args, report, "Category shares before and after the merge", "after")
    return outcome(args, True, message, lines)
