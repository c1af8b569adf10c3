"""sglfleet.fleet._gpus and the gpu_facts module, on nvidia-smi output text of the reference machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.module_runner import assert_examples_use_documented_options, module_doc, run_module
from support.paths import FIXTURES

from sglfleet.fleet import GpuQueryError, combine, parse_compute_apps, parse_gpus, query_gpus

pytestmark = pytest.mark.timeout(60)

DATA = FIXTURES / "nvidia_smi"
FAKE = DATA / "fake-nvidia-smi"


def text(name: str) -> str:
    return (DATA / name).read_text()


def test_parse_eight_idle_workstation_gpus() -> None:
    parsed = parse_gpus(text("rtxpro6000_ws_idle.gpus.csv"))
    assert [g.index for g in parsed] == list(range(8))
    first = parsed[0]
    assert first.name == "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
    assert first.uuid == "GPU-3f0a2c1e-5d7b-4e43-9a61-0c2d8e7f9b10"
    assert (first.memory_used_mib, first.memory_total_mib) == (2, 97887)
    assert (first.compute_cap, first.sm, first.driver_version) == ("12.0", "120", "580.95.05")
    assert parse_compute_apps(text("rtxpro6000_ws_idle.apps.csv")) == []


def test_busy_training_processes_land_on_their_gpus() -> None:
    facts = combine(
        parse_gpus(text("rtxpro6000_srv_training.gpus.csv")),
        parse_compute_apps(text("rtxpro6000_srv_training.apps.csv")),
        "/usr/bin/nvidia-smi",
    )
    assert facts.gpu_count == 8 and facts.busy_gpus == tuple(range(8))
    assert facts.driver_version == "580.95.05"
    assert {g.name for g in facts.gpus} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    assert [p.pid for p in facts.gpus[3].processes] == [2381907]
    assert facts.gpus[3].processes[0].gpu_index == 3
    assert facts.gpus[3].processes[0].used_memory_mib == 91512
    assert facts.gpus[3].processes[0].process_name == "/opt/train/.venv/bin/python3"
    assert facts.gpus[3].memory_used_mib == 91532


def test_na_fields_are_none() -> None:
    facts = combine(
        parse_gpus(text("rtxpro6000_srv_container_na.gpus.csv")),
        parse_compute_apps(text("rtxpro6000_srv_container_na.apps.csv")),
        "/usr/bin/nvidia-smi",
    )
    assert facts.gpus[1].memory_used_mib is None and facts.gpus[1].memory_total_mib == 97887
    proc = facts.processes[0]
    assert (proc.used_memory_mib, proc.process_name, proc.gpu_index) == (None, None, 0)
    assert facts.busy_gpus == (0,)


def test_process_on_an_unlisted_gpu_keeps_its_uuid() -> None:
    apps = parse_compute_apps("77, GPU-00000000-0000-0000-0000-000000000000, 100, python\n")
    facts = combine(parse_gpus(text("rtxpro6000_ws_idle.gpus.csv")), apps, "nvidia-smi")
    assert facts.processes[0].gpu_index is None and facts.busy_gpus == ()


@pytest.mark.parametrize(
    ("csv_text", "message"),
    [
        ("0, GPU-x, NVIDIA RTX PRO 6000, 2, 97887, 12.0\n", r"line 1: expected 7 fields .* got 6"),
        (
            "0, GPU-x, NVIDIA RTX PRO 6000, lots, 97887, 12.0, 580.95.05\n",
            r"line 1: memory.used is not a number: 'lots'",
        ),
        ("\n[N/A], GPU-x, NVIDIA, 2, 97887, 12.0, 580.95.05\n", r"line 2: a GPU without index or uuid"),
    ],
)
def test_malformed_gpu_lines_are_named(csv_text: str, message: str) -> None:
    with pytest.raises(GpuQueryError, match=message):
        parse_gpus(csv_text)


def test_no_nvidia_smi_is_zero_gpus(tmp_path: Path) -> None:
    facts = query_gpus(str(tmp_path / "nvidia-smi"))
    assert (facts.nvidia_smi_found, facts.gpu_count, facts.gpus) == (False, 0, ())


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Put the fake nvidia-smi on PATH (as `nvidia-smi`) answering with canned output `prefix`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy(FAKE, bin_dir / "nvidia-smi")

    def use(prefix: str) -> dict[str, str]:
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_NVSMI": str(DATA / prefix)}
        monkeypatch.setenv("PATH", env["PATH"])
        monkeypatch.setenv("FAKE_NVSMI", env["FAKE_NVSMI"])
        return env

    return use


def test_query_runs_both_queries(fake_smi) -> None:
    fake_smi("rtxpro6000_srv_training")
    facts = query_gpus()
    assert facts.nvidia_smi_found and facts.nvidia_smi_path.endswith("/bin/nvidia-smi")
    assert facts.gpu_count == 8 and len(facts.processes) == 8


def test_query_reports_a_failing_driver(tmp_path: Path, fake_smi) -> None:
    prefix = tmp_path / "broken"
    (tmp_path / "broken.fail").write_text(
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n"
    )
    fake_smi(str(prefix))
    with pytest.raises(GpuQueryError, match=r"--query-gpu=.*: exit code 9: NVIDIA-SMI has failed"):
        query_gpus()


def test_query_no_devices_is_zero_gpus(tmp_path: Path, fake_smi, monkeypatch) -> None:
    (tmp_path / "none.fail").write_text("No devices were found\n")
    fake_smi(str(tmp_path / "none"))
    monkeypatch.setenv("FAKE_NVSMI_RC", "6")
    facts = query_gpus()
    assert facts.nvidia_smi_found and facts.gpu_count == 0


def test_query_timeout(tmp_path: Path) -> None:
    slow = tmp_path / "nvidia-smi"
    slow.write_text("#!/bin/sh\nsleep 5\n")
    slow.chmod(0o755)
    with pytest.raises(GpuQueryError, match=r"no answer within 0.3 s"):
        query_gpus(str(slow), timeout=0.3)


# --- the module, run as Ansible runs it ---------------------------------------------------------


def test_module_eight_busy_gpus_and_facts(tmp_path: Path, fake_smi) -> None:
    env = fake_smi("rtxpro6000_srv_training")
    for check in (False, True):
        result = run_module("gpu_facts", {"required": True}, tmp_path, check=check, env=env)
        assert result["changed"] is False and not result.get("failed")
        assert result["gpu_count"] == 8 and result["busy_gpus"] == list(range(8))
        assert result["gpus"][7]["busy"] is True and result["gpus"][7]["sm"] == "120"
        assert result["gpus"][7]["processes"][0]["pid"] == 2381911
        facts = result["ansible_facts"]["sglfleet_gpu_facts"]
        assert facts["gpu_count"] == 8 and facts["gpus"][0]["memory_total_mib"] == 97887


def test_module_without_nvidia_smi(tmp_path: Path) -> None:
    args = {"nvidia_smi": str(tmp_path / "absent" / "nvidia-smi")}
    ok = run_module("gpu_facts", args, tmp_path)
    assert (ok["nvidia_smi_found"], ok["gpu_count"], ok["gpus"]) == (False, 0, [])
    failed = run_module("gpu_facts", {**args, "required": True}, tmp_path)
    assert failed["failed"] and "no GPU" in failed["msg"] and "not found" in failed["msg"]


def test_module_broken_driver_warns_or_fails(tmp_path: Path, fake_smi) -> None:
    (tmp_path / "broken.fail").write_text(
        "NVIDIA-SMI has failed because it couldn't communicate with the driver\n"
    )
    env = fake_smi(str(tmp_path / "broken"))
    lenient = run_module("gpu_facts", {}, tmp_path, env=env)
    assert lenient["gpu_count"] == 0 and "exit code 9" in lenient["error"]
    assert "nvidia-smi answered with an error" in json.dumps(lenient["warnings"])
    strict = run_module("gpu_facts", {"required": True}, tmp_path, env=env)
    assert strict["failed"] and "NVIDIA-SMI has failed" in strict["msg"]


def test_fake_nvidia_smi_refuses_other_queries() -> None:
    proc = subprocess.run([str(FAKE), "-L"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "unexpected arguments" in proc.stderr


def test_module_documentation_renders() -> None:
    doc = module_doc("gpu_facts")
    assert doc["doc"]["short_description"].startswith("Gather the NVIDIA GPUs")
    assert set(doc["doc"]["options"]) == {"nvidia_smi", "required", "timeout"}
    assert {"gpu_count", "gpus", "processes", "nvidia_smi_found", "ansible_facts"} <= set(doc["return"])
    assert_examples_use_documented_options("gpu_facts", doc)
