"""What the pinned SGLang wheels need of the interpreter and the C library, written once.

`pip install` of sglang fails where no wheel fits (sglang 0.5.12 publishes no sdist), after the venv was
made and torch installed. Phase sglang's preflight asks `install_problems` first, with what the venv's
interpreter reports, and refuses naming the wheel and what it needs.

The table is the wheels' own tags as PyPI lists them (`pip download --no-deps --only-binary=:all:
--platform X --python-version 3.11 -vv NAME==VER` prints every file's tags), read 2026-12-04:

- sglang 0.5.12: cp310, cp311, cp312, cp313 (no cp313t, no cp314), manylinux_2_34, x86_64 and aarch64;
  no sdist. Its METADATA pins sglang-kernel==0.4.2.post2, flashinfer_python==0.6.11.post1,
  flashinfer_cubin==0.6.11.post1, torch==2.11.0.
- sglang-kernel 0.4.2.post2: cp310-abi3 (any CPython >= 3.10), manylinux2014 (glibc 2.17).
- flashinfer-python 0.6.11.post1: py3-none-any, Requires-Python >=3.10,<4.0; flashinfer-cubin: py3-none-any.
- torch 2.11.0: cp310 to cp314 and cp313t/cp314t, manylinux_2_28. (The cu130 index serves the same tags
  for its builds; PyPI's are the ones read here.)
- triton 3.6.0 (torch 2.11.0's on Linux): cp310 to cp314 and the t builds, manylinux_2_27/2_28,
  Requires-Python <3.15.

- outlines-core 0.1.26 (sglang 0.5.12 pins outlines==0.1.11, which pins outlines_core==0.1.26): cp39 to
  cp312 only, manylinux_2_17, x86_64 and aarch64; its sdist is a Rust (maturin) build, which a CT
  without a Rust toolchain cannot do. So Python 3.13 is refused although sglang has a cp313 wheel (`pip
  install --dry-run --only-binary=:all: --python-version 3.13 sglang==0.5.12` stops on it; 3.10 and
  3.12 resolve the whole tree from wheels, read 2026-12-04).

The glibc a manylinux_2_X wheel needs is X (PEP 600); manylinux2014 is 2.17 (PEP 599).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["WHEELS", "WheelNeed", "install_problems", "wheel_needs"]

MACHINES = ("x86_64", "aarch64")


@dataclass(frozen=True)
class WheelNeed:
    name: str
    version: str
    python_min: int  # the oldest CPython 3.N a wheel exists for
    python_max: int | None  # the newest (None: any newer one, an abi3 or py3 wheel)
    glibc: tuple[int, int]
    free_threaded: bool  # a wheel for the free-threaded build (cp313t) exists
    example: str  # one x86_64 file name, as PyPI lists it


#: Every wheel the pinned sglang installs that has a tag to match (see the module docstring).
WHEELS: tuple[WheelNeed, ...] = (
    WheelNeed(
        "sglang", "0.5.12", 10, 13, (2, 34), False, "sglang-0.5.12-cp313-cp313-manylinux_2_34_x86_64.whl"
    ),
    WheelNeed(
        "sglang-kernel", "0.4.2.post2", 10, None, (2, 17), False,
        "sglang_kernel-0.4.2.post2-cp310-abi3-manylinux2014_x86_64.whl",
    ),
    WheelNeed(
        "flashinfer-python", "0.6.11.post1", 10, None, (0, 0), True,
        "flashinfer_python-0.6.11.post1-py3-none-any.whl",
    ),
    WheelNeed(
        "outlines-core", "0.1.26", 9, 12, (2, 17), False,
        "outlines_core-0.1.26-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    ),
    WheelNeed("torch", "2.11.0", 10, 14, (2, 28), True, "torch-2.11.0-cp314-cp314-manylinux_2_28_x86_64.whl"),
    WheelNeed(
        "triton", "3.6.0", 10, 14, (2, 27), True,
        "triton-3.6.0-cp314-cp314-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
    ),
)  # fmt: skip

#: What each pinned sglang brings with a tag to match (its METADATA's Requires-Dist and theirs: triton comes
#: with torch, outlines-core with outlines), and the torch it needs.
_SGLANG_BRINGS = {"0.5.12": ("sglang-kernel", "flashinfer-python", "outlines-core", "torch", "triton")}


def wheel_needs(sglang_version: str, torch_version: str) -> tuple[list[WheelNeed], list[str]]:
    """The table's rows for these pins, and what is not in the table (a pin this module has not read)."""
    by_name = {(w.name, w.version): w for w in WHEELS}
    needs, unknown = [], []
    sglang = by_name.get(("sglang", sglang_version))
    if sglang is None:
        unknown.append(f"sglang {sglang_version}")
    else:
        needs.append(sglang)
        needs += [w for w in WHEELS if w.name in _SGLANG_BRINGS[sglang_version] and w.name != "torch"]
    torch = by_name.get(("torch", torch_version))
    if torch is None:
        unknown.append(f"torch {torch_version}")
    else:
        needs.append(torch)
    return needs, unknown


def _glibc(text: str | None) -> tuple[int, int] | None:
    """`glibc 2.36` / `2.36` -> (2, 36); None for no glibc (musl) or a text that is no version."""
    if not text:
        return None
    words = text.split()
    parts = words[-1].split(".") if words and (len(words) == 1 or words[0] == "glibc") else []
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        return None
    return int(parts[0]), int(parts[1])


def install_problems(
    *,
    python: str,
    libc: str | None,
    machine: str,
    free_threaded: bool,
    needs: Sequence[WheelNeed],
    interpreter: str = "the interpreter",
) -> list[str]:
    """Why pip could not install `needs` for this interpreter: one line per wheel, naming it and what
    it needs. `python` is "3.11", `libc` what `os.confstr("CS_GNU_LIBC_VERSION")` says ("glibc 2.36";
    None or empty on a C library that is not glibc)."""
    major, _, minor_text = python.partition(".")
    if major != "3" or not minor_text.isdigit():
        raise ValueError(f"{python!r} is not a Python version like 3.11")
    minor = int(minor_text)
    problems = []
    if machine not in MACHINES:
        problems.append(
            f"{interpreter} runs on {machine}; the pinned wheels exist for {' and '.join(MACHINES)} only"
        )
    have_glibc = _glibc(libc)
    for need in needs:
        wheel = f"{need.name} {need.version} ({need.example})"
        if not (need.python_min <= minor and (need.python_max is None or minor <= need.python_max)):
            span = (
                f"CPython 3.{need.python_min} or newer"
                if need.python_max is None
                else f"CPython 3.{need.python_min} to 3.{need.python_max}"
            )
            problems.append(f"{wheel} needs {span}; {interpreter} is Python {python}")
        elif free_threaded and not need.free_threaded:
            problems.append(
                f"{wheel} has no free-threaded (cp{python.replace('.', '')}t) build; {interpreter} is one"
            )
        if need.glibc > (0, 0):
            if have_glibc is None:
                problems.append(
                    f"{wheel} needs glibc {need.glibc[0]}.{need.glibc[1]} or newer (manylinux); "
                    f"{interpreter} has no glibc ({libc or 'not glibc'})"
                )
            elif have_glibc < need.glibc:
                problems.append(
                    f"{wheel} needs glibc {need.glibc[0]}.{need.glibc[1]} or newer (manylinux_"
                    f"{need.glibc[0]}_{need.glibc[1]}); the host has glibc {have_glibc[0]}.{have_glibc[1]}"
                )
    return problems
