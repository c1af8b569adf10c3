import signal
import sys

# SIGTERM before the engine installs its own handlers (imports take a while): end like SIGINT does,
# so that `sglfleet generate` exits 130 from its first millisecond, having sent nothing.
signal.signal(signal.SIGTERM, signal.default_int_handler)

try:
    from sglfleet.cli import main

    sys.exit(main())
except KeyboardInterrupt:
    print("sglfleet: interrupted", file=sys.stderr)
    sys.exit(130)
