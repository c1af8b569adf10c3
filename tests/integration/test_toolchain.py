"""Role cuda_toolchain with ansible-playbook: converge, idempotence, check mode, break-and-repair.

Runs against the lab's CT 200 (default) or this machine (SGLFLEET_ROLE_TESTS_TARGET=local), every
path under a test directory (see toolchain_support). Only the tree at the prefix is ever used: this
machine has an nvcc 13.0 of its own on PATH, which the role and these tests never touch.
Wheels come through pip's cache on the target, so a repeated converge does not download them again.
"""

from __future__ import annotations

import time

import pytest
from support.ansible_lab import PlaybookRun, Target

pytestmark = [pytest.mark.timeout(1800)]

PLAYBOOK = "toolchain.yml"
RELEASE = "13.2.2"
WHEEL = "13.2.86"
PIN_TASK = "cuda_toolchain : Install every CUDA component pinned to one release"
CUDART_TASK = "cuda_toolchain : Link lib64/libcudart.so -> libcudart.so.13"
CCCL_TASK = "cuda_toolchain : Overlay the CCCL headers at include/ (cub, cuda, nv, thrust)"
STUB_TASK = "cuda_toolchain : Build lib64/stubs/libcuda.so (SONAME libcuda.so.1)"
HEADERS_TASK = "cuda_toolchain : Install the headers of the JIT python (python3.X-dev for its X)"
CHECKS = [
    "cuda_toolchain : Check that nvcc reports the release",
    "cuda_toolchain : Check the PTX ISA version and target",
    "cuda_toolchain : Check that ptxas assembled the kernel",
    "cuda_toolchain : Check the -cudart shared link",
    "cuda_toolchain : Check the host compile against the CCCL headers",
    "cuda_toolchain : Check flashinfer's JIT build",
    "cuda_toolchain : Check Triton's launcher build",
    "cuda_toolchain : Check that every component is at the release's pin",
]
GPU_SKIP_TASK = "cuda_toolchain : Say that the GPU check is skipped by decision"
GPU_CHECK_TASK = "cuda_toolchain : Check the kernel launch on GPU 0"


@pytest.fixture(scope="module")
def target(role_target: Target) -> Target:
    return role_target  # emptied at the start of the session; this module converges into it first


@pytest.fixture(scope="module")
def converged(target: Target) -> PlaybookRun:
    start = time.monotonic()
    run = target.play(PLAYBOOK)
    print(f"\ncuda_toolchain: first converge into an empty prefix took {time.monotonic() - start:.1f} s")
    assert run.rc == 0, run.explain()
    return run


def assert_verified(run: PlaybookRun) -> None:
    for check in CHECKS:
        assert run.status(check) == ["ok"], (check, run.explain())
    # the lab declares no GPU (inventory/lab: sglfleet_gpus_expected false): the launch is skipped, saying why
    assert run.status(GPU_SKIP_TASK) == ["ok"], run.explain()
    assert "skipped: inventory declares no GPU (sglfleet_gpus_expected=false)" in run.output
    assert run.status(GPU_CHECK_TASK) in ([], ["skipping"]), run.explain()


def test_first_run_installs_assembles_and_verifies(target: Target, converged: PlaybookRun) -> None:
    assert_verified(converged)
    assert PIN_TASK in converged.changed_tasks()
    p = target.prefix
    target.ok(
        f"test -x {p}/bin/nvcc && test -x {p}/bin/ptxas && test -x {p}/nvvm/bin/cicc"
        f" && test -f {p}/include/cuda_runtime.h && test -f {p}/lib64/libcudart.so.13"
        f" && test -f {p}/include/cuda/std/cstdint && test -f {p}/include/cub/cub.cuh"
        f" && test -f {p}/include/thrust/version.h && test -f {p}/include/nv/target"
    )
    assert target.ok(f"readlink {p}/lib64/libcudart.so").strip() == "libcudart.so.13"
    assert "release 13.2, V13.2.86" in target.ok(f"{p}/bin/nvcc --version")
    phase = target.ledger_phase("toolchain")
    assert phase["status"] == "done"
    assert phase["evidence"]["release"] == RELEASE
    assert f"nvidia-nvvm=={WHEEL}" in phase["evidence"]["wheels"]
    # the JIT prerequisites: the driver stub flashinfer links against, and the venv python's headers
    stub = target.ok(f"readelf -d {p}/lib64/stubs/libcuda.so")
    assert "Library soname: [libcuda.so.1]" in stub
    assert target.sh("test -f /usr/include/python3.11/Python.h").returncode == 0
    assert "flashinfer-jit-link" in phase["evidence"]["checks"]
    # flashinfer's own SM120 line (compilation_context.py:28-31,98-101): the family target and its defines
    sm120 = (
        "-gencode=arch=compute_120f,code=sm_120f "
        + "-DFLASHINFER_ENABLE_FP8_E8M0 -DFLASHINFER_ENABLE_FP4_E2M1"
    )
    assert sm120 in " ".join(converged.output.split()), converged.explain()


