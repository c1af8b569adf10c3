"""playbooks/fleet.yml against CT 200: eight stand-in SGLang instances under systemd.

The tests run in file order on one fleet (module fixture): bring-up, where the API key goes (it reaches
the servers only through the 0600 EnvironmentFile and sglfleet.launch: no command line, no journal line
holds it), idempotence, a rolling restart, systemd restarting a killed instance, bad variables, then
8 -> 3 instances. CT 200 shares the host's network namespace, so the instances' ports are reachable from
here on 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from support.ansible_lab import FAKE_NVIDIA_SMI, MODULE_PYTHON, Ansible, Container, PlaybookRun

pytestmark = pytest.mark.timeout(600)

INSTANCES = 8
# What the fleet is scaled down to, and what the tests after that roll (fewer: each restart waits on a drain).
KEPT = 3
PORT_BASE = 30000
API_KEY = "lab-only-key-0f3c9a"  # a test secret: must never show in the output or the unit file
MODEL = "standin-7b"
RESET = (
    "systemctl stop 'sglang@*.service'; "
    "for i in $(seq 0 15); do systemctl disable sglang@$i.service 2>/dev/null; done; "
    "rm -rf /etc/sglang /etc/systemd/system/sglang@.service; systemctl daemon-reload; "
    "systemctl reset-failed 'sglang@*.service'; true"
)


@dataclass
class Fleet:
    ct: Container
    ansible: Ansible
    tmp: Path
    vars: dict = field(default_factory=dict)
    first: PlaybookRun | None = None
    fresh_check: PlaybookRun | None = None
    fresh_left: str = ""
    journal: str = ""  # a journalctl command line that prints what was logged since just before the first run

    def serve(self, *args: str, **overrides: object) -> PlaybookRun:
        extra = self.tmp / f"vars-{time.monotonic_ns()}.json"
        extra.write_text(json.dumps({**self.vars, **overrides}))
        return self.ansible.playbook("playbooks/fleet.yml", "-e", f"@{extra}", *args)

    def props(self, i: int, *names: str) -> dict[str, str]:
        return self.ct.unit_props(f"sglang@{i}.service", names)

    def main_pids(self) -> list[int]:
        return [int(self.props(i, "MainPID")["MainPID"]) for i in range(INSTANCES)]

    def snapshot(self) -> str:
        """What a run that changes nothing leaves as it was: files, their times, the processes."""
        return self.ct.out(
            "stat -c '%n %Y %a' /etc/systemd/system/sglang@.service /etc/sglang/*; "
            "sha256sum /etc/sglang/*; "
            "for i in $(seq 0 15); do systemctl show -p MainPID -p ActiveState sglang@$i.service; done"
        )


def health(port: int, timeout: float = 2.0) -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health_generate", timeout=timeout).status_code
    except httpx.HTTPError:
        return None


def wait_healthy(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while health(port) != 200:
        assert time.monotonic() < deadline, f"port {port} never answered /health_generate 200"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def fleet(fleet_ct: Container, ansible: Ansible, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet_ct.run(RESET)
    fleet = Fleet(
        fleet_ct,
        ansible,
        tmp_path_factory.mktemp("serve"),
        vars={"ansible_python_interpreter": MODULE_PYTHON, "sglang_fleet_api_key": API_KEY},
    )
    fleet.fresh_check = fleet.serve("--check")
    units = "/etc/systemd/system"
    fleet.fresh_left = fleet_ct.run(
        f"ls -d /etc/sglang {units}/sglang@.service {units}/multi-user.target.wants/sglang@*", check=False
    ).stdout
    # Where the journal stands now: the tests read what this fleet wrote, from here on.
    since = fleet_ct.out("date +%s")
    fleet.journal = f"journalctl --no-pager --output=cat --since=@{since}"
    fleet.first = fleet.serve()
    yield fleet
    fleet_ct.run(RESET)


def test_serve_brings_up_eight_healthy_instances(fleet: Fleet) -> None:
    run = fleet.first
    assert run is not None
    assert run.rc == 0, run.explain()
    assert API_KEY not in run.output, "the API key leaked into the output"
    for i in range(INSTANCES):
        port = PORT_BASE + i
        assert fleet.props(i, "ActiveState", "UnitFileState") == {
            "ActiveState": "active",
            "UnitFileState": "enabled",
        }
        assert health(port) == 200
        models = httpx.get(
            f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}
        )
        assert [m["id"] for m in models.json()["data"]] == [MODEL]
        # The servers require the key (/health* need none).
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 401
        wrong = {"Authorization": "Bearer wrong"}
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=wrong).status_code == 401
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200

    # Instance 3: its own GPU, port and metrics directory, from a 0600 environment file.
    env = fleet.ct.out("cat /etc/sglang/instance-3.env")
    assert "CUDA_VISIBLE_DEVICES=3\n" in env
    assert "PROMETHEUS_MULTIPROC_DIR=/run/sglang/instance-3\n" in env
    assert "--port 30003" in env
    assert fleet.ct.out("stat -c %a /etc/sglang/instance-3.env") == "600"
    pid = fleet.props(3, "MainPID")["MainPID"]
    environ = fleet.ct.out(f"tr '\\0' '\\n' < /proc/{pid}/environ")
    assert "CUDA_VISIBLE_DEVICES=3" in environ.splitlines()
    assert fleet.ct.run("test -d /run/sglang/instance-3", check=False).returncode == 0
    unit = fleet.ct.out("cat /etc/systemd/system/sglang@.service")
    assert API_KEY not in unit
    for line in ("Restart=on-failure", "KillSignal=SIGTERM", "TimeoutStopSec=30"):
        assert line in unit.splitlines()
    assert fleet.ct.out("journalctl --unit=sglang@3.service --output=cat | wc -l") != "0"

    ledger = json.loads(fleet.ct.out("cat /var/lib/sglfleet/ledger.json"))["phases"]["fleet"]
    assert ledger["status"] == "done"
    assert ledger["evidence"]["instances"] == INSTANCES
    assert ledger["evidence"]["ports"] == [PORT_BASE + i for i in range(INSTANCES)]


def test_check_mode_on_a_fresh_host_changes_nothing(fleet: Fleet) -> None:
    # Run by the fixture on CT 200 without any instance, before the first real run.
    run = fleet.fresh_check
    assert run is not None
    assert run.rc == 0, run.explain()
    assert "Would install sglang@.service, then enable and start sglang@0" in " ".join(run.output.split())
    assert run.recap["changed"] >= 1
    assert fleet.fresh_left == "", f"check mode left {fleet.fresh_left}"


def _grep_key(ct: Container, files: str) -> str:
    """The files among `files` (a shell glob in CT 200) that contain the key. The key goes in on
    stdin, so that the grep itself does not carry it on its command line."""
    return ct.run(f"grep -l -a -F -f - {files} 2>/dev/null", stdin=API_KEY + "\n", check=False).stdout


def test_no_process_has_the_key_on_its_command_line(fleet: Fleet) -> None:
    assert _grep_key(fleet.ct, "/proc/[0-9]*/cmdline") == ""
    for pid in fleet.main_pids():
        cmdline = fleet.ct.out(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
        assert " -m sglfleet.launch sglfleet_testing.standin " in cmdline, cmdline
        assert "--api-key" not in cmdline


def test_the_journal_has_no_line_with_the_key(fleet: Fleet) -> None:
    assert int(fleet.ct.out(f"{fleet.journal} | wc -l")) > 0
    found = fleet.ct.run(f"{fleet.journal} | grep -c -F -f -", stdin=API_KEY + "\n", check=False)
    assert found.stdout.strip() == "0"
    # The stand-in logs its arguments as SGLang does (engine.py:773); the launcher redacted the key.
    server_args = fleet.ct.out(f"{fleet.journal} --unit=sglang@0.service | grep server_args=")
    assert "api_key='<redacted>'" in server_args


def test_the_key_is_only_in_the_0600_environment_files(fleet: Fleet) -> None:
    holders = sorted(_grep_key(fleet.ct, "/etc/sglang/* /etc/systemd/system/sglang@.service").split())
    assert holders == [f"/etc/sglang/instance-{i}.env" for i in range(INSTANCES)]
    for path in holders:
        assert fleet.ct.out(f"stat -c '%a %U' {path}") == "600 root"
        assert "--api-key" not in fleet.ct.out(f"grep '^SGLANG_ARGS=' {path}")


def test_a_normal_stop_and_restart_are_no_failure(fleet: Fleet) -> None:
    # The drain of SGLang 0.5.12 ends in SIGKILL of itself: systemd must not count that a failure.
    before = fleet.props(1, "NRestarts")["NRestarts"]
    fleet.ct.run("systemctl stop sglang@1.service", timeout=60)
    stopped = fleet.props(1, "ActiveState", "Result", "ExecMainStatus", "ExecMainCode")
    assert stopped == {
        "ActiveState": "inactive",
        "Result": "success",
        "ExecMainStatus": "0",
        "ExecMainCode": "1",
    }
    fleet.ct.run("systemctl start sglang@1.service")
    wait_healthy(PORT_BASE + 1, timeout=60)
    fleet.ct.run("systemctl restart sglang@0.service", timeout=60)
    wait_healthy(PORT_BASE, timeout=60)
    for i in (0, 1):
        assert fleet.props(i, "ActiveState", "Result") == {"ActiveState": "active", "Result": "success"}
    assert fleet.props(1, "NRestarts")["NRestarts"] == before  # systemd restarted nothing itself
    journal = fleet.ct.out("journalctl --no-pager --output=cat --unit=sglang@1.service")
    assert "Draining requests and shutting down" in journal
    assert "Failed with result" not in journal


def test_second_run_changes_nothing_and_instances_default_to_one_per_gpu(
    fleet: Fleet, fake_nvidia_smi: str
) -> None:
    # The second run, with eight GPUs (the stand-in nvidia-smi) and no count: the fleet is the eight it
    # already is, and nothing is rewritten or restarted.
    before = fleet.snapshot()
    run = fleet.serve(
        sglang_fleet_instances=None, sglang_fleet_check_gpus=True, sglang_fleet_nvidia_smi=fake_nvidia_smi
    )
    assert run.rc == 0, run.explain()
    assert run.recap["changed"] == 0, run.explain()
    assert fleet.snapshot() == before


def test_check_mode_says_what_would_change_and_changes_nothing(fleet: Fleet) -> None:
    before = fleet.snapshot()
    run = fleet.serve("--check", sglang_fleet_max_running_requests=64)
    assert run.rc == 0, run.explain()
    assert run.recap["changed"] >= INSTANCES, run.explain()  # eight environment files, eight restarts
    assert "Restart sglang@7" in run.output
    assert API_KEY not in run.output
    assert fleet.snapshot() == before


class HealthWatch:
    """Polls every instance's /health_generate from here and keeps (monotonic time, healthy) samples."""

    def __init__(self) -> None:
        self.samples: dict[int, list[tuple[float, bool]]] = {i: [] for i in range(INSTANCES)}
        self._stop = threading.Event()
        # One poller per instance: a /health_generate takes about 1 s (SGLang 0.5.12 and the stand-in).
        self._threads = [
            threading.Thread(target=self._poll, args=(i,), daemon=True) for i in range(INSTANCES)
        ]

    def _poll(self, i: int) -> None:
        with httpx.Client(timeout=5.0) as client:
            while not self._stop.is_set():
                try:
                    ok = client.get(f"http://127.0.0.1:{PORT_BASE + i}/health_generate").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.samples[i].append((time.monotonic(), ok))
                time.sleep(0.02)

    def __enter__(self) -> HealthWatch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def healthy_after(self, i: int, t: float) -> float:
        """When instance i was first seen healthy after time t."""
        return next(ts for ts, ok in self.samples[i] if ts > t and ok)

    def down_between(self, i: int, start: float, end: float) -> bool:
        return any(not ok for ts, ok in self.samples[i] if start <= ts <= end)


