"""Role cuda_toolchain, run with ansible-playbook: converge, idempotence, check mode, break-and-repair.

Target: this machine with ansible_connection=local, everything under a temporary prefix (the lab
container variant is not wired yet, see README "cuda_toolchain"). This machine has its own nvcc 13.0 on
PATH; the role and these tests only ever use the tree at the prefix.
Wheels come from PyPI through pip's cache (~/.cache/pip), so only the first run on a machine downloads.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from toolchain_support import PlaybookRun, run_playbook

pytestmark = [pytest.mark.timeout(900)]

RELEASE = "13.2.2"
WHEEL = "13.2.86"
PIN_TASK = "cuda_toolchain : Install every CUDA component pinned to one release"
CUDART_TASK = "cuda_toolchain : Link lib64/libcudart.so -> libcudart.so.13"
CCCL_TASK = "cuda_toolchain : Overlay the CCCL headers at include/ (cub, cuda, nv, thrust)"
CHECKS = [
    "cuda_toolchain : Check that nvcc reports the release",
    "cuda_toolchain : Check the PTX ISA version and target",
    "cuda_toolchain : Check that ptxas assembled the kernel",
    "cuda_toolchain : Check the -cudart shared link",
    "cuda_toolchain : Check the host compile against the CCCL headers",
    "cuda_toolchain : Check the JIT-style build",
    "cuda_toolchain : Check that every component is at the release's pin",
]


class LocalTarget:
    """This machine as the target: an inventory with ansible_connection=local and temporary paths."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.prefix = base / "cuda-13.2"
        self.etc = base / "etc"
        self.ledger = base / "ledger.json"
        self.inventory = base / "hosts.ini"
        self.inventory.write_text(
            f"[fleet]\nlocalhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"
        )
        self.vars = self.write_vars("vars.yml", {})

    def write_vars(self, name: str, overrides: dict) -> Path:
        data = {
            "cuda_toolchain_prefix": str(self.prefix),
            "cuda_toolchain_env_file": str(self.etc / "cuda-toolchain.env"),
            "cuda_toolchain_profile_path": str(self.etc / "profile.d" / "cuda-toolchain.sh"),
            "cuda_toolchain_ledger_path": str(self.ledger),
            **overrides,
        }
        path = self.base / name
        path.write_text(yaml.safe_dump(data))
        return path

    def play(self, *extra: str, extra_vars: Path | None = None) -> PlaybookRun:
        return run_playbook("toolchain.yml", self.inventory, *extra, extra_vars=extra_vars or self.vars)

    def sh(self, script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, timeout=300, check=False
        )

    def cu13(self) -> Path:
        return (self.prefix / "bin").resolve().parent

    def ledger_phase(self) -> dict:
        return json.loads(self.ledger.read_text())["phases"]["toolchain"]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> LocalTarget:
    if shutil.which("g++") is None and shutil.which("apt-get") is None:
        pytest.skip("needs g++ or apt-get on this machine")
    return LocalTarget(tmp_path_factory.mktemp("toolchain"))


@pytest.fixture(scope="module")
def converged(target: LocalTarget) -> PlaybookRun:
    start = time.monotonic()
    run = target.play()
    print(f"\nfirst converge took {time.monotonic() - start:.1f} s")
    assert run.rc == 0, run.explain()
    return run


def assert_verified(run: PlaybookRun) -> None:
    for check in CHECKS:
        assert run.status(check) == ["ok"], (check, run.explain())


def test_first_run_installs_assembles_and_verifies(target: LocalTarget, converged: PlaybookRun) -> None:
    assert_verified(converged)
    assert PIN_TASK in converged.changed_tasks()
    prefix = target.prefix
    for entry in (
        "bin/nvcc",
        "bin/ptxas",
        "nvvm/bin/cicc",
        "include/cuda_runtime.h",
        "lib64/libcudart.so.13",
    ):
        assert (prefix / entry).exists(), entry
    assert (prefix / "lib64/libcudart.so").readlink() == Path("libcudart.so.13")
    for overlay in ("cuda/std/cstdint", "cub/cub.cuh", "thrust/version.h", "nv/target"):
        assert (prefix / "include" / overlay).is_file(), overlay
    assert "V13.2.86" in target.sh(f"{prefix}/bin/nvcc --version").stdout
    phase = target.ledger_phase()
    assert phase["status"] == "done"
    assert phase["evidence"]["release"] == RELEASE
    assert f"nvidia-nvvm=={WHEEL}" in phase["evidence"]["wheels"]


def test_second_run_changes_nothing(target: LocalTarget, converged: PlaybookRun) -> None:
    run = target.play()
    assert run.rc == 0, run.explain()
    assert run.total("changed") == 0, run.changed_tasks()
    assert_verified(run)


