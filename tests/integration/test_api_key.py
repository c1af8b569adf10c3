"""The API key on the lab fleet: set through playbooks/serve.yml, it reaches the servers only through
the 0600 EnvironmentFile and sglfleet.launch: no process in CT 200 has it on its command line, no
journal line holds it, and the servers require it (401 without, 200 with). A normal stop of an
instance is not a failure in systemd's eyes (the drain of SGLang 0.5.12 ends in SIGKILL of itself).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from support.ansible_lab import MODULE_PYTHON, Ansible, Container, PlaybookRun

pytestmark = pytest.mark.timeout(600)

INSTANCES = 2
PORT_BASE = 30000
API_KEY = "lab-key-3d9f0b7e51c2"  # a test secret: nowhere but in /etc/sglang/instance-*.env
RESET = (
    "systemctl stop 'sglang@*.service'; "
    "for i in $(seq 0 15); do systemctl disable sglang@$i.service 2>/dev/null; done; "
    "rm -rf /etc/sglang /etc/systemd/system/sglang@.service; systemctl daemon-reload; "
    "systemctl reset-failed 'sglang@*.service'; true"
)


@dataclass
class Served:
    run: PlaybookRun
    journal: str  # a journalctl command line that prints what was logged since just before the run


def _grep_key(ct: Container, files: str) -> str:
    """The files among `files` (a shell glob in CT 200) that contain the key. The key goes in on
    stdin, so that the grep itself does not carry it on its command line."""
    return ct.run(f"grep -l -a -F -f - {files} 2>/dev/null", stdin=API_KEY + "\n", check=False).stdout


def _props(ct: Container, i: int, *names: str) -> dict[str, str]:
    return ct.unit_props(f"sglang@{i}.service", names)


def _wait_healthy(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health_generate", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"port {port} never answered /health_generate 200"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def served(
    fleet_ct: Container, ansible: Ansible, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    fleet_ct.run(RESET)
    extra = tmp_path_factory.mktemp("api_key") / "vars.json"
    extra.write_text(
        json.dumps(
            {
                "ansible_python_interpreter": MODULE_PYTHON,
                "sglang_fleet_api_key": API_KEY,
                "sglang_fleet_instances": INSTANCES,
            }
        )
    )
    # Where the journal stands now: the tests read what this fleet wrote, from here on.
    since = fleet_ct.out("date +%s")
    run = ansible.playbook("playbooks/serve.yml", "-e", f"@{extra}")
    yield Served(run, f"journalctl --no-pager --output=cat --since=@{since}")
    fleet_ct.run(RESET)


def test_serve_converges_without_printing_the_key(served: Served) -> None:
    assert served.run.rc == 0, served.run.explain()
    assert API_KEY not in served.run.output


def test_no_process_has_the_key_on_its_command_line(served: Served, fleet_ct: Container) -> None:
    assert served.run.rc == 0
    assert _grep_key(fleet_ct, "/proc/[0-9]*/cmdline") == ""
    for i in range(INSTANCES):
        pid = _props(fleet_ct, i, "MainPID")["MainPID"]
        cmdline = fleet_ct.out(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
        assert " -m sglfleet.launch sglfleet_testing.standin " in cmdline, cmdline
        assert "--api-key" not in cmdline


def test_the_journal_has_no_line_with_the_key(served: Served, fleet_ct: Container) -> None:
    assert served.run.rc == 0
    journal = served.journal
    assert int(fleet_ct.out(f"{journal} | wc -l")) > 0
    found = fleet_ct.run(f"{journal} | grep -c -F -f -", stdin=API_KEY + "\n", check=False)
    assert found.stdout.strip() == "0"
    # The stand-in logs its arguments as SGLang does (engine.py:773); the launcher redacted the key.
    server_args = fleet_ct.out(f"{journal} --unit=sglang@0.service | grep server_args=")
    assert "api_key='<redacted>'" in server_args


def test_the_servers_require_the_key(served: Served) -> None:
    assert served.run.rc == 0
    for i in range(INSTANCES):
        url = f"http://127.0.0.1:{PORT_BASE + i}"
        assert httpx.get(f"{url}/v1/models").status_code == 401
        assert httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert (
            httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
        )
        assert httpx.get(f"{url}/health").status_code == 200  # /health* need none


def test_the_key_is_only_in_the_0600_environment_files(served: Served, fleet_ct: Container) -> None:
    assert served.run.rc == 0
    holders = sorted(_grep_key(fleet_ct, "/etc/sglang/* /etc/systemd/system/sglang@.service").split())
    assert holders == [f"/etc/sglang/instance-{i}.env" for i in range(INSTANCES)]
    for path in holders:
        assert fleet_ct.out(f"stat -c '%a %U' {path}") == "600 root"
        args = fleet_ct.out(f"grep '^SGLANG_ARGS=' {path}")
        assert "--api-key" not in args


def test_a_normal_stop_and_restart_are_no_failure(served: Served, fleet_ct: Container) -> None:
    assert served.run.rc == 0
    before = _props(fleet_ct, 1, "NRestarts")["NRestarts"]
    fleet_ct.run("systemctl stop sglang@1.service", timeout=60)
    stopped = _props(fleet_ct, 1, "ActiveState", "Result", "ExecMainStatus", "ExecMainCode")
    assert stopped == {
        "ActiveState": "inactive",
        "Result": "success",
        "ExecMainStatus": "0",
        "ExecMainCode": "1",
    }
    fleet_ct.run("systemctl start sglang@1.service")
    _wait_healthy(PORT_BASE + 1)
    fleet_ct.run("systemctl restart sglang@0.service", timeout=60)
    _wait_healthy(PORT_BASE)
    for i in range(INSTANCES):
        assert _props(fleet_ct, i, "ActiveState", "Result") == {
            "ActiveState": "active",
            "Result": "success",
        }
    assert _props(fleet_ct, 1, "NRestarts")["NRestarts"] == before  # systemd restarted nothing itself
    journal = fleet_ct.out("journalctl --no-pager --output=cat --unit=sglang@1.service")
    assert "Draining requests and shutting down" in journal
    assert "Failed with result" not in journal
