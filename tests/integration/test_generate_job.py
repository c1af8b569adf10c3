"""generation_job and playbooks/generate.yml in the lab: a real CT with systemd runs the job as a
transient unit against stand-ins on 127.0.0.1 (the lab's containers share the host's network).

Run under the lab lock:
    flock /tmp/sglfleet-lab.lock .venv/bin/pytest tests/integration/test_generate_job.py
Self-sufficient: it makes its own container (CT 207, so it never touches CT 200) and removes it.
"""

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

import pytest

REPO = Path(__file__).resolve().parents[2]
VMID = 207
VENV = "/opt/sglfleet"
pytestmark = pytest.mark.timeout(900)

lab = pytest.importorskip("sglfleet_testing.lab.settings")
standin = pytest.importorskip("sglfleet_testing.standin.process")


@dataclass
class Ct:
    settings: object
    port: int
    key: Path

    def ssh(
        self, command: str, timeout: float = 300, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv = ["ssh", "-i", str(self.key), "-p", str(self.port), "-o", "BatchMode=yes"]
        argv += [
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
        ]
        deadline = time.monotonic() + 60
        while True:
            done = subprocess.run(
                [*argv, "root@127.0.0.1", command],
                input=stdin,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            if done.returncode != 255 or time.monotonic() > deadline:
                return done
            time.sleep(0.3)


def _wait_task(pve, node: str, upid: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status = pve.nodes(node).tasks(upid).status.get()
        if status["status"] == "stopped":
            return status
        assert time.monotonic() < deadline, f"task {upid} still running"
        time.sleep(0.2)


def _remove(pve, node: str) -> None:
    from proxmoxer.core import ResourceException

    try:
        current = pve.nodes(node).lxc(VMID).status.current.get()
    except ResourceException:
        return
    if current["status"] == "running":
        _wait_task(pve, node, pve.nodes(node).lxc(VMID).status.stop.post())
    _wait_task(pve, node, pve.nodes(node).lxc(VMID).delete())


@pytest.fixture(scope="module")
def ct(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ct]:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    from proxmoxer import ProxmoxAPI
    from sglfleet_testing.lab.service import up

    settings = lab.LabSettings()
    up(settings, say=lambda line: print(f"lab: {line}"))
    pve = ProxmoxAPI(
        settings.host,
        port=settings.port,
        user=settings.user,
        token_name=settings.token_name,
        token_value=settings.token_secret,
        verify_ssl=str(settings.ca_cert),
    )
    node = settings.node
    _remove(pve, node)
    created = _wait_task(
        pve,
        node,
        pve.nodes(node).lxc.post(
            vmid=VMID,
            ostemplate=settings.ostemplate,
            storage=settings.rootfs_storage,
            hostname=f"ct{VMID}",
            memory=2048,
            **{"ssh-public-keys": settings.ssh_key.with_suffix(".pub").read_text()},
        ),
    )
    assert created["exitstatus"] == "OK", created
    assert _wait_task(pve, node, pve.nodes(node).lxc(VMID).status.start.post())["exitstatus"] == "OK"
    box = Ct(settings, settings.ssh_port(VMID), settings.ssh_key)
    try:
        booted = box.ssh("systemctl is-system-running --wait")
        assert booted.stdout.strip() in ("running", "degraded"), booted
        wheels = tmp_path_factory.mktemp("wheel")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-deps",
                "-w",
                str(wheels),
                str(REPO / "python"),
            ],
            check=True,
        )
        (wheel,) = wheels.glob("sglfleet-*.whl")
        target = f"/var/tmp/{wheel.name}"
        scp = ["scp", "-q", "-i", str(box.key), "-P", str(box.port), "-o", "StrictHostKeyChecking=no"]
        scp += ["-o", "UserKnownHostsFile=/dev/null", str(wheel), f"root@127.0.0.1:{target}"]
        subprocess.run(scp, check=True, timeout=60)
        install = box.ssh(
            f"python3 -m venv {VENV} && {VENV}/bin/pip install --quiet --disable-pip-version-check {target}"
        )
        assert install.returncode == 0, install.stderr[-3000:]
        yield box
    finally:
        _remove(pve, node)


def _inventory(tmp: Path, box: Ct) -> Path:
    path = tmp / "hosts.yml"
    path.write_text(
        "fleet:\n  hosts:\n    ct207:\n"
        f"      ansible_host: 127.0.0.1\n      ansible_port: {box.port}\n      ansible_user: root\n"
        f"      ansible_ssh_private_key_file: {box.key}\n"
        f"      ansible_python_interpreter: {VENV}/bin/python\n"
        "      ansible_ssh_common_args: -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null\n"
    )
    return path


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
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(wrapper), *extra]
    if check:
        argv.append("--check")
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=600, check=False)
    recap = re.search(r"^ct207\s*:\s*(.*)$", proc.stdout, re.MULTILINE)
    assert recap and result.exists(), f"rc {proc.returncode}: {proc.stdout[-3000:]} {proc.stderr[-2000:]}"
    stats = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", recap.group(1))}
    return {"rc": proc.returncode, "stats": stats, "job": json.loads(result.read_text()), "out": proc.stdout}


