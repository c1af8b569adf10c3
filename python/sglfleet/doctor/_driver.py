"""The NVIDIA driver the fleet's CUDA 13.2 needs: the floors, defined once.

NVIDIA's CUDA 13.2 release notes, Table 3 ("CUDA Toolkit and Corresponding Driver Versions"): 13.2 GA
needs driver >= 595.45.04, 13.2 Update 1 >= 595.58.03; the newest row the notes give is taken. The
project pins the 13.2.2 wheels, which are 13.2 Update 2 (PyPI's cuda-toolkit has 13.2.0, 13.2.1 and 13.2.2;
Update 1's notes list its components as 13.2.75, not 13.2.86): if Update 2's row in Table 3 names a newer
driver, FULL_DRIVER is that one. Below it, from branch 580 (the CUDA 13.x minor-version-compatibility floor),
SASS runs but PTX that the driver must JIT fails with cudaErrorUnsupportedPtxVersion. What that means for
what the fleet runs (checked in the pinned wheels):

- sglang-kernel 0.4.2.post2 (cu130 build: NEEDED libcudart.so.13): `cuobjdump --list-elf/--list-ptx` of
  its .so files lists SASS only, no PTX: common_ops and spatial_ops sm_80/89/90(a)/100/103/120,
  flash_ops sm_80/86/90, flashmla_ops sm_90/100/103. Runs on 580.
- flashinfer 0.6.11.post1 JIT: compiled by the toolchain's 13.2 nvcc with one
  `-gencode=arch=compute_XX,code=sm_XX` per arch (flashinfer/compilation_context.py get_nvcc_flags_list,
  jit/core.py), SASS only, no PTX embedded; flashinfer-cubin ships cubins. Runs on 580.
- Triton 3.6.0 (torch 2.11.0's): assembles its PTX to a cubin with ptxas (backends/nvidia/compiler.py
  get_ptxas / make_cubin) and loads the cubin: no driver JIT. In the fleet that ptxas is the toolchain's
  13.2 one (phase sglang's common.env sets TRITON_PTXAS_PATH and TRITON_PTXAS_BLACKWELL_PATH, knobs.py's
  env_nvidia_tool); without it, the bundled 12.8 ptxas (12.9's ptxas-blackwell for sm >= 100). A cubin
  either way: runs on 580 (scripts/gpu-check's triton-kernel row on driver 580, docs/gpu-check.md).
- PTX from the 13.2 toolchain (`.version 9.2`, what cuda_toolchain's `nvcc -ptx` check and any
  `-gencode ...,code=compute_XX` build hand the driver) cannot be loaded below the full floor: degraded.
- Below 580 the CUDA 13 runtime (torch cu130) does not start at all: blocked.
"""

from __future__ import annotations

from enum import Enum

__all__ = [
    "COMPAT_FOUND",
    "CUDA_TOOLKIT",
    "FULL_DRIVER",
    "GA_DRIVER",
    "MIN_BRANCH",
    "DriverSupport",
    "driver_support",
]

#: The CUDA 13.x minor-version-compatibility floor: below it the CUDA 13 runtime does not start.
MIN_BRANCH = 580
#: CUDA 13.2 GA's and Update 1's driver (release notes, Table 3).
GA_DRIVER = "595.45.04"
FULL_DRIVER = "595.58.03"
#: The toolchain release the floors are for (cuda_toolchain_version's default).
CUDA_TOOLKIT = "13.2"


class DriverSupport(Enum):
    BLOCKED = "blocked"
    COMPAT = "compat"  # minor-version compatibility: SASS runs, 13.2 PTX does not JIT
    FULL = "full"


def parse_version(version: str) -> tuple[int, ...]:
    """`595.58.03` -> (595, 58, 3); ValueError naming the text when it is no driver version."""
    parts = version.strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"{version!r} is not a driver version (like 595.58.03)")
    return tuple(int(p) for p in parts)


def driver_support(version: str, min_branch: int = MIN_BRANCH, full: str = FULL_DRIVER) -> DriverSupport:
    """What a kernel module of `version` allows for CUDA 13.2."""
    have = parse_version(version)
    if have[0] < min_branch:
        return DriverSupport.BLOCKED
    if have < parse_version(full):
        return DriverSupport.COMPAT
    return DriverSupport.FULL


#: What runs and what does not under minor-version compatibility (the doctor's row, the roles' warning).
COMPAT_FOUND = (
    "CUDA 13.x minor-version compatibility only: SASS runs (sglang-kernel's prebuilt kernels, flashinfer's "
    "JIT and cubins, Triton's cubins), but PTX from the CUDA {toolkit} toolchain cannot be JIT-compiled by "
    "this driver (cudaErrorUnsupportedPtxVersion)"
)
