"""Training-job discovery (sglfleet.fleet._training) and the module training_jobs, on real processes."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from support.module_runner import assert_examples_use_documented_options, module_doc, run_module
from support.polling import wait_until

from sglfleet.fleet import (
    LAUNCHER_KILL_AFTER_S,
    PatternError,
    checkpoint_time_warnings,
    compile_patterns,
    discover,
    matching_processes,
    signal_number,
    still_alive,
    stop_settings_problems,
)
from sglfleet.host import process_alive

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def job() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A stand-in training process whose command line carries a unique marker."""
    marker = f"train-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"--run={marker}"])
    try:
        # Popen returns before the child has exec'd: wait until its command line is the new one.
        wait_until(
            lambda: marker in Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace"),
            timeout=10,
            what="the stand-in training process started",
        )
        yield proc, marker
    finally:
        proc.kill()
        proc.wait()


def test_finds_the_matching_process_but_not_itself(job: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, marker = job
    found = matching_processes([f"time[.]sleep.*run={marker}", marker])
    assert [(p.pid, p.pattern) for p in found] == [(proc.pid, f"time[.]sleep.*run={marker}")]
    assert found[0].cmdline.endswith(f"--run={marker}")
    # The caller (whose own command line does not match) and its ancestors are never listed.
    assert matching_processes(["pytest|python"], self_pid=None)  # something else matches
    assert all(p.pid != proc.pid for p in matching_processes(["x"], self_pid=proc.pid))


def test_processes_of_a_running_unit_are_stopped_with_it(tmp_path: Path) -> None:
    for pid, cgroup in (
        (10, "0::/system.slice/train.service\n"),
        (11, "0::/user.slice/user-0.slice/session-3.scope\n"),
        # A user's own train.service (systemctl --user) is not the system's: systemd puts it in user@1000
        # (cgroup-util.c v252 cg_path_get_unit), and stopping the system unit leaves it running.
        (12, "0::/user.slice/user-1000.slice/user@1000.service/app.slice/train.service\n"),
    ):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / f"{pid}/cmdline").write_bytes(b"python\0train.py\0")
        (tmp_path / f"{pid}/cgroup").write_text(cgroup)
        (tmp_path / f"{pid}/stat").write_text(f"{pid} (python) S 1 ...")
    show = "Id=train.service\nLoadState=loaded\nActiveState=active\nMainPID=10\nUnitFileState=enabled\n\n"
    show += "Id=gone.service\nLoadState=not-found\nActiveState=inactive\nMainPID=0\nUnitFileState=\n"
    job = discover(["train", "gone.service"], ["train[.]py"], systemctl=lambda argv: show, proc=tmp_path)
    out = job.as_dict()
    assert [u["Id"] for u in out["running_units"]] == ["train.service"]
    assert [p["pid"] for p in out["processes"]] == [11, 12]
    assert out["loaded_units"] == ["train"]
    assert out["targets"] == ["unit train.service", "process 11", "process 12"]


def test_a_bad_pattern_is_named() -> None:
    with pytest.raises(PatternError, match=r"process pattern \[1\] 'a\(' is not a regular expression"):
        compile_patterns(["ok", "a("])


def test_module_finds_the_job_and_changes_nothing(
    job: tuple[subprocess.Popen[bytes], str], tmp_path: Path
) -> None:
    proc, marker = job
    result = run_module("training_jobs", {"patterns": [f"run={marker}"]}, tmp_path, check=True)
    assert result["changed"] is False
    assert result["targets"] == [f"process {proc.pid}"]
    assert result["alive"] == {"units": [], "pids": []}
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    look = run_module("training_jobs", {"pids": [proc.pid, gone.pid]}, tmp_path)
    assert look["alive"] == {"units": [], "pids": [proc.pid]}  # structured: no string to split again
    bad = run_module("training_jobs", {"patterns": ["("]}, tmp_path)
    assert bad["failed"] and "not a regular expression" in bad["msg"]


