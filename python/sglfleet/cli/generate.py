"""`sglfleet generate`: run a batch-generation job across the fleet, resumable, exactly once."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sglfleet.gen._engine import ExitCode, GenerateConfig, run
from sglfleet.gen._formats import GenParams
from sglfleet.gen._progress import reporter_for

EPILOG = """\
exit codes: 0 every request has its result; 3 done, with permanent failures (OUT.errors.jsonl);
2 bad input or arguments (nothing sent); 130 interrupted (rerun to resume); 1 stopped (no endpoint
answered, output unwritable; rerun to resume)."""


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "generate",
        help="run a resumable, exactly-once batch-generation job across the fleet",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--input", "-i", required=True, type=Path, help="OpenAI Batch JSONL or conversation JSONL")
    p.add_argument("--output", "-o", required=True, type=Path, help="OpenAI Batch output JSONL (appended)")
    p.add_argument(
        "--endpoint",
        "-e",
        action="append",
        default=[],
        metavar="URL",
        help="e.g. http://10.0.0.5:30000; repeat",
    )
    p.add_argument("--endpoints-file", type=Path, help="one endpoint URL a line (# comments)")
    p.add_argument("--concurrency", "-c", type=int, default=32, help="requests in flight per endpoint (32)")
    p.add_argument("--model", help="model name for bodies without one")
    p.add_argument("--max-tokens", type=int, help="max_tokens for bodies without one")
    p.add_argument("--temperature", type=float, help="temperature for bodies without one")
    p.add_argument("--top-p", type=float, help="top_p for bodies without one")
    p.add_argument("--max-retries", type=int, default=5, help="retries of a request on retryable errors (5)")
    p.add_argument("--request-timeout", type=_positive_float, default=600.0, help="seconds per attempt (600)")
    p.add_argument(
        "--backoff-base", type=_positive_float, default=1.0, help="first retry delay in seconds (1)"
    )
    p.add_argument(
        "--grace", type=float, default=30.0, help="seconds in-flight requests get after SIGINT/SIGTERM (30)"
    )
    p.add_argument(
        "--down-timeout",
        type=_positive_float,
        default=600.0,
        help="give up when no endpoint answers this long (600)",
    )
    p.add_argument(
        "--log-interval",
        type=_positive_float,
        default=10.0,
        help="seconds between log lines off a terminal (10)",
    )
    p.add_argument(
        "--api-key", default=os.environ.get("SGLANG_API_KEY"), help="Bearer token (default: $SGLANG_API_KEY)"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="continue an output whose manifest has another input or parameters",
    )
    p.set_defaults(func=main)


def _endpoints(args: argparse.Namespace) -> list[str]:
    urls = list(args.endpoint)
    if args.endpoints_file:
        for raw in args.endpoints_file.read_text().splitlines():
            url = raw.split("#", 1)[0].strip()
            if url:
                urls.append(url)
    return urls


def main(args: argparse.Namespace) -> int:
    try:
        endpoints = _endpoints(args)
    except OSError as exc:
        print(f"sglfleet generate: cannot read --endpoints-file: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    config = GenerateConfig(
        input=args.input,
        output=args.output,
        endpoints=endpoints,
        concurrency=args.concurrency,
        params=GenParams(args.model, args.max_tokens, args.temperature, args.top_p),
        max_retries=args.max_retries,
        request_timeout=args.request_timeout,
        api_key=args.api_key,
        force=args.force,
        backoff_base=args.backoff_base,
        grace=args.grace,
        down_timeout=args.down_timeout,
    )
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
    return int(outcome.exit_code)
