"""The lab's stand-in NVIDIA driver: a `.run`-like installer of a driver userspace, and the host's
kernel module version as a container sees it.

A real CT on a PVE GPU node sees the host's /proc, so /proc/driver/nvidia/version names the host
module's version; the CT needs that exact version's userspace (libcuda.so.1, libnvidia-ml.so.1,
nvidia-smi), installed from NVIDIA's `NVIDIA-Linux-x86_64-V.run` with `--no-kernel-modules --silent`.
The lab has no GPU and no nvidia module, so it builds both halves itself:

- `build_installer(settings, version)`: `NVIDIA-Linux-x86_64-<version>.run`, a self-extracting shell
  script (as NVIDIA's makeself archive is) that installs, for that version:
  - `libcuda.so.<version>` (+ `libcuda.so.1`, `libcuda.so`): a real shared object built with gcc that
    exports the driver API entry points; `cuInit` answers CUDA_ERROR_NO_DEVICE (100), as the real
    driver does on a host without a GPU; `cuDriverGetVersion` answers the driver's CUDA version;
  - `libnvidia-ml.so.<version>` (+ `.so.1`): NVML with no device; `nvmlSystemGetDriverVersion` answers;
  - `/usr/bin/nvidia-smi`: answers the queries the project uses (`--query-gpu=...`,
    `--query-compute-apps=...`, `--version`) and, like the real one, fails with "Driver/library version
    mismatch" (exit 18) when the module version differs from its own, and exit 9 without a module.
  The installer refuses to run without modprobe, rmmod, lsmod and depmod (kmod) on $PATH or in
  /bin:/usr/bin:/sbin:/usr/sbin, with the real one's message (nvidia-installer 590.48.01 looks for them
  even with --no-kernel-modules: nvidia-installer.c:705-706, misc.c:534-537, 600-623, 853-880), without
  `--no-kernel-modules` or its alias `--no-kernel-module` (it cannot build a kernel module in a
  container, as the real one cannot) and without `--silent` (no interactive UI here).
- `declare_module(settings, version)`: writes `<state>/proc-driver/nvidia/version` in the real
  driver's format; the lab's containers bind-mount `<state>/proc-driver` over their /proc/driver
  (container.py), so the CT reads the declared module version where a real CT reads the host's.
- Every lab CT sees that one declaration, as every CT of a node sees the host's module. A test that
  changes it does so inside `module_changing(settings)` (the driver lock, exclusive, and the default
  declared again on the way out); a test session that runs the driver's userspace in another CT at the
  same time runs each play inside `module_steady()` (shared).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import io
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .settings import LabSettings

# The module version the lab declares unless told otherwise: the 580 branch, the first with CUDA 13.
DEFAULT_MODULE_VERSION = "580.95.05"
# Taken shared by whoever needs the declared module to stay put, exclusive by whoever changes it. Outside
# the state directory, which `lab down` removes while others may hold this.
DRIVER_LOCK = Path("/tmp/sglfleet-lab-driver.lock")
VERSION = re.compile(r"^\d{3}\.\d{2,3}(\.\d{2})?$")
# The version in /proc/driver/nvidia/version: "... Kernel Module  550.54.14  ..." (proprietary) or
# "... Open Kernel Module for x86_64  580.95.05  ..." (open modules).
MODULE_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)\s")
# cuDriverGetVersion's answer per branch (CUDA major * 1000 + minor * 10): 580 ships CUDA 13.0.
CUDA_VERSION = {"5": 12080, "58": 13000, "59": 13010}

# The real module's line (open kernel modules): nvidia's nv.c prints it into /proc/driver/nvidia/version.
MODULE_LINE = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
    "(sglfleet-lab@stand-in)  Thu Jan  1 00:00:00 UTC 2026\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n"
)

LIBCUDA_C = r"""
/* Stand-in libcuda.so.1 of the sglfleet lab: the driver API of a host without a GPU. */
#include <stddef.h>
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
int cuInit(unsigned int flags) { (void)flags; return CUDA_ERROR_NO_DEVICE; }
int cuDriverGetVersion(int *v) { if (!v) return CUDA_ERROR_INVALID_VALUE; *v = @CUDA@; return CUDA_SUCCESS; }
int cuDeviceGetCount(int *n) { if (n) *n = 0; return CUDA_ERROR_NOT_INITIALIZED; }
static const char *name_of(int e) {
  return e == 0 ? "CUDA_SUCCESS" : e == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_NOT_INITIALIZED";
}
static const char *text_of(int e) {
  return e == 0 ? "no error" : e == 100 ? "no CUDA-capable device is detected" : "initialization error";
}
int cuGetErrorName(int e, const char **s) { if (s) *s = name_of(e); return CUDA_SUCCESS; }
int cuGetErrorString(int e, const char **s) { if (s) *s = text_of(e); return CUDA_SUCCESS; }
int cuGetProcAddress(const char *s, void **p, int v, unsigned long long f) {
  (void)s; (void)v; (void)f; if (p) *p = NULL; return CUDA_ERROR_NOT_INITIALIZED;
}
int cuGetProcAddress_v2(const char *s, void **p, int v, unsigned long long f, void *st) {
  (void)st; return cuGetProcAddress(s, p, v, f);
}
#define NOT_INIT(name) int name(void) { return CUDA_ERROR_NOT_INITIALIZED; }
NOT_INIT(cuDeviceGet) NOT_INIT(cuDeviceGetName) NOT_INIT(cuDeviceGetAttribute)
NOT_INIT(cuDeviceTotalMem_v2) NOT_INIT(cuDevicePrimaryCtxRetain)
NOT_INIT(cuDevicePrimaryCtxRelease_v2) NOT_INIT(cuCtxGetCurrent) NOT_INIT(cuCtxSetCurrent)
NOT_INIT(cuCtxGetDevice) NOT_INIT(cuCtxSynchronize) NOT_INIT(cuModuleLoadData)
NOT_INIT(cuModuleLoadDataEx) NOT_INIT(cuModuleUnload) NOT_INIT(cuModuleGetFunction)
NOT_INIT(cuModuleGetGlobal_v2) NOT_INIT(cuLibraryLoadData) NOT_INIT(cuLibraryUnload)
NOT_INIT(cuLibraryGetKernel) NOT_INIT(cuKernelGetFunction) NOT_INIT(cuFuncGetAttribute)
NOT_INIT(cuFuncSetAttribute) NOT_INIT(cuFuncSetCacheConfig) NOT_INIT(cuLaunchKernel)
NOT_INIT(cuLaunchKernelEx) NOT_INIT(cuLaunchCooperativeKernel)
NOT_INIT(cuOccupancyMaxActiveClusters) NOT_INIT(cuPointerGetAttribute)
NOT_INIT(cuPointerGetAttributes) NOT_INIT(cuMemAlloc_v2) NOT_INIT(cuMemFree_v2)
NOT_INIT(cuMemcpyHtoD_v2) NOT_INIT(cuMemcpyDtoH_v2) NOT_INIT(cuMemGetInfo_v2)
NOT_INIT(cuStreamCreate) NOT_INIT(cuStreamDestroy_v2) NOT_INIT(cuStreamSynchronize)
NOT_INIT(cuEventCreate) NOT_INIT(cuEventRecord) NOT_INIT(cuEventSynchronize)
NOT_INIT(cuTensorMapEncodeTiled) NOT_INIT(cuTensorMapEncodeIm2col)
"""

LIBNVML_C = r"""
/* Stand-in libnvidia-ml.so.1 of the sglfleet lab: NVML on a host without a GPU. */
#include <string.h>
#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_INSUFFICIENT_SIZE 7
int nvmlInit_v2(void) { return NVML_SUCCESS; }
int nvmlInitWithFlags(unsigned int f) { (void)f; return NVML_SUCCESS; }
int nvmlShutdown(void) { return NVML_SUCCESS; }
int nvmlDeviceGetCount_v2(unsigned int *n) {
  if (!n) return NVML_ERROR_INVALID_ARGUMENT;
  *n = 0;
  return NVML_SUCCESS;
}
int nvmlSystemGetDriverVersion(char *s, unsigned int len) {
  const char *v = "@VERSION@";
  if (!s) return NVML_ERROR_INVALID_ARGUMENT;
  if (len < strlen(v) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
  strcpy(s, v);
  return NVML_SUCCESS;
}
int nvmlSystemGetCudaDriverVersion_v2(int *v) {
  if (!v) return NVML_ERROR_INVALID_ARGUMENT;
  *v = @CUDA@;
  return NVML_SUCCESS;
}
const char *nvmlErrorString(int e) { return e == 0 ? "Success" : "Unknown Error"; }
"""

# nvidia-smi, for the queries the project makes (sglfleet.fleet._gpus: --query-gpu with
# index,uuid,name,memory.used,memory.total,compute_cap,driver_version; --query-compute-apps; the
# nvidia_userspace role: --query-gpu=driver_version). The GPUs it lists are kpro6's eight RTX PRO 6000.
NVIDIA_SMI = r"""#!/bin/bash
# Stand-in nvidia-smi of the sglfleet lab, userspace version @VERSION@.
userspace=@VERSION@
# The version stands between two double spaces in the module's line (both module flavours).
module=$(sed -n 's/^NVRM version:.*  \([0-9]\{3\}\.[0-9][0-9.]*\)  .*/\1/p' \
  /proc/driver/nvidia/version 2>/dev/null)
if [ -z "$module" ]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." \
    "Make sure that the latest NVIDIA driver is installed and running."
  exit 9
fi
if [ "$module" != "$userspace" ]; then
  echo "Failed to initialize NVML: Driver/library version mismatch"
  echo "NVML library version: ${userspace%.*}"
  exit 18
fi
field() {
  case "$1" in
    index) echo "$2" ;;
    uuid) echo "GPU-3f0a2c1e-5d7b-4e43-9a61-0c2d8e7f9b1$2" ;;
    name) echo "NVIDIA RTX PRO 6000 Blackwell Server Edition" ;;
    memory.used) echo 0 ;;
    memory.total) echo 97887 ;;
    compute_cap) echo 12.0 ;;
    driver_version) echo "$userspace" ;;
    *) echo "Field \"$1\" is not a valid field to query." >&2; return 2 ;;
  esac
}
case "$*" in
  *--query-gpu=*)
    query=$(printf '%s\n' "$@" | sed -n 's/^--query-gpu=//p')
    for i in 0 1 2 3 4 5 6 7; do
      line=""
      for name in ${query//,/ }; do
        value=$(field "$name" "$i") || exit 2
        line="${line:+$line, }$value"
      done
      echo "$line"
    done
    ;;
  *--query-compute-apps=*) ;;
  *--version*)
    echo "NVIDIA-SMI version  : $userspace"
    echo "NVML version        : ${userspace%.*}"
    echo "DRIVER version      : $userspace"
    ;;
  *)
    echo "stand-in nvidia-smi: unsupported arguments: $*" >&2
    exit 2
    ;;
