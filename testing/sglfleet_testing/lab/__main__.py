"""python -m sglfleet_testing.lab up|down|status (and serve, what the daemon runs)."""

from __future__ import annotations

import argparse
import sys

from .container import LxcError
from .service import LabError, down, serve, status, up
from .settings import LabSettings
from .template import TemplateError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglfleet_testing.lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="bring the lab up (a no-op when it is up)")
    down_parser = sub.add_parser("down", help="remove every container, process and file the lab made")
    down_parser.add_argument(
        "--keep-template",
        action="store_true",
        help="keep the cached template (the next `up` skips the debootstrap)",
    )
    sub.add_parser("status", help="say what of the lab runs; exit 0 when it is up, 3 when it is not")
    sub.add_parser("serve", help="run the PVE bridge in the foreground (what `up` starts as a daemon)")
    args = parser.parse_args(argv)
    settings = LabSettings()
    try:
        if args.command == "up":
            up(settings)
        elif args.command == "down":
            down(settings, keep_template=args.keep_template)
        elif args.command == "status":
            state = status(settings)
            print("\n".join(state.lines()))
            return 0 if state.up else 3
        else:
            serve(settings)
    except (LabError, LxcError, TemplateError) as e:
        print(f"lab {args.command}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
