"""The sglang phase's decision (sglfleet.fleet._backend, module sglang_backend): the attention backend
from the compute capability, the refused overrides, torch's CUDA runtime and the CCCL override, the
EnvironmentFile read back as units read it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support.module_runner import assert_examples_use_documented_options, module_doc, run_module
from support.paths import FIXTURES

from sglfleet.fleet import _backend as backend

DATA = FIXTURES / "nvidia_smi"
TOOLCHAIN = "13.2.2"


def decide(**kwargs: object) -> backend.Decision:
    return backend.decide(**{"toolchain_version": TOOLCHAIN, **kwargs})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("capability", "expected"),
    [
        (
            "12.0",
            "flashinfer",
        ),  # RTX PRO 6000: FA3 refuses SM120, TRT-LLM is SM100
        ("12.1", "flashinfer"),
        ("10.0", "trtllm_mha"),  # B200/GB200
        ("10.3", "trtllm_mha"),  # B300
        ("9.0", "fa3"),  # H100/H200
        ("8.9", "flashinfer"),  # Ada: the default
        ("8.0", "flashinfer"),
    ],
)
def test_the_backend_follows_the_compute_capability(capability: str, expected: str) -> None:
    decision = decide(capability=capability)
    assert decision.attention_backend == expected
    assert decision.compute_capabilities == (capability,)
    assert decision.as_dict()["flashinfer_cuda_arch_list"] == capability
    assert decision.sm == capability.replace(".", "")


def test_the_gpus_capability_is_used_and_the_default_without_gpus() -> None:
    assert decide(gpu_capabilities=["9.0"] * 8).attention_backend == "fa3"
    assert decide(gpu_capabilities=["9.0"] * 8).capability_source == "the GPUs (nvidia-smi)"
    # the inventory's capability wins over the GPUs'
    assert decide(capability="12.0", gpu_capabilities=["9.0"]).attention_backend == "flashinfer"
    none = decide(gpu_capabilities=[], default_capability="10.0")
    assert (none.compute_capabilities, none.attention_backend) == (("10.0",), "trtllm_mha")
    assert decide(gpu_capabilities=[None]).compute_capabilities == ("12.0",)


def test_gpus_of_several_capabilities_need_an_override() -> None:
    with pytest.raises(
        backend.BackendError, match=r"capabilities 12\.0, 8\.9; .*set sglang_attention_backend"
    ):
        decide(gpu_capabilities=["8.9", "12.0", "12.0"])
    mixed = decide(gpu_capabilities=["8.9", "12.0"], attention_backend="triton")
    assert mixed.attention_backend == "triton"
    assert mixed.as_dict()["torch_cuda_arch_list"] == "12.0;8.9"


def test_an_override_the_gpus_refuse_is_named_with_sglangs_words() -> None:
    with pytest.raises(backend.BackendError) as err:
        decide(capability="12.0", attention_backend="fa3")
    assert "'fa3' cannot run on compute capability 12.0" in str(err.value)
    assert "FlashAttention v3 Backend requires SM>=80 and SM<=90" in str(err.value)
    with pytest.raises(
        backend.BackendError, match=r'SGLang 0\.5\.12 refuses it: "TRTLLM MHA backend for prefill'
    ):
        decide(capability="9.0", attention_backend="trtllm_mha")
    assert decide(capability="9.0", attention_backend="fa3").attention_backend == "fa3"
    assert (
        decide(capability="10.0", attention_backend="fa4").backend_source
        == "sglang_attention_backend (inventory)"
    )


def test_an_unknown_override_or_capability_is_refused() -> None:
    with pytest.raises(
        backend.BackendError, match=r"'fa9' is not an SGLang --attention-backend\. Known: triton"
    ):
        decide(attention_backend="fa9")
    with pytest.raises(backend.BackendError, match="sglang_compute_capability '120'"):
        decide(capability="120")
    with pytest.raises(backend.BackendError, match="sglang_torch_cuda_version '13'"):
        decide(torch_cuda_version="13")


def test_every_backend_the_table_names_is_an_sglang_choice() -> None:
    for name in [*backend.BY_CAPABILITY.values(), backend.DEFAULT_BACKEND, *backend.REFUSED]:
        assert name in backend.ATTENTION_BACKENDS, name


@pytest.mark.parametrize(
    ("kwargs", "cuda", "override"),
    [
        ({"torch_cuda_version": "13.2"}, "13.2", False),
        ({"runtime_version": "13.0.96"}, "13.0", True),
        ({"torch_index_url": "https://download.pytorch.org/whl/cu130"}, "13.0", True),
        ({"torch_index_url": "https://download.pytorch.org/whl/cu132/"}, "13.2", False),
        ({"torch_index_url": "https://mirror.example/simple"}, "13.2", False),
        # the venv's wheel is what torch loads: it wins over the index URL
        (
            {"runtime_version": "13.2.86", "torch_index_url": "https://download.pytorch.org/whl/cu130"},
            "13.2",
            False,
        ),
    ],
)
def test_torch_cuda_and_the_cccl_override(kwargs: dict, cuda: str, override: bool) -> None:
    decision = decide(**kwargs)
    assert (decision.torch_cuda, decision.toolchain_cuda, decision.cccl_override) == (cuda, "13.2", override)


def test_the_runtime_wheel_is_read_from_the_venv(tmp_path: Path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    assert backend.observe_torch_cuda(tmp_path / "venv") is None
    site.mkdir(parents=True)
    assert backend.observe_torch_cuda(tmp_path / "venv") is None
    info = site / "nvidia_cuda_runtime-13.0.96.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-cuda-runtime\nVersion: 13.0.96\n")
    assert backend.observe_torch_cuda(tmp_path / "venv") == "13.0.96"


@pytest.fixture
def smi_env(tmp_path: Path) -> dict[str, str]:
    """A PATH whose nvidia-smi answers as a host with 8 RTX PRO 6000 (SM120)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy(DATA / "fake-nvidia-smi", bin_dir / "nvidia-smi")
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_NVSMI": str(DATA / "rtxpro6000_ws_idle"),
    }


