"""What the pinned SGLang wheels need of the interpreter and glibc: refused before pip would fail."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.module_runner import run_module

from sglfleet.fleet import WHEELS, install_problems, wheel_needs

REPO = Path(__file__).resolve().parents[3]
DEFAULTS = yaml.safe_load((REPO / "roles/sglang/defaults/main.yml").read_text())
NEEDS, UNKNOWN = wheel_needs(str(DEFAULTS["sglang_version"]), str(DEFAULTS["sglang_torch_version"]))


def problems(
    python: str = "3.11", libc: str | None = "glibc 2.36", machine: str = "x86_64", ft: bool = False
):
    return install_problems(python=python, libc=libc, machine=machine, free_threaded=ft, needs=NEEDS)


def test_the_roles_pins_are_in_the_table() -> None:
    assert UNKNOWN == []
    assert {n.name for n in NEEDS} == {
        "sglang", "sglang-kernel", "flashinfer-python", "outlines-core", "torch", "triton"
    }  # fmt: skip
    assert len({(w.name, w.version) for w in WHEELS}) == len(WHEELS)


@pytest.mark.parametrize("python", ["3.10", "3.11", "3.12"])
def test_debian_12_and_ubuntu_22_04_with_3_10_to_3_12_install(python: str) -> None:
    assert problems(python) == []
    assert problems(python, "glibc 2.35") == []  # Ubuntu 22.04
    assert problems(python, machine="aarch64") == []


def test_python_3_13_is_refused_naming_outlines_core_alone() -> None:
    # sglang 0.5.12 has a cp313 wheel, but outlines==0.1.11 pins outlines_core==0.1.26: cp39 to cp312
    # wheels and a Rust sdist, so pip would need cargo in the CT (Debian 13's python3 is 3.13).
    assert problems("3.13") == [
        "outlines-core 0.1.26 (outlines_core-0.1.26-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64"
        ".whl) needs CPython 3.9 to 3.12; the interpreter is Python 3.13"
    ]


def test_python_3_14_is_refused_naming_sglang_and_outlines_core() -> None:
    # torch 2.11.0 and triton 3.6.0 have cp314 wheels; sglang 0.5.12 stops at cp313 and has no sdist.
    assert [p.split(" (")[0] for p in problems("3.14")] == ["sglang 0.5.12", "outlines-core 0.1.26"]
    assert problems("3.14")[0] == (
        "sglang 0.5.12 (sglang-0.5.12-cp313-cp313-manylinux_2_34_x86_64.whl) needs CPython 3.10 to 3.13; "
        "the interpreter is Python 3.14"
    )
    assert len(problems("3.9")) == 5  # every wheel but outlines-core's needs 3.10


def test_a_glibc_older_than_2_34_is_refused_naming_the_wheel_and_its_manylinux_tag() -> None:
    # Debian 11 (2.31) and Ubuntu 20.04 (2.31): torch's manylinux_2_28 installs, sglang's _2_34 does not.
    assert problems(libc="glibc 2.31") == [
        "sglang 0.5.12 (sglang-0.5.12-cp313-cp313-manylinux_2_34_x86_64.whl) needs glibc 2.34 or newer "
        "(manylinux_2_34); the host has glibc 2.31"
    ]
    # CentOS 7 (2.17): sglang, torch and triton refused; sglang-kernel's manylinux2014 would install.
    assert [p.split(" (")[0] for p in problems(libc="glibc 2.17")] == [
        "sglang 0.5.12",
        "triton 3.6.0",
        "torch 2.11.0",
    ]
    assert all("has no glibc" in p for p in problems(libc=""))  # musl (Alpine): no manylinux wheel at all


def test_a_free_threaded_interpreter_and_another_machine_are_refused() -> None:
    assert [p.split(" (")[0] for p in problems("3.13", ft=True)] == [
        "sglang 0.5.12",
        "sglang-kernel 0.4.2.post2",
        "outlines-core 0.1.26",
    ]
    assert (
        problems(machine="ppc64le")[0]
        == "the interpreter runs on ppc64le; the pinned wheels exist for x86_64 and aarch64 only"
    )
    with pytest.raises(ValueError, match=r"'python3' is not a Python version like 3.11"):
        problems("python3")


def test_the_role_probes_the_interpreter_with_a_script_that_runs(tmp_path: Path) -> None:
    tasks = yaml.safe_load((REPO / "roles/sglang/tasks/preflight.yml").read_text())
    probe = next(t for t in tasks if t["name"].startswith("Probe what the venv interpreter"))
    script = probe["ansible.builtin.command"]["argv"][2]
    out = json.loads(
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    )
    assert out["libc"].startswith("glibc 2.") and out["machine"] and out["free_threaded"] is False
    check = next(t for t in tasks if "sglang_wheels" in t)
    assert check["sglang_wheels"]["sglang_version"] == "{{ sglang_version }}"


def test_the_module_fails_naming_the_wheel_and_says_which_pins_it_did_not_check(tmp_path: Path) -> None:
    args = {"python_version": "3.14", "libc": "glibc 2.36", "machine": "x86_64", "sglang_version": "0.5.12",
            "torch_version": "2.11.0", "interpreter": "sglang_python /usr/bin/python3"}  # fmt: skip
    failed = run_module("sglang_wheels", args, tmp_path, check=True)
    assert failed["failed"] and "sglang 0.5.12" in failed["msg"] and "Point sglang_python at" in failed["msg"]
    assert "sglang_python /usr/bin/python3 is Python 3.14" in failed["msg"]
    newer = run_module(
        "sglang_wheels", {**args, "python_version": "3.12", "sglang_version": "0.6.0"}, tmp_path
    )
    assert not newer.get("failed") and newer["unknown"] == ["sglang 0.6.0"] and newer["changed"] is False
