"""`sglfleet status`: the phase checklist from the ledger and the instance table."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sglfleet.cli._common import add_endpoint_args, api_key_from_args, endpoints_from_args, table_console
from sglfleet.fleet import (
    LEDGER_PATH,
    GpuFacts,
    LedgerError,
    gather_status,
    layout_from_env_dir,
    parse_status_json,
    query_gpus_tolerant,
    render,
)

DEFAULT_ENV_DIR = Path("/etc/sglang")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help="print the phase checklist and the instance table",
        description="Print where the fleet stands: every phase from the ledger (done, pending, failed, when, "
        "evidence), then one row per instance (GPU, port, health, model, running and waiting requests, "
        "tokens/s, GPU memory used). Exit status 0, or 2 when the ledger or the arguments are bad.",
    )
    parser.add_argument(
        "--ledger", type=Path, default=LEDGER_PATH, help="the ledger file (default: %(default)s)"
    )
    add_endpoint_args(parser, count_required=False)
    parser.add_argument(
        "--env-dir", type=Path, default=DEFAULT_ENV_DIR, help="where instance-*.env files live"
    )
    parser.add_argument(
        "--nvidia-smi",
        default="nvidia-smi",
        help="nvidia-smi to ask for GPU memory ('' to skip; default: %(default)s)",
    )
    parser.add_argument(
        "--render",
        metavar="FILE",
        help="print the tables from the JSON that `sglfleet status --json` wrote to FILE ('-' for stdin)",
    )
    parser.add_argument(
        "--width",
        type=int,
        default=None,
        help="table width (default: the terminal's; unlimited off a terminal)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.render:
            source = "<stdin>" if args.render == "-" else args.render
            text = sys.stdin.read() if args.render == "-" else Path(args.render).read_text()
            status = parse_status_json(text, source)
        else:
            endpoints = endpoints_from_args(args)
            api_key = api_key_from_args(args)
            gpu_sets = None
            if not endpoints:
                layout = layout_from_env_dir(args.env_dir)
                endpoints = list(layout.endpoints)
                api_key = api_key or layout.api_key
                gpu_sets = layout.gpu_sets
            wanted = {i for s in (gpu_sets or {}).values() for i in s} | {
                e.gpu for e in endpoints if e.gpu is not None
            }
            facts, gpu_errors = _gpu_facts(args.nvidia_smi, sorted(wanted))
            if not endpoints and facts and facts.gpu_count:
                endpoints = endpoints_from_args(args, facts.gpu_count)
            status = gather_status(
                ledger_path=args.ledger,
                endpoints=endpoints,
                api_key=api_key,
                expected_model=args.expected_model,
                timeout=args.timeout,
                gpu_facts=facts,
                gpu_sets=gpu_sets,
                gpu_errors=gpu_errors,
            )
    except (ValueError, OSError, LedgerError) as exc:
        print(f"sglfleet status: {exc}", file=sys.stderr)
        return 2
    if args.json:
        data = status.model_dump(mode="json")
        data.update(summary=status.summary(), healthy_count=status.healthy_count)
        print(json.dumps(data, indent=2))
    else:
        render(status, table_console(args.width))
    return 0


def _gpu_facts(nvidia_smi: str, indices: list[int]) -> tuple[GpuFacts | None, list[str]]:
    """GPU facts for the memory columns: the GPUs that answer, and what nvidia-smi said about the others
    (an instance whose GPU is not listed is named in the table)."""
    if not nvidia_smi:
        return None, []
    facts, errors = query_gpus_tolerant(nvidia_smi, indices)
    for error in errors:
        print(f"sglfleet status: warning: nvidia-smi: {error}", file=sys.stderr)
    return facts, errors
