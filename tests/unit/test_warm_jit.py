"""roles/sglang/files/warm_jit.py runs only on GPU hosts: here it must compile, and skip cleanly."""

from __future__ import annotations

import ast
import py_compile
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "roles/sglang/files/warm_jit.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)


def test_it_compiles():
    py_compile.compile(str(SCRIPT), doraise=True)


def test_it_warms_the_batch_wrappers_sglangs_flashinfer_backend_uses():
    called = {
        node.func.attr
        for node in ast.walk(ast.parse(SCRIPT.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }
    assert {
        "BatchPrefillWithRaggedKVCacheWrapper",
        "BatchPrefillWithPagedKVCacheWrapper",
        "BatchDecodeWithPagedKVCacheWrapper",
    } <= called
    assert not {"single_prefill_with_kv_cache", "single_decode_with_kv_cache"} & called


def test_without_a_gpu_it_skips_and_exits_0():
    result = _run("128")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("skipped: ")


def test_a_bad_head_dim_exits_2_naming_it():
    result = _run("128", "big")
    assert result.returncode == 2
    assert "'big'" in result.stderr
