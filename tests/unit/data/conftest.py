"""Fixtures the data tools' tests share."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.paths import REPO


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    """A copy of the example mix (config, sources, existing set) that tests may try to damage."""
    shutil.copytree(REPO / "examples/mix", tmp_path / "mix")
    return tmp_path / "mix"
