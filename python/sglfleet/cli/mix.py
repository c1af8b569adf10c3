"""`sglfleet mix`: build a diverse, deduplicated prompt set (OpenAI Batch JSONL) with its report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglfleet.data import DataError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "mix",
        help="build a deduplicated prompt mix from several sources (OpenAI Batch JSONL + report)",
        description="Read the sources named in the config, filter and dedupe them, pick each source's "
        "quota (seeded) and write OpenAI Batch JSONL ready for `sglfleet generate`.",
    )
    parser.add_argument("--config", type=Path, required=True, help="mix config (YAML)")
    parser.add_argument("--output", type=Path, required=True, help="prompts file to write (JSONL)")
    parser.add_argument(
        "--report", type=Path, help="report to write (Markdown; the JSON goes next to it as .json)"
    )
    parser.add_argument("--seed", type=int, help="override the config's seed")
    add_cache_arguments(parser)
    parser.set_defaults(func=run)


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


def cache_of(args: argparse.Namespace):  # -> CategoryCache (imported lazily with the data package)
    from sglfleet.data import CategoryCache, cache_dir

    return CategoryCache(None if args.no_cache else (args.cache_dir or cache_dir()))


def run(args: argparse.Namespace) -> int:
    # Imported here: the mix extra (numpy, datasketch, pyarrow) is not on the fleet hosts, and every
    # other subcommand must start without it.
    try:
        from sglfleet.data import build_mix, load_config
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
        report = build_mix(config, args.output, args.report, cache=cache_of(args))
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
    print(f"{data['prompts']} prompts written to {args.output}")
    for note in report.notes:
        print(f"note: {note}")
    if args.report:
        print(f"report: {args.report} and {args.report.with_suffix('.json')}")
    return 0
