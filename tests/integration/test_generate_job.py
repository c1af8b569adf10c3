"""generation_job and playbooks/generate.yml in the lab: a real CT with systemd runs the job as a
transient unit against stand-ins on 127.0.0.1 (the lab's containers share the host's network).

Runs on the session's prepared CT 200 (the sglfleet runtime is the modules' interpreter), through an
inventory of CT 200 alone, so that the lab's group_vars do not reach the job; the module's units and
files are removed before and after. Under the lab lock, like every integration test:
    .venv/bin/pytest tests/integration/test_generate_job.py
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.ansible_lab import CT_HOST, REPO, Ansible, Container, host_inventory, wait_until

pytestmark = pytest.mark.timeout(900)

standin = pytest.importorskip("sglfleet_testing.standin.process")

# What the tests leave in CT 200: their jobs' units and directories.
CLEAN = (
    "for u in sglfleet-gen-itest sglfleet-gen-slow; do systemctl stop $u.service; systemctl reset-failed"
    " $u.service; done 2>/dev/null; rm -rf /srv/gen /srv/gen2; true"
)


@pytest.fixture(scope="module", autouse=True)
def clean(fleet_ct: Container) -> Iterator[None]:
    fleet_ct.run(CLEAN)
    yield
    fleet_ct.run(CLEAN)


def _inventory(tmp: Path, box: Container) -> Path:
    return host_inventory(tmp / "hosts.yml")


def _playbook(inventory: Path, playbook: Path, *extra: str, check: bool = False) -> dict:
    """Run it; the registered result of its generation_job task, and the PLAY RECAP of the CT."""
    result = inventory.parent / "job.json"
    result.unlink(missing_ok=True)
    wrapper = inventory.parent / "wrapper.yml"
    wrapper.write_text(
        f"- name: The playbook under test\n  ansible.builtin.import_playbook: {playbook}\n"
        "- name: Save the job's result\n  hosts: fleet\n  gather_facts: false\n  tasks:\n"
        "    - name: Save it\n      ansible.builtin.copy:\n"
        "        content: '{{ __generate_job | to_json }}'\n"
        f"        dest: {result}\n        mode: '0644'\n"
        "      delegate_to: localhost\n      check_mode: false\n      changed_when: false\n"
    )
    run = Ansible(inventory=inventory).playbook(wrapper, *extra, *(["--check"] if check else []))
    assert run.recaps.get(CT_HOST) and result.exists(), run.explain()
    return {"rc": run.rc, "stats": run.recap, "job": json.loads(result.read_text()), "out": run.output}


def _writing(box: Container, output: str) -> bool:
    """The job has written a result (it runs, and made progress)."""
    return box.ssh(f"test -s {output}").returncode == 0


def _conversations(n: int) -> str:
    turns = lambda i: [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "old"}]  # noqa: E731
    return "".join(json.dumps({"id": f"c{i:05d}", "conversations": turns(i)}) + "\n" for i in range(n))


def _exactly_once(box: Container, output: str, n: int) -> None:
    text = box.ssh(f"cat {output}").stdout
    assert text.endswith("\n")
    counts = Counter(json.loads(line)["custom_id"] for line in text.splitlines())
    assert len(counts) == n and set(counts.values()) == {1}


def test_generate_playbook_runs_the_job_once(fleet_ct: Container, tmp_path: Path) -> None:
    with standin.standin_process(standin_ttft=0.002) as a, standin.standin_process(standin_ttft=0.002) as b:
        assert (
            fleet_ct.ssh("mkdir -p /srv/gen && cat > /srv/gen/in.jsonl", stdin=_conversations(300)).returncode
            == 0
        )
        inv = _inventory(tmp_path, fleet_ct)
        extra = [
            "-e", json.dumps({"generate_endpoints": [a.base_url, b.base_url]}),
            "-e", "generate_name=itest generate_input=/srv/gen/in.jsonl generate_output=/srv/gen/out.jsonl",
            "-e", "generate_max_tokens=16 generate_wait_timeout=300",
        ]  # fmt: skip
        first = _playbook(inv, REPO / "playbooks/generate.yml", *extra)
        assert first["rc"] == 0, first
        assert first["job"]["changed"] is True and first["job"]["status"] == "complete"
        assert first["job"]["counts"]["done"] == 300 and first["job"]["unit"] == "sglfleet-gen-itest.service"
        _exactly_once(fleet_ct, "/srv/gen/out.jsonl", 300)
        # A re-run of a complete job changes nothing (nor does check mode): test_site's second run of
        # site.yml ("lab-demo.service: complete") and its --check --diff run.


# Prompts of the slow job: more than it can answer before the test freezes its stand-in (8 a second).
SLOW_JOB = 1000
SLOW_UNIT = "sglfleet-gen-slow.service"


def _resume_once_stopping(box: Container, server: subprocess.Popen) -> threading.Thread:
    """SIGCONT to the frozen `server` once systemd is stopping the slow job (it got its SIGTERM), so that
    its in-flight requests end at once instead of after the job's grace period."""

    def resume() -> None:
        try:
            wait_until(
                lambda: (
                    box.ssh(f"systemctl show --property=ActiveState --value {SLOW_UNIT}").stdout.strip()
                    != "active"
                ),
                timeout=300,
                what="systemd stops the slow job",
            )
        finally:
            server.send_signal(signal.SIGCONT)

    thread = threading.Thread(target=resume, daemon=True)
    thread.start()
    return thread