esac
"""

# The installer: NVIDIA's .run is a makeself archive whose nvidia-installer takes --no-kernel-modules
# ("Install everything but the kernel modules, and do not remove any existing, possibly conflicting, kernel
# modules.", option_table.h:469-477; --no-kernel-module is its undocumented backwards-compatible alias,
# which this one accepts too) and -s/--silent; this one checks the same flags and
# installs the same files (libraries into the multiarch directory, nvidia-smi into /usr/bin), removes
# a previously installed version first (as nvidia-installer uninstalls an existing driver), runs
# ldconfig and logs to /var/log/nvidia-installer.log.
INSTALLER = r"""#!/bin/sh
# NVIDIA-Linux-x86_64-@VERSION@.run: the sglfleet lab's stand-in of NVIDIA's driver installer.
version=@VERSION@
no_kernel_module=0; silent=0
for arg in "$@"; do
  case "$arg" in
    --no-kernel-module|--no-kernel-modules) no_kernel_module=1 ;;
    -s|--silent) silent=1 ;;
    -v|--version) echo "nvidia-installer:  version $version"; exit 0 ;;
    --no-questions|--accept-license|--no-x-check|--no-nouveau-check|--no-drm|--no-systemd) ;;
    *) echo "ERROR: Unrecognized option: '$arg'; run with --help" >&2; exit 1 ;;
  esac
