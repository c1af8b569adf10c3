"""`python -m sglfleet_testing.standin --model-path M [--port P] ...`: see `cli.build_parser`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from sglfleet_testing.standin.cli import parse_config
from sglfleet_testing.standin.server import serve


def main(argv: Sequence[str] | None = None) -> int:
    return serve(parse_config(argv))


if __name__ == "__main__":
    sys.exit(main())
