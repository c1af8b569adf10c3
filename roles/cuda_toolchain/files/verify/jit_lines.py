"""cuda_toolchain verification: build with flashinfer's and Triton's own command lines.

Run on the target with the interpreter the SGLang venv is made from (its sysconfig decides the python
include directory, as it does for both projects), in a scratch directory holding the sources:

    python jit_lines.py flashinfer SM     (flashinfer 0.6.11.post1, flashinfer/jit/cpp_ext.py)
    python jit_lines.py triton            (Triton 3.6.0, triton/runtime/build.py + backends/nvidia/driver.py)

Prints one JSON object: {"steps": [{"name", "argv", "rc", "output"}], ...}; never raises for a failed
build (the role turns the JSON into one message naming the step and the repair).
Standard library only: neither flashinfer nor Triton is installed when the toolchain phase runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig

OUTPUT_TAIL = 1500
CUDA_IO = ["-c", "jit_kernel.cu", "-o", "jit_kernel.cuda.o"]


def run(name: str, argv: list[str]) -> dict:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        output, rc = (proc.stdout + proc.stderr)[-OUTPUT_TAIL:], proc.returncode
    except OSError as e:
        output, rc = f"{argv[0]}: {e.strerror}", 127
    return {"name": name, "argv": argv, "rc": rc, "output": output}


def soname(path: str) -> str | None:
    """The SONAME of a shared object, or None when it is missing or has none."""
    if not os.path.exists(path):
        return None
    proc = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=False)
    found = [line.split("[", 1)[1].rstrip("]") for line in proc.stdout.splitlines() if "(SONAME)" in line]
    return found[0] if found else None


def needed(path: str) -> list[str]:
    """The DT_NEEDED entries of a shared object (readelf -d, from binutils, which g++ pulls in)."""
    proc = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=False)
    return [line.split("[", 1)[1].rstrip("]") for line in proc.stdout.splitlines() if "(NEEDED)" in line]


def flashinfer(sm: str) -> dict:
    cuda_home = os.environ["CUDA_HOME"]
    # cpp_ext.py:124-141 get_system_includes: sysconfig's include, $cuda_home/include (then tvm-ffi's,
    # flashinfer's, CUTLASS's and spdlog's own include directories, which come with the flashinfer wheel).
    system_includes = [sysconfig.get_path("include"), f"{cuda_home}/include"]
    common = []
    if not sysconfig.get_config_var("Py_GIL_DISABLED"):  # cpp_ext.py:153-154
        common.append("-DPy_LIMITED_API=0x03090000")
    # cpp_ext.py:40-44: torch._C._GLIBCXX_USE_CXX11_ABI, which is 1 for the cu13 torch wheels.
    common.append("-D_GLIBCXX_USE_CXX11_ABI=1")
    for directory in system_includes:  # cpp_ext.py:164-165, "-isystem DIR"
        common += ["-isystem", directory]
    cflags = [*common, "-fPIC"]  # cpp_ext.py:175-178
    cuda_cflags = [  # cpp_ext.py:198-208 (CUDA >= 12.8), then the module's -gencode
        *common,
        "--compiler-options=-fPIC",
        "--expt-relaxed-constexpr",
        "-static-global-template-stub=false",
        f"-gencode=arch=compute_{sm},code=sm_{sm}",
    ]
    # cpp_ext.py:252-258
    ldflags = ["-shared", f"-L{cuda_home}/lib64", f"-L{cuda_home}/lib64/stubs", "-lcudart", "-lcuda"]
    cxx = os.environ.get("CXX", "c++")  # cpp_ext.py:267
    nvcc = f"{cuda_home}/bin/nvcc"  # cpp_ext.py:268
    depfile = ["-MF", "jit_kernel.cuda.o.d"]
    steps = []
    for name, argv in (
        # rule cuda_compile, cpp_ext.py:295
        ("cuda_compile", [nvcc, "--generate-dependencies-with-compile", *depfile, *cuda_cflags, *CUDA_IO]),
        # rule compile, cpp_ext.py:290
        (
            "compile",
            [cxx, "-MMD", "-MF", "jit_binding.o.d", *cflags, "-c", "jit_binding.cpp", "-o", "jit_binding.o"],
        ),
        # rule link, cpp_ext.py:314
        ("link", [cxx, "jit_kernel.cuda.o", "jit_binding.o", *ldflags, "-o", "jit_ext.so"]),
    ):
        steps.append(run(name, argv))
        if steps[-1]["rc"] != 0:
            break
    linked = steps[-1]["name"] == "link" and steps[-1]["rc"] == 0
    return {
        "steps": steps,
        "needed": needed("jit_ext.so") if linked else [],
        "python_include": system_includes[0],
        # With a driver installed, -lcuda also resolves to its libcuda.so; the stub is what a host without
        # one (a build host, a CT before nvidia_userspace) links against, so it is checked on its own.
        "stub_soname": soname(f"{cuda_home}/lib64/stubs/libcuda.so"),
    }


def libcuda_dirs() -> tuple[list[str], list[str]]:
    """triton/backends/nvidia/driver.py:21-40: the directories of libcuda.so.1 in `ldconfig -p`, else
    those of LD_LIBRARY_PATH holding it; and the locations found."""
    proc = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, check=False)
    libs = proc.stdout.decode(errors="ignore")
    locs = [line.split()[-1] for line in libs.splitlines() if "libcuda.so.1" in line]
    dirs = [os.path.dirname(loc) for loc in locs]
    env_ld_library_path = os.getenv("LD_LIBRARY_PATH")
    if env_ld_library_path and not dirs:
        dirs = [d for d in env_ld_library_path.split(":") if os.path.exists(os.path.join(d, "libcuda.so.1"))]
    return [d for d in dirs if os.path.exists(os.path.join(d, "libcuda.so.1"))], locs


def triton() -> dict:
    cuda_home = os.environ["CUDA_HOME"]
    dirs, locs = libcuda_dirs()
    result: dict = {"steps": [], "libcuda_dirs": dirs, "libcuda_locations": locs}
    if not dirs:
        # driver.py:33-40, Triton's own words
        result["error"] = (
            'libcuda.so cannot found! Please make sure GPU is set up and then run "/sbin/ldconfig"'
        )
        return result
    # build.py:26-33: $CC, else gcc, else clang
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        result["error"] = "Failed to find C compiler. Please specify via CC environment variable"
        return result
    # build.py:34-39: the default scheme, posix_local read as posix_prefix (Debian's system python)
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":
        scheme = "posix_prefix"
    py_include_dir = sysconfig.get_paths(scheme=scheme)["include"]
    result["python_include"] = py_include_dir
    srcdir = os.getcwd()
    so = os.path.join(srcdir, "triton_launcher{}".format(sysconfig.get_config_var("EXT_SUFFIX")))
    # driver.py:14-16 + build.py:41-47. Triton's include dir is triton/backends/nvidia/include (its own
    # cuda.h); the tree's include/cuda.h stands in for it, Triton being installed only by the sglang phase.
    include_dirs = [f"{cuda_home}/include", srcdir, py_include_dir]
    cc_cmd = [cc, "triton_launcher.c", "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o", so]
    cc_cmd += ["-l:libcuda.so.1"]  # build.py:52-56 _library_flag("libcuda.so.1")
    cc_cmd += [f"-L{d}" for d in dirs]
    cc_cmd += [f"-I{d}" for d in include_dirs]
    result["steps"].append(run("compile", cc_cmd))
    if result["steps"][-1]["rc"] == 0:
        # build.py:65-71 _load_module_from_path, then one driver call through the loaded launcher
        try:
            spec = importlib.util.spec_from_file_location("triton_launcher", so)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            result["cu_init"] = module.cu_init()
        except (ImportError, OSError) as e:
            result["error"] = f"the launcher compiled but does not load: {e}"
    return result


def main() -> None:
    what = sys.argv[1]
    out = flashinfer(sys.argv[2]) if what == "flashinfer" else triton()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
