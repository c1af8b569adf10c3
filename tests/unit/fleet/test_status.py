"""`sglfleet status` and `sglfleet health`: the checklist and instance table, against real stand-ins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sglfleet_testing.standin.process import standin_argv
from support.net import consecutive_free_ports
from support.paths import FIXTURES

from sglfleet.fleet import (
    check_fleet,
    combine,
    endpoints_from_range,
    gather_status,
    layout_from_env_dir,
    parse_gpus,
    parse_status_json,
    record_phase,
)

pytestmark = pytest.mark.timeout(90)

DATA = FIXTURES / "nvidia_smi"
SERVED = "qwen3-32b"
T0 = datetime(2026, 12, 2, 18, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def fleet() -> Iterator[int]:
    """Three stand-in instances on consecutive ports (instance i on base+i, as the fleet lays them out)."""
    base = consecutive_free_ports(3)
    procs = [
        subprocess.Popen(
            standin_argv(base + i, model_path="/models/Qwen3-32B", served_model_name=SERVED),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(3)
    ]
    try:
        ready = check_fleet(endpoints_from_range("127.0.0.1", base, 3), wait=30, interval=0.1)
        assert ready.all_healthy, ready.summary()
        yield base
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.fixture
def ledger_file(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.json"
    record_phase(path, "provision", "done", {"vmid": 200, "node": "kpro6"}, now=T0)
    record_phase(path, "training_stop", "failed", {"pid": 2381904, "reason": "still on GPU 0"}, now=T0)
    return path


def sglfleet(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sglfleet", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        input=stdin,
        check=False,
    )


def fake_smi_env(prefix: str) -> dict[str, str]:
    return {"FAKE_NVSMI": str(DATA / prefix)}


def test_status_json_has_checklist_and_rows_with_gpu_memory(fleet: int, ledger_file: Path) -> None:
    proc = sglfleet(
        "status", "--json", "--ledger", str(ledger_file), "--port-base", str(fleet), "--count", "4",
        "--nvidia-smi", str(DATA / "fake-nvidia-smi"), "--expected-model", SERVED,
        env=fake_smi_env("rtxpro6000_srv_training"),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # training_stop has failed
    data = json.loads(proc.stdout)
    assert [(r["phase"], r["status"]) for r in data["checklist"][:4]] == [
        ("host", "pending"), ("provision", "done"), ("training_stop", "failed"), ("toolchain", "pending"),
    ]  # fmt: skip
    assert data["checklist"][1]["evidence"] == {"vmid": 200, "node": "kpro6"}
    rows = data["instances"]
    assert [r["health"]["port"] for r in rows] == [fleet, fleet + 1, fleet + 2, fleet + 3]
    assert [r["health"]["healthy"] for r in rows] == [True, True, True, False]
    assert rows[3]["health"]["reason"] == "refused"
    assert rows[1]["health"]["model"] == SERVED and rows[1]["health"]["gpu"] == 1
    assert (rows[1]["gpu_memory_used_mib"], rows[1]["gpu_memory_total_mib"]) == (91532, 97887)
    assert data["summary"] == "1/11 phases done, failed: training_stop; 3/4 instances healthy"
    assert data["gpu_count"] == 8


def test_status_table_for_humans(fleet: int, ledger_file: Path) -> None:
    proc = sglfleet(
        "status", "--ledger", str(ledger_file), "--port-base", str(fleet), "--count", "3", "--width", "160",
        "--nvidia-smi", str(DATA / "fake-nvidia-smi"), env=fake_smi_env("rtxpro6000_ws_idle"),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # training_stop has failed
    out = proc.stdout
    assert "Instances (3/3 healthy)" in out
    assert "node=kpro6, vmid=200" in out and "2026-12-02 18:00 UTC" in out
    lines = [line for line in out.splitlines() if f"{fleet + 2}" in line]
    assert len(lines) == 2  # its row in the instance table, its GPU's row in the GPU table
    cells = [c.strip() for c in lines[0].strip("│ ").split("│")]
    assert cells == ["2", str(fleet + 2), "200 healthy", SERVED, "0", "0", "0.0", "0.0 / 97.9 GB"]
    gpu = [c.strip() for c in lines[1].strip("│ ").split("│")]
    name = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
    assert gpu == ["2", name, "0.0 / 97.9 GB", "0", str(fleet + 2)]
    assert "GPUs (8 answer nvidia-smi)" in out
    assert out.rstrip().endswith("1/11 phases done, failed: training_stop; all 3 instances healthy")


def write_env_files(env_dir: Path, base: int, count: int, gpus: list[int], api_key: str = "") -> None:
    """Environment files as the sglang_fleet role writes them (instance-<i>.env)."""
    env_dir.mkdir(exist_ok=True)
    for i in range(count):
        args = f"--model-path /srv/models/standin-7b --host 0.0.0.0 --port {base + i}"
        args += f" --served-model-name {SERVED}"
        if api_key:
            args += f" --api-key {api_key}"
        (env_dir / f"instance-{i}.env").write_text(
            f"# Managed by Ansible (role sglang_fleet): SGLang instance {i} (unit sglang@{i}.service).\n"
            f"CUDA_VISIBLE_DEVICES={gpus[i]}\nPROMETHEUS_MULTIPROC_DIR=/run/sglang/instance-{i}\n"
            f"SGLANG_FLEET_INSTANCE={i}\nSGLANG_FLEET_PORT={base + i}\n"
            f'SGLANG_ARGS="{args} --standin-warmup-seconds 1"\nSGLANG_FLEET_DIGEST=0123abcd\n'
        )


def test_layout_from_env_files(tmp_path: Path) -> None:
    write_env_files(tmp_path, 30000, 12, list(range(12)), api_key="k-1")
    layout = layout_from_env_dir(tmp_path)
    assert [e.port for e in layout.endpoints] == list(range(30000, 30012))  # instance-10 after instance-9
    assert layout.endpoints[11].url == "http://127.0.0.1:30011" and layout.endpoints[11].gpu == 11
    assert layout.api_key == "k-1"
    assert layout_from_env_dir(tmp_path / "none").endpoints == ()
    (tmp_path / "instance-12.env").write_text('CUDA_VISIBLE_DEVICES=0\nSGLANG_ARGS="--model-path m"\n')
    with pytest.raises(ValueError, match=r"instance-12.env: no port"):
        layout_from_env_dir(tmp_path)
    (tmp_path / "instance-12.env").write_text("CUDA_VISIBLE_DEVICES\n")
    with pytest.raises(ValueError, match=r"instance-12.env:1: not KEY=VALUE"):
        layout_from_env_dir(tmp_path)


def test_status_without_nvidia_smi_reads_the_env_files_and_shows_dashes(
    fleet: int, ledger_file: Path, tmp_path: Path
) -> None:
    env_dir = tmp_path / "sglang"
    write_env_files(env_dir, fleet, 3, [5, 6, 7])
    proc = sglfleet(
        "status", "--json", "--ledger", str(ledger_file), "--env-dir", str(env_dir),
        "--nvidia-smi", str(tmp_path / "no-nvidia-smi"),
    )  # fmt: skip
    data = json.loads(proc.stdout)
    assert data["nvidia_smi_found"] is False
    assert [(r["health"]["port"], r["health"]["gpu"], r["health"]["healthy"]) for r in data["instances"]] == [
        (fleet, 5, True), (fleet + 1, 6, True), (fleet + 2, 7, True),
    ]  # fmt: skip
    assert {r["gpu_memory_used_mib"] for r in data["instances"]} == {None}
    table = sglfleet(
        "status", "--ledger", str(ledger_file), "--width", "160", "--env-dir", str(env_dir),
        "--nvidia-smi", "",
    ).stdout  # fmt: skip
    row = next(line for line in table.splitlines() if str(fleet) in line)
    assert row.rstrip().rstrip("│").rstrip().endswith("-")


def test_status_defaults_to_one_instance_per_gpu(fleet: int, ledger_file: Path, tmp_path: Path) -> None:
    proc = sglfleet(
        "status", "--json", "--ledger", str(ledger_file), "--env-dir", str(tmp_path / "none"),
        "--port-base", str(fleet), "--nvidia-smi", str(DATA / "fake-nvidia-smi"),
        env=fake_smi_env("rtxpro6000_ws_idle"),
    )  # fmt: skip
    rows = json.loads(proc.stdout)["instances"]
    assert len(rows) == 8 and sum(r["health"]["healthy"] for r in rows) == 3
    assert rows[7]["health"]["reason"] == "refused" and rows[7]["gpu_memory_used_mib"] == 2


def test_status_bad_ledger_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "ledger.json"
    bad.write_text(
        '{"version": 1,\n "phases": {"fleet": {"status": "maybe", "time": "2026-12-02T18:00:00Z"}}}'
    )
    proc = sglfleet("status", "--ledger", str(bad), "--nvidia-smi", "")
    assert proc.returncode == 2
    assert f"{bad}: not a valid sglfleet ledger: phases.fleet.status" in proc.stderr


def test_render_prints_what_status_json_gathered(fleet: int, ledger_file: Path) -> None:
    """`status --json` on the fleet host, `status --render` elsewhere: the same tables, nothing re-probed."""
    facts = combine(
        parse_gpus((DATA / "rtxpro6000_srv_training.gpus.csv").read_text()), [], "/usr/bin/nvidia-smi"
    )
    eps = endpoints_from_range("127.0.0.1", fleet, 3)
    direct = gather_status(ledger_path=ledger_file, endpoints=eps, gpu_facts=facts)
    gathered = sglfleet(
        "status", "--json", "--ledger", str(ledger_file), "--port-base", str(fleet), "--count", "3",
        "--nvidia-smi", str(DATA / "fake-nvidia-smi"),
        env={"FAKE_NVSMI": str(DATA / "rtxpro6000_srv_training")},
    )  # fmt: skip
    assert gathered.returncode == 1, gathered.stderr  # training_stop has failed
    rendered = parse_status_json(gathered.stdout)
    assert rendered.checklist == direct.checklist
    assert [(r.health.port, r.health.healthy, r.gpu_memory_used_mib) for r in rendered.instances] == [
        (r.health.port, r.health.healthy, r.gpu_memory_used_mib) for r in direct.instances
    ]
    proc = sglfleet("status", "--render", "-", "--width", "160", stdin=gathered.stdout)
    assert proc.returncode == 1, proc.stderr  # --render too
    assert "Instances (3/3 healthy)" in proc.stdout and "91.5 / 97.9 GB" in proc.stdout


def test_render_rejects_bad_json() -> None:
    proc = sglfleet("status", "--render", "-", stdin="{\n  oops")
    assert proc.returncode == 2 and "<stdin>:2:3: not valid JSON" in proc.stderr


def test_health_cli_exit_codes(fleet: int) -> None:
    ok = sglfleet("health", "--json", "--port-base", str(fleet), "--count", "3")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["summary"] == "all 3 instances healthy"
    bad = sglfleet("health", "--port-base", str(fleet), "--count", "4", "--expected-model", SERVED)
    assert bad.returncode == 1
    assert f"3/4 instances healthy; unhealthy: http://127.0.0.1:{fleet + 3} (refused)" in bad.stdout.replace(
        "\n", " "
    )
    wrong = sglfleet("health", "-e", f"http://127.0.0.1:{fleet}", "--expected-model", "llama")
    assert wrong.returncode == 1 and "unexpected model" in wrong.stdout
    usage = sglfleet("health")
    assert usage.returncode == 2 and "-e URL ... or --count N" in usage.stderr
    both = sglfleet("health", "--count", "1", "--url", "http://127.0.0.1:1")
    assert both.returncode == 2 and "either -e/--endpoint or --count" in both.stderr


def test_health_cli_api_key_from_env_is_used(tmp_path: Path) -> None:
    from sglfleet_testing.standin.process import running_standin

    with running_standin(api_key="k-9", served_model_name=SERVED) as url:
        no_key = json.loads(sglfleet("health", "--json", "--url", url).stdout)["instances"][0]
        env_key = json.loads(
            sglfleet("health", "--json", "--url", url, env={"SGLFLEET_API_KEY": "k-9"}).stdout
        )
        key_file = tmp_path / "key"
        key_file.write_text("k-9\n")
        file_key = json.loads(
            sglfleet("health", "--json", "--url", url, "--api-key-file", str(key_file)).stdout
        )
    assert no_key["model"] is None
    assert env_key["instances"][0]["model"] == SERVED
    assert file_key["instances"][0]["model"] == SERVED


def test_piped_output_cuts_no_column(fleet: int, ledger_file: Path) -> None:
    """Off a terminal (a pipe, a log, Ansible's register) and without --width, `status` and `health` print
    every cell whole, however wide the tables get; rich alone would assume 80 columns and cut to `350…`."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(fake_smi_env("rtxpro6000_ws_idle"))
    down = f"http://127.0.0.1:{fleet + 3}"
    status = subprocess.run(
        [sys.executable, "-m", "sglfleet", "status", "--ledger", str(ledger_file), "--port-base", str(fleet),
         "--count", "4", "--nvidia-smi", str(DATA / "fake-nvidia-smi")],
        capture_output=True, text=True, timeout=60, env=env, check=False,  # stdout a pipe, not a terminal
    )  # fmt: skip
    health = subprocess.run(
        [sys.executable, "-m", "sglfleet", "health", "--port-base", str(fleet), "--count", "4"],
        capture_output=True, text=True, timeout=60, env=env, check=False,  # stdout a pipe, not a terminal
    )  # fmt: skip
    assert status.returncode == 1, status.stderr  # training_stop has failed
    assert health.returncode == 1, health.stderr  # instance 3 is down
    for out in (status.stdout, health.stdout):
        assert "…" not in out, out
        assert max(len(line) for line in out.splitlines()) > 80, out
        rows = [line for line in out.splitlines() if f"│ {fleet + 2} │" in line]
        assert len(rows) == 1, out
        cells = [c.strip() for c in rows[0].strip("│ ").split("│")]
        assert cells[:5] == ["2", str(fleet + 2), "200 healthy", SERVED, "0"], cells
    assert f"3/4 instances healthy; unhealthy: {down} (refused)" in health.stdout  # one line, whole
    assert "node=kpro6, vmid=200" in status.stdout


LOST_GPU_SMI = """#!/bin/sh
# nvidia-smi with GPU 3 fallen off the bus: the whole query prints only the error and exits 15
# (NVIDIA/open-gpu-kernel-modules#387); `-i N` still answers for the GPUs that work
# (NVIDIA/nvidia-docker#1553).
name="NVIDIA RTX PRO 6000 Blackwell Server Edition"
row() { echo "$1, GPU-0000000$1, $name, 84700, 97887, 12.0, 580.95.05"; }
case "$*" in
  "-i 3 --query-gpu="*|"--query-gpu="*)
    echo "Unable to determine the device handle for GPU 0000:41:00.0: Unknown Error"; exit 15 ;;
  "-i "*" --query-gpu="*) set -- $*; row "$2" ;;
  "--query-compute-apps="*) ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""


def test_status_shows_memory_per_gpu_and_per_instance_and_names_a_lost_gpu(
    ledger_file: Path, tmp_path: Path
) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(LOST_GPU_SMI)
    smi.chmod(0o755)
    env_dir = tmp_path / "sglang"
    env_dir.mkdir()
    # Instance 0 runs tensor-parallel on GPUs 0 and 1; instance 2's GPU no longer answers.
    for i, devices in enumerate(["0,1", "2", "3"]):
        (env_dir / f"instance-{i}.env").write_text(
            f'CUDA_VISIBLE_DEVICES={devices}\nSGLANG_FLEET_PORT={39990 + i}\nSGLANG_ARGS="--model-path m"\n'
        )
    args = ["status", "--ledger", str(ledger_file), "--env-dir", str(env_dir), "--nvidia-smi", str(smi)]
    proc = sglfleet(*args, "--json", "--timeout", "1")
    assert proc.returncode == 1, proc.stderr  # training_stop has failed
    data = json.loads(proc.stdout)
    rows = {r["health"]["port"]: r for r in data["instances"]}
    assert rows[39990]["gpus"] == [0, 1]
    assert (rows[39990]["gpu_memory_used_mib"], rows[39990]["gpu_memory_total_mib"]) == (169400, 195774)
    assert (rows[39991]["gpu_memory_used_mib"], rows[39991]["gpu_memory_total_mib"]) == (84700, 97887)
    assert rows[39992]["gpu_memory_used_mib"] is None
    assert rows[39992]["gpu_problem"] == (
        "GPU 3 does not answer nvidia-smi "
        "(Unable to determine the device handle for GPU 0000:41:00.0: Unknown Error)"
    )
    assert rows[39990]["gpu_problem"] is None and rows[39991]["gpu_problem"] is None
    assert [(g["index"], g["instances"]) for g in data["gpus"]] == [(0, [39990]), (1, [39990]), (2, [39991])]
    assert "GPU 3: Unable to determine the device handle" in proc.stderr  # the warning names it too
    table = sglfleet(*args, "--width", "200", "--timeout", "1").stdout
    line = next(line for line in table.splitlines() if "39990" in line)
    assert "│ 0,1 │ 39990 │" in line and "169.4 / 195.8 GB" in line
    assert "84.7 / 97.9 GB" in next(line for line in table.splitlines() if "39991" in line)
    assert "no answer" in next(line for line in table.splitlines() if "39992" in line)
    assert "http://127.0.0.1:39992: GPU 3 does not answer nvidia-smi" in table
    assert "GPUs (3 answer nvidia-smi)" in table