def test_module_decides_from_the_gpus_and_reads_the_env_file(tmp_path: Path, smi_env: dict[str, str]) -> None:
    env_file = tmp_path / "common.env"
    env_file.write_text(
        '# Managed by Ansible\nCUDA_HOME=/opt/cuda-13.2\nFLASHINFER_CUDA_ARCH_LIST="12.0"\n'
        "SGLANG_ATTENTION_BACKEND=flashinfer\n"
    )
    args = {
        "toolchain_version": TOOLCHAIN,
        "torch_index_url": "https://download.pytorch.org/whl/cu130",
        "venv": str(tmp_path / "no-venv"),
        "env_file": str(env_file),
    }
    for check in (False, True):
        result = run_module("sglang_backend", args, tmp_path, check=check, env=smi_env)
        assert not result.get("failed"), result
        assert result["changed"] is False
        assert result["gpu_count"] >= 1
        assert result["compute_capabilities"] == ["12.0"]
        assert result["attention_backend"] == "flashinfer"
        assert (result["torch_cuda"], result["toolchain_cuda"], result["cccl_override"]) == (
            "13.0",
            "13.2",
            True,
        )
        assert result["env"] == {
            "CUDA_HOME": "/opt/cuda-13.2",
            "FLASHINFER_CUDA_ARCH_LIST": "12.0",
            "SGLANG_ATTENTION_BACKEND": "flashinfer",
        }
    missing = run_module(
        "sglang_backend", {**args, "env_file": str(tmp_path / "absent.env")}, tmp_path, env=smi_env
    )
    assert (missing["env"], missing["env_exists"]) == ({}, False)
    # systemd refuses a file whose values are not UTF-8 (env-file.c check_utf8ness_and_warn): named
    env_file.write_bytes(b"CUDA_HOME=/opt/cuda-13.2\r\nSGLANG_ATTENTION_BACKEND=fl\xe4shinfer\r\n")
    bad = run_module("sglang_backend", args, tmp_path, env=smi_env)
    assert (
        bad["failed"]
        and f"{env_file}:2: invalid UTF-8 in the value of SGLANG_ATTENTION_BACKEND" in bad["msg"]
    )


def test_module_refuses_fa3_on_the_gpus_and_needs_no_gpu_for_an_inventory_capability(
    tmp_path: Path, smi_env: dict[str, str]
) -> None:
    refused = run_module(
        "sglang_backend", {"toolchain_version": TOOLCHAIN, "attention_backend": "fa3"}, tmp_path, env=smi_env
    )
    assert refused["failed"]
    assert "FlashAttention v3 Backend requires SM>=80 and SM<=90" in refused["msg"]
    # no nvidia-smi at all: the inventory's capability decides
    hopper = run_module(
        "sglang_backend",
        {"toolchain_version": TOOLCHAIN, "compute_capability": "9.0", "nvidia_smi": str(tmp_path / "none")},
        tmp_path,
    )
    assert (hopper["attention_backend"], hopper["gpu_count"]) == ("fa3", 0)


def test_module_documentation_renders() -> None:
    doc = module_doc("sglang_backend")
    assert_examples_use_documented_options("sglang_backend", doc)
    assert {"attention_backend", "torch_cuda", "cccl_override", "env"} <= set(doc["return"])


def test_each_refusal_says_whose_rule_it_is() -> None:
    # trtllm_mla: SGLang refuses it off Blackwell (server_args.py:2713-2720); on SM12x, which SGLang
    # accepts, the refusal is sglfleet's and says so.
    with pytest.raises(
        backend.BackendError, match=r'SGLang 0\.5\.12 refuses it: "TRTLLM MLA backend is only'
    ):
        decide(capability="9.0", attention_backend="trtllm_mla")
    with pytest.raises(backend.BackendError) as sm120:
        decide(capability="12.0", attention_backend="trtllm_mla")
    assert "sglfleet refuses it off SM10x, though SGLang 0.5.12 accepts it" in str(sm120.value)
    assert decide(capability="10.0", attention_backend="trtllm_mla").attention_backend == "trtllm_mla"
    # fa4: SGLang does not check; flash-attn-4 asserts against paged KV on SM 12.0 and SM 8.x, not SM 9.0.
    with pytest.raises(backend.BackendError) as fa4:
        decide(capability="12.0", attention_backend="fa4")
    assert "sglfleet refuses it (SGLang 0.5.12 does not check)" in str(fa4.value)
    assert '"Paged KV not supported on SM 12.0"' in str(fa4.value)
    assert decide(capability="9.0", attention_backend="fa4").attention_backend == "fa4"
    for refusals in backend.REFUSED.values():
        assert all(
            r.message.startswith(("SGLang 0.5.12 refuses it", "sglfleet refuses it")) for r in refusals
        )
