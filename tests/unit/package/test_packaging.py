"""Dependencies written once: the packages declare ranges (python/pyproject.toml, testing/pyproject.toml), the
lock (requirements.txt, requirements-dev.txt) pins each package exactly once, every pin satisfies the ranges
that name it, and the venv runs with the pinned versions. The package declares what it imports and imports
what it declares; its version is the CHANGELOG's."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from support.paths import REPO

import sglfleet

ROOT = REPO
PROJECTS = {"sglfleet": ROOT / "python", "sglfleet-testing": ROOT / "testing"}
# the extras `make venv` installs: -e "python[mix,hf,pve,plot]" -e "testing[lab]"
INSTALLED_EXTRAS = {"sglfleet": {"mix", "hf", "pve", "plot"}, "sglfleet-testing": {"lab"}}


def lock(path: Path = ROOT / "requirements-dev.txt") -> list[tuple[str, Requirement]]:
    """Every requirement of the lock, following -r, as (where, requirement)."""
    out: list[tuple[str, Requirement]] = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            out += lock(path.parent / line[3:].strip())
            continue
        out.append((f"{path.name}:{number}", Requirement(line)))
    return out


def pins() -> dict[str, Version]:
    return {canonicalize_name(r.name): Version(str(r.specifier).removeprefix("==")) for _, r in lock()}


def declared(project: str) -> dict[str, list[Requirement]]:
    """The project's dependencies by extra ('' for the core)."""
    meta = tomllib.loads((PROJECTS[project] / "pyproject.toml").read_text())["project"]
    groups = {"": meta.get("dependencies", []), **meta.get("optional-dependencies", {})}
    return {extra: [Requirement(r) for r in reqs] for extra, reqs in groups.items()}


def test_the_lock_pins_each_package_exactly_once() -> None:
    seen: dict[str, str] = {}
    for where, req in lock():
        name = canonicalize_name(req.name)
        assert name not in seen, f"{where}: {req.name} is already pinned at {seen[name]}"
        seen[name] = where
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"{where}: {req} is not an exact pin (==)"


def test_the_packages_declare_ranges_that_the_pins_satisfy() -> None:
    pinned = pins()
    for project in PROJECTS:
        for extra, reqs in declared(project).items():
            for req in reqs:
                name = canonicalize_name(req.name)
                assert not any(s.operator == "==" for s in req.specifier), (
                    f"{project}[{extra}]: {req} is a pin; the package declares a range, requirements.txt pins"
                )
                if extra and extra not in INSTALLED_EXTRAS[project]:
                    continue
                assert name in pinned, (
                    f"{project}[{extra}] needs {req.name}: requirements*.txt pins no version"
                )
                assert req.specifier.contains(pinned[name], prereleases=True), (
                    f"{project}[{extra}]: pin {req.name}=={pinned[name]} is outside {req.specifier}"
                )


def test_the_venv_runs_the_pinned_versions() -> None:
    for name, version in pins().items():
        assert Version(importlib.metadata.version(name)) == version, f"{name}: the venv is not at its pin"


def _third_party_imports(package: Path) -> set[str]:
    names: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != package.name}


def test_the_package_declares_what_it_imports_and_nothing_else() -> None:
    """`httpx` left the `pve` extra: nothing in sglfleet imports it."""
    distributions = importlib.metadata.packages_distributions()
    imported = {
        canonicalize_name(distributions[module][0])
        for module in _third_party_imports(ROOT / "python" / "sglfleet")
    }
    wanted = {canonicalize_name(r.name) for reqs in declared("sglfleet").values() for r in reqs}
    assert imported == wanted, (
        f"imported, not declared: {imported - wanted}; declared, unused: {wanted - imported}"
    )
    assert "httpx" not in wanted


def test_one_version_in_pyproject_the_package_and_the_changelog() -> None:
    version = tomllib.loads((ROOT / "python" / "pyproject.toml").read_text())["project"]["version"]
    assert version == sglfleet.__version__
    assert Version(version).major == 0
    changelog = (ROOT / "CHANGELOG.md").read_text()
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", changelog, re.M)
    assert released and released[0] == version, (
        f"CHANGELOG.md's latest release {released[:1]} is not {version}"
    )
    assert changelog.index("## [Unreleased]") < changelog.index(f"## [{version}]")