done
log=/var/log/nvidia-installer.log
# nvidia-installer looks for the module utilities before anything else, --no-kernel-modules or not
# (NVIDIA/nvidia-installer 590.48.01: nvidia-installer.c:705-706; find_module_utils, misc.c:600-623, over
# $PATH then EXTRA_PATH, misc.c:500 and 853-880, a regular executable file; the list, misc.c:534-537).
for util in modprobe rmmod lsmod depmod; do
  found=""
  for dir in $(echo "${PATH:-}:/bin:/usr/bin:/sbin:/usr/sbin:/usr/X11R6/bin:/usr/bin/X11" | tr ':' ' '); do
    if [ -f "$dir/$util" ] && [ -x "$dir/$util" ]; then found="$dir/$util"; break; fi
  done
  if [ -z "$found" ]; then
    echo "ERROR: Unable to find the module utility \`$util\`; please make sure you have the package" \
      "'module-init-tools' or 'kmod' installed.  If you do have 'module-init-tools' or 'kmod' installed," \
      "then please check that \`$util\` is in your PATH." >&2
    exit 1
  fi
done
if [ "$silent" != 1 ]; then
  echo "ERROR: this stand-in has no interactive interface: run it with --silent" >&2; exit 1
fi
if [ "$no_kernel_module" != 1 ]; then
  echo "ERROR: Unable to find the kernel source tree for the currently running kernel." \
    "(a container cannot build the NVIDIA kernel module: use --no-kernel-modules)" >&2
  exit 1
