"""A rolling restart of the lab fleet under a running `sglfleet generate` job: every instance drains
as SGLang 0.5.12 does (503 on /health*, still serving, exit once no request is left), the job moves
its new requests to the others, and nothing is lost, duplicated or marked failed by systemd.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from support.ansible_lab import MODULE_PYTHON, Ansible, Container, PlaybookRun

pytestmark = pytest.mark.timeout(900)

INSTANCES = 3
PORT_BASE = 30000
API_KEY = "lab-key-roll-51c29e"
PROMPTS = 6000
# Requests of 0.05 s + 4..64 tokens at 200 tokens/s: never an idle instant on a busy instance.
LOAD_ARGS = ["--standin-ttft", "0.05", "--standin-decode-tps", "200", "--standin-natural-tokens", "4:64"]
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

    def serve(self, **overrides: object) -> PlaybookRun:
        extra = self.tmp / f"vars-{time.monotonic_ns()}.json"
        extra.write_text(json.dumps({**self.vars, **overrides}))
        return self.ansible.playbook("playbooks/fleet.yml", "-e", f"@{extra}")

    def props(self, i: int, *names: str) -> dict[str, str]:
        return self.ct.unit_props(f"sglang@{i}.service", names)


@pytest.fixture(scope="module")
def fleet(fleet_ct: Container, ansible: Ansible, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet_ct.run(RESET)
    fleet = Fleet(
        fleet_ct,
        ansible,
        tmp_path_factory.mktemp("roll"),
        vars={
            "ansible_python_interpreter": MODULE_PYTHON,
            "sglang_fleet_api_key": API_KEY,
            "sglang_fleet_instances": INSTANCES,
            "sglang_fleet_extra_args": LOAD_ARGS,
        },
    )
    first = fleet.serve()
    assert first.rc == 0, first.explain()
    yield fleet
    fleet_ct.run(RESET)


def _write_input(path: Path) -> list[str]:
    ids = [f"roll{i:06d}" for i in range(PROMPTS)]
    with path.open("w") as fh:
        for i, cid in enumerate(ids):
            turns = [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "old"}]
            fh.write(json.dumps({"id": cid, "conversations": turns}) + "\n")
    return ids


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_a_rolling_restart_under_load_loses_and_duplicates_nothing(fleet: Fleet) -> None:
    inp, out = fleet.tmp / "in.jsonl", fleet.tmp / "out.jsonl"
    ids = _write_input(inp)
    pids = [fleet.props(i, "MainPID")["MainPID"] for i in range(INSTANCES)]
    restarts = [fleet.props(i, "NRestarts")["NRestarts"] for i in range(INSTANCES)]
    since = fleet.ct.out("date +%s")
    argv = [sys.executable, "-m", "sglfleet", "generate", "-i", str(inp), "-o", str(out)]
    for i in range(INSTANCES):
        argv += ["--endpoint", f"http://127.0.0.1:{PORT_BASE + i}"]
    argv += ["--concurrency", "4", "--max-tokens", "64", "--model", "standin-7b", "--log-interval", "5"]
    job_log = fleet.tmp / "job.log"
    with job_log.open("wb") as log:  # the key through the environment, as a user would (not argv)
        job = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "SGLFLEET_API_KEY": API_KEY}
        )
    try:
        deadline = time.monotonic() + 60
        while _lines(out) < 200:
            assert job.poll() is None, job_log.read_text()
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.1)
        began, done_before = time.monotonic(), _lines(out)
        roll = fleet.serve(sglang_fleet_extra_args=[*LOAD_ARGS, "--standin-seed", "1"])
        rolled_in, done_after = time.monotonic() - began, _lines(out)
        assert roll.rc == 0, roll.explain()
        assert job.poll() is None, f"the job ended before the roll did: raise PROMPTS ({done_after} done)"
        assert job.wait(600) == 0, job_log.read_text()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    meanwhile = done_after - done_before
    print(f"roll of {INSTANCES} instances under load: {rolled_in:.1f} s, {meanwhile} results meanwhile")

    counts = Counter(json.loads(line)["custom_id"] for line in out.read_text().splitlines())
    lost, duplicated = set(ids) - set(counts), {k for k, n in counts.items() if n > 1}
    print(f"lost {len(lost)}, duplicated {len(duplicated)}")
    assert (len(lost), len(duplicated)) == (0, 0)

    journal = f"journalctl --no-pager --output=cat --since=@{since}"
    for i in range(INSTANCES):
        now = fleet.props(i, "MainPID", "NRestarts", "ActiveState", "Result")
        assert now["MainPID"] != pids[i], f"sglang@{i} did not restart"
        assert (now["ActiveState"], now["Result"], now["NRestarts"]) == ("active", "success", restarts[i])
        unit_log = fleet.ct.out(f"{journal} --unit=sglang@{i}.service")
        assert "Draining requests and shutting down" in unit_log
        # the drain ended by itself (no request left), not by systemd's stop timeout
        assert "Gracefully exiting... Remaining number of requests 0." in unit_log
        assert "Failed with result" not in unit_log and "timed out" not in unit_log.lower()
    for i in range(INSTANCES):
        assert httpx.get(f"http://127.0.0.1:{PORT_BASE + i}/health").status_code == 200
