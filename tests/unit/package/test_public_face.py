"""The package's public face is what its users use: outside `python/sglfleet`, code imports a subpackage's
public names (`from sglfleet.gen import run`), never its private modules (`sglfleet.gen._engine`), so that
the package can rearrange its modules without breaking the Ansible modules, the CLI, the benches or tests.
Inside the package the same holds between siblings: `sglfleet.fleet` reads the host through
`sglfleet.host`'s face, not through `sglfleet.host._systemd`. Each private module names what it offers in
`__all__`, and its subpackage's face (the `if TYPE_CHECKING:` block `sglfleet._lazy.attach` reads)
re-exports exactly that."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support.paths import REPO

from sglfleet._lazy import declared

# Every consumer of the package. The CLI lives inside the package but is a user of the others.
CONSUMERS = ("library", "module_utils", "bench", "tests", "testing", "scripts", "python/sglfleet/cli")

# White-box tests of one private module's internals (and one bench that times them), each with the reason
# its private names stay private. Keep this list short: a name a user could need belongs on the face.
EXCEPTIONS = {
    "bench/bench_generate.py": {"sglfleet.gen._client", "sglfleet.gen._manifest"},  # times the HTTP client
    "tests/unit/data/test_dedupe.py": {"sglfleet.data._dedupe"},  # the MinHash signer, its block sizes
    "tests/unit/data/test_merge_cache.py": {"sglfleet.data._merge"},  # chunking and the block copy
    "tests/unit/gen/test_store.py": {"sglfleet.gen._ids"},  # the id set
    "tests/unit/gen/test_generate_prefix.py": {"sglfleet.gen._affinity", "sglfleet.gen._dispatch"},
    "tests/unit/gen/test_generate_small_fixes.py": {"sglfleet.gen._dispatch"},  # the stall check's clock
    "tests/unit/gen/test_generate_overdue.py": {  # the pool and one request's runner on a fake clock
        "sglfleet.gen._client",
        "sglfleet.gen._dispatch",
        "sglfleet.gen._formats",
        "sglfleet.gen._progress",
        "sglfleet.gen._requests",
    },
    "tests/unit/gen/test_generation_job.py": {"sglfleet.gen._unit"},  # the unit's observation and decision
    "tests/unit/gen/test_pool_release.py": {"sglfleet.gen._dispatch"},  # what a release says, on the pool
    # a live frame drawn from hand-made counters, at several terminal widths
    "tests/unit/gen/test_progress_width.py": {"sglfleet.gen._dispatch", "sglfleet.gen._progress"},
    "tests/unit/fleet/test_instances.py": {  # the layout's steps, the observation and the plan
        "sglfleet.fleet._backend",
        "sglfleet.fleet._instances",
        "sglfleet.fleet._instances_observe",
        "sglfleet.fleet._instances_plan",
    },
    "tests/unit/fleet/test_backend.py": {"sglfleet.fleet._backend"},  # the table's steps: capability, refusal
    "tests/unit/data/test_mix_stages.py": {  # each stage of the mix pipeline on its own
        "sglfleet.data._mix",
        "sglfleet.data._mixconfig",
        "sglfleet.data._report",
    },
    "tests/unit/host/test_procfs.py": {"sglfleet.host._procfs"},  # the /proc readers on their own
    "tests/unit/host/test_systemd.py": {"sglfleet.host._systemd"},  # the EnvironmentFile= parser's states
    "tests/unit/doctor/test_doctor.py": {"sglfleet.doctor._probe"},  # the probe is a script run by path
    "tests/unit/package/test_public_face.py": {"sglfleet._lazy"},  # reads each face as attach reads it
}


def _is_private(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "sglfleet" and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])


def private_imports(path: Path) -> set[str]:
    """The private sglfleet modules in `path`: `import a._b`, `from a._b import x`, `from a import _b`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if _is_private(alias.name)}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if _is_private(node.module):
                found.add(node.module)
            elif node.module.startswith("sglfleet"):
                found |= {
                    f"{node.module}.{a.name}" for a in node.names if _is_private(f"{node.module}.{a.name}")
                }
    return found


def _consumer_files() -> list[Path]:
    files: list[Path] = []
    for top in CONSUMERS:
        files += [p for p in sorted((REPO / top).rglob("*.py")) if ".venv" not in p.parts]
    return files


