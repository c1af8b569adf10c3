"""`sglfleet mix`: build a diverse, deduplicated prompt set (OpenAI Batch JSONL) with its report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglfleet.data._errors import DataError


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
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: the mix extra (numpy, datasketch, pyarrow) is not on the fleet hosts, and every
    # other subcommand must start without it.
    try:
        from sglfleet.data._mix import build_mix
        from sglfleet.data._mixconfig import load_config
    except ImportError as exc:
        print(
            f"sglfleet mix: error: {exc.name} is missing; install the mix extra: pip install 'sglfleet[mix]'",
            file=sys.stderr,
        )
        return 2
    try:
        config = load_config(args.config)
        if args.seed is not None:
            config = config.model_copy(update={"seed": args.seed})
        report = build_mix(config, args.output, args.report)
    except DataError as exc:
        print(f"sglfleet mix: error: {exc}", file=sys.stderr)
        return 1
    data = report.as_dict()
    print(f"{data['prompts']} prompts written to {args.output}")
    for note in report.notes:
        print(f"note: {note}")
    if args.report:
        print(f"report: {args.report} and {args.report.with_suffix('.json')}")
    return 0