fi
libdir=/usr/lib/x86_64-linux-gnu
manifest=/var/lib/nvidia-standin/installed
if [ -f "$manifest" ]; then
  echo "-> uninstalling the existing driver $(head -1 $manifest)" >> "$log"
  tail -n +2 "$manifest" | while read -r f; do rm -f "$f"; done
fi
payload=$(mktemp -d)
trap 'rm -rf "$payload"' EXIT
sed '1,/^__PAYLOAD__$/d' "$0" | base64 -d | tar -xz -C "$payload"
install -D -m 0755 "$payload/nvidia-smi" /usr/bin/nvidia-smi
install -D -m 0755 "$payload/libcuda.so" "$libdir/libcuda.so.$version"
install -D -m 0755 "$payload/libnvidia-ml.so" "$libdir/libnvidia-ml.so.$version"
ln -sf "libcuda.so.$version" "$libdir/libcuda.so.1"
ln -sf libcuda.so.1 "$libdir/libcuda.so"
ln -sf "libnvidia-ml.so.$version" "$libdir/libnvidia-ml.so.1"
mkdir -p "$(dirname $manifest)"
printf '%s\n' "$version" /usr/bin/nvidia-smi "$libdir/libcuda.so.$version" "$libdir/libcuda.so.1" \
  "$libdir/libcuda.so" "$libdir/libnvidia-ml.so.$version" "$libdir/libnvidia-ml.so.1" > "$manifest"
