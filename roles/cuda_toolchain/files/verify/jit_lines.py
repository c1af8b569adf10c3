"""cuda_toolchain verification: build with flashinfer's and Triton's own command lines.

Run on the target with the interpreter the SGLang venv is made from (its sysconfig decides the python
include directory, as it does for both projects), in a scratch directory holding the sources:

    python jit_lines.py flashinfer SM [VENV]  flashinfer 0.6.11.post1 (flashinfer/jit/cpp_ext.py); VENV:
                                              where flashinfer is, for its vendored CCCL
    python jit_lines.py triton                Triton 3.6.0 (triton/runtime/build.py, backends/nvidia/driver)
    python jit_lines.py launch SM             GPU hosts: cuInit, a kernel on device 0, its result read back

Prints one JSON object: {"steps": [{"name", "argv", "rc", "output"}], ...}; never raises for a failed
build (the role turns the JSON into one message naming the step and the repair).
Standard library only: neither flashinfer nor Triton is installed when the toolchain phase runs.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
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


def flashinfer_arch(sm: str) -> str:
    """flashinfer's own arch suffix for compute capability `sm` ("120" -> "120f"), as
    flashinfer/compilation_context.py:34-59 (_normalize_cuda_arch) writes it for CUDA >= 12.9:
    SM 9.x -> "a"; SM 12.0 -> "0f", other 12.x -> "a"; SM 10+ -> "a"; below 9 no suffix."""
    major, minor = int(sm[:-1]), sm[-1]
    if major == 12:
        return f"{major}{minor}f" if minor == "0" else f"{major}{minor}a"
    if major == 9 or major >= 10:
        return f"{major}{minor}a"
    return f"{major}{minor}"


def flashinfer_cccl(venv: str | None, cuda_home: str) -> tuple[list[str], str]:
    """The CCCL include directories flashinfer puts first, with -I (cpp_ext.py:159-163): its vendored copy,
    flashinfer/data/cccl/{cub, libcudacxx/include, thrust} (flashinfer/jit/env.py:160-164), from the venv
    that has flashinfer (phase sglang installs it); until then the tree's own CCCL stands in. Returns the
    directories and where they came from."""
    for site in sorted(glob.glob(f"{venv}/lib/python3*/site-packages")) if venv else []:
        data = os.path.join(site, "flashinfer", "data", "cccl")
        dirs = [
            os.path.join(data, "cub"),
            os.path.join(data, "libcudacxx", "include"),
            os.path.join(data, "thrust"),
        ]
        if all(os.path.isdir(d) for d in dirs):
            return dirs, "flashinfer"
    return [f"{cuda_home}/include/cccl"], "toolkit"


def flashinfer(sm: str, venv: str | None = None) -> dict:
    cuda_home = os.environ["CUDA_HOME"]
    cccl, cccl_from = flashinfer_cccl(venv, cuda_home)
    # cpp_ext.py:124-141 get_system_includes: sysconfig's include, $cuda_home/include (then tvm-ffi's,
    # flashinfer's, CUTLASS's and spdlog's own include directories, which come with the flashinfer wheel).
    system_includes = [sysconfig.get_path("include"), f"{cuda_home}/include"]
    common = []
    if not sysconfig.get_config_var("Py_GIL_DISABLED"):  # cpp_ext.py:153-154
        common.append("-DPy_LIMITED_API=0x03090000")
    # cpp_ext.py:40-44: torch._C._GLIBCXX_USE_CXX11_ABI, which is 1 for the cu13 torch wheels.
    common.append("-D_GLIBCXX_USE_CXX11_ABI=1")
    common += [f"-I{directory}" for directory in cccl]  # cpp_ext.py:159-163, before every -isystem
    for directory in system_includes:  # cpp_ext.py:164-165, "-isystem DIR"
        common += ["-isystem", directory]
    cflags = [*common, "-fPIC"]  # cpp_ext.py:175-178
    arch = flashinfer_arch(sm)
    cuda_cflags = [  # cpp_ext.py:198-208 (CUDA >= 12.8), then the global flags (cpp_ext.py:210-229)
        *common,
        "--compiler-options=-fPIC",
        "--expt-relaxed-constexpr",
        "-static-global-template-stub=false",
        # compilation_context.py:98-101: one -gencode per target arch, then COMMON_NVCC_FLAGS (:28-31)
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
        "-DFLASHINFER_ENABLE_FP8_E8M0",
        "-DFLASHINFER_ENABLE_FP4_E2M1",
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
        "arch": arch,
        "cccl": cccl,
        "cccl_from": cccl_from,
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


# CUresult codes by name (cuda.h, enum cudaError_enum), for a libcuda whose cuGetErrorName does not answer
# (NVIDIA's stub answers every call with CUDA_ERROR_STUB_LIBRARY).
CU_RESULT_NAMES = {
    0: "CUDA_SUCCESS",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    100: "CUDA_ERROR_NO_DEVICE",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
}
# cuInit results that name their cause.
CU_INIT_CAUSES = {
    "CUDA_ERROR_NO_DEVICE": "the driver sees no GPU",
    "CUDA_ERROR_STUB_LIBRARY": "the link-time stub libcuda.so was loaded instead of the driver's: the driver "
    "userspace is not installed (role nvidia_userspace)",
    "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH": "the driver userspace and the kernel module are different versions",
    "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE": "the forward-compatibility libcuda does not serve this GPU",
    "CUDA_ERROR_NOT_INITIALIZED": "the driver did not initialise",
    "CUDA_ERROR_OPERATING_SYSTEM": "the operating system refused the driver (device node permissions?)",
    "CUDA_ERROR_UNKNOWN": "/dev/nvidia-uvm missing or unusable (a container without nvidia-uvm passed "
    "through typically gets 999)",
}
# cuInit opens /dev/nvidia-uvm; the UVM nodes come from nvidia-uvm.ko (nvidia-modprobe -u -c 0 on the node).
UVM_NODES = ("nvidia-uvm", "nvidia-uvm-tools")
DEVICE_NODE = re.compile(r"^nvidia(\d+|ctl|-uvm|-uvm-tools)$")
# nv.c writes "NVRM version: NVIDIA UNIX ... Kernel Module  580.95.05  ..." into /proc/driver/nvidia/version.
MODULE_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)\s")


def gpu_causes(
    cu_init_name: str | None, dev_nodes: list[str], module_version: str | None, userspace_version: str | None
) -> list[str]:
    """Why a host that should have GPUs cannot run a kernel, from what it shows: its device nodes, the
    module version in /proc/driver/nvidia/version, the version libcuda.so.1 resolves to, cuInit's answer."""
    causes = []
    if not any(DEVICE_NODE.match(name) for name in dev_nodes):
        causes.append(
            "no /dev/nvidia* device node: the GPUs are not passed into this host (proxmox_lxc_gpu_count)"
        )
    elif not any(name[6:].isdigit() for name in dev_nodes if name.startswith("nvidia")):
        causes.append("no /dev/nvidiaN (only " + ", ".join(sorted(dev_nodes)) + ")")
    if any(DEVICE_NODE.match(name) for name in dev_nodes):
        missing_uvm = [name for name in UVM_NODES if name not in dev_nodes]
        if missing_uvm:
            nodes = ", ".join(f"/dev/{name}" for name in missing_uvm)
            causes.append(
                f"no {nodes}: nvidia_uvm is not loaded on the node or its nodes are not passed into this "
                "host (phase host makes them, proxmox_lxc passes them)"
            )
    if module_version is None:
        causes.append("no /proc/driver/nvidia/version: the nvidia kernel module is not loaded on the node")
    if userspace_version is None:
        causes.append(
            "no libcuda.so.1 in `ldconfig -p`: the driver userspace is not installed (role nvidia_userspace)"
        )
    elif module_version and userspace_version != module_version:
        causes.append(
            f"driver/userspace mismatch: kernel module {module_version}, libcuda.so {userspace_version}"
        )
    if cu_init_name and cu_init_name != "CUDA_SUCCESS" and cu_init_name in CU_INIT_CAUSES:
        causes.append(f"{cu_init_name}: {CU_INIT_CAUSES[cu_init_name]}")
    return causes


