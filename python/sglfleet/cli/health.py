"""`sglfleet health`: probe every SGLang instance at once; exit 0 only when all are healthy."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rich.console import Console

from sglfleet.fleet import _health as health
from sglfleet.fleet._status import FleetStatus, instance_table, join_gpu_memory

API_KEY_ENV = "SGLFLEET_API_KEY"


def add_endpoint_args(parser: argparse.ArgumentParser, *, count_required: bool) -> None:
    """The flags that say which instances to probe (shared with `sglfleet status`)."""
    group = parser.add_argument_group("instances (--url ..., or --host/--port-base/--count)")
    group.add_argument("--url", action="append", default=[], help="base URL of an instance (repeatable)")
    group.add_argument(
        "--host", default="127.0.0.1", help="host of instances 0..COUNT-1 (default: %(default)s)"
    )
    group.add_argument(
        "--port-base", type=int, default=30000, help="port of instance 0 (default: %(default)s)"
    )
    count_help = "number of instances; instance i listens on PORT_BASE+i and uses GPU i"
    if not count_required:
        count_help += (
            " (default: the instances the instance-*.env files in --env-dir describe, else one per GPU "
            "nvidia-smi lists)"
        )
    group.add_argument("--count", type=int, default=None, help=count_help)
    auth = parser.add_argument_group("authentication")
    auth.add_argument("--api-key-file", type=Path, help="file holding the SGLang API key")
    auth.add_argument("--api-key", help=f"the SGLang API key (prefer ${API_KEY_ENV} or --api-key-file)")
    parser.add_argument("--expected-model", help="fail instances that do not serve this model")
    parser.add_argument("--timeout", type=float, default=health.DEFAULT_TIMEOUT_S, help="seconds per probe")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def api_key_from_args(args: argparse.Namespace) -> str | None:
    if args.api_key:
        return args.api_key
    if args.api_key_file:
        try:
            return args.api_key_file.read_text().strip() or None
        except OSError as exc:
            raise ValueError(f"--api-key-file {args.api_key_file}: {exc.strerror or exc}") from None
    return os.environ.get(API_KEY_ENV) or None


def endpoints_from_args(args: argparse.Namespace, default_count: int | None = None) -> list[health.Endpoint]:
    if args.url and args.count is not None:
        raise ValueError("give either --url or --count, not both")
    if args.url:
        return health.endpoints_from_urls(args.url)
    count = args.count if args.count is not None else default_count
    if not count:
        return []
    return health.endpoints_from_range(args.host, args.port_base, count)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "health",
        help="probe every SGLang instance concurrently",
        description="Probe /health_generate, /model_info, /v1/models and /v1/loads of every instance at "
        "once. Exit status: 0 when all are healthy, 1 when not, 2 on bad arguments.",
    )
    add_endpoint_args(parser, count_required=True)
    parser.add_argument(
        "--wait", type=float, default=0.0, help="keep probing up to this many seconds until healthy"
    )
    parser.add_argument(
        "--interval", type=float, default=health.DEFAULT_INTERVAL_S, help="seconds between probes"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        endpoints = endpoints_from_args(args)
        if not endpoints:
            raise ValueError("say which instances to probe: --url URL ... or --count N")
        fleet = health.check_fleet(
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
        console = Console()
        status = FleetStatus(ledger_path="", checklist=(), instances=join_gpu_memory(fleet.instances, None))
        console.print(f"Instances ({fleet.healthy_count}/{len(fleet.instances)} healthy)", style="bold")
        console.print(instance_table(status))
        for row in fleet.unhealthy:
            if row.detail:
                console.print(f"  {row.url}: {row.detail}", style="red")
        console.print(fleet.summary())
    return 0 if fleet.all_healthy else 1
