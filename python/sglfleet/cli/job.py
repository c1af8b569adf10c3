"""`sglfleet job status OUT`: where a generation job stands, from another shell."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sglfleet.gen import ManifestError, job_status


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("job", help="watch a generation job (sglfleet job status OUT)")
    sub = parser.add_subparsers(dest="job_command", metavar="SUBCOMMAND", required=True)
    status = sub.add_parser(
        "status",
        help="print a job's progress from its manifest",
        description="Print the progress of the `sglfleet generate` job writing OUT (from OUT.manifest.json, "
        "rewritten every few seconds while it runs): state, done/total, failures, rate, ETA, endpoints. "
        "Exit status: 0 complete, 3 complete with failures, 10 running, 11 stopped, interrupted, "
        "failed, or results missing or short (its output is not what the manifest summarised): rerun to "
        "resume, 2 no manifest.",
    )
    status.add_argument("output", type=Path, metavar="OUT", help="the job's --output")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=run_status)


EXIT = {"complete": 0, "complete_with_failures": 3, "running": 10}


def run_status(args: argparse.Namespace) -> int:
    try:
        st = job_status(args.output)
    except (ManifestError, OSError, ValueError) as exc:
        print(f"sglfleet job status: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(st.as_dict(), indent=2))
    else:
        print("\n".join(st.lines()))
    return EXIT.get(st.state, 11)
