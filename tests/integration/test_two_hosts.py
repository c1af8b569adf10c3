"""Two hosts, one front door (issue 29): the session's lab CT (CT 200, or SGLFLEET_TEST_CT) and CT 203 both
run the fleet (playbooks/fleet.yml over both), the REAL sglang-router (playbooks/router.yml) on the first
one in front of the instances of both; one `sglfleet generate` job goes through the router, every worker
of both hosts serves part of it, and the second host's fleet is rolled during the job (with
sglang_fleet_router_url: each instance leaves the router before its restart and comes back after its
gate): exactly once, nothing lost, and no instance accepted a request after its drain began.

The lab's CTs share the host's network namespace, so the second host's instances bind 127.0.0.1 and the
router reaches them there: sglang_router_worker_host says so explicitly (the router's preflight refuses a
loopback worker on another host otherwise)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sglfleet_testing.lab.settings import LabSettings
from sglfleet_testing.router import tokenizer_json
from support.ansible_lab import Container, lab_inventory, run_playbook
from support.lab import prepare
from support.polling import wait_until

pytestmark = pytest.mark.timeout(1200)

SECOND = 203
SECOND_PORT_BASE = 30000 + 1000 * (SECOND - 200)
INSTANCES = 2
ROUTER_PORT = 30150
ROUTER = f"http://127.0.0.1:{ROUTER_PORT}"
API_KEY = "lab-two-hosts-key-7d21c4"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MODEL_DIR = "/srv/models/standin-7b"
PROMPTS = 4000
# Requests of 0.05 s + 4..64 tokens at 200 tokens/s: the job outlasts the roll of the second host.
LOAD_ARGS = ["--standin-ttft", "0.05", "--standin-decode-tps", "200", "--standin-natural-tokens", "4:64"]
RESET = (
    "systemctl stop sglang-router.service 'sglang@*.service' 2>/dev/null; "
    "systemctl disable sglang-router.service 2>/dev/null; "
    "for i in $(seq 0 15); do systemctl disable sglang@$i.service 2>/dev/null; done; "
    "rm -rf /etc/sglang /etc/sglang-router /etc/systemd/system/sglang@.service "
    "/etc/systemd/system/sglang-router.service; systemctl daemon-reload; "
    "systemctl reset-failed 'sglang@*.service' sglang-router.service 2>/dev/null; true"
)


@dataclass
class Pair:
    first: Container
    second: Container
    inventory: Path
    tmp: Path

    def play(self, playbook: str, *args: str, **overrides: object) -> object:
        extra = self.tmp / f"vars-{time.monotonic_ns()}.json"
        extra.write_text(
            json.dumps(
                {
                    # a cycle of its own: a CT whose training resumed on another cycle's set (test_site's,
                    # before this module in the CT 202 session) keeps its fleet stopped for that cycle
                    "generate_name": "two-hosts",
                    "sglang_fleet_api_key": API_KEY,
                    "sglang_fleet_instances": INSTANCES,
                    "sglang_fleet_extra_args": LOAD_ARGS,
                    "sglang_router_enabled": True,
                    "sglang_router_listen_host": "127.0.0.1",  # the lab CTs share the host's network
                    "sglang_router_port": ROUTER_PORT,
                    "sglang_router_prometheus_port": ROUTER_PORT + 1,
                    # every worker of both hosts serves part of the job (cache_aware's balance: issue 29)
                    "sglang_router_policy": "round_robin",
                    **overrides,
                }
            )
        )
        return run_playbook(playbook, self.inventory, "-e", f"@{extra}", *args, timeout=900)

    def workers(self) -> list[str]:
        return [
            *(f"http://127.0.0.1:{self.first.port_base + i}" for i in range(INSTANCES)),
            *(f"http://127.0.0.1:{self.second.port_base + i}" for i in range(INSTANCES)),
        ]


@pytest.fixture(scope="module")
def pair(
    ct: Container, lab_settings: LabSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("two-hosts")
    port = lab_settings.ssh_port(SECOND)
    second_vars = {
        "pve_vmid": SECOND,
        "proxmox_lxc_hostname": f"ct{SECOND}",
        "sglang_fleet_port_base": SECOND_PORT_BASE,
        # the CTs share one network namespace: the router reaches this host's loopback instances there
        "sglang_router_worker_host": "127.0.0.1",
    }
    own = lab_inventory(tmp / "second", vmid=SECOND, port=port, host_vars=second_vars)
    second = Container(SECOND, port=port, inventory=own, port_base=SECOND_PORT_BASE)
    made = second.playbook("provision.yml")
    assert made.rc == 0, made.explain()
    second.wait_reachable(timeout=60)
    prepare(second)
    first_vars = {
        "pve_vmid": ct.vmid,
        "proxmox_lxc_hostname": f"ct{ct.vmid}",
        "sglang_fleet_port_base": ct.port_base,
    }
    both = lab_inventory(
        tmp / "both", vmid=ct.vmid, port=ct.port, host_vars=first_vars, more={SECOND: (port, second_vars)}
    )
    for c in (ct, second):
        c.run(RESET)
    ct.put(f"{MODEL_DIR}/tokenizer.json", json.dumps(tokenizer_json()))
    yield Pair(ct, second, both, tmp)
    for c in (ct, second):
        c.run(RESET)
    second.disconnect()


def _served(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    match = re.search(r"^sglang:num_requests_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    assert match, text[:300]
    return float(match.group(1))


def _listed() -> list[str]:
    workers = httpx.get(f"{ROUTER}/workers", headers=AUTH, timeout=10).json()["workers"]
    return sorted(w["url"] for w in workers if w["is_healthy"])


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_one_router_in_front_of_two_hosts_and_a_roll_of_one_during_the_job(pair: Pair) -> None:
    served = pair.play("playbooks/fleet.yml")
    assert served.rc == 0, served.explain()
    routed = pair.play("playbooks/router.yml")
    assert routed.rc == 0, routed.explain()
    assert _listed() == sorted(pair.workers())

    inp, out = pair.tmp / "in.jsonl", pair.tmp / "out.jsonl"
    ids = [f"two{i:06d}" for i in range(PROMPTS)]
    with inp.open("w") as fh:
        for i, cid in enumerate(ids):
            fh.write(json.dumps({"id": cid, "conversations": [{"role": "user", "content": f"question {i}"}]}))
            fh.write("\n")
    argv = [
        sys.executable,
        "-m",
        "sglfleet",
        "generate",
        "-i",
        str(inp),
        "-o",
        str(out),
        "--endpoint",
        ROUTER,
    ]
    argv += ["--concurrency", "8", "--max-tokens", "64", "--model", "standin-7b", "--log-interval", "5"]
    job_log = pair.tmp / "job.log"
    since = pair.second.out("date +%s")
    with job_log.open("wb") as log:
        job = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "SGLFLEET_API_KEY": API_KEY}
        )
    try:
        wait_until(lambda: _lines(out) >= 200 or job.poll() is not None, timeout=120, what="the job's start")
        assert job.poll() is None, job_log.read_text()
        # every worker of the second host has served part of the job before its roll resets its counters
        before_roll = {w: _served(w) for w in pair.workers()[INSTANCES:]}
        roll = pair.play(
            "playbooks/fleet.yml",
            "--limit",
            pair.second.host,
            sglang_fleet_extra_args=[*LOAD_ARGS, "--standin-seed", "1"],
            sglang_fleet_router_url=ROUTER,
        )
        assert roll.rc == 0, roll.explain()
        assert job.poll() is None, f"the job ended before the roll did: raise PROMPTS ({_lines(out)} done)"
        assert job.wait(900) == 0, job_log.read_text()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()

    counts = Counter(json.loads(line)["custom_id"] for line in out.read_text().splitlines())
    lost, duplicated = set(ids) - set(counts), {k for k, n in counts.items() if n > 1}
    assert (len(lost), len(duplicated)) == (0, 0)
    per_worker = {w: _served(w) for w in pair.workers()[:INSTANCES]} | before_roll
    print(f"requests per worker: {per_worker}")
    assert all(n > 0 for n in per_worker.values()), per_worker
    # the rolled instances are back in the router, and none took a request once its drain began
    assert _listed() == sorted(pair.workers())
    journal = f"journalctl --no-pager --output=cat --since=@{since}"
    for i in range(INSTANCES):
        unit_log = pair.second.out(f"{journal} --unit=sglang@{i}.service")
        assert "Draining requests and shutting down" in unit_log
        assert "Requests accepted while draining: 0" in unit_log, unit_log[-2000:]