ldconfig
echo "nvidia-installer: installed the userspace of driver $version (no kernel module)" >> "$log"
exit 0
__PAYLOAD__
"""


class DriverError(RuntimeError):
    """The stand-in driver cannot be built or declared as asked."""


@dataclass(frozen=True)
class Installer:
    """A built installer: its file and the sha256 the inventory declares for it."""

    version: str
    path: Path
    sha256: str


def check_version(version: str) -> str:
    if not VERSION.match(version):
        raise DriverError(f"{version!r} is not an NVIDIA driver version such as {DEFAULT_MODULE_VERSION}")
    return version


def installer_path(settings: LabSettings, version: str) -> Path:
    return settings.state_dir / "driver" / f"NVIDIA-Linux-x86_64-{check_version(version)}.run"


def _cuda_version(version: str) -> int:
    branch = version.split(".", 1)[0]
    for prefix in sorted(CUDA_VERSION, key=len, reverse=True):
        if branch.startswith(prefix):
            return CUDA_VERSION[prefix]
    return 12080


def _compile(source: str, soname: str, out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "lib.c"
        src.write_text(source)
        cmd = ["gcc", "-shared", "-fPIC", "-O2", f"-Wl,-soname,{soname}", "-o", str(out), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise DriverError(f"building the stand-in {soname} failed: {proc.stderr.strip()}")


def build_installer(settings: LabSettings, version: str = DEFAULT_MODULE_VERSION) -> Installer:
    """Build (or reuse) the stand-in NVIDIA-Linux-x86_64-<version>.run under the lab's state dir; one
    built by an older stand-in is built again."""
    path = installer_path(settings, version)
    script = INSTALLER.replace("@VERSION@", version)
    # missing, or built by an older stand-in
    if not path.is_file() or not path.read_bytes().startswith(script.encode()):
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        cuda = str(_cuda_version(version))
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            _compile(LIBCUDA_C.replace("@CUDA@", cuda), "libcuda.so.1", work / "libcuda.so")
            _compile(
                LIBNVML_C.replace("@VERSION@", version).replace("@CUDA@", cuda),
                "libnvidia-ml.so.1",
                work / "libnvidia-ml.so",
            )
            (work / "nvidia-smi").write_text(NVIDIA_SMI.replace("@VERSION@", version))
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w:gz") as tar:
                for name in ("libcuda.so", "libnvidia-ml.so", "nvidia-smi"):
                    tar.add(work / name, arcname=name)
        payload = base64.encodebytes(buf.getvalue()).decode()
        tmp_path = path.with_suffix(".tmp")
        tmp_path.write_text(script + payload)
        tmp_path.chmod(0o755)
        tmp_path.replace(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    path.with_name(path.name + ".sha256").write_text(f"{digest}  {path.name}\n")
    return Installer(version, path, digest)


def proc_driver_dir(settings: LabSettings) -> Path:
    """What the lab's containers see as /proc/driver (bind-mounted read-only)."""
    return settings.state_dir / "proc-driver"


def declare_module(settings: LabSettings, version: str | None) -> Path:
    """Declare the host module's version as the CT sees it; None: no module loaded (no nvidia/ dir)."""
    nvidia = proc_driver_dir(settings) / "nvidia"
    nvidia.mkdir(mode=0o755, parents=True, exist_ok=True)
    version_file = nvidia / "version"
    if version is None:
        version_file.unlink(missing_ok=True)
    else:
        version_file.write_text(MODULE_LINE.format(version=check_version(version)))
        version_file.chmod(0o444)
    return version_file


@contextlib.contextmanager
def _driver_lock(mode: int) -> Iterator[None]:
    with DRIVER_LOCK.open("a") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def module_steady() -> Iterator[None]:
    """The declared module does not change during the block (other holders of this may share it)."""
    with _driver_lock(fcntl.LOCK_SH):
        yield


@contextlib.contextmanager
def module_changing(settings: LabSettings, default: str = DEFAULT_MODULE_VERSION) -> Iterator[None]:
    """The block may declare other module versions; nobody in module_steady() runs meanwhile, and
    `default` is declared again at the end, however the block ends."""
    with _driver_lock(fcntl.LOCK_EX):
        try:
            yield
        finally:
            declare_module(settings, default)


def declared_module(settings: LabSettings) -> str | None:
    """The module version the lab declares now, or None."""
    version_file = proc_driver_dir(settings) / "nvidia" / "version"
    if not version_file.is_file():
        return None
    found = MODULE_VERSION.search(version_file.read_text())
    return found.group(1) if found else None
