"""What SGLang runs with on a host's GPUs: the compute capability, attention backend, torch's CUDA runtime.

The sglang phase decides once per host and writes the decision into the fleet's common EnvironmentFile
(`SGLANG_ATTENTION_BACKEND`, the arch lists, the CCCL override); `decide()` is that decision, from what
the inventory says and what the host shows (the GPUs' compute capabilities, the CUDA runtime wheel in
the engine's venv). It reads nothing itself: `observe_torch_cuda()` and `sglfleet.fleet._gpus.query`
observe, the module `sglang_backend` joins them.

The backend table, checked against SGLang 0.5.12 (`python/sglang/srt/...` of the wheel):
- SM120 (RTX PRO 6000 Blackwell, RTX 50xx): FA3 is refused, `attention_registry.py:151-155` asserts
  "FlashAttention v3 Backend requires SM>=80 and SM<=90" (major 8, or 9); trtllm_mha prefill needs
  SM100, `server_args.py:2763-2766` ("only supported on Blackwell GPUs (SM100)"); SGLang's own default
  leaves SM120 to flashinfer (`server_args.py:2584-2586`: "trtllm_mha does not support SM120, which
  will fall back to flashinfer"). So: flashinfer.
- SM100/SM103 (B200, GB200, B300): trtllm_mha, SGLang's own default there (`server_args.py:2612-2620`).
- SM90 (H100, H200): fa3, SGLang's Hopper default (`server_args.py:2606-2611`).
- Anything else: flashinfer, SGLang's default when flashinfer is there (`server_args.py:2625-2628`).
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

__all__ = ["ATTENTION_BACKENDS", "BackendError", "Decision", "decide", "observe_torch_cuda"]

#: `--attention-backend` choices of SGLang 0.5.12: ATTENTION_BACKEND_CHOICES in
#: python/sglang/srt/server_args.py (line 147 of the 0.5.12 wheel); "compressed" is its deprecated
#: alias of "dsv4". The one list: role sglang, the fleet's layout and the stand-in are checked against it.
ATTENTION_BACKENDS: tuple[str, ...] = (
    "triton",
    "torch_native",
    "flex_attention",
    "nsa",
    "dsv4",
    "compressed",
    "cutlass_mla",
    "fa3",
    "fa4",
    "flashinfer",
    "flashmla",
    "trtllm_mla",
    "tokenspeed_mla",
    "trtllm_mha",
    "dual_chunk_flash_attn",
    "aiter",
    "wave",
    "intel_amx",
    "ascend",
    "intel_xpu",
)

#: The backend by compute capability: the exact capability first, then its major version, then the default.
BY_CAPABILITY: Mapping[str, str] = {"9.0": "fa3", "10": "trtllm_mha", "12": "flashinfer"}
DEFAULT_BACKEND = "flashinfer"


class Refusal(BaseModel):
    """Where a backend runs, and what is said when it is asked to run elsewhere: `message` names whose
    rule it is (SGLang's own check, or sglfleet's, with the upstream line it rests on)."""

    model_config = ConfigDict(frozen=True)

    capabilities: frozenset[str]
    message: str


_BLACKWELL = frozenset({"10.0", "10.3", "11.0", "12.0", "12.1"})

#: Backends that cannot run on every compute capability: an override naming one is refused on the
#: others. Each backend's refusals are checked in order, SGLang's own first.
REFUSED: Mapping[str, tuple[Refusal, ...]] = {
    "fa3": (
        Refusal(
            capabilities=frozenset({"8.0", "8.6", "8.7", "8.9", "9.0"}),
            message='SGLang 0.5.12 refuses it: "FlashAttention v3 Backend requires SM>=80 and SM<=90" '
            "(srt/layers/attention/attention_registry.py:151-155)",
        ),
    ),
    "fa4": (
        Refusal(
            capabilities=frozenset({"9.0", "10.0", "10.3", "11.0"}),
            message="sglfleet refuses it (SGLang 0.5.12 does not check): the flash-attn-4 4.0.0b9 kernels "
            'it runs assert "Paged KV not supported on SM 12.0" (flash_attn/cute/interface.py:799) and '
            '"paged KV not supported on SM 8.0" (:714), and SGLang\'s KV cache is paged',
        ),
    ),
    "trtllm_mha": (
        Refusal(
            capabilities=frozenset({"10.0", "10.3"}),
            message='SGLang 0.5.12 refuses it: "TRTLLM MHA backend for prefill is only supported on '
            'Blackwell GPUs (SM100)" (srt/server_args.py:2763-2766; is_sm100_supported is major 10, '
            "srt/utils/common.py:259-263)",
        ),
    ),
    "trtllm_mla": (
        Refusal(
            capabilities=_BLACKWELL,
            message='SGLang 0.5.12 refuses it: "TRTLLM MLA backend is only supported on Blackwell GPUs '
            '(SM100/SM12x)" (srt/server_args.py:2713-2720, is_blackwell_supported = majors 10, 11, 12 '
            "with CUDA >= 12.8, srt/utils/common.py:247-253)",
        ),
        Refusal(
            capabilities=frozenset({"10.0", "10.3"}),
            message="sglfleet refuses it off SM10x, though SGLang 0.5.12 accepts it on SM11x/SM12x "
            "(srt/server_args.py:2713-2720): its prefill calls flashinfer's trtllm_ragged_attention_deepseek "
            "(srt/layers/attention/trtllm_mla_backend.py:839) with that function's default trtllm-gen "
            "kernels (flashinfer 0.6.11.post1 prefill.py:3772), which flashinfer's own MLA decode picks only "
            "on major 10 (XQA elsewhere, mla/_core.py:683-686); not tried on an SM12x GPU",
        ),
    ),
}

#: The CUDA runtime wheel torch loads (torch 2.11.0 cu130: nvidia-cuda-runtime 13.0.x).
RUNTIME_DISTRIBUTION = "nvidia-cuda-runtime"

_CAPABILITY_RE = re.compile(r"^[0-9]+\.[0-9]+$")
_INDEX_CUDA_RE = re.compile(r"cu([0-9]+)([0-9])/?$")


class BackendError(ValueError):
    """The inventory asks for something these GPUs cannot run; the message names the variable and the fix."""


class Decision(BaseModel):
    """What the sglang phase writes into the common EnvironmentFile, and where each part comes from."""

    model_config = ConfigDict(frozen=True)

    compute_capabilities: tuple[str, ...]
    capability_source: str
    attention_backend: str
    backend_source: str
    torch_cuda: str
    torch_cuda_source: str
    toolchain_cuda: str

    @property
    def cccl_override(self) -> bool:
        """torch's CUDA runtime and the toolchain differ in minor version: CCCL's header check must be off."""
        return self.torch_cuda != self.toolchain_cuda

    @property
    def sm(self) -> str:
        """The first capability as CUDA arch digits (12.0 -> 120), what ptxas and nvcc's -arch=sm_XX take."""
        return self.compute_capabilities[0].replace(".", "")

    def as_dict(self) -> dict[str, object]:
        return {
            **self.model_dump(mode="json"),
            "compute_capabilities": list(self.compute_capabilities),
            "cccl_override": self.cccl_override,
            "sm": self.sm,
            "flashinfer_cuda_arch_list": " ".join(self.compute_capabilities),
            "torch_cuda_arch_list": ";".join(self.compute_capabilities),
        }


