"""`sglfleet status`: the phase checklist from the ledger and the instance table."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sglfleet.cli import HELP
from sglfleet.cli._common import add_endpoint_args, api_key_from_args, endpoints_from_args, table_console
from sglfleet.cli._watch import Frame, add_watch_arg, watch
from sglfleet.fleet import LEDGER_PATH

if TYPE_CHECKING:  # imported where used: `--help` loads neither pydantic nor the HTTP client
    from rich.console import Console

    from sglfleet.fleet import FleetStatus, GpuFacts

DEFAULT_ENV_DIR = Path("/etc/sglang")


EXIT_STATUS = (
    "Exit status: 0, 1 when a phase has failed (the summary names it), 2 when the ledger or the arguments "
    "are bad (docs/exit-codes.md)."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help=HELP["status"],
        description="Print where the fleet stands: every phase from the ledger (done, pending, failed, when, "
        "evidence), then one row per instance (GPU, port, health, model, running and waiting requests, "
        "tokens/s, GPU memory used). A missing ledger is said so (every phase then reads pending). "
        + EXIT_STATUS,
    )
    parser.add_argument(
        "--ledger", type=Path, default=LEDGER_PATH, help="the ledger file (default: %(default)s)"
    )
    add_endpoint_args(parser, count_required=False)
    parser.add_argument(
        "--env-dir",
        type=Path,
        default=DEFAULT_ENV_DIR,
        help="where instance-*.env files live (default: %(default)s)",
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
    add_watch_arg(parser, "until Ctrl-C")
    parser.set_defaults(func=run)


def exit_code(status: FleetStatus) -> int:
    """0, or 1 when a phase has failed."""
    return 1 if status.failed_phases else 0


def gather(args: argparse.Namespace) -> FleetStatus:
    """The status the arguments ask for (read from --render's file, or gathered from this host)."""
    from sglfleet.fleet import gather_status, layout_from_env_dir, parse_status_json

    if args.render:
        source = "<stdin>" if args.render == "-" else args.render
        text = sys.stdin.read() if args.render == "-" else Path(args.render).read_text()
        return parse_status_json(text, source)
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
    return gather_status(
        ledger_path=args.ledger,
        endpoints=endpoints,
        api_key=api_key,
        expected_model=args.expected_model,
        timeout=args.timeout,
        gpu_facts=facts,
        gpu_sets=gpu_sets,
        gpu_errors=gpu_errors,
    )


def as_json(status: FleetStatus) -> str:
    data = status.model_dump(mode="json")
    data.update(summary=status.summary(), healthy_count=status.healthy_count)
    return json.dumps(data, indent=2)


def status_frame(args: argparse.Namespace, console: Console) -> Frame:
    """One frame of `status --watch`: the tables as `render` prints them, and the exit code."""
    from rich.console import Console
    from rich.text import Text

    from sglfleet.fleet import render

    status = gather(args)
    if args.json:
        return Text(as_json(status)), exit_code(status), False
    buffer = io.StringIO()
    render(status, Console(file=buffer, width=console.width, force_terminal=console.is_terminal))
    return Text.from_ansi(buffer.getvalue()), exit_code(status), False


def run(args: argparse.Namespace) -> int:
    from sglfleet.fleet import LedgerError, render

    try:
        if args.watch is not None:
            console = table_console(args.width)
            return watch(lambda: status_frame(args, console), args.watch, console)
        status = gather(args)
    except BrokenPipeError:
        raise  # the reader went away: main() says so (141)
    except (ValueError, OSError, LedgerError) as exc:
        print(f"sglfleet status: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(as_json(status))
    else:
        render(status, table_console(args.width))
    if status.ledger_missing:
        print(f"sglfleet status: warning: no ledger at {status.ledger_path} (--ledger)", file=sys.stderr)
    return exit_code(status)


def _gpu_facts(nvidia_smi: str, indices: list[int]) -> tuple[GpuFacts | None, list[str]]:
    """GPU facts for the memory columns: the GPUs that answer, and what nvidia-smi said about the others
    (an instance whose GPU is not listed is named in the table)."""
    if not nvidia_smi:
        return None, []
    from sglfleet.fleet import query_gpus_tolerant

    facts, errors = query_gpus_tolerant(nvidia_smi, indices)
    for error in errors:
        print(f"sglfleet status: warning: nvidia-smi: {error}", file=sys.stderr)
    return facts, errors