def test_no_consumer_imports_a_private_module() -> None:
    offenders = []
    for path in _consumer_files():
        rel = path.relative_to(REPO).as_posix()
        # the CLI's own helpers are the CLI's: sglfleet.cli._common is private to sglfleet.cli
        extra = {m for m in private_imports(path) if not m.startswith("sglfleet.cli.")} - EXCEPTIONS.get(
            rel, set()
        )
        offenders += [f"{rel}: {m}" for m in sorted(extra)]
    assert not offenders, "import the public names instead:\n" + "\n".join(offenders)


def test_every_exception_is_still_needed() -> None:
    stale = [
        f"{rel}: {sorted(mods - private_imports(REPO / rel))}"
        for rel, mods in EXCEPTIONS.items()
        if not (REPO / rel).exists() or mods - private_imports(REPO / rel)
    ]
    assert not stale, f"drop these from EXCEPTIONS: {stale}"


def test_the_scan_sees_each_form_of_a_private_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sglfleet.fleet._gpus\nfrom sglfleet.gen._engine import run\n"
        "from sglfleet.data import _merge, merge\nfrom sglfleet.fleet import query_gpus\n"
        "from . import _local\n"
    )
    assert private_imports(probe) == {"sglfleet.fleet._gpus", "sglfleet.gen._engine", "sglfleet.data._merge"}


PACKAGE = REPO / "python" / "sglfleet"

# Imports of a sibling's private module that another branch removes; each with the reason it stays.
SIBLING_EXCEPTIONS: dict[str, set[str]] = {}


def _owner(module: str) -> str:
    """The package (or module) a private module belongs to: the dotted path before its first private part."""
    parts = module.split(".")
    first = next(i for i, p in enumerate(parts) if i and p.startswith("_") and not p.startswith("__"))
    return ".".join(parts[:first])


def _package_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1])


def _faces() -> list[Path]:
    """The subpackages with a public face (an `__init__` that ends with `sglfleet._lazy.attach`)."""
    return [p for p in sorted(PACKAGE.glob("*/__init__.py")) if "attach(__name__, __file__)" in p.read_text()]


def test_no_module_imports_a_sibling_subpackages_private_module() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        package = _package_of(path)
        for module in sorted(private_imports(path) - SIBLING_EXCEPTIONS.get(rel, set())):
            owner = _owner(module)
            # its own package's private modules, or the root package's helpers (sglfleet._lazy)
            if not (package == owner or package.startswith(owner + ".")):
                offenders.append(f"{rel}: {module}")
    assert not offenders, "import the sibling's public names (its face) instead:\n" + "\n".join(offenders)


def test_every_sibling_exception_is_still_needed() -> None:
    stale = [
        f"{rel}: {sorted(mods - private_imports(REPO / rel))}"
        for rel, mods in SIBLING_EXCEPTIONS.items()
        if not (REPO / rel).exists() or mods - private_imports(REPO / rel)
    ]
    assert not stale, f"drop these from SIBLING_EXCEPTIONS: {stale}"


def _module_all(path: Path) -> list[str] | None:
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        target = node.target if isinstance(node, ast.AnnAssign) else target
        if isinstance(target, ast.Name) and target.id == "__all__" and node.value is not None:
            return list(ast.literal_eval(node.value))
    return None


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


@pytest.mark.parametrize("init", _faces(), ids=lambda p: p.parent.name)
def test_each_private_module_declares_all_and_its_face_reexports_exactly_that(init: Path) -> None:
    package = f"sglfleet.{init.parent.name}"
    exported: dict[str, set[str]] = {}
    for module, name in declared(package, str(init)).values():
        exported.setdefault(module, set()).add(name)
    problems = []
    modules = sorted(init.parent.glob("_*.py"))
    for path in (p for p in modules if p.name != "__init__.py"):
        module = f"{package}.{path.stem}"
        names = _module_all(path)
        if names is None:
            problems.append(
                f"{module}: no __all__ (write `__all__: list[str] = []` when the face takes nothing)"
            )
            continue
        if len(set(names)) != len(names):
            problems.append(f"{module}: __all__ names a name twice")
        if missing := sorted(set(names) - _top_level_names(path)):
            problems.append(f"{module}: __all__ names what the module does not define: {missing}")
        face = exported.pop(module, set())
        if set(names) != face:
            problems.append(
                f"{module}: __all__ {sorted(names)} but {package}'s face takes {sorted(face)} "
                f"(only in __all__: {sorted(set(names) - face)}; "
                f"only on the face: {sorted(face - set(names))})"
            )
    problems += [
        f"{package}'s face imports {m}, which is not a private module of it" for m in sorted(exported)
    ]
    assert not problems, "\n".join(problems)
