"""Each role's README carries its variable table generated from meta/argument_specs.yml, never a hand copy."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from support.paths import REPO

ROOT = REPO


def _role_docs():  # scripts/ is not a package: load the generator from its file
    spec = importlib.util.spec_from_file_location("role_docs", ROOT / "scripts" / "role_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_role_readme_has_the_table_its_argument_specs_give(capsys: pytest.CaptureFixture[str]) -> None:
    assert _role_docs().main(["--check"]) == 0, capsys.readouterr().err


def test_a_changed_argument_spec_makes_the_readme_stale(tmp_path: Path) -> None:
    role_docs = _role_docs()
    readme = (ROOT / "roles" / "training_stop" / "README.md").read_text()
    table = role_docs.table(ROOT / "roles" / "training_stop")
    assert role_docs.render(readme, table) == readme
    assert "`training_stop_signal` | str | `SIGTERM` |" in table
    assert role_docs.render(readme.replace("`SIGTERM` |", "`SIGINT` |", 1), table) == readme


def test_every_role_has_a_readme() -> None:
    roles = [p.parent.parent for p in (ROOT / "roles").glob("*/meta/argument_specs.yml")]
    assert roles
    assert [r.name for r in roles if not (r / "README.md").is_file()] == []
