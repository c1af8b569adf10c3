"""roles/sglang/files/warm_jit.py: fails on a host that should have GPUs and shows none; skips only when the
inventory declares no GPU, and says that the skip is that decision."""

from __future__ import annotations

import ast
import py_compile
import subprocess
import sys

from support.paths import REPO

SCRIPT = REPO / "roles/sglang/files/warm_jit.py"


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


def test_where_the_inventory_declares_no_gpu_it_skips_saying_so():
    result = _run("--gpus-expected", "false", "128")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "skipped: inventory declares no GPU (sglfleet_gpus_expected=false)"


def test_where_gpus_are_expected_and_none_is_visible_it_fails_naming_why():
    # this machine has no torch in the test venv and no GPU: either is a reason, and both fail
    result = _run("--gpus-expected", "true", "128")
    assert result.returncode == 1, result.stdout
    expected = "failed: this host should have GPUs (sglfleet_gpus_expected=true), but no "
    assert result.stderr.startswith(expected), result.stderr
    assert "skipped" not in result.stdout


def test_the_gpu_declaration_is_required():
    result = _run("128")
    assert result.returncode == 2
    assert "--gpus-expected" in result.stderr


def test_a_bad_head_dim_exits_2_naming_it():
    result = _run("--gpus-expected", "true", "128", "big")
    assert result.returncode == 2
    assert "'big'" in result.stderr