def test_changing_one_flag_rolls_the_restart_with_a_health_gate(fleet: Fleet) -> None:
    warmup = 2.0
    pids_before = fleet.main_pids()
    fleet.vars["sglang_fleet_extra_args"] = ["--standin-warmup-seconds", str(warmup)]
    with HealthWatch() as watch:
        run = fleet.serve()
    assert run.rc == 0, run.explain()
    pids_after = fleet.main_pids()
    assert all(a != b for a, b in zip(pids_before, pids_after, strict=True)), "not every instance restarted"

    # ExecMainStartTimestampMonotonic is CLOCK_MONOTONIC in microseconds, the clock time.monotonic()
    # reads here (the container shares the host's kernel).
    starts = [
        int(fleet.props(i, "ExecMainStartTimestampMonotonic")["ExecMainStartTimestampMonotonic"]) / 1e6
        for i in range(INSTANCES)
    ]
    assert starts == sorted(starts), f"instances restarted out of order: {starts}"
    for i in range(INSTANCES - 1):
        healthy = watch.healthy_after(i, starts[i])
        # The gate: instance i+1 restarts only once instance i answers 200 again...
        assert starts[i] < healthy < starts[i + 1], (i, starts[i], healthy, starts[i + 1])
        # ...which the new warm-up delays by `warmup` seconds after its start.
        assert starts[i + 1] - starts[i] >= warmup
        # One at a time: while i was down, every other instance kept answering.
        for j in range(INSTANCES):
            if j != i:
                assert not watch.down_between(j, starts[i] + 0.05, healthy - 0.05), (i, j)
    assert watch.healthy_after(INSTANCES - 1, starts[-1])