def major_minor(version: str) -> str:
    """ "13.2.2" -> "13.2"."""
    return ".".join(str(version).split(".")[:2])


def capabilities(
    override: str, gpu_capabilities: Iterable[str | None], default: str
) -> tuple[tuple[str, ...], str]:
    """The host's compute capabilities (sorted as nvidia-smi's strings) and where they come from.

    The inventory's value wins; else the GPUs' (each once); a host without GPUs (or whose GPUs report
    none) gets the default.
    """
    for name, value in (
        ("sglang_compute_capability", override),
        ("sglang_default_compute_capability", default),
    ):
        if value and not _CAPABILITY_RE.match(value):
            raise BackendError(f'{name} {value!r} is not "major.minor" such as "12.0"')
    if override:
        return (override,), "sglang_compute_capability (inventory)"
    seen = sorted({cc for cc in gpu_capabilities if cc})
    if seen:
        return tuple(seen), "the GPUs (nvidia-smi)"
    return (default,), "sglang_default_compute_capability (no GPU found)"


def choose_backend(caps: tuple[str, ...], override: str = "") -> tuple[str, str]:
    """The attention backend for GPUs of these compute capabilities, and where it comes from.

    Raises BackendError for a name SGLang does not know, for GPUs of several capabilities without an
    override (one backend serves every instance), and for a backend these GPUs refuse.
    """
    if override and override not in ATTENTION_BACKENDS:
        raise BackendError(
            f"sglang_attention_backend '{override}' is not an SGLang --attention-backend. Known: "
            f"{', '.join(ATTENTION_BACKENDS)}; leave it empty to choose from the compute capability."
        )
    if len(caps) > 1 and not override:
        raise BackendError(
            f"the GPUs report compute capabilities {', '.join(caps)}; one attention backend serves every "
            "instance: set sglang_attention_backend."
        )
    first = caps[0]
    if override:
        backend, source = override, "sglang_attention_backend (inventory)"
    elif first in BY_CAPABILITY:
        backend, source = BY_CAPABILITY[first], f"compute capability {first}"
    elif first.split(".")[0] in BY_CAPABILITY:
        backend, source = BY_CAPABILITY[first.split(".")[0]], f"compute capability {first.split('.')[0]}.x"
    else:
        backend, source = DEFAULT_BACKEND, f"the default (compute capability {first} has no entry)"
    for refusal in REFUSED.get(backend, ()):
        if not set(caps) <= refusal.capabilities:
            raise BackendError(
                f"sglang_attention_backend '{backend}' cannot run on compute capability {', '.join(caps)}: "
                f"{refusal.message}. Leave sglang_attention_backend empty (SM12x gets flashinfer) or pick "
                "flashinfer/triton."
            )
    return backend, source


