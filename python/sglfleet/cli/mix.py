"""`sglfleet mix`: build a diverse, deduplicated prompt set (OpenAI Batch JSONL) with its report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sglfleet.cli import HELP
from sglfleet.data import DataError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "mix",
        help=HELP["mix"],
        description="Read the sources named in the config, filter and dedupe them, pick each source's "
        "quota (seeded) and write OpenAI Batch JSONL ready for `sglfleet generate`.",
    )
    parser.add_argument("--config", type=Path, required=True, help="mix config (YAML)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="prompts file to write (JSONL)")
    parser.add_argument(
        "--report",
        type=Path,
        help="report to write (Markdown; the JSON goes next to it as .json, the shares chart as .png "
        "with the plot extra)",
    )
    parser.add_argument("--seed", type=int, help="override the config's seed")
    add_cache_arguments(parser)
    add_unchanged_arguments(parser)
    parser.set_defaults(func=run)


def add_unchanged_arguments(parser: argparse.ArgumentParser) -> None:
    """--skip-unchanged / --check / --json: how a phase role runs mix and merge (idempotent, check mode)."""
    parser.add_argument(
        "--skip-unchanged",
        action="store_true",
        help="write nothing when the output and the report are there and the report JSON's `inputs` "
        "are these very inputs (each file's SHA-256 and the options)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; say whether a run with --skip-unchanged would build (Ansible's check mode)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object, {"changed": ..., "output": ..., "report": ..., "message": ...}, '
        "instead of lines",
    )


def needs_record(args: argparse.Namespace) -> bool:
    """Whether the inputs are hashed: for the report JSON (only written with --report) or to compare."""
    return args.report is not None or args.skip_unchanged or args.check


def unchanged_outcome(args: argparse.Namespace, record: dict[str, Any]) -> int | None:
    """The exit status when there is nothing to build (or --check predicts), None to go on building."""
    from sglfleet.data import inputs_unchanged as unchanged

    if (args.skip_unchanged or args.check) and unchanged(record, args.output, args.report):
        report = args.report.with_suffix(".json")
        return outcome(args, False, f"unchanged: {args.output} was built from these inputs ({report})")
    if args.check:
        return outcome(args, True, f"would build {args.output}: an input changed, or an output is missing")
    return None


def outcome(args: argparse.Namespace, changed: bool, message: str, lines: tuple[str, ...] = ()) -> int:
    """Print the outcome (as lines, or as one JSON object with --json); exit 0."""
    if args.json:
        import orjson

        report = None if args.report is None else str(args.report.with_suffix(".json"))
        data = {"changed": changed, "output": str(args.output), "report": report, "message": message}
        print(orjson.dumps(data).decode())
    else:
        for line in (message, *lines):
            print(line)
    return 0


def add_cache_arguments(parser: argparse.ArgumentParser) -> None:
    """--cache-dir / --no-cache: where the existing set's category counts are kept (mix and merge)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--cache-dir",
        type=Path,
        help="cache of the existing set's category counts, by content digest "
        "(default: $SGLFLEET_CACHE_DIR, $XDG_CACHE_HOME/sglfleet or ~/.cache/sglfleet)",
    )
    group.add_argument("--no-cache", action="store_true", help="classify the existing set every time")


def chart_lines(args: argparse.Namespace, report: Any, title: str, after_label: str) -> tuple[str, ...]:
    """Draw the category shares before and after beside the Markdown report (REPORT.png); without the
    plot extra, a line that says how to get it (the data is written either way)."""
    if args.report is None:
        return ()
    try:
        from sglfleet.plot import shares_chart
    except ImportError as exc:
        missing = (exc.name or "matplotlib").split(".")[0]
        return (f"note: no chart: {missing} is missing; pip install 'sglfleet[plot]'",)
    chart = args.report.with_suffix(".png")
    try:
        shares_chart(report.existing, report.new, chart, title=title, after_label=after_label)
    except OSError as exc:
        return (f"note: no chart: cannot write {chart}: {exc.strerror or exc}",)
    return (f"chart: {chart}",)


def cache_of(args: argparse.Namespace):  # -> CategoryCache (imported lazily with the data package)
    from sglfleet.data import CategoryCache, cache_dir

    return CategoryCache(None if args.no_cache else (args.cache_dir or cache_dir()))


def run(args: argparse.Namespace) -> int:
    # Imported here: the mix extra (numpy, datasketch, pyarrow) is not on the fleet hosts, and every
    # other subcommand must start without it.
    try:
        from sglfleet.data import build_mix, input_record, load_config
    except ImportError as exc:
        print(
            f"sglfleet mix: error: {exc.name} is missing; install the mix extra: pip install 'sglfleet[mix]'",
            file=sys.stderr,
        )
        return 1  # not the input's fault (docs/exit-codes.md)
    try:
        config = load_config(args.config)
        if args.seed is not None:
            config = config.model_copy(update={"seed": args.seed})
        record = None
        if needs_record(args):
            files = {"mix config": args.config, **{f"source {s.name}": s.path for s in config.sources}}
            if config.existing is not None:
                files["existing set"] = config.existing.path
            record = input_record(files, {"seed": config.seed})
            done = unchanged_outcome(args, record)
            if done is not None:
                return done
        report = build_mix(config, args.output, args.report, cache=cache_of(args), inputs=record)
    except ImportError as exc:  # a part of the extra imported on the way (datasketch, pyarrow, ...)
        print(
            f"sglfleet mix: error: {exc.name} is missing; install the mix extra: pip install 'sglfleet[mix]'",
            file=sys.stderr,
        )
        return 1
    except DataError as exc:
        print(f"sglfleet mix: error: {exc}", file=sys.stderr)
        return int(exc.code)  # docs/exit-codes.md
    data = report.as_dict()
    lines = tuple(f"note: {note}" for note in report.notes)
    if args.report:
        lines += (f"report: {args.report} and {args.report.with_suffix('.json')}",)
        lines += chart_lines(
            args, report, "Category shares: the existing set, the new prompts, both", "merged"
        )
    return outcome(args, True, f"{data['prompts']} prompts written to {args.output}", lines)