# The converged role's re-run at changed=0 and its check mode changing nothing (its verification passing
# in both) are test_site's: site.yml's second run and its --check --diff run phase toolchain too.


def test_environment_file_has_literal_values(target: Target, converged: PlaybookRun) -> None:
    env = {}
    for line in target.ok(f"cat {target.path('etc', 'cuda-toolchain.env')}").splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    assert env["CUDA_HOME"] == target.prefix
    assert env["PATH"].split(":")[0] == f"{target.prefix}/bin"
    assert env["LD_LIBRARY_PATH"] == f"{target.prefix}/lib64"
    assert not any("$" in value for value in env.values()), env  # systemd would not expand them


def test_profile_script_puts_the_tree_before_any_other_nvcc(target: Target, converged: PlaybookRun) -> None:
    profile = target.path("etc", "profile.d", "cuda-toolchain.sh")
    out = target.ok(
        f"env -i PATH=/usr/local/bin:/usr/bin:/bin sh -c '. {profile}; . {profile}; "
        'command -v nvcc; nvcc --version | tail -2; echo "$PATH"; echo "$CUDA_HOME"\''
    )
    lines = out.splitlines()
    assert lines[0] == f"{target.prefix}/bin/nvcc"
    assert "release 13.2, V13.2.86" in lines[1]
    assert lines[3].split(":").count(f"{target.prefix}/bin") == 1  # sourcing twice adds it once
    assert lines[4] == target.prefix


# name: (break it, is it fixed (a shell test), the repairing task, what verification alone must say, how the
# test puts back what it broke: None when a real run repairs it)
BREAKS = {
    "libcudart-symlink": (
        "mv {p}/lib64/libcudart.so {p}/lib64/libcudart.so.moved",
        "test -L {p}/lib64/libcudart.so",
        CUDART_TASK,
        ["cannot find -lcudart", f"task '{CUDART_TASK}'"],
        "mv {p}/lib64/libcudart.so.moved {p}/lib64/libcudart.so",
    ),
    "cccl-overlay": (
        "for d in cub cuda thrust; do mv {p}/include/$d {p}/include/$d.moved; done",
        "test -L {p}/include/cub && test -L {p}/include/cuda && test -L {p}/include/thrust",
        CCCL_TASK,
        ["cuda/std/cstdint: No such file", f"task '{CCCL_TASK}'"],
        "for d in cub cuda thrust; do mv {p}/include/$d.moved {p}/include/$d; done",
    ),
    "libcuda-stub": (
        "mv {p}/lib64/stubs/libcuda.so {p}/lib64/stubs/libcuda.so.moved",
        "test -f {p}/lib64/stubs/libcuda.so",
        STUB_TASK,
        ["lib64/stubs/libcuda.so is missing", "cannot find -lcuda", f"task '{STUB_TASK}'"],
        "mv {p}/lib64/stubs/libcuda.so.moved {p}/lib64/stubs/libcuda.so",
    ),
    # Debian's python3.11-dev holds no header itself: libpython3.11-dev has Python.h.
    "python-headers": (
        "DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq python3.11-dev libpython3.11-dev >/dev/null",
        "test -f /usr/include/python3.11/Python.h",
        HEADERS_TASK,
        ["Python.h: No such file", "The headers of /usr/bin/python3 are missing", f"task '{HEADERS_TASK}'"],
        None,
    ),
    "nvvm-13.5": (
        "{p}/venv/bin/pip install --quiet --disable-pip-version-check nvidia-nvvm==13.5.37",
        "{p}/venv/bin/python -m pip show nvidia-nvvm | grep -qx 'Version: " + WHEEL + "'",
        PIN_TASK,
        [
            "PTX version mismatch",
            "Unsupported .version 9.5; current version is '9.2'",
            f"nvidia-nvvm is 13.5.37, release {RELEASE} pins {WHEEL}",
            f"task '{PIN_TASK}'",
        ],
        None,
    ),
}


# Repair tasks whose check-mode prediction test_check_mode_on_a_fresh_host_... asserts already; a break case
# that a real run repairs checks the others' (a check-mode run each: about 20 s).
PREDICTED_ON_A_FRESH_HOST = (PIN_TASK, CUDART_TASK, CCCL_TASK)