def test_module_documentation_renders() -> None:
    doc = module_doc("training_jobs")
    assert_examples_use_documented_options("training_jobs", doc)


def test_still_alive_names_running_units_and_live_processes(job: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, _ = job
    show = "Id=train.service\nLoadState=loaded\nActiveState=deactivating\nMainPID=10\nUnitFileState=enabled\n"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    alive = still_alive(["train.service"], [proc.pid, gone.pid], systemctl=lambda argv: show)
    assert [(u.Id, u.ActiveState) for u in alive.units] == [("train.service", "deactivating")]
    assert alive.pids == (proc.pid,)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # exited but not reaped: a zombie, which is not alive
        wait_until(lambda: not process_alive(zombie.pid), timeout=5, what="the exited child not alive")
    finally:
        zombie.wait()


def test_stop_settings_that_another_drop_in_overrides_are_named() -> None:
    # systemctl show prints KillSignal as a number and TimeoutStopUSec as a time span (format_timespan).
    shown = {
        "train.service": "KillSignal=15\nTimeoutStopUSec=1min 30s\nSendSIGKILL=yes\nDropInPaths=/run/a.conf",
        "other.service": (
            "KillSignal=2\nTimeoutStopUSec=1min 30s\nSendSIGKILL=no\n"
            "DropInPaths=/run/systemd/system/other.service.d/zz-sglfleet-training-stop.conf "
            "/etc/systemd/system/other.service.d/zzz.conf\n"
        ),
    }

    def systemctl(argv: Sequence[str]) -> str:
        return "\n\n".join(shown[u] for u in argv[3:])  # one block per unit, blank lines between

    assert stop_settings_problems(["train"], "SIGTERM", 90, systemctl) == []
    assert stop_settings_problems(["train.service"], "TERM", 90, systemctl) == []
    problems = stop_settings_problems(["train", "other"], "15", 30, systemctl)
    assert problems[0] == "train.service: TimeoutStopUSec=1min 30s (asked for 30s); drop-ins: /run/a.conf"
    assert problems[1].startswith("other.service: KillSignal=2 (asked for 15, 15), TimeoutStopUSec=")
    assert "SendSIGKILL=no (asked for yes); drop-ins: " in problems[1] and "zzz.conf" in problems[1]
    with pytest.raises(ValueError, match="'SIGNOPE' is not a signal name"):
        signal_number("SIGNOPE")


def test_a_checkpoint_longer_than_torchruns_30_s_or_the_stop_timeout_is_warned_about(tmp_path: Path) -> None:
    assert LAUNCHER_KILL_AFTER_S["torchrun"] == 30
    assert checkpoint_time_warnings(0, "torchrun", 300) == []  # not said: nothing checked
    assert checkpoint_time_warnings(30, "torchrun", 300) == []
    (torchrun,) = checkpoint_time_warnings(45, "torchrun", 300)
    assert torchrun.startswith(
        "the job takes 45 s to checkpoint after the signal (training_stop_checkpoint_seconds)"
    )
    assert "torchrun SIGKILLs its ranks 30 s after it forwards SIGTERM" in torchrun
    assert checkpoint_time_warnings(45, "none", 300) == []
    (systemd,) = checkpoint_time_warnings(400, "none", 300)
    assert "longer than training_stop_timeout (300 s)" in systemd
    assert len(checkpoint_time_warnings(400, "torchrun", 300)) == 2
    with pytest.raises(ValueError, match="'srun' is not one of"):
        checkpoint_time_warnings(1, "srun", 300)
    # The module says it as a warning and returns it; the stop-settings check still needs stop_signal.
    args = {"checkpoint_seconds": 45, "launcher": "torchrun", "stop_timeout": 300}
    result = run_module("training_jobs", args, tmp_path, check=True)
    assert not result.get("failed") and result["checkpoint_warnings"] == [torchrun]
    assert "torchrun SIGKILLs its ranks 30 s" in str(result.get("warnings"))  # shown as a [WARNING]
    assert run_module("training_jobs", {"stop_signal": "SIGTERM"}, tmp_path)["failed"]
