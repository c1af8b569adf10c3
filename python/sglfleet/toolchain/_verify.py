"""What role cuda_toolchain's verification concludes from what its checks printed: one verdict per check
(passed or not, and the message that names the cause and the task that repairs it), and the wheels that
drifted from the release's pins.

The role runs each check on the host (nvcc, a PTX compile, ptxas, the -cudart shared link, a host compile
against the CCCL headers, flashinfer's and Triton's JIT lines, a kernel on GPU 0), never failing on the
command itself, and hands the registered results to module `toolchain_verdict`; its asserts then fail at
the first check that did not pass, in the same order, with the message decided here. The messages quote
what the tools print (docs/troubleshooting.md): ptxas's "Unsupported .version 9.5; current version is
'9.2'", ld's "cannot find -lcudart" and "cannot find -lcuda", g++'s "cuda/std/cstdint: No such file or
directory" and "Python.h: No such file or directory", Triton's "libcuda.so cannot found!".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["CHECKS", "FIX_TASKS", "Check", "ToolchainFacts", "drift", "verdicts"]

# The tasks a message tells the user to run, by the role's own task names (a unit test checks that each is a
# task of roles/cuda_toolchain).
PIN_TASK = "cuda_toolchain : Install every CUDA component pinned to one release"
TREE_TASK = "cuda_toolchain : Link the CUDA_HOME tree (bin, include, lib, lib64, nvvm)"
CUDART_TASK = "cuda_toolchain : Link lib64/libcudart.so -> libcudart.so.13"
CCCL_TASK = "cuda_toolchain : Overlay the CCCL headers at include/ (cub, cuda, nv, thrust)"
COMPILER_TASK = "cuda_toolchain : Install the host compiler and venv support"
HEADERS_TASK = "cuda_toolchain : Install the headers of the JIT python (python3.X-dev for its X)"
STUB_TASK = "cuda_toolchain : Build lib64/stubs/libcuda.so (SONAME libcuda.so.1)"
FIX_TASKS = (PIN_TASK, TREE_TASK, CUDART_TASK, CCCL_TASK, COMPILER_TASK, HEADERS_TASK, STUB_TASK)

# The checks in the order the role asserts them (the first one that did not pass fails the play).
CHECKS = ("nvcc", "ptx", "ptxas", "cudart", "host_cccl", "flashinfer", "triton", "gpu", "pins")

# A line of a tool's output that says what went wrong (the rest is context).
_ERROR_LINE = re.compile(r"(?i)error|fatal|cannot find|unsupported")
_PTX_VERSION = re.compile(r"(?m)^\.version\s+(\S+)")
_PTX_TARGET = re.compile(r"(?m)^\.target\s+(\S+)")
# ld's "cannot find -lcuda", not "cannot find -lcudart" (which names another fix).
_NO_LIBCUDA = re.compile(r"cannot find -lcuda(?!rt)")


@dataclass(frozen=True)
class ToolchainFacts:
    """What the messages name: the release and its pins, the tree, the interpreters, the host."""

    version: str  # the release, e.g. 13.2.2
    release: Mapping[str, str]  # component -> pinned version, and nvcc, ptx_isa
    wheels: Mapping[str, str]  # component -> its wheel's name
    prefix: str
    venv: str
    sm: str
    jit_python: str
    host: str
    how: str = "run the role without --tags verify"

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])


@dataclass(frozen=True)
class Check:
    ok: bool
    msg: str  # why it failed, and the fix ("" when it passed)
    success_msg: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def drift(facts: ToolchainFacts, installed: Mapping[str, str | None]) -> list[str]:
    """Each wheel whose installed version is not the release's pin, as `<wheel> is <found or missing>,
    release <version> pins <pin>`."""
    return [
        f"{wheel} is {installed.get(wheel) or 'missing'}, release {facts.version} pins "
        f"{facts.release[component]}"
        for component, wheel in facts.wheels.items()
        if installed.get(wheel) != facts.release[component]
    ]


def _lines(text: Any) -> list[str]:
    return str(text or "").splitlines()


def _errors(lines: Sequence[str]) -> str:
    """The last two lines that say what went wrong (else the last two), one line, without a final stop."""
    picked = [line for line in lines if _ERROR_LINE.search(line)] or list(lines)
    return re.sub(r"\.$", "", " | ".join(picked[-2:]))


def _json(result: Mapping[str, Any], fallback: dict[str, Any]) -> dict[str, Any]:
    if result.get("rc") != 0:
        return fallback
    try:
        value = json.loads(result.get("stdout") or "")
    except ValueError:
        return fallback
    return value if isinstance(value, dict) else fallback


def _join(*parts: str) -> str:
    return " ".join(p.strip() for p in parts if p and p.strip())


class _Verdicts:
    def __init__(self, facts: ToolchainFacts, drift_msg: str) -> None:
        self.f = facts
        self.drift = drift_msg
        self.fix = f"Fix: {facts.how};"

    def nvcc(self, r: Mapping[str, Any]) -> Check:
        f = self.f
        out = _lines(r.get("stdout"))
        ok = r.get("rc") == 0 and f"release {f.minor}, V{f.release['nvcc']}" in str(r.get("stdout") or "")
        seen = " ".join(out[-2:]) or str(r.get("msg") or r.get("stderr") or "")
        msg = _join(
            f"{f.prefix}/bin/nvcc does not report release {f.minor} (V{f.release['nvcc']}): {seen}.",
            self.drift,
            f"{self.fix} tasks '{PIN_TASK}' and '{TREE_TASK}' repair it.",
        )
        return Check(ok, "" if ok else msg, out[-2] if len(out) >= 2 else "")

    def ptx(self, r: Mapping[str, Any], ptx_text: str) -> Check:
        f = self.f
        isa = f.release["ptx_isa"]
        version = (m.group(1) if (m := _PTX_VERSION.search(ptx_text)) else None) or "none"
        target = (m.group(1) if (m := _PTX_TARGET.search(ptx_text)) else None) or "none"
        ok = r.get("rc") == 0 and version == isa and target == f"sm_{f.sm}"
        if version not in ("none", isa):
            what = (
                f"PTX version mismatch: nvvm emits PTX ISA {version}, release {f.version}'s ptxas "
                f"accepts {isa} "
                f"(ptxas: \"Unsupported .version {version}; current version is '{isa}'\")."
            )
        else:
            what = (
                f"nvcc -ptx for compute_{f.sm} gave PTX ISA {version}, target {target} (rc {r.get('rc')}): "
                f"{_errors(_lines(r.get('stderr')))}."
            )
        msg = _join(
            what, self.drift, f"{self.fix} task '{PIN_TASK}' puts every component back on the release's pin."
        )
        return Check(ok, "" if ok else msg, f"PTX ISA {version}, target {target}")

    def ptxas(self, r: Mapping[str, Any]) -> Check:
        stderr = str(r.get("stderr") or "")
        head = (
            "PTX version mismatch between nvvm and ptxas:"
            if "Unsupported .version" in stderr
            else f"nvcc -c for sm_{self.f.sm} failed:"
        )
        msg = _join(
            f"{head} {_errors(_lines(stderr))}.", self.drift, f"{self.fix} task '{PIN_TASK}' repairs it."
        )
        return Check(r.get("rc") == 0, "" if r.get("rc") == 0 else msg)

    def cudart(self, r: Mapping[str, Any]) -> Check:
        stderr = str(r.get("stderr") or "")
        why = (
            "The wheels ship only libcudart.so.13; the unversioned libcudart.so link is missing."
            if "cannot find -lcudart" in stderr
            else ""
        )
        msg = _join(
            f"Linking with -cudart shared failed: {_errors(_lines(stderr))}.",
            why,
            f"{self.fix} task '{CUDART_TASK}' repairs it.",
        )
        return Check(r.get("rc") == 0, "" if r.get("rc") == 0 else msg)

    def host_cccl(self, r: Mapping[str, Any]) -> Check:
        f = self.f
        stderr = str(r.get("stderr") or "")
        picked = [line for line in stderr.splitlines() if _ERROR_LINE.search(line)] or [
            str(r.get("msg") or "")
        ]
        errors = re.sub(r"\.$", "", " | ".join(picked[-2:]))
        if "Errno 2" in str(r.get("msg") or ""):  # Ansible could not start g++
            fix = f"g++ is not installed. Fix: task '{COMPILER_TASK}' installs it."
        else:
            fix = _join(
                "The CCCL headers (cuda/, cub/, thrust/, nv/) are not at the top of include/."
                if "No such file" in stderr
                else "",
                f"{self.fix} task '{CCCL_TASK}' repairs it.",
            )
        msg = _join(f"g++ -I{f.prefix}/include on a file including <cuda/std/cstdint> failed: {errors}.", fix)
        return Check(r.get("rc") == 0, "" if r.get("rc") == 0 else msg)

    def flashinfer(self, r: Mapping[str, Any]) -> Check:
        f = self.f
        fi = _json(r, {"steps": []})
        steps = fi.get("steps") or []
        last = steps[-1] if steps else {"name": "start", "rc": 1, "output": str(r.get("stderr") or "")}
        output = str(last.get("output") or "")
        needed = list(fi.get("needed") or [])
        stub = fi.get("stub_soname")
        linked = last.get("name") == "link" and last.get("rc") == 0
        ok = linked and "libcuda.so.1" in needed and "libcudart.so.13" in needed and stub == "libcuda.so.1"
        if linked and stub != "libcuda.so.1":
            which = f" or not the driver stub (SONAME {stub})" if stub else ""
            msg = (
                f"lib64/stubs/libcuda.so is missing{which}: flashinfer links -L$CUDA_HOME/lib64/stubs "
                '-lcuda, and a host without the driver\'s own libcuda.so fails with "cannot find -lcuda". '
                f"{self.fix} task '{STUB_TASK}' builds it."
            )
        elif linked:
            msg = (
                f"flashinfer's link line linked, but the extension NEEDs {', '.join(needed)} instead of "
                "libcuda.so.1 and libcudart.so.13: lib64/stubs/libcuda.so is not the driver stub. "
                f"{self.fix} task '{STUB_TASK}' rebuilds it."
            )
        else:
            if "Python.h" in output:
                fix = f"The headers of {f.jit_python} are missing. Fix: task '{HEADERS_TASK}' installs them."
            elif _NO_LIBCUDA.search(output):
                fix = (
                    "lib64/stubs/libcuda.so is missing (the wheels ship no driver stub). "
                    f"{self.fix} task '{STUB_TASK}' builds it."
                )
            elif "cannot find -lcudart" in output:
                fix = (
                    "lib64/libcudart.so is missing (the wheel ships only libcudart.so.13). "
                    f"{self.fix} task '{CUDART_TASK}' repairs it."
                )
            elif "No such file" in output:
                fix = f"{self.fix} task '{CCCL_TASK}' repairs the include tree."
            else:
                fix = _join(self.drift, f"{self.fix} task '{PIN_TASK}' repairs it.")
            msg = _join(
                f"flashinfer's JIT {last.get('name')} step failed: {_errors(output.splitlines())}.", fix
            )
        first = steps[0] if steps else {}
        success = (
            f"{' '.join(first.get('argv') or [])}; {' '.join(last.get('argv') or [])} -> NEEDED "
            f"{', '.join(needed)} (sm_{fi.get('arch') or '?'}, CCCL from {fi.get('cccl_from') or '?'})"
        )
        return Check(ok, "" if ok else msg, success)

    def triton(self, r: Mapping[str, Any]) -> Check:
        f = self.f
        tr = _json(r, {"steps": [], "error": str(r.get("stderr") or "")})
        steps = tr.get("steps") or []
        last = steps[-1] if steps else {"rc": 1, "output": ""}
        output = str(last.get("output") or "")
        error = tr.get("error")
        ok = error is None and last.get("rc") == 0 and "cu_init" in tr
        if error is not None and "libcuda.so cannot found" in str(error):
            msg = (
                f'Triton finds no libcuda.so.1: `ldconfig -p` does not list it ("{error}"). The driver '
                f"userspace is not installed in {f.host}: run role nvidia_userspace (phase toolchain, before "
                "this role), or set cuda_toolchain_verify_triton: false."
            )
        elif error is not None:
            msg = f"Triton's launcher: {error}."
        else:
            msg = _join(
                f"Triton's launcher compile failed: {_errors(output.splitlines())}.",
                f"The headers of {f.jit_python} ({tr.get('python_include')}) are missing. "
                f"Fix: task '{HEADERS_TASK}' installs them."
                if "Python.h" in output
                else "",
            )
        success = f"{' '.join(last.get('argv') or [])}; loaded, cuInit -> {tr.get('cu_init', '?')}"
        return Check(ok, "" if ok else msg, success)

    @staticmethod
    def gpu(r: Mapping[str, Any]) -> Check:
        fallback = {"ok": False, "steps": [{"name": "start", "output": str(r.get("stderr") or "")}]}
        gpu = _json(r, fallback)
        steps = gpu.get("steps") or []
        last = steps[-1] if steps else {"name": "start", "output": ""}
        if "cu_init" in gpu:
            what = f"cuInit returned {gpu.get('cu_init_name')}={gpu['cu_init']}"
            if gpu["cu_init"] == 0:
                what += f", then the launch on device 0 gave {gpu.get('launch') or 'no answer'}"
                if str(gpu.get("value_diff", "0")) != "0":
                    what += f" and a wrong value (xor {gpu['value_diff']})"
        else:
            tail = " | ".join(str(last.get("output") or "").splitlines()[-2:])
            what = f"the {last.get('name')} step failed: {tail}"
        msg = (
            f"This host should have GPUs (sglfleet_gpus_expected=true) but cannot run a kernel: {what}. "
            f"Cause: {'; '.join(gpu.get('causes') or []) or 'unknown'}. "
            "Fix: pass the GPUs into the CT (proxmox_lxc_gpu_count, phase provision), load the driver on the "
            "node (phase host), install the node driver's exact userspace (role nvidia_userspace), or, on a "
            "machine that has no GPU by design, set sglfleet_gpus_expected: false in its inventory."
        )
        ok = bool(gpu.get("ok"))
        success = (
            f"cuInit -> CUDA_SUCCESS, {gpu.get('devices', '?')} device(s), kernel on device 0 -> right value"
        )
        return Check(ok, "" if ok else msg, success)

    def pins(self, drifted: Sequence[str], requirements: Sequence[str]) -> Check:
        f = self.f
        msg = (
            f"The wheels in {f.venv} drifted from release {f.version}: {'; '.join(drifted)}. "
            f"{self.fix} task '{PIN_TASK}' repairs it."
        )
        return Check(not drifted, "" if not drifted else msg, ", ".join(requirements))


def verdicts(
    facts: ToolchainFacts,
    results: Mapping[str, Mapping[str, Any]],
    installed: Mapping[str, str | None] | None,
    ptx_text: str = "",
    requirements: Sequence[str] = (),
) -> tuple[dict[str, Check], list[str]]:
    """(each check's verdict by name, in CHECKS' order, the drift) from the registered results of the
    role's commands: `results` by check name (nvcc, ptx, ptxas, cudart, host_cccl, flashinfer, triton,
    gpu; a check not run, or skipped, has no verdict); `ptx_text`, the PTX file the ptx check wrote.
    `installed`: wheel -> version as the probe found them (None: the probe failed, every pin drifted)."""
    drifted = drift(facts, installed or {})
    v = _Verdicts(facts, f"{'; '.join(drifted)}." if drifted else "")
    out: dict[str, Check] = {}
    for name in CHECKS:
        if name == "pins":
            out[name] = v.pins(drifted, requirements)
        elif name in results and not results[name].get("skipped"):
            result = results[name]
            out[name] = v.ptx(result, ptx_text) if name == "ptx" else getattr(v, name)(result)
    return out, drifted
