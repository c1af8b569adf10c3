"""The `sglfleet` command: a thin layer of argument parsing over the package's functions.

Each subcommand lives in its own module under `sglfleet.cli` and exposes
`register(subparsers) -> None`, which adds its parser and sets `func` to a
callable taking the parsed namespace and returning the exit code.

Only the chosen subcommand's module is imported (the others are listed from `HELP`), and a module
imports the package's heavy parts (aiohttp, rich, pydantic, numpy) inside its `run`, not at the top:
`sglfleet --help` and `sglfleet SUBCOMMAND --help` start in a tenth of the time.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence

from sglfleet import __version__

# Each subcommand's one-line help, in the order `sglfleet --help` lists them (each module's parser
# takes its help from here: listing them imports none of the modules).
HELP: dict[str, str] = {
    "health": "probe every SGLang instance concurrently",
    "status": "print the phase checklist and the instance table",
    "mix": "build a deduplicated prompt mix from several sources (OpenAI Batch JSONL + report)",
    "generate": "run a resumable, exactly-once batch-generation job across the fleet",
    "job": "watch a generation job (sglfleet job status|report OUT)",
    "merge": "merge generation results into the training set (conversation JSONL + report)",
}
SUBCOMMANDS: tuple[str, ...] = tuple(HELP)


def chosen_subcommand(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` names (its first word that is not an option), None when it names none."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in HELP else None
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with `argv`, only the subcommand it names is imported and registered in full (the
    others are listed by name and help); without, all of them."""
    parser = argparse.ArgumentParser(
        prog="sglfleet",
        description="SGLang fleet tooling: health, status, prompt mix, generation, merge.",
    )
    parser.add_argument("--version", action="version", version=f"sglfleet {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = None if argv is None else chosen_subcommand(argv)
    for name in SUBCOMMANDS:
        if argv is None or name == chosen:
            importlib.import_module(f"sglfleet.cli.{name}").register(subparsers)
        else:
            subparsers.add_parser(name, help=HELP[name])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # First of all, before the subcommands are imported (a few hundred milliseconds): SIGTERM ends
    # the command the way SIGINT does (KeyboardInterrupt, exit 130) until a command installs its own
    # handlers, so that `sglfleet generate` stopped at any moment exits 130 having sent nothing.
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        given = list(sys.argv[1:] if argv is None else argv)
        parser = build_parser(given)
        args = parser.parse_args(given)
        args.argv = given  # as given (what a "next:" line repeats)
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return 2
        code = int(args.func(args))
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
        return code
    except KeyboardInterrupt:
        print("sglfleet: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _reader_gone()
    finally:
        if previous is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _reader_gone() -> int:
    """Whoever read our output went away (`sglfleet job status OUT | head -1`): no traceback. As the
    Python docs advise (library/signal, "Note on SIGPIPE"), stdout goes to /dev/null so that the
    interpreter's last flush does not fail again; the exit status is a shell's for a SIGPIPE death."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


def run() -> None:
    """The program's entry point (`sglfleet`, `python -m sglfleet`): main()'s code as the exit status."""
    code = main()
    if code == 130:
        # A KeyboardInterrupt that passed through source run by exec() (dataclasses builds methods that
        # way while a module imports) sets CPython's "unhandled interrupt" flag even though main() caught
        # it, and the interpreter then ends by re-raising SIGINT (status -2) instead of 130.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(code)


if __name__ == "__main__":
    run()