def _module_version() -> str | None:
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            found = MODULE_VERSION.search(f.read())
    except OSError:
        return None
    return found.group(1) if found else None


def _userspace_version() -> str | None:
    _, locations = libcuda_dirs()
    for location in locations:
        real = os.path.basename(os.path.realpath(location))
        if real.startswith("libcuda.so.") and real != "libcuda.so.1":
            return real[len("libcuda.so.") :]
    return None


def launch(sm: str) -> dict:
    cuda_home = os.environ["CUDA_HOME"]
    gencode = f"arch=compute_{sm},code=sm_{sm}"
    stubs = f"-L{cuda_home}/lib64/stubs"
    argv = ["nvcc", "-gencode", gencode, "-cudart", "shared", "launch.cu", stubs, "-lcuda", "-o", "launch"]
    result: dict = {"steps": [run("compile", argv)]}
    if result["steps"][-1]["rc"] == 0:
        step = run("run", [os.path.join(os.getcwd(), "launch")])
        result["steps"].append(step)
        for line in step["output"].splitlines():
            word, _, rest = line.partition(" ")
            if word == "cuInit":
                code, _, name = rest.partition(" ")
                result["cu_init"] = int(code)
                known = CU_RESULT_NAMES.get(int(code), name)
                result["cu_init_name"] = name if name.startswith("CUDA_") else known
            elif word == "devices":
                result["devices"] = int(rest)
            elif word == "launch":
                result["launch"] = rest
            elif word == "value":
                result["value_diff"] = rest
        result["ok"] = step["rc"] == 0
    else:
        result["ok"] = False
    if not result["ok"]:
        dev_nodes = os.listdir("/dev") if os.path.isdir("/dev") else []
        result["causes"] = gpu_causes(
            result.get("cu_init_name"), dev_nodes, _module_version(), _userspace_version()
        )
    return result


def main() -> None:
    what = sys.argv[1]
    if what == "flashinfer":
        out = flashinfer(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    elif what == "launch":
        out = launch(sys.argv[2])
    else:
        out = triton()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