def test_killed_instance_is_restarted_by_systemd(fleet: Fleet) -> None:
    before = fleet.props(3, "MainPID", "NRestarts")
    fleet.ct.run(f"kill -9 {before['MainPID']}")
    deadline = time.monotonic() + 30
    while True:
        now = fleet.props(3, "MainPID", "NRestarts", "ActiveState")
        if now["ActiveState"] == "active" and now["MainPID"] not in ("0", before["MainPID"]):
            break
        assert time.monotonic() < deadline, f"systemd did not restart sglang@3: {now}"
        time.sleep(0.2)
    assert int(now["NRestarts"]) == int(before["NRestarts"]) + 1
    wait_healthy(PORT_BASE + 3)


def test_failed_health_gate_stops_the_roll_and_names_the_instance(fleet: Fleet) -> None:
    pids = fleet.main_pids()
    # A warm-up longer than the gate waits: the first instance restarted never turns healthy.
    run = fleet.serve(
        sglang_fleet_extra_args=["--standin-warmup-seconds", "600"], sglang_fleet_health_timeout=4
    )
    assert run.rc != 0, run.explain()
    output = " ".join(run.output.split())
    assert "Rolling restart stopped" in output, run.explain()
    assert "sglang@0 (port 30000) is not healthy: starting" in output, run.explain()
    assert "last 30 journal lines of sglang@0" in output, run.explain()
    assert "Restart sglang@1" not in output
    after = fleet.main_pids()
    assert after[0] != pids[0]
    assert after[1:] == pids[1:], "the roll went on past the failed gate"
    ledger = json.loads(fleet.ct.out("cat /var/lib/sglfleet/ledger.json"))["phases"]["fleet"]
    assert (ledger["status"], ledger["evidence"]["unhealthy"]) == ("failed", ["sglang@0"])

    # Back to the fleet's configuration: only instance 0 runs another one, so only it restarts.
    run = fleet.serve()
    assert run.rc == 0, run.explain()
    assert fleet.main_pids()[1:] == pids[1:]
    assert health(PORT_BASE) == 200
    assert (
        json.loads(fleet.ct.out("cat /var/lib/sglfleet/ledger.json"))["phases"]["fleet"]["status"] == "done"
    )


