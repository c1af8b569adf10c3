"""Where things are, for every test wherever it lives under tests/."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Captured outputs of real programs (nvidia-smi on the reference machines), read by the unit tests.
FIXTURES = REPO / "tests" / "fixtures"