def torch_cuda(override: str, runtime_version: str | None, index_url: str, toolchain: str) -> tuple[str, str]:
    """torch's CUDA runtime "major.minor", and where it comes from.

    The inventory's value; else the version of the runtime wheel in the engine's venv (what torch loads);
    else the cuNNN suffix of torch's index URL (cu130 -> 13.0); else the toolchain's (no override then).
    """
    if override:
        return override, "sglang_torch_cuda_version (inventory)"
    if runtime_version:
        return major_minor(runtime_version), f"{RUNTIME_DISTRIBUTION} {runtime_version} in the venv"
    if m := _INDEX_CUDA_RE.search(index_url):
        return f"{m.group(1)}.{m.group(2)}", f"the torch index URL ({index_url})"
    return major_minor(toolchain), "the toolchain's (nothing else says)"


def observe_torch_cuda(venv: Path) -> str | None:
    """The version of the CUDA runtime wheel installed in `venv`, as its own python would import it."""
    paths = [str(p) for p in sorted(venv.glob("lib/python3*/site-packages"))]
    if not paths:
        return None
    for dist in importlib.metadata.distributions(name=RUNTIME_DISTRIBUTION, path=paths):
        return dist.version
    return None


def decide(
    *,
    capability: str = "",
    gpu_capabilities: Iterable[str | None] = (),
    default_capability: str = "12.0",
    attention_backend: str = "",
    torch_cuda_version: str = "",
    runtime_version: str | None = None,
    torch_index_url: str = "",
    toolchain_version: str,
) -> Decision:
    """The whole decision (BackendError, naming the variable, when the inventory asks the impossible)."""
    if torch_cuda_version and not _CAPABILITY_RE.match(torch_cuda_version):
        raise BackendError(
            f'sglang_torch_cuda_version {torch_cuda_version!r} is not "major.minor" such as "13.0"'
        )
    caps, cap_source = capabilities(capability, gpu_capabilities, default_capability)
    backend, backend_source = choose_backend(caps, attention_backend)
    cuda, cuda_source = torch_cuda(torch_cuda_version, runtime_version, torch_index_url, toolchain_version)
    return Decision(
        compute_capabilities=caps,
        capability_source=cap_source,
        attention_backend=backend,
        backend_source=backend_source,
        torch_cuda=cuda,
        torch_cuda_source=cuda_source,
        toolchain_cuda=major_minor(toolchain_version),
    )