@pytest.fixture
def port_taken() -> Iterator[int]:
    """Something else listening on the port a ninth instance would take (here, on the shared network)."""
    port = PORT_BASE + INSTANCES
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield port


# Two cases the lab CT decides (its GPUs as nvidia-smi counts them, a path on it): the play fails before any
# change. The module names every other refusal (no GPU found, two instances on one GPU, ...), before it
# writes anything: tests/unit/test_instances.py (test_bad_configuration_is_refused_naming_the_variable,
# test_module_refuses_overlapping_gpus_before_writing).
BAD_VARIABLES = {
    "more instances than GPUs": (
        {
            "sglang_fleet_check_gpus": True,
            "sglang_fleet_nvidia_smi": FAKE_NVIDIA_SMI,
            "sglang_fleet_instances": 9,
        },
        "sglang_fleet_instances is 9 but ct200 has 8 GPU(s)",
    ),
    "missing model path": (
        {"sglang_fleet_model_path": "/srv/models/missing"},
        "sglang_fleet_model_path /srv/models/missing does not exist on ct200",
    ),
}


@pytest.mark.parametrize("case", BAD_VARIABLES, ids=list(BAD_VARIABLES))
def test_bad_variable_fails_before_any_change(fleet: Fleet, fake_nvidia_smi: str, case: str) -> None:
    overrides, message = BAD_VARIABLES[case]
    before = fleet.snapshot()
    run = fleet.serve(**overrides)
    assert run.rc != 0, run.explain()
    assert message in " ".join(run.output.split()), run.explain()
    assert run.recap["changed"] == 0, run.explain()
    assert fleet.snapshot() == before


