"""`sglfleet job status OUT` and `sglfleet job report OUT`: where a generation job stands, from
another shell, as lines (once or `--watch`ed) or as a picture."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sglfleet.cli import HELP
from sglfleet.cli._watch import Frame, add_watch_arg, watch

STATUS_EXIT_CODES = (
    "0 complete, 3 complete with failures, 10 running, 11 stopped, interrupted, failed, or results missing "
    "or short (its output is not what the manifest summarised)"
)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("job", help=HELP["job"])
    sub = parser.add_subparsers(dest="job_command", metavar="SUBCOMMAND", required=True)
    status = sub.add_parser(
        "status",
        help="print a job's progress from its manifest",
        description="Print the progress of the `sglfleet generate` job writing OUT (from OUT.manifest.json, "
        "rewritten every few seconds while it runs): state, done/total, failures, rate, ETA, endpoints. "
        f"Exit status: {STATUS_EXIT_CODES} (rerun to resume), 2 no manifest.",
    )
    status.add_argument("output", type=Path, metavar="OUT", help="the job's --output")
    status.add_argument("--json", action="store_true", help="print JSON")
    add_watch_arg(status, "until the job is no longer running, or Ctrl-C")
    status.set_defaults(func=run_status)
    report = sub.add_parser(
        "report",
        help="draw a job's progress and throughput per endpoint over time (PNG)",
        description="Draw the progress (done, failed) and the throughput of each endpoint of the job "
        "writing OUT over time, from OUT.timeline.jsonl (a sample every few seconds while it runs), as a "
        "PNG. Works on a running job (what it has done so far) and a finished one. Needs the plot "
        "extra: pip install 'sglfleet[plot]'. Exit status: 0 drawn, 2 no timeline or bad arguments, "
        "2 the plot extra missing.",
    )
    report.add_argument("output", type=Path, metavar="OUT", help="the job's --output")
    report.add_argument(
        "-o",
        "--chart",
        type=Path,
        metavar="PNG",
        help="where to write the picture (default: OUT.report.png)",
    )
    report.set_defaults(func=run_report)


EXIT = {"complete": 0, "complete_with_failures": 3, "running": 10}


def status_frame(output: Path, as_json: bool) -> Frame:
    """What `job status` draws once: the lines (or JSON), the exit code, whether the job has stopped
    running (no further frame would differ)."""
    from rich.text import Text

    from sglfleet.gen import job_status

    st = job_status(output)
    text = json.dumps(st.as_dict(), indent=2) if as_json else "\n".join(st.lines())
    return Text(text), EXIT.get(st.state, 11), not st.running


def run_status(args: argparse.Namespace) -> int:
    from sglfleet.gen import ManifestError

    try:
        if args.watch is not None:
            from rich.console import Console

            return watch(lambda: status_frame(args.output, args.json), args.watch, Console())
        renderable, code, _ = status_frame(args.output, args.json)
    except BrokenPipeError:
        raise  # the reader went away: main() says so (141), not "job status: [Errno 32]"
    except (ManifestError, OSError, ValueError) as exc:
        print(f"sglfleet job status: {exc}", file=sys.stderr)
        return 2
    print(renderable.plain)  # outside the try: a closed pipe is main()'s (exit 141)
    return code


def run_report(args: argparse.Namespace) -> int:
    from sglfleet.gen import load_timeline

    try:
        from sglfleet.plot import job_chart
    except ImportError as exc:
        print(f"sglfleet job report: {missing_plot_extra(exc)}", file=sys.stderr)
        return 2
    chart = args.chart or args.output.with_name(args.output.name + ".report.png")
    try:
        samples = load_timeline(args.output)
        job_chart(samples, chart, title=args.output.name)
    except (OSError, ValueError) as exc:
        print(f"sglfleet job report: {exc}", file=sys.stderr)
        return 2
    print(f"report: {chart} ({len(samples)} samples)")
    return 0


def missing_plot_extra(exc: ImportError) -> str:
    missing = (exc.name or "matplotlib").split(".")[0]
    return f"{missing} is missing; install the plot extra: pip install 'sglfleet[plot]'"
