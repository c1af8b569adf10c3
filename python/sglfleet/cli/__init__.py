"""The `sglfleet` command: a thin layer of argument parsing over the package's functions.

Each subcommand lives in its own module under `sglfleet.cli` and exposes
`register(subparsers) -> None`, which adds its parser and sets `func` to a
callable taking the parsed namespace and returning the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence

from sglfleet import __version__

# Order is the order `sglfleet --help` lists them in.
SUBCOMMANDS: tuple[str, ...] = ("health", "status", "mix", "generate", "job", "merge")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglfleet",
        description="SGLang fleet tooling: health, status, prompt mix, generation, merge.",
    )
    parser.add_argument("--version", action="version", version=f"sglfleet {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"sglfleet.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # First of all, before the subcommands are imported (a few hundred milliseconds): SIGTERM ends
    # the command the way SIGINT does (KeyboardInterrupt, exit 130) until a command installs its own
    # handlers, so that `sglfleet generate` stopped at any moment exits 130 having sent nothing.
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)  # as given (what a "next:" line repeats)
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