def test_check_mode_on_a_converged_host_changes_nothing_and_still_verifies(
    target: LocalTarget, converged: PlaybookRun
) -> None:
    run = target.play("--check", "--diff")
    assert run.rc == 0, run.explain()
    assert run.total("changed") == 0, run.changed_tasks()
    assert_verified(run)


def test_environment_file_has_literal_values(target: LocalTarget, converged: PlaybookRun) -> None:
    env = {}
    for line in (target.etc / "cuda-toolchain.env").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    assert env["CUDA_HOME"] == str(target.prefix)
    assert env["PATH"].split(":")[0] == f"{target.prefix}/bin"
    assert env["LD_LIBRARY_PATH"] == f"{target.prefix}/lib64"
    assert not any("$" in value for value in env.values()), env  # systemd would not expand them


def test_profile_script_puts_the_tree_before_any_other_nvcc(
    target: LocalTarget, converged: PlaybookRun
) -> None:
    profile = target.etc / "profile.d" / "cuda-toolchain.sh"
    proc = target.sh(
        f"env -i PATH=/usr/local/bin:/usr/bin:/bin sh -c '. {profile}; . {profile}; "
        'command -v nvcc; nvcc --version | tail -2; echo "$PATH"; echo "$CUDA_HOME"\''
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{target.prefix}/bin/nvcc"
    assert "release 13.2, V13.2.86" in lines[1]
    assert lines[3].split(":").count(f"{target.prefix}/bin") == 1  # sourcing twice adds it once
    assert lines[4] == str(target.prefix)


def _break_cudart(target: LocalTarget) -> None:
    (target.prefix / "lib64" / "libcudart.so").unlink()


def _break_cccl(target: LocalTarget) -> None:
    for name in ("cub", "cuda", "thrust"):
        (target.prefix / "include" / name).unlink()


def _break_nvvm(target: LocalTarget) -> None:
    proc = target.sh(
        f"{target.prefix}/venv/bin/pip install --quiet --disable-pip-version-check nvidia-nvvm==13.5.37"
    )
    assert proc.returncode == 0, proc.stderr


def _cudart_ok(target: LocalTarget) -> bool:
    return (target.prefix / "lib64" / "libcudart.so").is_symlink()


def _cccl_ok(target: LocalTarget) -> bool:
    return all((target.prefix / "include" / name).is_symlink() for name in ("cub", "cuda", "thrust"))


def _nvvm_ok(target: LocalTarget) -> bool:
    proc = target.sh(f"{target.prefix}/venv/bin/python -m pip show nvidia-nvvm")
    return f"Version: {WHEEL}" in proc.stdout


BREAKS = {
    # name: (break it, is it fixed, the repairing task, what the verification-only failure must say)
    "libcudart-symlink": (
        _break_cudart,
        _cudart_ok,
        CUDART_TASK,
        ["cannot find -lcudart", f"task '{CUDART_TASK}'"],
    ),
    "cccl-overlay": (
        _break_cccl,
        _cccl_ok,
        CCCL_TASK,
        ["cuda/std/cstdint: No such file", f"task '{CCCL_TASK}'"],
    ),
    "nvvm-13.5": (
        _break_nvvm,
        _nvvm_ok,
        PIN_TASK,
        [
            "PTX version mismatch",
            "Unsupported .version 9.5; current version is '9.2'",
            f"nvidia-nvvm is 13.5.37, release {RELEASE} pins {WHEEL}",
            f"task '{PIN_TASK}'",
        ],
    ),
}


@pytest.mark.parametrize("case", list(BREAKS))
def test_broken_fix_is_named_by_verify_and_repaired_by_the_next_run(
    target: LocalTarget, converged: PlaybookRun, case: str
) -> None:
    breaker, is_fixed, repair_task, messages = BREAKS[case]
    breaker(target)

    verify = target.play("--tags", "verify")
    assert verify.rc != 0, verify.explain()
    for message in messages:
        assert message in verify.output, (message, verify.explain())
    assert target.ledger_phase()["status"] == "failed"

    check = target.play("--check", "--tags", "install,configure")
    assert check.rc == 0, check.explain()
    assert check.status(repair_task)[:1] == ["changed"], check.explain()  # check mode says it would repair
    assert not is_fixed(target), "check mode repaired the tree"

    repair = target.play()
    assert repair.rc == 0, repair.explain()
    assert repair_task in repair.changed_tasks(), repair.explain()
    assert_verified(repair)
    assert is_fixed(target)
    assert target.ledger_phase()["status"] == "done"


def test_unknown_release_fails_listing_the_known_ones_before_any_change(target: LocalTarget) -> None:
    fresh = target.base / "never-created"
    overrides = target.write_vars(
        "unknown.yml", {"cuda_toolchain_version": "13.9.9", "cuda_toolchain_prefix": str(fresh)}
    )
    run = target.play(extra_vars=overrides)
    assert run.rc != 0
    assert "cuda_toolchain_version '13.9.9' is not a known release. Known releases: 13.2.2" in run.output
    assert not fresh.exists()
