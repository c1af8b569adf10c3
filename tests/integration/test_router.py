"""Phase router on the lab: the REAL sglang-router (0.3.2 from PyPI) under systemd in CT 200, in front
of the stand-in instances playbooks/fleet.yml started. It converges, re-runs at changed=0, passes its
health gate with every instance registered, keeps the API key off every command line, follows the
fleet when an instance is added, and takes one `sglfleet generate` job exactly once."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sglfleet_testing.router import tokenizer_json
from support.ansible_lab import MODULE_PYTHON, Ansible, Container, PlaybookRun

pytestmark = pytest.mark.timeout(900)

PORT_BASE = 30000
ROUTER_PORT = 30100
ROUTER = f"http://127.0.0.1:{ROUTER_PORT}"
API_KEY = "lab-router-key-5e0c7a91"  # a test secret: only in the 0600 environment files
MODEL_DIR = "/srv/models/standin-7b"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
RESET = (
    "systemctl stop sglang-router.service 'sglang@*.service' 2>/dev/null; "
    "systemctl disable sglang-router.service 2>/dev/null; "
    "for i in $(seq 0 15); do systemctl disable sglang@$i.service 2>/dev/null; done; "
    "rm -rf /etc/sglang /etc/sglang-router /etc/systemd/system/sglang@.service "
    "/etc/systemd/system/sglang-router.service; systemctl daemon-reload; "
    "systemctl reset-failed 'sglang@*.service' sglang-router.service 2>/dev/null; true"
)


def _vars(path: Path, instances: int, **more: object) -> Path:
    path.write_text(
        json.dumps(
            {
                # not ansible_python_interpreter: inventory/lab sets it per group, and as an extra
                # variable it would outrank the controller's own for the tasks delegated there
                "sglang_fleet_api_key": API_KEY,
                "sglang_fleet_instances": instances,
                "sglang_router_enabled": True,
                "sglang_router_listen_host": "127.0.0.1",  # the lab CT shares the host's network
                "sglang_router_port": ROUTER_PORT,
                "sglang_router_prometheus_port": ROUTER_PORT + 1,
                **more,
            }
        )
    )
    return path


def _workers() -> int:
    return int(httpx.get(f"{ROUTER}/get_server_info", headers=AUTH, timeout=10).json()["workers_count"])


@pytest.fixture(scope="module")
def routed(
    fleet_ct: Container, ansible: Ansible, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[PlaybookRun, Path]]:
    fleet_ct.run(RESET)
    # containers made before the lab's model store held a tokenizer get it here
    fleet_ct.put(f"{MODEL_DIR}/tokenizer.json", json.dumps(tokenizer_json()))
    extra = _vars(tmp_path_factory.mktemp("router") / "vars.json", instances=2)
    served = ansible.playbook("playbooks/fleet.yml", "-e", f"@{extra}")
    assert served.rc == 0, served.explain()
    run = ansible.playbook("playbooks/router.yml", "-e", f"@{extra}")
    yield run, extra
    fleet_ct.run(RESET)


def test_the_router_converges_and_passes_its_health_gate(
    routed: tuple[PlaybookRun, Path], fleet_ct: Container
) -> None:
    run, _ = routed
    assert run.rc == 0, run.explain()
    assert API_KEY not in run.output
    assert httpx.get(f"{ROUTER}/health_generate", timeout=10).status_code == 200
    assert _workers() == 2
    # systemd waits for the router's grace period (180 s, its default) and 15 s more before SIGKILL
    props = fleet_ct.unit_props("sglang-router.service", ["TimeoutStopUSec"])
    assert props["TimeoutStopUSec"] == "3min 15s"
    models = httpx.get(f"{ROUTER}/v1/models", headers=AUTH, timeout=10).json()
    assert models["data"][0]["id"] == "standin-7b"  # its workers' served model name


def test_a_rerun_changes_nothing_and_check_mode_predicts_nothing(
    routed: tuple[PlaybookRun, Path], ansible: Ansible
) -> None:
    run, extra = routed
    assert run.rc == 0
    again = ansible.playbook("playbooks/router.yml", "-e", f"@{extra}")
    assert again.rc == 0 and again.total("changed") == 0, again.explain()
    check = ansible.playbook("playbooks/router.yml", "-e", f"@{extra}", "--check", "--diff")
    assert check.rc == 0 and check.total("changed") == 0, check.explain()


def test_the_key_is_on_no_command_line_and_only_in_the_0600_file(
    routed: tuple[PlaybookRun, Path], fleet_ct: Container
) -> None:
    assert routed[0].rc == 0
    holders = fleet_ct.run(
        "grep -l -a -F -f - /proc/[0-9]*/cmdline /etc/sglang-router/* "
        "/etc/systemd/system/sglang-router.service 2>/dev/null",
        stdin=API_KEY + "\n",
        check=False,
    ).stdout.split()
    assert holders == ["/etc/sglang-router/router.env"]
    assert fleet_ct.out("stat -c '%a %U' /etc/sglang-router/router.env") == "600 root"
    pid = fleet_ct.unit_props("sglang-router.service", ["MainPID"])["MainPID"]
    cmdline = fleet_ct.out(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
    assert " -m sglfleet.launch sglang_router.launch_router " in cmdline and "--api-key" not in cmdline
    # the router asks the key of its clients too
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(f"{ROUTER}/v1/chat/completions", json=body, timeout=30).status_code == 401
    assert httpx.post(f"{ROUTER}/v1/chat/completions", json=body, headers=AUTH, timeout=30).status_code == 200


def test_the_ledger_records_the_phase_and_status_shows_it(
    routed: tuple[PlaybookRun, Path], fleet_ct: Container
) -> None:
    assert routed[0].rc == 0
    out = fleet_ct.out(f"{MODULE_PYTHON} -m sglfleet status --json --count 0")
    rows = {r["phase"]: r for r in json.loads(out)["checklist"]}
    assert rows["router"]["status"] == "done"
    assert rows["router"]["evidence"]["workers"] == 2


def test_one_job_through_the_router_exactly_once(routed: tuple[PlaybookRun, Path], tmp_path: Path) -> None:
    assert routed[0].rc == 0
    from sglfleet.gen import ExitCode, GenerateConfig, GenParams, LogReporter, run

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = [f"r{i:04d}" for i in range(200)]
    with inp.open("w") as fh:
        for cid in ids:
            body = {"messages": [{"role": "user", "content": f"prompt {cid}"}], "max_tokens": 8}
            fh.write(
                json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body})
            )
            fh.write("\n")
    config = GenerateConfig(
        input=inp, output=out, endpoints=[ROUTER], concurrency=16, api_key=API_KEY, params=GenParams()
    )
    outcome = run(config, LogReporter(io.StringIO(), interval=5), handle_signals=False)
    assert outcome.exit_code == ExitCode.OK, outcome.message
    written = [json.loads(line)["custom_id"] for line in out.read_text().splitlines()]
    assert sorted(written) == ids


def test_the_preflight_refuses_workers_the_router_cannot_reach(
    routed: tuple[PlaybookRun, Path], ansible: Ansible, fleet_ct: Container, tmp_path: Path
) -> None:
    """The instances bind 127.0.0.1 (sglang_fleet_host's default): a worker address elsewhere is refused
    before any change, naming both variables (nothing is sent there: the preflight only compares)."""
    assert routed[0].rc == 0
    before = fleet_ct.out("sha256sum /etc/sglang-router/router.env")
    bad = _vars(tmp_path / "vars.json", instances=2, sglang_router_worker_host="10.255.0.7")
    run = ansible.playbook("playbooks/router.yml", "-e", f"@{bad}")
    assert run.rc != 0
    assert "instances bind 127.0.0.1, the router would send to 10.255.0.7" in run.output, run.explain()
    assert "sglang_fleet_host" in run.output and "sglang_router_worker_host" in run.output
    assert fleet_ct.out("sha256sum /etc/sglang-router/router.env") == before


def test_the_router_follows_the_fleet(
    routed: tuple[PlaybookRun, Path], ansible: Ansible, fleet_ct: Container, tmp_path: Path
) -> None:
    assert routed[0].rc == 0
    three = _vars(tmp_path / "vars.json", instances=3)
    assert ansible.playbook("playbooks/fleet.yml", "-e", f"@{three}").rc == 0
    run = ansible.playbook("playbooks/router.yml", "-e", f"@{three}")
    assert run.rc == 0, run.explain()
    assert "Write the router's environment file" in " ".join(run.changed_tasks())
    deadline = time.monotonic() + 60
    while _workers() != 3:  # the gate waited for it; this only reads it back
        assert time.monotonic() < deadline
        time.sleep(0.5)
    env = fleet_ct.out("grep '^ROUTER_ARGS=' /etc/sglang-router/router.env")
    assert f"http://127.0.0.1:{PORT_BASE + 2}" in env
