"""Role sglang with ansible-playbook, as the lab runs it (sglang_install_engine: false): the sglfleet
stand-in in the venv, the SM120 fixes in the EnvironmentFile, verified; the wheel reinstalled only when
its content changes, the CCCL override against real 13.0 runtime headers, the attention backend table,
refused overrides. (Idempotence and check mode on the converged role: test_site's site.yml re-runs.)

Target: the lab's CT 200 (default) or this machine (SGLFLEET_ROLE_TESTS_TARGET=local); see toolchain_support.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from support.ansible_lab import ROOT, PlaybookRun, Target

pytestmark = [pytest.mark.timeout(1800)]

PLAYBOOK = "sglang.yml"
FIX_TASKS = [
    "sglang : SM120 fix: CUDA_HOME = the CUDA toolchain tree for JIT builds",
    "sglang : SM120 fix: PATH with the venv and the toolchain's bin/ (literal)",
    "sglang : SM120 fix: FLASHINFER_CUDA_ARCH_LIST and TORCH_CUDA_ARCH_LIST"
    " from the GPUs' compute capability",
    "sglang : SM120 fix: TRITON_PTXAS_PATH = the toolchain's ptxas",
    "sglang : SM120 fix: CCCL compatibility override"
    " when torch's CUDA runtime and the toolchain differ in minor version",
]
CCCL_TASK = FIX_TASKS[-1]
CHECKS = [
    "sglang : Check that every value is literal and every fix is there",
    "sglang : Check that CUDA_HOME is the CUDA toolchain release",
    "sglang : Check that Triton's ptxas assembles for the GPUs",
    "sglang : Check that the stand-in is installed in the venv",
]


@pytest.fixture(scope="module")
def target(role_target: Target) -> Target:
    # The toolchain the role needs: test_toolchain (run before) converged it there, then this re-run
    # only verifies it; run alone, this module installs it.
    run = role_target.play("toolchain.yml")
    assert run.rc == 0, run.explain()
    return role_target


@pytest.fixture(scope="module")
def converged(target: Target) -> PlaybookRun:
    start = time.monotonic()
    run = target.play(PLAYBOOK)
    print(f"\nsglang (stand-in): first converge took {time.monotonic() - start:.1f} s")
    assert run.rc == 0, run.explain()
    return run


def env_file(target: Target) -> dict[str, str]:
    env = {}
    for line in target.ok(f"cat {target.path('etc', 'sglang', 'common.env')}").splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value.strip('"')
    return env


def test_first_run_installs_the_standin_and_writes_every_fix(target: Target, converged: PlaybookRun) -> None:
    for task in FIX_TASKS:
        assert "changed" in converged.status(task), (task, converged.explain())
    for check in CHECKS:
        assert converged.status(check) == ["ok"], (check, converged.explain())
    assert converged.status("sglang : Install torch pinned (from the torch CUDA index)") == ["skipping"]
    env = env_file(target)
    venv = target.path("sglang", "venv")
    assert env["CUDA_HOME"] == target.prefix
    assert env["PATH"].startswith(f"{venv}/bin:{target.prefix}/bin:")
    assert env["FLASHINFER_CUDA_ARCH_LIST"] == "12.0"
    assert env["TORCH_CUDA_ARCH_LIST"] == "12.0"
    assert env["TRITON_PTXAS_PATH"] == f"{target.prefix}/bin/ptxas"
    assert env["SGLANG_ATTENTION_BACKEND"] == "flashinfer"
    # torch 2.11.0 from the cu130 index runs CUDA 13.0, the toolchain is 13.2: the override is on
    assert env["NVCC_APPEND_FLAGS"] == "-DCCCL_DISABLE_CTK_COMPATIBILITY_CHECK"
    assert not any("$" in value for value in env.values()), env
    assert "usage" in target.ok(f"{venv}/bin/python -m sglfleet_testing.standin --help").lower()
    phase = target.ledger_phase("sglang")
    assert phase["status"] == "done"
    assert phase["evidence"]["attention_backend"] == "flashinfer"
    assert phase["evidence"]["engine"] == "sglfleet stand-in"


# The converged role's re-run at changed=0 and its check mode changing nothing are test_site's: site.yml's
# second run and its --check --diff run phase sglang.


def test_sglfleet_is_reinstalled_only_when_its_wheel_content_changes(
    target: Target, converged: PlaybookRun, tmp_path: Path
) -> None:
    source = tmp_path / "python"
    for tree in ("python", "testing"):
        shutil.copytree(
            ROOT / tree, tmp_path / tree, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "build")
        )
    (tmp_path / "testing" / "sglfleet_testing" / "marker_for_reinstall.py").write_text("MARK = 1\n")
    venv = target.path("sglang", "venv")
    probe = f"{venv}/bin/python -c 'import sglfleet_testing.marker_for_reinstall'"

    changed = target.play(PLAYBOOK, overrides={"sglang_sglfleet_source": str(source)})
    assert changed.rc == 0, changed.explain()
    assert set(changed.changed_tasks()) == {
        "sglfleet_runtime : Copy the wheels to the host",
        "sglfleet_runtime : Install the packages and their dependencies, then these wheels' content",
        "sglfleet_runtime : Mark what is installed",
    }, changed.changed_tasks()
    assert target.sh(probe).returncode == 0

    same = target.play(PLAYBOOK, overrides={"sglang_sglfleet_source": str(source)})
    assert same.total("changed") == 0, same.changed_tasks()

    back = target.play(PLAYBOOK)
    assert (
        "sglfleet_runtime : Install the packages and their dependencies, then these wheels' content"
        in back.changed_tasks()
    )
    assert target.sh(probe).returncode != 0


@pytest.mark.parametrize(
    ("capability", "backend"),
    [("12.0", "flashinfer"), ("10.0", "trtllm_mha"), ("9.0", "fa3"), ("8.9", "flashinfer")],
)
def test_attention_backend_follows_the_compute_capability(
    target: Target, converged: PlaybookRun, capability: str, backend: str
) -> None:
    run = target.play(
        PLAYBOOK,
        "--check",
        "--diff",
        "--tags",
        "configure",
        overrides={"sglang_compute_capability": capability},
    )
    assert run.rc == 0, run.explain()
    if backend == "flashinfer":
        assert "SGLANG_ATTENTION_BACKEND" not in "".join(run.changed_tasks())
    else:
        assert f"+SGLANG_ATTENTION_BACKEND={backend}" in run.output, run.explain()
    if capability != "12.0":
        assert f'+FLASHINFER_CUDA_ARCH_LIST="{capability}"' in run.output, run.explain()


def test_a_backend_the_gpus_refuse_fails_before_any_change(target: Target, converged: PlaybookRun) -> None:
    before = env_file(target)
    run = target.play(
        PLAYBOOK, overrides={"sglang_compute_capability": "12.0", "sglang_attention_backend": "fa3"}
    )
    assert run.rc != 0
    assert "FlashAttention v3 Backend requires SM>=80 and SM<=90" in run.output
    assert run.total("changed") == 0, run.changed_tasks()
    assert env_file(target) == before


def test_a_missing_toolchain_is_named(target: Target, converged: PlaybookRun) -> None:
    run = target.play(PLAYBOOK, overrides={"sglang_cuda_home": target.path("no-such-cuda")})
    assert run.rc != 0
    assert "Run playbooks/toolchain.yml (role cuda_toolchain) first" in run.output
    assert run.total("changed") == 0, run.changed_tasks()


def test_cccl_override_follows_the_minor_versions(target: Target, converged: PlaybookRun) -> None:
    same = target.play(PLAYBOOK, overrides={"sglang_torch_cuda_version": "13.2"})
    assert same.rc == 0, same.explain()
    assert CCCL_TASK in same.changed_tasks()
    assert "NVCC_APPEND_FLAGS" not in env_file(target)
    differ = target.play(PLAYBOOK)
    assert CCCL_TASK in differ.changed_tasks()
    assert env_file(target)["NVCC_APPEND_FLAGS"] == "-DCCCL_DISABLE_CTK_COMPATIBILITY_CHECK"


def test_cccl_override_lets_a_jit_build_use_torchs_13_0_runtime_headers(
    target: Target, converged: PlaybookRun
) -> None:
    venv = target.path("sglang", "venv")
    # What torch 2.11.0 (cu130) brings into the venv: the CUDA 13.0 runtime wheel and its headers.
    target.ok(f"{venv}/bin/pip install --quiet --disable-pip-version-check nvidia-cuda-runtime==13.0.96")
    try:
        # Claiming torch's runtime matches the toolchain leaves the override out: the real error.
        wrong = target.play(PLAYBOOK, overrides={"sglang_torch_cuda_version": "13.2"})
        assert wrong.rc != 0
        error = next(line for line in wrong.output.splitlines() if line.startswith("[ERROR]: Task failed"))
        assert "CUDA compiler and CUDA toolkit headers are incompatible" in error, wrong.explain()
        assert "the minors differ and the CCCL compatibility override is missing" in error, error
        assert f'task "{CCCL_TASK}" sets it' in error, error
        # Left to itself the role reads 13.0 from the venv's runtime wheel, sets the override, and the
        # same build passes.
        right = target.play(PLAYBOOK)
        assert right.rc == 0, right.explain()
        assert right.status("sglang : Check the build against torch's CUDA runtime headers") == ["ok"]
        assert env_file(target)["NVCC_APPEND_FLAGS"] == "-DCCCL_DISABLE_CTK_COMPATIBILITY_CHECK"
    finally:
        target.ok(f"{venv}/bin/pip uninstall --quiet --yes nvidia-cuda-runtime")
