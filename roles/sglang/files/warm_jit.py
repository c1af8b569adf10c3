"""Build flashinfer's JIT attention kernels once, before the fleet starts (GPU hosts only).

Runs the prefill and decode kernels SGLang's flashinfer backend uses, for each head dim given on the
command line, on GPU 0, so that eight instances starting together find them in FLASHINFER_WORKSPACE_BASE
instead of compiling the same kernels eight times. Prints "built N" (new files in the cache) or "cached".
"""

import os
import pathlib
import sys

import flashinfer
import torch


def cache_files(base: pathlib.Path) -> set[pathlib.Path]:
    return {p for p in base.rglob("*") if p.is_file()} if base.exists() else set()


def main(head_dims: list[int]) -> int:
    base = pathlib.Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", pathlib.Path.home()))
    before = cache_files(base)
    dev = torch.device("cuda:0")
    for head_dim in head_dims:
        q = torch.randn(16, 8, head_dim, dtype=torch.bfloat16, device=dev)
        kv = torch.randn(16, 8, head_dim, dtype=torch.bfloat16, device=dev)
        flashinfer.single_prefill_with_kv_cache(q, kv, kv, causal=True)
        flashinfer.single_decode_with_kv_cache(q[0], kv, kv)
    torch.cuda.synchronize()
    new = cache_files(base) - before
    print(f"built {len(new)}" if new else "cached")
    return 0


if __name__ == "__main__":
    sys.exit(main([int(arg) for arg in sys.argv[1:]]))
