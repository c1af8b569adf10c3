"""`sglfleet health`: probe every SGLang instance at once; exit 0 only when all are healthy."""

from __future__ import annotations

import argparse
import json
import sys

from sglfleet.cli import HELP

# shared with `sglfleet status` and `sglfleet generate`; kept importable from here
from sglfleet.cli._common import (
    API_KEY_ENV,
    add_endpoint_args,
    api_key_from_args,
    endpoints_from_args,
    non_negative_float,
    positive_float,
    table_console,
)
from sglfleet.fleet import HEALTH_INTERVAL_S

__all__ = ["API_KEY_ENV", "add_endpoint_args", "api_key_from_args", "endpoints_from_args", "register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "health",
        help=HELP["health"],
        description="Probe /health_generate, /model_info, /v1/models and /v1/loads of every instance at "
        "once. Exit status: 0 when all are healthy, 1 when not, 2 on bad arguments.",
    )
    add_endpoint_args(parser, count_required=True)
    parser.add_argument(
        "--wait",
        type=non_negative_float,
        default=0.0,
        help="keep probing up to this many seconds until healthy (default: %(default)s)",
    )
    parser.add_argument(
        "--interval",
        type=positive_float,
        default=HEALTH_INTERVAL_S,
        help="seconds between probes (default: %(default)s)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sglfleet.fleet import FleetStatus, check_fleet, instance_table, join_gpu_memory

    try:
        endpoints = endpoints_from_args(args)
        if not endpoints:
            raise ValueError("say which instances to probe: -e URL ... or --count N")
        fleet = check_fleet(
            endpoints,
            api_key=api_key_from_args(args),
            expected_model=args.expected_model,
            timeout=args.timeout,
            wait=args.wait,
            interval=args.interval,
        )
    except ValueError as exc:
        print(f"sglfleet health: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**fleet.model_dump(mode="json"), "summary": fleet.summary()}, indent=2))
    else:
        console = table_console()
        status = FleetStatus(ledger_path="", checklist=(), instances=join_gpu_memory(fleet.instances, None))
        console.print(f"Instances ({fleet.healthy_count}/{len(fleet.instances)} healthy)", style="bold")
        console.print(instance_table(status))
        for row in fleet.unhealthy:
            if row.detail:
                console.print(f"  {row.url}: {row.detail}", style="red")
        console.print(fleet.summary())
    return 0 if fleet.all_healthy else 1
