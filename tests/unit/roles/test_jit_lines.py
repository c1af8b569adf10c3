"""roles/cuda_toolchain/files/verify/jit_lines.py: flashinfer's own SM120 flags and CCCL order, and the
causes a GPU host that cannot run a kernel is told."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from support.paths import REPO

SCRIPT = REPO / "roles/cuda_toolchain/files/verify/jit_lines.py"
_spec = importlib.util.spec_from_file_location("jit_lines", SCRIPT)
assert _spec and _spec.loader
jit_lines = importlib.util.module_from_spec(_spec)
sys.modules["jit_lines"] = jit_lines
_spec.loader.exec_module(jit_lines)


@pytest.mark.parametrize(
    ("sm", "arch"),
    # flashinfer 0.6.11.post1 compilation_context.py:45-59 (_normalize_cuda_arch, CUDA >= 12.9)
    [
        ("120", "120f"),
        ("121", "121a"),
        ("90", "90a"),
        ("100", "100a"),
        ("103", "103a"),
        ("89", "89"),
        ("80", "80"),
    ],
)
def test_the_arch_suffix_is_flashinfers(sm: str, arch: str) -> None:
    assert jit_lines.flashinfer_arch(sm) == arch


def _fake_flashinfer(venv: Path) -> Path:
    data = venv / "lib" / "python3.11" / "site-packages" / "flashinfer" / "data" / "cccl"
    for sub in ("cub", "libcudacxx/include", "thrust"):
        (data / sub).mkdir(parents=True)
    return data


def test_the_vendored_cccl_comes_first_with_dash_i_before_every_isystem(tmp_path, monkeypatch) -> None:
    data = _fake_flashinfer(tmp_path / "venv")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    seen: list[list[str]] = []
    monkeypatch.setattr(jit_lines, "run", lambda name, argv: seen.append(argv) or {"name": name, "rc": 1})
    monkeypatch.chdir(tmp_path)
    out = jit_lines.flashinfer("120", str(tmp_path / "venv"))
    nvcc = seen[0]
    assert out["cccl_from"] == "flashinfer"
    includes = [a for a in nvcc if a.startswith("-I")]
    # flashinfer/jit/env.py:160-164 order, cpp_ext.py:159-163 flag
    assert includes == [f"-I{data}/cub", f"-I{data}/libcudacxx/include", f"-I{data}/thrust"]
    assert nvcc.index(includes[-1]) < nvcc.index("-isystem")
    # compilation_context.py:98-101 then :28-31
    gencode = nvcc.index("-gencode=arch=compute_120f,code=sm_120f")
    assert nvcc[gencode + 1 : gencode + 3] == ["-DFLASHINFER_ENABLE_FP8_E8M0", "-DFLASHINFER_ENABLE_FP4_E2M1"]


def test_without_flashinfer_yet_the_trees_cccl_stands_in_and_says_so(tmp_path, monkeypatch) -> None:
    cccl, source = jit_lines.flashinfer_cccl(str(tmp_path / "no-venv"), "/opt/cuda-13.2")
    assert (cccl, source) == (["/opt/cuda-13.2/include/cccl"], "toolkit")


def test_no_device_node_and_no_device_are_both_named() -> None:
    causes = jit_lines.gpu_causes("CUDA_ERROR_NO_DEVICE", ["null", "zero", "tty"], "580.95.05", "580.95.05")
    assert causes[0].startswith("no /dev/nvidia* device node")
    assert causes[-1].startswith("CUDA_ERROR_NO_DEVICE: ")
    assert len(causes) == 2


def test_a_driver_userspace_mismatch_is_named_with_both_versions() -> None:
    nodes = ["nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
    causes = jit_lines.gpu_causes("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", nodes, "580.95.05", "590.48.01")
    assert "driver/userspace mismatch: kernel module 580.95.05, libcuda.so 590.48.01" in causes
    assert any(c.startswith("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: ") for c in causes)


def test_no_module_and_no_userspace_are_named() -> None:
    causes = jit_lines.gpu_causes("CUDA_ERROR_STUB_LIBRARY", ["nvidia0", "nvidiactl"], None, None)
    assert any("no /proc/driver/nvidia/version" in c for c in causes)
    assert any("no libcuda.so.1" in c for c in causes)
    assert any(c.startswith("CUDA_ERROR_STUB_LIBRARY: ") for c in causes)


def test_a_container_without_the_uvm_nodes_gets_999_and_both_are_named() -> None:
    """cuInit answers 999 (CUDA_ERROR_UNKNOWN, cuda.h) when /dev/nvidia-uvm is not there or not usable."""
    assert jit_lines.CU_RESULT_NAMES[999] == "CUDA_ERROR_UNKNOWN"
    causes = jit_lines.gpu_causes("CUDA_ERROR_UNKNOWN", ["nvidia0", "nvidiactl"], "580.95.05", "580.95.05")
    assert causes[0].startswith("no /dev/nvidia-uvm, /dev/nvidia-uvm-tools: ")
    assert causes[1].startswith("CUDA_ERROR_UNKNOWN: /dev/nvidia-uvm missing or unusable")
    assert len(causes) == 2
    only_tools = jit_lines.gpu_causes(None, ["nvidia0", "nvidiactl", "nvidia-uvm"], "580.95.05", "580.95.05")
    assert len(only_tools) == 1 and only_tools[0].startswith("no /dev/nvidia-uvm-tools: ")


def test_a_healthy_host_has_no_cause() -> None:
    nodes = ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
    assert jit_lines.gpu_causes("CUDA_SUCCESS", nodes, "580.95.05", "580.95.05") == []
