"""scripts/gpu-check: the roles' GPU checks for a lent GPU machine. What can be shown without a GPU: it
reads the release from the role, fails loudly on a machine that should have a GPU and shows none, says
"no GPU here" only when told so, and lays the wheels out in folders one call can carry."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from support.paths import FIXTURES, REPO

SCRIPT = REPO / "scripts" / "gpu-check"


def _load():
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


gpu_check = _load()


def _run(
    tmp_path: Path, *args: str, nvidia_smi_fixture: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if nvidia_smi_fixture:
        (bin_dir / "nvidia-smi").symlink_to(FIXTURES / "nvidia_smi" / "fake-nvidia-smi")
        env["FAKE_NVSMI"] = str(FIXTURES / "nvidia_smi" / nvidia_smi_fixture)
    # Only this test's bin/ and the system's: no nvidia-smi of the machine's own.
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    wheels = tmp_path / "wheels"
    wheels.mkdir(exist_ok=True)
    argv = [sys.executable, str(SCRIPT), "--wheels", str(wheels), "--work", str(tmp_path / "work"), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=120)


def _rows(output: str) -> dict[str, tuple[str, str]]:
    rows = {}
    for line in output.splitlines():
        name, _, rest = line.partition(" ")
        fields = rest.split(None, 2)
        if len(fields) == 3 and fields[0] in {"ok", "FAIL", "warn", "skip"}:
            rows[name] = (fields[0], fields[2])
    return rows


def test_the_release_is_the_roles_own():
    variables = yaml.safe_load((REPO / "roles/cuda_toolchain/vars/main.yml").read_text())
    defaults = yaml.safe_load((REPO / "roles/cuda_toolchain/defaults/main.yml").read_text())
    release = gpu_check.load_release()
    pinned = variables["__cuda_toolchain_releases"][defaults["cuda_toolchain_version"]]
    assert release.version == defaults["cuda_toolchain_version"]
    assert sorted(release.requirements) == sorted(
        f"{wheel}=={pinned[component]}" for component, wheel in variables["__cuda_toolchain_wheels"].items()
    )
    assert release.ptx_isa == pinned["ptx_isa"]


def test_a_machine_that_should_have_a_gpu_and_shows_none_fails_loudly(tmp_path):
    result = _run(tmp_path)
    rows = _rows(result.stdout)
    assert result.returncode == 1, result.stdout + result.stderr
    assert rows["gpu"][0] == "FAIL"
    assert "should have a GPU" in rows["gpu"][1] and "no nvidia-smi" in rows["gpu"][1]
    assert rows["driver"] == ("skip", "needs gpu")
    assert "failed" in result.stdout.splitlines()[-1]


def test_no_gpu_here_is_said_only_when_declared(tmp_path):
    result = _run(tmp_path, "--gpus-expected", "false")
    rows = _rows(result.stdout)
    assert rows["gpu"] == ("skip", "no GPU here (declared: --gpus-expected false)")
    # Without the wheels nothing is built: the tree's rows fail or wait, they never pass.
    assert rows["wheels"][0] == "FAIL" and "pip install" in rows["wheels"][1]
    assert rows["tree"] == ("skip", "needs wheels")
    assert result.returncode == 1


def test_the_gpus_are_read_as_sglfleet_reads_them(tmp_path):
    result = _run(tmp_path, nvidia_smi_fixture="rtxpro6000_ws_idle")
    rows = _rows(result.stdout)
    status, detail = rows["gpu"]
    assert status == "ok", result.stdout
    assert "compute capability 12.0" in detail and "RTX PRO 6000" in detail
    # The fixture's driver, 580.95.05, is under CUDA 13.2's floor: minor-version compatibility, said so.
    assert rows["driver"][0] == "warn" and "minor-version compatibility" in rows["driver"][1]


def test_the_wheels_are_laid_out_in_folders_one_call_carries():
    mib = 2**20
    sizes = {
        "nvvm.whl": 45 * mib,
        "nvcc.whl": 42 * mib,
        "fi.whl": 13 * mib,
        "cccl.whl": 4 * mib,
        "rt.whl": 2 * mib,
    }
    folders = gpu_check.layout(sizes, 58 * mib)
    assert sorted(name for folder in folders for name in folder) == sorted(sizes)
    assert all(sum(sizes[name] for name in folder) <= 58 * mib for folder in folders)
    assert len(folders) == 2
    with pytest.raises(SystemExit, match="over the 40 MiB budget"):
        gpu_check.layout(sizes, 40 * mib)


def test_a_repacked_wheel_has_the_same_members(tmp_path):
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("demo/bin/tool", b"\x7fELF" + bytes(range(256)) * 400)
        archive.writestr("demo-1.0.dist-info/RECORD", "demo/bin/tool,,\n")
    before = [(info.filename, info.CRC) for info in zipfile.ZipFile(wheel).infolist()]
    gpu_check.repack(wheel)
    with zipfile.ZipFile(wheel) as archive:
        assert [(info.filename, info.CRC) for info in archive.infolist()] == before
        assert {info.compress_type for info in archive.infolist()} == {zipfile.ZIP_LZMA}
        assert archive.read("demo/bin/tool").startswith(b"\x7fELF")


def test_the_package_wheels_are_the_locked_versions():
    pins = gpu_check.locked(["pydantic"])
    assert pins == [
        line for line in (REPO / "requirements.txt").read_text().splitlines() if line.startswith("pydantic==")
    ]
