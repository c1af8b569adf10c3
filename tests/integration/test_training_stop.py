"""playbooks/training_stop.yml against CT 200, with the stand-in trainer as the training job.

The lab's group_vars name the job both ways: the unit sglfleet-trainer.service and the pattern
matching the trainer's command line (so the unit's own process matches too, and must be stopped
once, with its unit).
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sglfleet_testing import trainer
from support.ansible_lab import MODULE_PYTHON, Ansible, Container, PlaybookRun

pytestmark = pytest.mark.timeout(300)

SCRIPT = "/usr/local/lib/sglfleet-trainer.py"
UNIT = "sglfleet-trainer.service"
WORK = "/var/tmp/sglfleet-trainer"
DROP_IN = f"/run/systemd/system/{UNIT}.d/zz-sglfleet-training-stop.conf"
ETC_DROP_INS = f"/etc/systemd/system/{UNIT}.d"
GPU_PIDS = (
    "/var/tmp/fake-nvidia-smi.pids"  # what tests/integration/files/nvidia-smi lists as compute processes
)


class Jobs:
    """Stand-in training jobs in CT 200: one as the unit, any number as plain processes."""

    def __init__(self, ct: Container) -> None:
        self.ct = ct
        self.pids: list[int] = []

    def start_process(self, name: str, *args: str) -> int:
        ckpt = f"{WORK}/{name}.ckpt"
        cmd = " ".join(["/usr/bin/python3", "-u", SCRIPT, "--checkpoint", ckpt, *args])
        pid = int(self.ct.out(f"cd /; setsid nohup {cmd} > {WORK}/{name}.log 2>&1 < /dev/null & echo $!"))
        self.pids.append(pid)
        self._wait_for(f"grep -q training {WORK}/{name}.log")
        return pid

    def start_unit(self, name: str, *args: str) -> int:
        unit = trainer.render_unit(script=SCRIPT, checkpoint=f"{WORK}/{name}.ckpt", extra_args=args)
        self.ct.put(f"/etc/systemd/system/{UNIT}", unit)
        self.ct.run(
            f"systemctl daemon-reload && systemctl reset-failed {UNIT} 2>/dev/null; systemctl start {UNIT}"
        )
        pid = int(self.ct.unit_props(UNIT, ["MainPID"])["MainPID"])
        self._wait_for(f"journalctl --unit={UNIT} _PID={pid} --output=cat | grep -q training")
        return pid

    def start_gpu_holder(self) -> int:
        """A process the stand-in nvidia-smi lists on GPU 0 until the test (or cleanup()) ends it."""
        pid = int(self.ct.out("cd /; setsid nohup sleep infinity > /dev/null 2>&1 < /dev/null & echo $!"))
        self.pids.append(pid)
        self.ct.run(f"echo {pid} >> {GPU_PIDS}")
        return pid

    def _wait_for(self, command: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while self.ct.run(command, check=False).returncode != 0:
            assert time.monotonic() < deadline, f"CT 200: {command!r} never succeeded"
            time.sleep(0.2)

    def alive(self, pid: int) -> bool:
        state = self.ct.run(f"ps -o stat= -p {pid}", check=False).stdout.strip()
        return bool(state) and not state.startswith("Z")

    def checkpoint(self, name: str) -> dict | None:
        proc = self.ct.run(f"cat {WORK}/{name}.ckpt", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def cleanup(self) -> None:
        self.ct.run(
            f"systemctl stop {UNIT}; rm -rf /etc/systemd/system/{UNIT} {ETC_DROP_INS};"
            f" systemctl daemon-reload; systemctl reset-failed {UNIT}; true",
            check=False,
        )
        for pid in self.pids:
            self.ct.run(f"kill -9 {pid}", check=False)
        self.ct.run(f"rm -rf {WORK} {shlex.quote(DROP_IN)} {GPU_PIDS}", check=False)


@pytest.fixture
def jobs(fleet_ct: Container) -> Iterator[Jobs]:
    fleet_ct.put(SCRIPT, Path(trainer.__file__).read_text())
    jobs = Jobs(fleet_ct)
    jobs.cleanup()
    fleet_ct.run(f"mkdir -p {WORK}")
    yield jobs
    jobs.cleanup()


def stop_training(ansible: Ansible, *args: str) -> PlaybookRun:
    return ansible.playbook(
        "playbooks/training_stop.yml", "-e", f"ansible_python_interpreter={MODULE_PYTHON}", *args
    )


def ledger(ct: Container) -> dict:
    return json.loads(ct.out("cat /var/lib/sglfleet/ledger.json"))["phases"]["training_stop"]


def test_job_is_stopped_with_sigterm_and_writes_its_checkpoint(ansible: Ansible, jobs: Jobs) -> None:
    unit_pid = jobs.start_unit("unit")
    pid = jobs.start_process("proc")

    check = stop_training(ansible, "--check")
    assert check.rc == 0, check.explain()
    assert f"unit {UNIT}" in check.output, check.explain()
    assert f"process {pid}" in check.output, check.explain()
    # The unit's own process matches the pattern too, but it is stopped with its unit.
    assert f"process {unit_pid}" not in check.output, check.explain()
    assert check.recap["changed"] >= 1, check.explain()
    assert jobs.alive(pid)
    assert jobs.alive(unit_pid)
    assert jobs.checkpoint("unit") is None
    assert jobs.checkpoint("proc") is None

    run = stop_training(ansible)
    assert run.rc == 0, run.explain()
    assert run.recap["failed"] == 0, run.explain()
    assert "WARNING" not in run.output, run.explain()
    for name, expected_pid in (("unit", unit_pid), ("proc", pid)):
        ckpt = jobs.checkpoint(name)
        assert ckpt is not None, f"no checkpoint from the {name} job\n{run.explain()}"
        assert ckpt["signal"] == "SIGTERM"
        assert ckpt["pid"] == expected_pid
    assert not jobs.alive(pid)
    props = jobs.ct.unit_props(UNIT, ["ActiveState", "Result"])
    assert props == {"ActiveState": "inactive", "Result": "success"}
    assert jobs.ct.run(f"test -e {DROP_IN}", check=False).returncode != 0, "the runtime drop-in was left"

    record = ledger(jobs.ct)
    assert record["status"] == "done"
    assert record["evidence"]["units_stopped"] == [UNIT]
    assert record["evidence"]["processes_stopped"] == [pid]
    assert record["evidence"]["killed"] == []
    # the lab's CT has nvidia-smi once phase toolchain installed the stand-in driver
    has_nvidia_smi = jobs.ct.run("command -v nvidia-smi", check=False).returncode == 0
    assert record["evidence"]["nvidia_smi_found"] is has_nvidia_smi

    again = stop_training(ansible)
    assert again.rc == 0, again.explain()
    assert again.recap["changed"] == 0, again.explain()
    assert "nothing to stop" in again.output
    assert ledger(jobs.ct) == record, "a run that stopped nothing rewrote the ledger"


def test_job_ignoring_sigterm_is_killed_after_the_timeout(ansible: Ansible, jobs: Jobs) -> None:
    timeout = 3
    unit_pid = jobs.start_unit("unit", "--ignore-sigterm")
    pid = jobs.start_process("proc", "--ignore-sigterm")

    run = stop_training(ansible, "-e", json.dumps({"training_stop_timeout": timeout}))
    assert run.rc == 0, run.explain()
    assert run.recap["failed"] == 0, run.explain()
    assert run.seconds >= timeout
    assert "WARNING" in run.output and "SIGKILL" in run.output, run.explain()
    assert not jobs.alive(pid)
    assert not jobs.alive(unit_pid)
    assert jobs.checkpoint("unit") is None
    assert jobs.checkpoint("proc") is None
    # The stop sticks: Restart=on-failure does not bring the killed unit back. A restart systemd had
    # scheduled would show now, as ActiveState=activating with SubState=auto-restart for RestartSec.
    state = jobs.ct.unit_props(UNIT, ["ActiveState", "SubState"])
    assert state["ActiveState"] in {"inactive", "failed"}, state
    assert jobs.ct.run(f"test -e {DROP_IN}", check=False).returncode != 0, "the runtime drop-in was left"

    evidence = ledger(jobs.ct)["evidence"]
    assert f"pid {pid}" in evidence["killed"]
    assert f"unit {UNIT}" in evidence["killed"]


def test_the_stop_settings_win_over_override_conf_and_a_later_drop_in_is_refused(
    ansible: Ansible, jobs: Jobs
) -> None:
    # systemd.unit(5): drop-ins apply in the lexicographic order of their names, whatever their directory.
    # `systemctl edit` writes override.conf, which sorts before ours (zz-...): ours wins. A drop-in that
    # sorts after ours would win; the role sees it in `systemctl show` and refuses before stopping anything.
    unit_pid = jobs.start_unit("unit")
    jobs.ct.put(f"{ETC_DROP_INS}/zzz-local.conf", "[Service]\nKillSignal=SIGINT\n")
    jobs.ct.run("systemctl daemon-reload")
    refused = stop_training(ansible)
    assert refused.rc != 0, refused.explain()
    assert "systemd would not stop the training units as asked" in refused.output, refused.explain()
    assert "KillSignal=2 (asked for SIGTERM, 15)" in refused.output, refused.explain()
    assert f"{ETC_DROP_INS}/zzz-local.conf" in refused.output, refused.explain()
    assert jobs.alive(unit_pid) and jobs.checkpoint("unit") is None
    assert jobs.ct.run(f"test -e {DROP_IN}", check=False).returncode != 0, "the runtime drop-in was left"

    jobs.ct.run(f"mv {ETC_DROP_INS}/zzz-local.conf {ETC_DROP_INS}/override.conf && systemctl daemon-reload")
    run = stop_training(ansible)
    assert run.rc == 0, run.explain()
    ckpt = jobs.checkpoint("unit")
    assert ckpt is not None and ckpt["signal"] == "SIGTERM", run.explain()
    assert jobs.ct.unit_props(UNIT, ["KillSignal"]) == {"KillSignal": "2"}, "override.conf is in effect again"


def test_waits_until_no_compute_process_holds_a_gpu(
    ansible: Ansible, jobs: Jobs, fake_nvidia_smi: str
) -> None:
    pid = jobs.start_process("proc")
    holder = jobs.start_gpu_holder()  # e.g. a dataloader worker that outlives the job a while

    running = ansible.start(
        "playbooks/training_stop.yml",
        "-e", f"ansible_python_interpreter={MODULE_PYTHON}",
        "-e", json.dumps({"training_stop_nvidia_smi": fake_nvidia_smi}),
    )  # fmt: skip
    # The job is stopped, and the play polls while the GPU is still busy...
    running.wait_for("FAILED - RETRYING: [ct200]: Wait until nvidia-smi lists no compute process")
    assert not jobs.alive(pid)
    assert jobs.alive(holder)
    # ...and returns once the last process on it has ended (the holder ends when the test says so, however
    # long the play took to get here).
    jobs.ct.run(f"kill {holder}")
    run = running.finish()
    assert run.rc == 0, run.explain()
    assert jobs.checkpoint("proc") is not None
    assert not jobs.alive(holder)
    assert "nvidia-smi was not found" not in run.output
    assert ledger(jobs.ct)["evidence"]["nvidia_smi_found"] is True


def test_fails_naming_the_process_that_keeps_a_gpu(
    ansible: Ansible, jobs: Jobs, fake_nvidia_smi: str
) -> None:
    holder = jobs.start_gpu_holder()
    extra = {"training_stop_nvidia_smi": fake_nvidia_smi, "training_stop_gpu_timeout": 2}
    run = stop_training(ansible, "-e", json.dumps(extra))
    assert run.rc != 0, run.explain()
    output = " ".join(run.output.split())
    assert "Compute processes still hold GPUs on ct200 2 s after the training job was stopped" in output
    assert f"pid {holder} (/usr/bin/python3) on GPU 0" in output, run.explain()
    record = ledger(jobs.ct)
    assert (record["status"], record["evidence"]["gpu_processes_left"]) == ("failed", [holder])


STEP_TAGS = [
    "training_stop_preflight",
    "training_stop_discover",
    "training_stop_stop",
    "training_stop_verify",
    "training_stop_record",
]


def test_every_step_runs_alone_with_its_tag_in_check_mode(ansible: Ansible, jobs: Jobs) -> None:
    pid = jobs.start_process("proc")
    before = jobs.ct.run("cat /var/lib/sglfleet/ledger.json", check=False).stdout
    for tag in STEP_TAGS:
        run = stop_training(ansible, "--check", "--tags", tag)
        assert run.rc == 0, f"--tags {tag}\n{run.explain()}"
        assert run.recap["failed"] == 0, f"--tags {tag}\n{run.explain()}"
    assert jobs.alive(pid)
    assert jobs.checkpoint("proc") is None
    assert jobs.ct.run("cat /var/lib/sglfleet/ledger.json", check=False).stdout == before
