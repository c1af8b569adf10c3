"""The fleet's default settings, in a module that imports nothing: the CLI's `--help` shows them
without loading the HTTP client or pydantic (`sglfleet health --help` starts in a tenth of the time)."""

from __future__ import annotations

from pathlib import Path

# Seconds one probe of an instance may take, and between two rounds of `health --wait`.
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_INTERVAL_S = 2.0
# Where every phase records its outcome on a target.
DEFAULT_PATH = Path("/var/lib/sglfleet/ledger.json")