def _conversations(n: int) -> str:
    turns = lambda i: [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "old"}]  # noqa: E731
    return "".join(json.dumps({"id": f"c{i:05d}", "conversations": turns(i)}) + "\n" for i in range(n))


def _exactly_once(box: Ct, output: str, n: int) -> None:
    text = box.ssh(f"cat {output}").stdout
    assert text.endswith("\n")
    counts = Counter(json.loads(line)["custom_id"] for line in text.splitlines())
    assert len(counts) == n and set(counts.values()) == {1}


def test_generate_playbook_runs_the_job_once_and_is_idempotent(ct: Ct, tmp_path: Path) -> None:
    with standin.standin_process(standin_ttft=0.002) as a, standin.standin_process(standin_ttft=0.002) as b:
        assert (
            ct.ssh("mkdir -p /srv/gen && cat > /srv/gen/in.jsonl", stdin=_conversations(300)).returncode == 0
        )
        inv = _inventory(tmp_path, ct)
        extra = [
            "-e", json.dumps({"generate_endpoints": [a.base_url, b.base_url]}),
            "-e", "generate_name=itest generate_input=/srv/gen/in.jsonl generate_output=/srv/gen/out.jsonl",
            "-e", "generate_max_tokens=16 generate_wait_timeout=300",
        ]  # fmt: skip
        first = _playbook(inv, REPO / "playbooks/generate.yml", *extra)
        assert first["rc"] == 0, first
        assert first["job"]["changed"] is True and first["job"]["status"] == "complete"
        assert first["job"]["counts"]["done"] == 300 and first["job"]["unit"] == "sglfleet-gen-itest.service"
        _exactly_once(ct, "/srv/gen/out.jsonl", 300)

        second = _playbook(inv, REPO / "playbooks/generate.yml", *extra)
        assert second["rc"] == 0 and second["stats"]["changed"] == 0, second
        assert second["job"]["status"] == "complete" and second["job"]["reason"] == "the job is complete"

        checked = _playbook(inv, REPO / "playbooks/generate.yml", *extra, check=True)
        assert checked["stats"]["changed"] == 0


def test_running_is_unchanged_stopped_is_resumed(ct: Ct, tmp_path: Path) -> None:
    with standin.standin_process(standin_ttft=0.5, max_running_requests=4) as slow:
        assert (
            ct.ssh("mkdir -p /srv/gen2 && cat > /srv/gen2/in.jsonl", stdin=_conversations(200)).returncode
            == 0
        )
        inv = _inventory(tmp_path, ct)
        base = [
            "-e", json.dumps({"generate_endpoints": [slow.base_url]}),
            "-e", "generate_name=slow generate_input=/srv/gen2/in.jsonl generate_output=/srv/gen2/out.jsonl",
            "-e", "generate_max_tokens=16 generate_concurrency=4",
        ]  # fmt: skip
        started = _playbook(inv, REPO / "playbooks/generate.yml", *base, "-e", "generate_wait=false")
        assert started["job"]["changed"] is True and started["job"]["action"] == "start", started
        time.sleep(3)
        running = _playbook(inv, REPO / "playbooks/generate.yml", *base, "-e", "generate_wait=false")
        assert running["stats"]["changed"] == 0 and running["job"]["status"] == "running", running
        assert ct.ssh("systemctl is-active sglfleet-gen-slow.service").stdout.strip() == "active"

        would = _playbook(
            inv, REPO / "playbooks/generate.yml", *base, "-e", "generate_state=stopped", check=True
        )
        assert would["job"]["changed"] is True
        assert ct.ssh("systemctl is-active sglfleet-gen-slow.service").stdout.strip() == "active"

        stopped = _playbook(inv, REPO / "playbooks/generate.yml", *base, "-e", "generate_state=stopped")
        assert stopped["job"]["changed"] is True and stopped["job"]["action"] == "stop", stopped
        assert ct.ssh("systemctl is-active sglfleet-gen-slow.service").stdout.strip() != "active"
        manifest = json.loads(ct.ssh("cat /srv/gen2/out.jsonl.manifest.json").stdout)
        assert manifest["status"] == "interrupted" and 0 < manifest["counts"]["done"] < 200
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
        assert resumed["job"]["status"] == "complete" and resumed["job"]["counts"]["done"] == 200
        assert resumed["job"]["counts"]["sent_this_run"] < 200, "it resumed, not restarted"
        _exactly_once(ct, "/srv/gen2/out.jsonl", 200)
