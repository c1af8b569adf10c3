"""`sglfleet generate`: run a batch-generation job across the fleet, resumable, exactly once."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from sglfleet.argtypes import positive_float
from sglfleet.cli import HELP
from sglfleet.cli._common import API_KEY_ENV, add_api_key_args, api_key_from_args
from sglfleet.exitcodes import ExitCode
from sglfleet.gen import job_settings  # the settings model only: the engine is imported by _main

EPILOG = f"""\
exit codes (the scheme of mix, merge and generate: docs/exit-codes.md); the last line of a run that
did not end with 0 or 2 names the command to run next:
  0 every request has its result       3 done, with permanent failures (OUT.errors.jsonl)
  2 bad input or arguments, nothing sent
  4 401/403: the API key is wrong or missing ({API_KEY_ENV}, --api-key-file)
  5 no endpoint answers                6 the input changed since it was validated (--force goes on)
  7 no space left on the output's disk 1 other fatal error      130 interrupted
Watch a running job from another shell: sglfleet job status OUT."""


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "generate",
        help=HELP["generate"],
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_job_arguments(p)
    p.add_argument("--endpoints-file", type=Path, help="one endpoint URL a line (# comments)")
    p.add_argument(
        "--log-interval",
        type=positive_float,
        default=10.0,
        help="seconds between log lines off a terminal (10)",
    )
    add_api_key_args(p)
    p.set_defaults(func=main)


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """One argument per setting of the job (:mod:`sglfleet.gen._config`), its dest the setting's name;
    the API key's flags are :func:`add_api_key_args`'s (the key has three sources)."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for s in job_settings():
        if s.secret:
            continue
        where: Any = parser
        if s.group is not None:
            where = groups.get(s.group) or groups.setdefault(s.group, parser.add_argument_group(s.group))
        flags = s.flags or (s.flag,)
        if s.kind == "bool":
            where.add_argument(*flags, dest=s.name, action="store_true", help=s.help_text)
            continue
        kw: dict[str, Any] = {"dest": s.name, "help": s.help_text, "metavar": s.metavar}
        if s.kind == "list":
            kw.update(action="append", default=[])
        else:
            kw.update(type=s.parse, default=s.default, choices=s.choices, required=s.required)
        where.add_argument(*flags, **kw)


def _endpoints(args: argparse.Namespace) -> list[str]:
    urls = list(args.endpoints)
    if args.endpoints_file:
        for raw in args.endpoints_file.read_text().splitlines():
            url = raw.split("#", 1)[0].strip()
            if url:
                urls.append(url)
    return urls


def main(args: argparse.Namespace) -> int:
    try:
        return _main(args)
    except KeyboardInterrupt:  # before the engine's own handlers are in place: nothing was sent
        print("sglfleet generate: interrupted before anything was sent; rerun it", file=sys.stderr)
        return ExitCode.INTERRUPTED


def _main(args: argparse.Namespace) -> int:
    from sglfleet.gen import job_config, reporter_for, run

    try:
        endpoints = _endpoints(args)
    except OSError as exc:
        print(f"sglfleet generate: cannot read --endpoints-file: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    try:
        api_key = api_key_from_args(args)
    except ValueError as exc:
        print(f"sglfleet generate: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    config = job_config(args, endpoints=endpoints, api_key=api_key)
    outcome = run(config, reporter_for(sys.stdout, args.log_interval))
    for err in outcome.input_errors:
        print(f"{args.input}:{err.line}: {err.reason}", file=sys.stderr)
    stream = sys.stdout if outcome.exit_code == ExitCode.OK else sys.stderr
    print(f"sglfleet generate: {outcome.message}", file=stream)
    if outcome.manifest is not None:
        m = outcome.manifest
        print(
            f"  {m.counts.done}/{m.counts.total} done, {m.counts.failed} failed, "
            f"{m.tokens.completion} output tokens, {m.throughput.requests_per_s:.1f} req/s, "
            f"{m.throughput.output_tokens_per_s:,.0f} out tok/s this run",
            file=stream,
        )
    if outcome.next is not None:
        print(f"next: {next_command(getattr(args, 'argv', None), outcome.next)}", file=stream)
    return int(outcome.exit_code)


def next_command(argv: list[str] | None, step: str) -> str:
    """The command to run next, as a shell line: this one again ("rerun"), or with --force ("force").
    A key given with --api-key is left out (it would land in logs): give it the way you did."""
    argv = list(sys.argv[1:] if argv is None else argv)
    shown: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--api-key":
            skip = True
            continue
        if arg.startswith("--api-key="):
            continue
        shown.append(arg)
    if step == "force" and "--force" not in shown:
        shown.append("--force")
    line = shlex.join(["sglfleet", *shown])
    if any(a == "--api-key" or a.startswith("--api-key=") for a in argv):
        line += f"  # with the API key as before (better: ${API_KEY_ENV} or --api-key-file)"
    return line
