"""Arguments that several subcommands share: which instances, and the API key.

The key is read, first match wins, from ``--api-key`` (on the command line, visible in ``ps``:
prefer the others), ``--api-key-file FILE`` or ``$SGLFLEET_API_KEY``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

# the subcommands import them from here too; they live in sglfleet.argtypes (the settings models use them)
from sglfleet.argtypes import finite_float, non_negative_float, positive_float  # noqa: F401
from sglfleet.fleet import HEALTH_TIMEOUT_S

if TYPE_CHECKING:  # imported where used: `--help` loads neither rich nor the HTTP client
    from rich.console import Console

    from sglfleet.fleet import Endpoint

API_KEY_ENV = "SGLFLEET_API_KEY"
# Off a terminal (a pipe, a log, Ansible's register) no column is cut: the table is as wide as its content.
UNBOUNDED_WIDTH = 100_000


def table_console(width: int | None = None) -> Console:
    """The console tables print to: `width` columns when given; else the terminal's width on a terminal,
    and no limit off one (rich would assume 80 columns and cut cells to `350…`)."""
    from rich.console import Console

    if width:
        return Console(width=width)
    console = Console()
    if not console.is_terminal:
        console = Console(width=UNBOUNDED_WIDTH)
    return console


def add_api_key_args(parser: argparse.ArgumentParser) -> None:
    auth = parser.add_argument_group("authentication")
    auth.add_argument(
        "--api-key-file", type=Path, help=f"file holding the SGLang API key (else ${API_KEY_ENV})"
    )
    auth.add_argument(
        "--api-key",
        help=f"the SGLang API key (visible to other users in ps: prefer ${API_KEY_ENV} or --api-key-file)",
    )


def api_key_from_args(args: argparse.Namespace) -> str | None:
    """The key from --api-key, --api-key-file or $SGLFLEET_API_KEY; ValueError naming a bad file or a
    key that cannot go into an HTTP header (a line break or another control character in it)."""
    if args.api_key:
        return _checked(args.api_key, "--api-key")
    if args.api_key_file:
        try:
            key = args.api_key_file.read_text().strip() or None
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise ValueError(f"--api-key-file {args.api_key_file}: {why or exc}") from None
        return _checked(key, f"--api-key-file {args.api_key_file}") if key else None
    key = os.environ.get(API_KEY_ENV) or None
    return _checked(key, f"${API_KEY_ENV}") if key else None


def _checked(key: str, where: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise ValueError(
            f"{where}: the key holds a line break or another control character (a key is one line)"
        )
    return key


def add_endpoint_args(parser: argparse.ArgumentParser, *, count_required: bool) -> None:
    """The flags that say which instances to probe (`sglfleet health`, `sglfleet status`)."""
    group = parser.add_argument_group("instances (-e URL ..., or --host/--port-base/--count)")
    group.add_argument(
        "-e",
        "--endpoint",
        "--url",
        dest="url",
        action="append",
        default=[],
        metavar="URL",
        help="base URL of an instance, e.g. http://10.0.0.5:30000; repeat (--url: the old name)",
    )
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
    add_api_key_args(parser)
    parser.add_argument("--expected-model", help="fail instances that do not serve this model")
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=HEALTH_TIMEOUT_S,
        help="seconds per probe (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def endpoints_from_args(args: argparse.Namespace, default_count: int | None = None) -> list[Endpoint]:
    from sglfleet.fleet import endpoints_from_range, endpoints_from_urls

    if args.url and args.count is not None:
        raise ValueError("give either -e/--endpoint or --count, not both")
    if args.url:
        return endpoints_from_urls(args.url)
    count = args.count if args.count is not None else default_count
    if not count:
        return []
    return endpoints_from_range(args.host, args.port_base, count)
