"""`make collection`: roles/, library/ and module_utils/ as the collection sglfleet.fleet, which
`ansible-galaxy collection install` accepts and whose modules and roles ansible-doc then renders
(validate-modules runs on it in `make lint`, through scripts/collection-sanity)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO

pytestmark = pytest.mark.timeout(120)

ROOT = REPO
BIN = Path(sys.executable).parent


def test_the_collection_builds_installs_and_documents_itself(tmp_path: Path) -> None:
    env = {**os.environ, "VENV_BIN": str(BIN), "ANSIBLE_COLLECTIONS_PATH": str(tmp_path)}
    built = subprocess.run(
        [str(ROOT / "scripts" / "build-collection"), "--install", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    root = tmp_path / "ansible_collections" / "sglfleet" / "fleet"
    modules = sorted(p.name for p in (root / "plugins" / "modules").glob("*.py"))
    assert modules == sorted(p.name for p in (ROOT / "library").glob("*.py"))
    assert (root / "plugins" / "module_utils" / "sglfleet_deps.py").is_file()
    for module in modules:
        text = (root / "plugins" / "modules" / module).read_text()
        assert "ansible_collections.sglfleet.fleet.plugins.module_utils.sglfleet_deps" in text, module
    for name in ("sglfleet.fleet.fleet_ledger", "sglfleet.fleet.generation_job"):
        doc = subprocess.run(
            [str(BIN / "ansible-doc"), name], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert doc.returncode == 0 and "[WARNING]" not in doc.stderr, doc.stderr
    role = subprocess.run(
        [str(BIN / "ansible-doc"), "-t", "role", "sglfleet.fleet.generate"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert role.returncode == 0 and "generate_max_failures" in role.stdout, role.stderr
