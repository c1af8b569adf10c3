"""The package's public face is what its users use: outside `python/sglfleet`, code imports a subpackage's
public names (`from sglfleet.gen import run`), never its private modules (`sglfleet.gen._engine`), so that
the package can rearrange its modules without breaking the Ansible modules, the CLI, the benches or tests."""

from __future__ import annotations

import ast
from pathlib import Path

from support.paths import REPO

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