def test_running_is_unchanged_stopped_is_resumed(fleet_ct: Container, tmp_path: Path) -> None:
    with standin.standin_process(standin_ttft=0.5, max_running_requests=4) as slow:
        assert (
            fleet_ct.ssh(
                "mkdir -p /srv/gen2 && cat > /srv/gen2/in.jsonl", stdin=_conversations(SLOW_JOB)
            ).returncode
            == 0
        )
        inv = _inventory(tmp_path, fleet_ct)
        base = [
            "-e", json.dumps({"generate_endpoints": [slow.base_url]}),
            "-e", "generate_name=slow generate_input=/srv/gen2/in.jsonl generate_output=/srv/gen2/out.jsonl",
            "-e", "generate_max_tokens=16 generate_concurrency=4",
        ]  # fmt: skip
        started = _playbook(inv, REPO / "playbooks/generate.yml", *base, "-e", "generate_wait=false")
        assert started["job"]["changed"] is True and started["job"]["action"] == "start", started
        wait_until(
            lambda: _writing(fleet_ct, "/srv/gen2/out.jsonl"), timeout=60, what="the job writes results"
        )
        # The stand-in frozen (SIGSTOP): the job makes no progress, so it cannot finish before it is stopped,
        # however long the playbook runs below take.
        slow.process.send_signal(signal.SIGSTOP)
        try:
            running = _playbook(inv, REPO / "playbooks/generate.yml", *base, "-e", "generate_wait=false")
            assert running["stats"]["changed"] == 0 and running["job"]["status"] == "running", running
            assert fleet_ct.ssh(f"systemctl is-active {SLOW_UNIT}").stdout.strip() == "active"

            would = _playbook(
                inv, REPO / "playbooks/generate.yml", *base, "-e", "generate_state=stopped", check=True
            )
            assert would["job"]["changed"] is True
            assert fleet_ct.ssh(f"systemctl is-active {SLOW_UNIT}").stdout.strip() == "active"

            resumer = _resume_once_stopping(fleet_ct, slow.process)
            stopped = _playbook(inv, REPO / "playbooks/generate.yml", *base, "-e", "generate_state=stopped")
            resumer.join(timeout=10)
        finally:
            slow.process.send_signal(signal.SIGCONT)
        assert stopped["job"]["changed"] is True and stopped["job"]["action"] == "stop", stopped
        assert fleet_ct.ssh(f"systemctl is-active {SLOW_UNIT}").stdout.strip() != "active"
        manifest = json.loads(fleet_ct.ssh("cat /srv/gen2/out.jsonl.manifest.json").stdout)
        assert manifest["status"] == "interrupted" and 0 < manifest["counts"]["done"] < SLOW_JOB
        again = _playbook(inv, REPO / "playbooks/generate.yml", *base, "-e", "generate_state=stopped")
        assert again["stats"]["changed"] == 0

    with standin.standin_process() as fast:
        resumed = _playbook(
            inv,
            REPO / "playbooks/generate.yml",
            *base,
            "-e",
            json.dumps({"generate_endpoints": [fast.base_url], "generate_concurrency": 16}),
        )
        assert resumed["rc"] == 0 and resumed["job"]["changed"] is True, resumed
        assert resumed["job"]["status"] == "complete" and resumed["job"]["counts"]["done"] == SLOW_JOB
        assert resumed["job"]["counts"]["sent_this_run"] < SLOW_JOB, "it resumed, not restarted"
        _exactly_once(fleet_ct, "/srv/gen2/out.jsonl", SLOW_JOB)