def test_port_taken_by_another_process_fails_before_any_change(fleet: Fleet, port_taken: int) -> None:
    before = fleet.snapshot()
    run = fleet.serve(sglang_fleet_instances=INSTANCES + 1)
    assert run.rc != 0, run.explain()
    output = " ".join(run.output.split())
    assert "already taken by another process" in output, run.explain()
    assert f"{port_taken}: a process this host cannot see (the host or another container)" in output, (
        run.explain()
    )
    assert run.recap["changed"] == 0, run.explain()
    assert fleet.snapshot() == before


STEP_TAGS = [
    "sglang_fleet_preflight",
    "sglang_fleet_install",
    "sglang_fleet_configure",
    "sglang_fleet_retire",
    "sglang_fleet_start",
    "sglang_fleet_verify",
    "sglang_fleet_record",
]


def test_every_step_runs_alone_with_its_tag_in_check_mode(fleet: Fleet) -> None:
    before = fleet.snapshot()
    ledger = fleet.ct.out("cat /var/lib/sglfleet/ledger.json")
    for tag in STEP_TAGS:
        run = fleet.serve("--check", "--tags", tag)
        assert run.rc == 0, f"--tags {tag}\n{run.explain()}"
        assert run.recap["failed"] == 0, f"--tags {tag}\n{run.explain()}"
        assert run.recap["changed"] == 0, f"--tags {tag}\n{run.explain()}"
    assert fleet.snapshot() == before
    assert fleet.ct.out("cat /var/lib/sglfleet/ledger.json") == ledger, "a check run rewrote the ledger"


def test_deliberate_restarts_do_not_spend_the_crash_budget(fleet: Fleet) -> None:
    # Five starts of sglang@0 within StartLimitIntervalSec: its crash budget (StartLimitBurst=5) is spent.
    for _ in range(5):
        fleet.ct.run("systemctl restart sglang@0.service", check=False)
    pids = fleet.main_pids()
    # Instance 0 alone serves another model: the role restarts it, and the start is not refused.
    other = {"model_path": "/srv/models/standin-7b", "served_model_name": "standin-7b-b"}
    run = fleet.serve(sglang_fleet_instance_models=[other])
    assert run.rc == 0, run.explain()
    assert "start-limit-hit" not in run.output
    after = fleet.main_pids()
    assert after[0] != pids[0] and after[1:] == pids[1:], "only instance 0 serves another model"
    models = httpx.get(
        f"http://127.0.0.1:{PORT_BASE}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}
    )
    assert [m["id"] for m in models.json()["data"]] == ["standin-7b-b"]

    # A real crash loop still stops: systemd gives up after StartLimitBurst starts. systemd 252 (Debian
    # 12) leaves Result at the last failure's ("signal") when the limit stops an automatic restart, and
    # logs "Start request repeated too quickly"; a manual start that hits it says "start-limit-hit".
    since = int(fleet.ct.out("date +%s"))
    killed: list[str] = []
    deadline = time.monotonic() + 60
    while True:
        now = fleet.props(0, "ActiveState", "Result", "MainPID")
        if now["Result"] == "start-limit-hit":
            break
        if now["ActiveState"] == "failed" and "Start request repeated too quickly" in fleet.ct.out(
            f"journalctl -u sglang@0.service --no-pager -o cat --since=@{since}"
        ):
            break
        assert time.monotonic() < deadline, f"sglang@0 kept restarting: {now}"
        if now["ActiveState"] == "active" and now["MainPID"] not in ("0", *killed):
            fleet.ct.run(f"kill -9 {now['MainPID']}", check=False)
            killed.append(now["MainPID"])
        time.sleep(0.1)
    assert len(killed) <= 5, killed
    assert fleet.props(0, "ActiveState")["ActiveState"] == "failed"

    # The next serve starts it again (a deliberate start) with the fleet's model.
    run = fleet.serve()
    assert run.rc == 0, run.explain()
    assert health(PORT_BASE) == 200
    assert fleet.main_pids()[1:] == pids[1:]


def test_scaling_down_stops_and_disables_the_extra_instances(fleet: Fleet) -> None:
    pids = fleet.main_pids()
    run = fleet.serve(sglang_fleet_instances=KEPT)
    assert run.rc == 0, run.explain()
    for i in range(KEPT, INSTANCES):
        assert fleet.props(i, "ActiveState", "UnitFileState") == {
            "ActiveState": "inactive",
            "UnitFileState": "disabled",
        }
        assert fleet.ct.run(f"test -e /etc/sglang/instance-{i}.env", check=False).returncode != 0
        assert health(PORT_BASE + i) is None
    # The ones that stay were not touched.
    assert fleet.main_pids()[:KEPT] == pids[:KEPT]
    for i in range(KEPT):
        assert health(PORT_BASE + i) == 200
    ledger = json.loads(fleet.ct.out("cat /var/lib/sglfleet/ledger.json"))["phases"]["fleet"]
    assert ledger["evidence"]["instances"] == KEPT