@pytest.mark.parametrize("case", list(BREAKS))
def test_a_broken_fix_is_named_by_verify_and_repaired_or_its_repair_predicted(
    target: Target, converged: PlaybookRun, case: str
) -> None:
    """Verification names each broken fix and the task that repairs it. A real run repairs the breaks whose
    repair differs from what the first converge did (an apt package removed, a wheel at another version);
    the others (a link, an overlay, the stub, missing) are what the first converge made from nothing: for
    them, check mode on the broken tree predicts the repair, and the test puts back what it moved away."""
    breaker, fixed, repair_task, messages, restore = (
        item.format(p=target.prefix) if isinstance(item, str) else item for item in BREAKS[case]
    )
    ledger = target.path("ledger.json")
    target.ok(f"cp -p {ledger} {ledger}.before-break")
    target.ok(breaker)
    assert target.sh(fixed).returncode != 0

    verify = target.play(PLAYBOOK, "--tags", "verify")
    assert verify.rc != 0, verify.explain()
    flat = " ".join(verify.output.split())  # the yaml callback wraps long messages
    for message in messages:
        assert " ".join(message.split()) in flat, (message, verify.explain())
    assert target.ledger_phase("toolchain")["status"] == "failed"

    if restore is not None or repair_task not in PREDICTED_ON_A_FRESH_HOST:
        check = target.play(PLAYBOOK, "--check", "--tags", "install,configure")
        assert check.rc == 0, check.explain()
        assert check.status(repair_task)[:1] == ["changed"], check.explain()  # check mode: would repair
        assert target.sh(fixed).returncode != 0, "check mode changed the tree"

    if restore is not None:
        target.ok(f"{restore} && mv {ledger}.before-break {ledger}")
        assert target.sh(fixed).returncode == 0
        return
    repair = target.play(PLAYBOOK)
    assert repair.rc == 0, repair.explain()
    assert repair_task in repair.changed_tasks(), repair.explain()
    assert_verified(repair)
    assert target.sh(fixed).returncode == 0
    assert target.ledger_phase("toolchain")["status"] == "done"
    target.ok(f"rm -f {ledger}.before-break")


def test_a_host_that_should_have_gpus_and_has_none_fails_verify_naming_the_cause(
    target: Target, converged: PlaybookRun
) -> None:
    # The lab CT as a real inventory would see it: the driver userspace of the declared module is installed
    # (its libcuda.so.1 answers cuInit with CUDA_ERROR_NO_DEVICE, as the real one does without a GPU), no
    # /dev/nvidia* is passed in.
    verify = target.play(PLAYBOOK, "--tags", "verify", overrides={"sglfleet_gpus_expected": True})
    assert verify.rc != 0, verify.explain()
    assert verify.status(GPU_CHECK_TASK) == ["fatal"], verify.explain()
    flat = " ".join(verify.output.split())
    for message in (
        "This host should have GPUs (sglfleet_gpus_expected=true) but cannot run a kernel",
        "cuInit returned CUDA_ERROR_NO_DEVICE=100",
        "no /dev/nvidia* device node",
        "CUDA_ERROR_NO_DEVICE: the driver sees no GPU",
        "set sglfleet_gpus_expected: false",
    ):
        assert message in flat, (message, verify.explain())
    assert "skipped: inventory declares no GPU" not in verify.output
    phase = target.ledger_phase("toolchain")
    assert phase["status"] == "failed"
    assert phase["evidence"]["gpu_launch"] == "failed"

    again = target.play(PLAYBOOK, "--tags", "verify,record")
    assert again.rc == 0, again.explain()
    assert target.ledger_phase("toolchain")["evidence"]["gpu_launch"] == "skipped: inventory declares no GPU"


def test_unknown_release_fails_listing_the_known_ones_before_any_change(target: Target) -> None:
    fresh = target.path("never-created")
    run = target.play(
        PLAYBOOK, overrides={"cuda_toolchain_version": "13.9.9", "cuda_toolchain_prefix": fresh}
    )
    assert run.rc != 0
    assert "cuda_toolchain_version '13.9.9' is not a known release. Known releases: 13.2.2" in run.output
    assert target.sh(f"test -e {fresh}").returncode != 0


def test_check_mode_on_a_fresh_host_says_what_it_would_do_and_creates_nothing(target: Target) -> None:
    fresh = target.path("fresh")
    run = target.play(
        PLAYBOOK,
        "--check",
        overrides={
            "cuda_toolchain_prefix": f"{fresh}/cuda",
            "cuda_toolchain_env_file": f"{fresh}/etc/cuda-toolchain.env",
            "cuda_toolchain_profile_path": f"{fresh}/etc/cuda-toolchain.sh",
            "cuda_toolchain_ledger_path": f"{fresh}/ledger.json",
        },
    )
    assert run.rc == 0, run.explain()
    for task in PREDICTED_ON_A_FRESH_HOST:
        assert "changed" in run.status(task), (task, run.explain())
    assert "Check mode on a host without" in run.output
    assert target.sh(f"test -e {fresh}").returncode != 0
