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
        "import sglfleet.fleet, sglfleet.gen, sglfleet.pve, sglfleet.data, sglfleet.doctor",
        "from sglfleet.fleet import LedgerError, load_ledger, record_phase, remove_phase",  # fleet_ledger
        "from sglfleet.fleet import GpuFacts, GpuQueryError, find_nvidia_smi, query_gpus",  # gpu_facts
        "from sglfleet.fleet import PatternError, discover, still_alive",  # training_jobs
        "from sglfleet.fleet import FleetSpec, GpuInventory, observe, plan, problems, write_env_files",
        "from sglfleet.gen import JobSpec, decide_job, job_verdict, observe_job, wait_job",  # generation_job
        "from sglfleet.doctor import HostExpect, blockers, check_host, render",  # sglfleet_doctor
        "from sglfleet.fleet import BackendError, decide_backend, observe_torch_cuda",  # sglang_backend
        "from sglfleet.fleet import EndpointError, endpoints_from_ledgers",  # fleet_endpoints
        "from sglfleet.host import parse_env_file",  # sglang_backend
        "from sglfleet.toolchain import ToolchainFacts, toolchain_verdicts",  # toolchain_verdict
        "from sglfleet.doctor import char_majors, node_table",  # device_nodes
        "from sglfleet.data import merge",  # merge runs without numpy
    ],
)
def test_a_module_imports_only_what_it_uses(statement: str) -> None:
    heavy = set(HEAVY) & imported_after(statement)
    assert not heavy, f"{statement!r} loaded {sorted(heavy)}"


def test_the_probe_sees_a_heavy_import() -> None:
    assert "aiohttp" in imported_after("from sglfleet.fleet import check_fleet")


def test_a_public_name_still_resolves_to_its_submodule() -> None:
    import importlib

    from sglfleet import data, doctor, fleet, gen, pve

    # the face's name is the submodule's object, under the name the face gives it
    assert fleet.query_gpus is importlib.import_module("sglfleet.fleet._gpus").query
    assert "query_gpus" in dir(fleet) and "query" not in fleet.__all__
    assert all(getattr(fleet, name) is not None for name in fleet.__all__)
    for package in (data, doctor, gen, pve):
        assert all(getattr(package, name) is not None for name in package.__all__), package.__name__
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        _ = fleet.nope