def _site_packages(ct: Container) -> str:
    return ct.out("ls -d /opt/sglang/venv/lib/python3*/site-packages | head -n1")


def test_a_version_bump_rolls_every_instance_through_the_gate(fleet: Fleet) -> None:
    # What `pip install sglang==0.5.13` leaves in the servers' venv (the lab has no real SGLang).
    site = _site_packages(fleet.ct)
    dist = f"{site}/sglang-0.5.13.dist-info"
    pids = fleet.main_pids()[:KEPT]
    fleet.ct.run(f"mkdir -p {dist} && printf 'sglang/__init__.py,,\\n' > {dist}/RECORD")
    try:
        with HealthWatch() as watch:
            run = fleet.serve(sglang_fleet_instances=KEPT)
        assert run.rc == 0, run.explain()
        assert f"Restart sglang@{KEPT - 1}" in run.output
        after = fleet.main_pids()[:KEPT]
        assert all(a != b for a, b in zip(pids, after, strict=True)), "not every instance rolled"
        starts = [
            int(fleet.props(i, "ExecMainStartTimestampMonotonic")["ExecMainStartTimestampMonotonic"]) / 1e6
            for i in range(KEPT)
        ]
        assert starts == sorted(starts)
        for i in range(KEPT - 1):
            assert starts[i] < watch.healthy_after(i, starts[i]) < starts[i + 1], i
        evidence = json.loads(fleet.ct.out("cat /var/lib/sglfleet/ledger.json"))["phases"]["fleet"][
            "evidence"
        ]
        assert evidence["engine"] == "0.5.13"
        again = fleet.serve(sglang_fleet_instances=KEPT)
        assert again.rc == 0 and again.recap["changed"] == 0, again.explain()
    finally:
        fleet.ct.run(f"rm -rf {dist}")


def test_the_fleet_runs_the_backend_the_sglang_phase_decided(fleet: Fleet, fake_nvidia_smi: str) -> None:
    # The sglang role decides from the GPUs (a stand-in nvidia-smi reporting `capability`) and records
    # its decision in common.env; serve passes it to every instance. SM120's decision (flashinfer), on
    # the fleet site.yml converges: test_site.
    capability, backend = "9.0", "fa3"
    fleet.ct.run(
        f"echo {capability} > /var/tmp/fake-nvidia-smi.cc && mkdir -p /var/tmp/fake-cuda/bin"
        " && touch /var/tmp/fake-cuda/bin/nvcc"
    )
    try:
        extra = fleet.tmp / f"sglang-{capability}.json"
        extra.write_text(
            json.dumps(
                {
                    "ansible_python_interpreter": MODULE_PYTHON,
                    "sglang_nvidia_smi": fake_nvidia_smi,
                    "sglang_cuda_home": "/var/tmp/fake-cuda",
                }
            )
        )
        decide = fleet.ansible.playbook(
            "playbooks/sglang.yml", "-e", f"@{extra}", "--tags", "sglang_configure"
        )
        assert decide.rc == 0, decide.explain()
        assert f"SGLANG_ATTENTION_BACKEND={backend}\n" in fleet.ct.out("cat /etc/sglang/common.env") + "\n"
        run = fleet.serve(sglang_fleet_instances=KEPT)
        assert run.rc == 0, run.explain()
        for i in range(KEPT):
            info = httpx.get(
                f"http://127.0.0.1:{PORT_BASE + i}/server_info",
                headers={"Authorization": f"Bearer {API_KEY}"},
            ).json()
            assert info["attention_backend"] == backend, (i, info.get("attention_backend"))
        # The inventory overrides the recorded decision.
        run = fleet.serve(sglang_fleet_instances=KEPT, sglang_fleet_attention_backend="triton")
        assert run.rc == 0, run.explain()
        info = httpx.get(
            f"http://127.0.0.1:{PORT_BASE}/server_info", headers={"Authorization": f"Bearer {API_KEY}"}
        )
        assert info.json()["attention_backend"] == "triton"
    finally:
        fleet.ct.run("rm -rf /var/tmp/fake-nvidia-smi.cc /var/tmp/fake-cuda /etc/sglang/common.env")
