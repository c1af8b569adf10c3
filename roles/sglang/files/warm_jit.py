"""Build flashinfer's JIT attention kernels once, before the fleet starts (GPU hosts only).

Runs, for each head dim given on the command line, on GPU 0, the same flashinfer wrappers SGLang
0.5.12's flashinfer backend runs (sglang/srt/layers/attention/flashinfer_backend.py):

- ``BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="auto")`` (:255-257), the
  extend of new tokens, with and without the log-sum-exp (``forward``/``forward_return_lse``, :858-874);
- ``BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")`` (:266-278, backend from
  :126), the extend over the cached prefix (:813, :876), planned with page size 1 and
  ``q_data_type``/``kv_data_type`` (:1483-1494);
- ``BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2", use_tensor_cores=...)``
  (:281-286), planned like :1186-1200; ``use_tensor_cores`` depends on the model's GQA group size
  (``should_use_tensor_core``, :1661-1707), so both variants are built.

bfloat16 queries and KV cache (the model dtype of the reference models), int32 indices. Eight
instances starting together then find the kernels in FLASHINFER_WORKSPACE_BASE instead of compiling
the same ones eight times.

    warm_jit.py --gpus-expected true|false HEAD_DIM...

With --gpus-expected true (a real inventory, sglfleet_gpus_expected) it prints "built N" (new files in
the cache) or "cached" and exits 0, or exits 1 naming why it could not run (no torch, no flashinfer, no
CUDA device visible and what the host shows: /dev/nvidia*, CUDA_VISIBLE_DEVICES). With false (a lab
that declares no GPU) it prints "skipped: inventory declares no GPU (sglfleet_gpus_expected=false)"
and exits 0 without importing anything. Bad arguments exit 2.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from typing import Any

# SGLang's workspace (SGLANG_FLASHINFER_WORKSPACE_SIZE, sglang/srt/environ.py:370): 384 MiB.
WORKSPACE_BYTES = 384 * 1024 * 1024
NUM_QO_HEADS = 32
NUM_KV_HEADS = 8  # a GQA group of 4: the decode wrapper's tensor-core variant is the one SGLang picks
PAGES = 64
BATCH = 4


def cache_files(base: pathlib.Path) -> set[pathlib.Path]:
    return {p for p in base.rglob("*") if p.is_file()} if base.exists() else set()


def _gpu_modules() -> tuple[Any, Any] | str:
    """(torch, flashinfer), or why the warm-up cannot run here."""
    try:
        import torch
    except ImportError as error:
        return f"no torch ({error})"
    if not torch.cuda.is_available():
        nodes = sorted(p.name for p in pathlib.Path("/dev").glob("nvidia*"))
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")
        return (
            f"no CUDA device visible (torch {torch.__version__}, CUDA_VISIBLE_DEVICES={visible}, "
            f"/dev: {', '.join(nodes) or 'no nvidia* node'})"
        )
    try:
        import flashinfer
    except ImportError as error:
        return f"no flashinfer ({error})"
    return torch, flashinfer


def warm(torch: Any, flashinfer: Any, head_dim: int) -> None:
    """Plan and run each wrapper once for `head_dim` (flashinfer compiles what it lacks)."""
    dev = torch.device("cuda:0")
    bf16, i32 = torch.bfloat16, torch.int32
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
    per_req = PAGES // BATCH
    # page size 1, as SGLang's token-granular KV pool: one page per token
    qo_indptr = torch.arange(0, BATCH + 1, dtype=i32, device=dev) * per_req
    kv_indptr = torch.arange(0, BATCH + 1, dtype=i32, device=dev) * per_req
    kv_indices = torch.arange(0, PAGES, dtype=i32, device=dev)
    last_page_len = torch.ones(BATCH, dtype=i32, device=dev)
    k_cache = torch.randn(PAGES, 1, NUM_KV_HEADS, head_dim, dtype=bf16, device=dev)
    v_cache = torch.randn_like(k_cache)

    ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="auto")
    ragged.plan(qo_indptr, qo_indptr, NUM_QO_HEADS, NUM_KV_HEADS, head_dim, causal=True, q_data_type=bf16)
    q = torch.randn(PAGES, NUM_QO_HEADS, head_dim, dtype=bf16, device=dev)
    k = torch.randn(PAGES, NUM_KV_HEADS, head_dim, dtype=bf16, device=dev)
    ragged.run(q, k, torch.randn_like(k))
    ragged.run(q, k, torch.randn_like(k), return_lse=True)

    paged = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
    paged.plan(
        qo_indptr, kv_indptr, kv_indices, last_page_len, NUM_QO_HEADS, NUM_KV_HEADS, head_dim, 1,
        causal=False, q_data_type=bf16, kv_data_type=bf16,
    )  # fmt: skip
    paged.run(q, (k_cache, v_cache))
    paged.run(q, (k_cache, v_cache), return_lse=True)

    for tensor_cores in (False, True):
        decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", backend="fa2", use_tensor_cores=tensor_cores
        )
        decode.plan(
            kv_indptr, kv_indices, last_page_len, NUM_QO_HEADS, NUM_KV_HEADS, head_dim, 1,
            data_type=bf16, q_data_type=bf16,
        )  # fmt: skip
        decode.run(torch.randn(BATCH, NUM_QO_HEADS, head_dim, dtype=bf16, device=dev), (k_cache, v_cache))


SKIPPED = "skipped: inventory declares no GPU (sglfleet_gpus_expected=false)"


def main(head_dims: list[int], gpus_expected: bool) -> int:
    if not gpus_expected:
        print(SKIPPED)
        return 0
    modules = _gpu_modules()
    if isinstance(modules, str):
        print(
            f"failed: this host should have GPUs (sglfleet_gpus_expected=true), but {modules}",
            file=sys.stderr,
        )
        return 1
    torch, flashinfer = modules
    base = pathlib.Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", pathlib.Path.home()))
    before = cache_files(base)
    for head_dim in head_dims:
        warm(torch, flashinfer, head_dim)
    torch.cuda.synchronize()
    new = cache_files(base) - before
    print(f"built {len(new)}" if new else "cached")
    return 0


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="warm_jit.py")
    parser.add_argument("--gpus-expected", required=True, choices=["true", "false"])
    parser.add_argument("head_dims", nargs="+", type=int, metavar="HEAD_DIM")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = _parse(sys.argv[1:])
    sys.exit(main(args.head_dims, args.gpus_expected == "true"))
