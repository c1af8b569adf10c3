"""The stand-in trainer: checkpoint on the stop signal, or (with --ignore-sigterm) only SIGKILL stops it."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sglfleet_testing.trainer import render_unit

pytestmark = pytest.mark.timeout(30)


def trainer_argv(ckpt: Path, *args: str) -> list[str]:
    """The stand-in trainer checkpointing to `ckpt`, a step every 0.01 s."""
    module = ["-u", "-m", "sglfleet_testing.trainer"]
    return [sys.executable, *module, "--checkpoint", str(ckpt), "--step-seconds", "0.01", *args]


def start(ckpt: Path, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(trainer_argv(ckpt, *args), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert "training" in proc.stdout.readline()  # the handlers are in place from here on
    return proc


def test_sigterm_writes_the_checkpoint_and_exits_0(tmp_path: Path) -> None:
    ckpt = tmp_path / "run" / "ckpt.json"
    proc = start(ckpt)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    payload = json.loads(ckpt.read_text())
    assert payload["signal"] == "SIGTERM"
    assert payload["pid"] == proc.pid
    # The step it was on when the signal came, or the next one when a step was under way (a step in progress
    # ends before the checkpoint, as a real trainer's does); 0 when the signal came before the first step.
    assert proc.stdout is not None
    received = re.search(r"received SIGTERM at step (\d+): writing checkpoint", proc.stdout.read())
    assert received and payload["step"] in (int(received[1]), int(received[1]) + 1)
    assert not list(ckpt.parent.glob(".*.tmp")), "the temporary file was left behind"


def test_other_checkpoint_signal(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.json"
    proc = start(ckpt, "--checkpoint-signal", "SIGUSR1")
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=10) == 0
    assert json.loads(ckpt.read_text())["signal"] == "SIGUSR1"


def test_ignoring_sigterm_only_sigkill_stops_it_and_no_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.json"
    proc = start(ckpt, "--ignore-sigterm")
    proc.send_signal(signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    proc.kill()
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert not ckpt.exists()


def test_unknown_signal_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglfleet_testing.trainer",
            "--checkpoint",
            str(tmp_path / "c"),
            "--checkpoint-signal",
            "SIGNOPE",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "unknown signal 'SIGNOPE'" in done.stderr


def test_render_unit_runs_the_script_with_its_checkpoint() -> None:
    unit = render_unit(
        script="/usr/local/lib/t.py", checkpoint="/var/tmp/c.json", extra_args=["--ignore-sigterm"]
    )
    lines = unit.splitlines()
    assert (
        "ExecStart=/usr/bin/python3 -u /usr/local/lib/t.py --checkpoint /var/tmp/c.json --ignore-sigterm"
        in lines
    )
    assert "Restart=on-failure" in lines
    assert "WantedBy=multi-user.target" in lines


def test_it_resumes_from_its_checkpoint_and_logs_the_rows_of_the_set_the_environment_names(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt.json"
    ckpt.write_text(json.dumps({"step": 4242}))
    data = tmp_path / "train.jsonl"
    data.write_text('{"a": 1}\n\n{"a": 2}\n{"a": 3}\n')
    env = {
        "SGLFLEET_TRAIN_DATASET": str(data),
        "SGLFLEET_TRAIN_RESUME_FROM": str(ckpt),
        "PATH": "/usr/bin:/bin",
    }
    proc = subprocess.Popen(
        trainer_argv(ckpt),
        stdout=subprocess.PIPE,
        text=True,
        env={**env, "PYTHONPATH": ":".join(sys.path)},
    )
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(3)]
    assert f"resumed from checkpoint {ckpt} at step 4242" in lines[0]
    assert f"loaded 3 rows from {data} (sha256 " in lines[1]
    assert "training" in lines[2]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    # it went on from there, not from 0 (a loaded machine may deliver the signal before its first step)
    assert json.loads(ckpt.read_text())["step"] >= 4242


def test_a_missing_dataset_is_an_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sglfleet_testing.trainer", "--checkpoint", str(tmp_path / "c"),
         "--dataset", str(tmp_path / "none.jsonl")],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    assert proc.returncode == 1 and "cannot resume" in proc.stderr and "none.jsonl" in proc.stderr


def start_torchrun(ckpt: Path, *args: str) -> subprocess.Popen[str]:
    """The trainer behind its torchrun-like launcher; returns once the rank's handlers are in place."""
    proc = subprocess.Popen(trainer_argv(ckpt, "--torchrun", *args), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert re.match(r"launcher\[\d+\]: started rank 0 \(pid \d+\)", proc.stdout.readline())
    assert "training (checkpoint" in proc.stdout.readline()
    return proc


def test_behind_the_launcher_a_quick_checkpoint_is_written_and_the_launcher_exits_1(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.json"
    proc = start_torchrun(ckpt, "--launcher-kill-after", "60")
    proc.send_signal(signal.SIGTERM)
    # torchrun re-raises the SignalException after its ranks are gone (launcher/api.py:325-331): status 1.
    assert proc.wait(timeout=20) == 1
    assert proc.stdout is not None
    out = proc.stdout.read()
    assert "received SIGTERM: sending SIGTERM to rank 0, SIGKILL in 60 s" in out
    assert "rank 0 exited with 0" in out and "SIGKILL\n" not in out
    payload = json.loads(ckpt.read_text())
    assert (
        payload["signal"] == "SIGTERM" and payload["pid"] != proc.pid
    )  # the rank wrote it, not the launcher


def test_behind_the_launcher_a_checkpoint_longer_than_its_kill_after_is_lost(tmp_path: Path) -> None:
    # torchrun's 30 s, injected shorter; the rank's checkpoint takes far longer than that.
    ckpt = tmp_path / "ckpt.json"
    proc = start_torchrun(ckpt, "--launcher-kill-after", "0.2", "--checkpoint-seconds", "30")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 1
    assert proc.stdout is not None
    out = proc.stdout.read()
    assert "received SIGTERM at step" in out  # the rank got the forwarded signal and began its checkpoint
    assert "rank 0 still running after 0.2 s: SIGKILL" in out
    assert not ckpt.exists()


def test_a_rank_that_ends_by_itself_ends_the_launcher_with_its_status(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.jsonl"
    done = subprocess.run(
        trainer_argv(tmp_path / "ckpt.json", "--torchrun", "--dataset", str(missing)),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert done.returncode == 1 and "rank 0 exited with 1" in done.stdout and "cannot resume" in done.stderr
