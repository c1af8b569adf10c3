"""`sglfleet generate`: run a batch-generation job across the fleet, resumable, exactly once."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglfleet.cli import HELP
from sglfleet.cli._common import (
    API_KEY_ENV,
    add_api_key_args,
    api_key_from_args,
    finite_float,
    non_negative_float,
    positive_float,
)
from sglfleet.exitcodes import ExitCode

if TYPE_CHECKING:  # the engine (aiohttp, rich, pydantic) is imported by main(), not by `--help`
    from sglfleet.gen import GenParams

EPILOG = f"""\
exit codes (the scheme of mix, merge and generate: docs/exit-codes.md); the last line of a run that
did not end with 0 or 2 names the command to run next:
  0 every request has its result       3 done, with permanent failures (OUT.errors.jsonl)
  2 bad input or arguments, nothing sent
  4 401/403: the API key is wrong or missing ({API_KEY_ENV}, --api-key-file)
  5 no endpoint answers                6 the input changed since it was validated (--force goes on)
  7 no space left on the output's disk 1 other fatal error      130 interrupted
Watch a running job from another shell: sglfleet job status OUT."""


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text, parse_constant=_json_finite)  # NaN, Infinity: not JSON
    except (json.JSONDecodeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (0-65535; 0: any free one)")
    return value


def _json_finite(text: str) -> float:
    raise ValueError(f"{text} is not a finite number")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "generate",
        help=HELP["generate"],
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
    p.add_argument(
        "--dispatch",
        choices=("prefix", "least-loaded"),
        default="prefix",
        help="prefix (default): a request goes to the endpoint that served its longest prompt prefix "
        "last (turns of a conversation, a shared system prompt) while its load allows, else the "
        "least-loaded; least-loaded: fewest requests in flight only",
    )
    sampling = p.add_argument_group(
        "sampling (each one given is set in every request body, over the body's own value; the "
        "manifest records them)"
    )
    sampling.add_argument("--model", help="model name")
    sampling.add_argument("--max-tokens", type=int, help="max_tokens")
    sampling.add_argument("--temperature", type=finite_float, help="temperature")
    sampling.add_argument("--top-p", type=finite_float, help="top_p")
    sampling.add_argument("--top-k", type=int, help="top_k (SGLang's extra sampling field)")
    sampling.add_argument(
        "--chat-template-kwargs",
        type=_json_object,
        metavar="JSON",
        help="chat_template_kwargs, e.g. '{\"enable_thinking\": false}'",
    )
    sampling.add_argument(
        "--extra-body",
        type=_json_object,
        metavar="JSON",
        help="more body fields, e.g. '{\"min_p\": 0.05}'",
    )
    p.add_argument(
        "--turns",
        choices=("last", "all"),
        default="last",
        help="conversation input: regenerate the last assistant turn (default) or every one in order, "
        "each from the regenerated turns before it (SpecForge's regenerate_train_data.py)",
    )
    p.add_argument(
        "--keep-reasoning",
        action="store_true",
        help="write each result's conversation with the answer's reasoning_content in its assistant "
        "turn (SpecForge's --reasoning save), for chat requests of either input format; merge keeps it",
    )
    p.add_argument("--max-retries", type=int, default=5, help="retries of a request on retryable errors (5)")
    p.add_argument("--request-timeout", type=positive_float, default=600.0, help="seconds per attempt (600)")
    p.add_argument(
        "--backoff-base", type=positive_float, default=1.0, help="first retry delay in seconds (1)"
    )
    p.add_argument(
        "--grace",
        type=non_negative_float,
        default=30.0,
        help="seconds in-flight requests get after SIGINT/SIGTERM (30)",
    )
    p.add_argument(
        "--down-timeout",
        type=positive_float,
        default=600.0,
        help="give up when no endpoint answers this long (600)",
    )
    p.add_argument(
        "--start-timeout",
        type=float,
        default=120.0,
        help="seconds to wait at the start while no endpoint is ready but one says not yet: a router "
        "with no healthy worker (/readiness 503), an instance starting (120; 0: do not wait)",
    )
    p.add_argument(
        "--log-interval",
        type=positive_float,
        default=10.0,
        help="seconds between log lines off a terminal (10)",
    )
    p.add_argument(
        "--probe-timeout",
        type=positive_float,
        default=10.0,
        help="seconds the preflight waits for each endpoint's /health_generate (10)",
    )
    p.add_argument(
        "--stall-factor",
        type=positive_float,
        default=8.0,
        help="an endpoint that answers nothing for this many times its recent latency is stalled (8)",
    )
    p.add_argument(
        "--stall-min", type=positive_float, default=2.0, help="...and for at least this many seconds (2)"
    )
    p.add_argument(
        "--max-resends",
        type=int,
        default=5,
        help="times one request is sent to another endpoint because the one it waits on stalled (5)",
    )
    p.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve Prometheus metrics on BIND:PORT/metrics while the job runs (0: any free port)",
    )
    p.add_argument(
        "--metrics-bind",
        default="127.0.0.1",
        metavar="ADDR",
        help="address the metrics listen on (127.0.0.1)",
    )
    p.add_argument(
        "--metrics-linger",
        type=non_negative_float,
        default=15.0,
        metavar="S",
        help="seconds the metrics stay up after the end, with the final values and "
        "sglfleet_generate_exit_code, for the last scrape (15; a signal ends the wait)",
    )
    add_api_key_args(p)
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


def _params(args: argparse.Namespace) -> GenParams:
    from sglfleet.gen import GenParams

    extra = dict(args.extra_body or {})
    if args.top_k is not None:
        extra["top_k"] = args.top_k
    if args.chat_template_kwargs is not None:
        extra["chat_template_kwargs"] = args.chat_template_kwargs
    return GenParams(
        args.model,
        args.max_tokens,
        args.temperature,
        args.top_p,
        extra=extra,
        turns=args.turns,
        keep_reasoning=args.keep_reasoning,
    )


def main(args: argparse.Namespace) -> int:
    try:
        return _main(args)
    except KeyboardInterrupt:  # before the engine's own handlers are in place: nothing was sent
        print("sglfleet generate: interrupted before anything was sent; rerun it", file=sys.stderr)
        return ExitCode.INTERRUPTED


def _main(args: argparse.Namespace) -> int:
    from sglfleet.gen import GenerateConfig, reporter_for, run

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
    config = GenerateConfig(
        input=args.input,
        output=args.output,
        endpoints=endpoints,
        concurrency=args.concurrency,
        dispatch=args.dispatch,
        params=_params(args),
        max_retries=args.max_retries,
        request_timeout=args.request_timeout,
        api_key=api_key,
        force=args.force,
        backoff_base=args.backoff_base,
        grace=args.grace,
        down_timeout=args.down_timeout,
        start_timeout=args.start_timeout,
        probe_timeout=args.probe_timeout,
        stall_factor=args.stall_factor,
        stall_min=args.stall_min,
        max_resends=args.max_resends,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_bind,
        metrics_linger=args.metrics_linger,
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
