"""What a module run pays for at start-up: each Ansible module imports the one submodule it drives, and
that import leaves out the HTTP stack, rich and numpy unless the submodule needs them (sglfleet._lazy)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("aiohttp", "httpx", "rich", "numpy")


def imported_after(statement: str) -> set[str]:
    probe = f"import sys\n{statement}\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return {name.split(".")[0] for name in out.split()} | set(out.split())


@pytest.mark.parametrize(
    "statement",
    [
        "import sglfleet.fleet, sglfleet.gen, sglfleet.pve, sglfleet.data",
        "from sglfleet.fleet import _ledger",  # fleet_ledger
        "from sglfleet.fleet import _gpus",  # gpu_facts
        "from sglfleet.fleet import _training",  # training_jobs
        "from sglfleet.fleet import _gpus, _instances_observe, _instances_plan",  # sglang_instances
        "from sglfleet.data import merge",  # merge runs without numpy
    ],
)
def test_a_module_imports_only_what_it_uses(statement: str) -> None:
    heavy = set(HEAVY) & imported_after(statement)
    assert not heavy, f"{statement!r} loaded {sorted(heavy)}"


def test_the_probe_sees_a_heavy_import() -> None:
    assert "aiohttp" in imported_after("from sglfleet.fleet import _health")


def test_a_public_name_still_resolves_to_its_submodule() -> None:
    from sglfleet import fleet, pve
    from sglfleet.fleet import _gpus

    assert fleet.query_gpus is _gpus.query
    assert all(getattr(fleet, name) is not None for name in fleet.__all__)
    assert all(getattr(pve, name) is not None for name in pve.__all__)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        _ = fleet.nope
