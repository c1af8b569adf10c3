"""The proxmox_lxc module, run for real (its file executed with an args file) against fakepve over TLS.

fakepve (pytest plugin) serves a schema-checked PVE API on 127.0.0.1 with its own CA; the module
process verifies it with that CA, logs in with a password or an API token, and we read the
outcome from the fake: its containers, its request log and its task log.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest
from support.module_runner import module_argv
from support.paths import REPO
from support.polling import wait_until

from sglfleet.pve import Credentials, PveApiError, PveClient

ROOT = REPO
MODULE = ROOT / "library" / "proxmox_lxc.py"
NODE = "pve1"
TEMPLATE = "debian-12-standard_12.7-1_amd64.tar.zst"
TOKEN_ID, TOKEN_SECRET = "ci", "5f0c1d9e-6a52-4c1b-9d7e-2b1f6a0c4e11"
GPU_NODES = [f"/dev/nvidia{i}" for i in range(8)] + [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
]

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def pve(fakepve):
    fakepve.store_file("local", TEMPLATE, 100 * 1024**2, content="vztmpl")
    fakepve.apitokens[f"root@pam!{TOKEN_ID}"] = TOKEN_SECRET
    return fakepve


@pytest.fixture
def module(pve, fakepve_cafile, tmp_path):
    """run(args, check=False, diff=True) -> the module's JSON result."""
    calls = iter(range(1000))

    def run(args=None, *, check=False, diff=True, auth="password", **extra):
        full = {
            "api_host": "127.0.0.1",
            "api_port": pve.port,
            "api_user": "root@pam",
            "ca_cert": fakepve_cafile,
            "node": NODE,
            "vmid": 200,
            "hostname": "sgl",
            "ostemplate": f"local:vztmpl/{TEMPLATE}",
            "storage": "local-lvm",
            "rootfs": "local-lvm:16",
            "cores": 8,
            "memory": "8G",
            "swap": 0,
            "netif": {"net0": "name=eth0,bridge=vmbr0,ip=dhcp"},
            "features": ["nesting=1", "keyctl=1"],
            "unprivileged": True,
            "onboot": True,
            "state": "present",
            "timeout": 30,
        }
        if auth == "password":
            full["api_password"] = "secret"
        else:
            full.update(api_token_id=TOKEN_ID, api_token_secret=TOKEN_SECRET)
        full.update(args or {}, **extra)
        full.update(_ansible_check_mode=check, _ansible_diff=diff)
        path = tmp_path / f"args{next(calls)}.json"
        path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": full}))
        proc = subprocess.run(
            module_argv("proxmox_lxc", path), capture_output=True, text=True, timeout=90, check=False
        )
        try:
            return json.loads(proc.stdout)
        except json.JSONDecodeError:
            pytest.fail(f"module printed no JSON (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")

    return run


def diff_values(result, side):
    """The diff's before or after text as {key: value}."""
    return dict(line.split(": ", 1) for line in result["diff"][side].splitlines())


def writes(pve, since=0):
    """Requests after `since` that could change something: anything but a GET or the password login."""
    return [(m, p) for m, p, _ in pve.requests[since:] if m != "GET" and not p.endswith("/access/ticket")]


def test_create_then_second_run_changes_nothing(pve, module):
    first = module()
    assert first["changed"] is True, first
    assert first["actions"] == ["create"]
    ct = pve.ct(200)
    assert ct is not None and ct.node == NODE
    assert ct.config["cores"] == 8 and ct.config["memory"] == 8192 and ct.config["swap"] == 0
    assert ct.config["features"] == "keyctl=1,nesting=1"
    assert ct.config["rootfs"] == "local-lvm:vm-200-disk-0,size=16G"
    assert first["config"]["hostname"] == "sgl"
    assert [t["type"] for t in pve.tasklog] == ["vzcreate"]
    assert pve.tasklog[0]["exitstatus"] == "OK"

    seen = len(pve.requests)
    digest = ct.digest()
    second = module()
    assert second["changed"] is False, second
    assert second["actions"] == []
    assert writes(pve, seen) == []
    assert ct.digest() == digest


def test_started_state_starts_once(pve, module):
    assert module(state="started")["actions"] == ["create", "start"]
    assert pve.ct(200).status == "running"
    again = module(state="started")
    assert again["changed"] is False and again["status"] == "running"


def test_cores_change_is_reported_with_a_diff(pve, module):
    module()
    result = module(cores=16)
    assert result["changed"] is True
    assert result["actions"] == ["update cores"]
    assert diff_values(result, "before")["cores"] == "8"
    assert diff_values(result, "after")["cores"] == "16"
    assert pve.ct(200).config["cores"] == 16
    puts = [p for m, p in writes(pve) if m == "PUT"]
    assert len(puts) == 1
    assert module(cores=16)["changed"] is False


def test_removing_one_feature_option_is_detected(pve, module):
    module()
    result = module(features=["nesting=1"])
    assert result["changed"] is True
    assert diff_values(result, "before")["features"] == "keyctl=1,nesting=1"
    assert diff_values(result, "after")["features"] == "nesting=1"
    assert pve.ct(200).config["features"] == "nesting=1"
    assert module(features=["nesting=1"])["changed"] is False


def test_check_mode_reports_the_change_and_writes_nothing(pve, module):
    module(state="started")
    ct = pve.ct(200)
    digest, tasks, seen = ct.digest(), len(pve.tasklog), len(pve.requests)
    result = module(check=True, state="started", cores=32, features=["nesting=1"])
    assert result["changed"] is True
    assert result["actions"] == ["update cores,features"]
    assert diff_values(result, "after")["cores"] == "32"
    assert result["restart_required"] is True  # features only apply at the next start
    assert writes(pve, seen) == []
    assert len(pve.tasklog) == tasks
    assert ct.digest() == digest and ct.config["cores"] == 8
    # and check mode says "no change" exactly when a real run would make none
    assert module(check=True, state="started")["changed"] is False


def test_check_mode_on_an_absent_container_creates_nothing(pve, module):
    result = module(check=True, state="started")
    assert result["changed"] is True and result["actions"] == ["create", "start"]
    assert result["diff"]["before"] == "" and diff_values(result, "after")["cores"] == "8"
    assert pve.ct(200) is None
    assert writes(pve) == []


def test_devices_with_a_token_fail_before_any_request(pve, module):
    result = module(devices=GPU_NODES, auth="token")
    assert result.get("failed") is True
    assert "root@pam" in result["msg"] and "API tokens" in result["msg"] and "api_password" in result["msg"]
    assert result["argument"] == "devices"
    assert pve.requests == []
    assert pve.ct(200) is None


def test_pve_itself_refuses_devices_to_a_token(pve, module, fakepve_cafile):
    """Why the module refuses up front: PVE turns an API token away for devN, even root's."""
    module()
    pve.grant(f"root@pam!{TOKEN_ID}", "/", "VM.Audit", "VM.Config.Options")  # permissions now enforced
    creds = Credentials(
        host="127.0.0.1",
        port=pve.port,
        user="root@pam",
        token_id=TOKEN_ID,
        token_secret=TOKEN_SECRET,
        ca_cert=fakepve_cafile,
    )
    client = PveClient.connect(creds, NODE)
    with pytest.raises(PveApiError) as err:
        client.update(200, {"dev0": "/dev/nvidia0"}, [], None)
    assert err.value.status == 403
    assert "configuring device passthrough is only allowed for root@pam" in str(err.value)
    assert "dev0" not in pve.ct(200).config


def test_devices_with_root_password_are_set(pve, module):
    result = module(devices=GPU_NODES)
    assert result["changed"] is True, result
    config = pve.ct(200).config
    assert [config[f"dev{i}"] for i in range(len(GPU_NODES))] == GPU_NODES
    assert module(devices=GPU_NODES)["changed"] is False
    # dropping one device and adding a mode is detected and applied
    fewer = [*GPU_NODES[:-1]]
    fewer[-1] = {"path": "/dev/nvidia-uvm", "mode": "0666"}
    result = module(devices=fewer)
    assert result["changed"] is True
    assert "dev10" not in pve.ct(200).config
    assert pve.ct(200).config["dev9"] == "/dev/nvidia-uvm,mode=0666"


def test_token_login_works_without_devices(pve, module):
    assert module(auth="token")["changed"] is True
    assert module(auth="token")["changed"] is False


def test_bad_value_gets_pves_message_and_parameter(pve, module):
    module()
    digest = pve.ct(200).digest()
    result = module(memory=8)
    assert result["failed"] is True
    assert "Parameter verification failed." in result["msg"]
    assert "memory: value must have a minimum value of 16" in result["msg"]
    assert result["pve_errors"] == {"memory": "value must have a minimum value of 16"}
    assert pve.ct(200).digest() == digest


def test_bad_value_on_create_creates_nothing(pve, module):
    result = module(memory=8)
    assert result["failed"] is True and "memory: value must have a minimum value of 16" in result["msg"]
    assert pve.ct(200) is None


def test_failing_create_task_reports_its_log(pve, module):
    """Ceph monitors unreachable while the pool still looks active: the create worker fails."""
    pve.add_ceph_storage("ceph-pool")
    pve.ceph_down()
    pve.storages["ceph-pool"]["active"] = 1
    result = module(rootfs="ceph-pool:16", storage="ceph-pool")
    assert result["failed"] is True
    assert "failed: unable to create CT 200 - rbd error" in result["msg"]
    assert "TASK ERROR: unable to create CT 200 - rbd error" in result["msg"]
    assert result["task_log"][-1].startswith("TASK ERROR:")
    assert result["upid"].startswith("UPID:pve1:")
    assert pve.ct(200) is None


def test_missing_template_lists_the_ones_there(pve, module):
    result = module(ostemplate="local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst")
    assert result["failed"] is True and result["argument"] == "ostemplate"
    assert f"templates there: local:vztmpl/{TEMPLATE}" in result["msg"]
    assert writes(pve) == []


def test_stale_digest_is_reread_and_retried_once(pve, module):
    module()
    stale = "detected modified configuration - file changed by other user? Try again."
    pve.fail("PUT", f"/nodes/{NODE}/lxc/200/config", 500, stale, times=1)
    seen = len(pve.requests)
    result = module(cores=12)
    assert result["changed"] is True, result
    assert pve.ct(200).config["cores"] == 12
    calls = [(m, p.rsplit("/", 1)[-1]) for m, p, _ in pve.requests[seen:] if p.endswith("/lxc/200/config")]
    assert calls == [
        ("GET", "config"),
        ("PUT", "config"),
        ("GET", "config"),
        ("PUT", "config"),
        ("GET", "config"),
    ]
    # twice stale: the second refusal reaches the user in PVE's words
    pve.fail("PUT", f"/nodes/{NODE}/lxc/200/config", 500, stale, times=2)
    result = module(cores=10)
    assert result["failed"] is True and stale in result["msg"]
    assert pve.ct(200).config["cores"] == 12


def test_absent_stops_and_destroys(pve, module):
    module(state="started")
    check = module(state="absent", check=True)
    assert check["changed"] is True and pve.ct(200) is not None
    result = module(state="absent")
    assert result["changed"] is True and result["actions"] == ["destroy"]
    assert pve.ct(200) is None
    assert module(state="absent")["changed"] is False


def test_wrong_ca_is_a_clear_tls_error(pve, module, tmp_path):
    other = tmp_path / "other-ca"
    other.mkdir()
    from fakepve.certs import make_cert

    cafile = make_cert(str(other))[0]
    result = module(ca_cert=cafile)
    assert result["failed"] is True and "TLS verification failed" in result["msg"]
    assert pve.requests == []


def test_running_container_reports_a_restart_for_pending_changes(pve, module):
    module(state="started")
    result = module(state="started", features=["nesting=1"], cores=4)
    assert result["changed"] is True and result["restart_required"] is True
    assert pve.ct(200).pending == {
        "features": "nesting=1"
    }  # cores applied at once, features at the next start
    assert result["config"]["features"] == "nesting=1"  # config shows what the CT will run with
    again = module(state="started", features=["nesting=1"], cores=4)
    assert again["changed"] is False and again["restart_required"] is True


@pytest.mark.fakepve(time_scale=0.01)
def test_tasks_are_waited_for_and_a_slow_one_times_out(pve, module):
    pve.ct_secs["create"] = 100  # one real second
    result = module()
    assert result["changed"] is True and pve.ct(200).config["cores"] == 8
    assert len([r for r in pve.requests if r[1].endswith("/status")]) >= 2  # polled while it ran
    pve.ct(200).start_secs = 250  # two and a half real seconds
    result = module(state="started", timeout=1)
    assert result["failed"] is True
    assert "still running after 1 s" in result["msg"]
    running = lambda: [t for t in pve.tasks.values() if t["status"] != "stopped"]  # noqa: E731
    wait_until(lambda: not running(), timeout=10, what="the start task ended before the fake stops")


@pytest.mark.fakepve(time_scale=0.01)
def test_a_real_concurrent_edit_between_read_and_write_is_retried(pve, module):
    """Someone edits the config while the module's PUT is on its way: PVE refuses the stale digest."""
    module()
    pve.slow_network(50)  # every answer half a real second late: a window between GET and PUT
    seen = len(pve.requests)
    edited = threading.Event()

    def edit_after_the_read():
        wait_until(
            lambda: any(m == "GET" and p.endswith("/lxc/200/config") for m, p, _ in pve.requests[seen:]),
            timeout=30,
            what="the module read the config",
        )
        time.sleep(0.2)  # the PUT is in flight now, held by the latency (the window this test needs)
        pve.ct(200).config["description"] = "edited by hand"
        edited.set()

    editor = threading.Thread(target=edit_after_the_read)
    editor.start()
    result = module(cores=12)
    editor.join()
    assert edited.is_set()
    assert result["changed"] is True, result
    config = pve.ct(200).config
    assert config["cores"] == 12 and config["description"] == "edited by hand"
    puts = [p for m, p, _ in pve.requests[seen:] if m == "PUT"]
    assert len(puts) == 2  # the stale one, then the one with the digest read again


# ---------------------------------------------------------------- tasks with warnings, locks, hot-plug


def _warn_on(pve, ttype, lines):
    """Make every `ttype` task end as PVE's fork_worker ends one that called log_warn: exit status
    `WARNINGS: N`, its log `WARN: ...` lines then `TASK WARNINGS: N` (pve-common RESTEnvironment.pm)."""
    original = pve.task

    async def task(node, kind, tid, user, body, vm=None, lock=True, log=()):  # noqa: PLR0917 - fakepve's signature
        upid = await original(node, kind, tid, user, body, vm=vm, lock=lock, log=log)
        record = pve.tasks[upid]
        if kind == ttype and record["exitstatus"] == "OK":
            record["log"][-1:] = [f"WARN: {line}" for line in lines] + [f"TASK WARNINGS: {len(lines)}"]
            record["exitstatus"] = f"WARNINGS: {len(lines)}"
        return upid

    pve.task = task


def test_a_start_that_ends_with_warnings_succeeds_and_relays_them(pve, module):
    module()
    _warn_on(pve, "vzstart", ["Device /dev/nvidia-caps not found, skipping", "mp0: acl not supported"])
    result = module(state="started")
    assert result.get("failed") is not True, result
    assert result["status"] == "running" and result["actions"] == ["start"]
    assert result["task_warnings"] == [
        "start CT 200: WARN: Device /dev/nvidia-caps not found, skipping",
        "start CT 200: WARN: mp0: acl not supported",
    ]
    assert pve.ct(200).status == "running"
    assert module(state="started")["task_warnings"] == []
    assert "start CT 200: WARN: mp0: acl not supported" in str(result["warnings"])  # relayed


def test_a_task_error_is_still_a_failure():
    from sglfleet.pve import task_succeeded

    assert task_succeeded("OK") and task_succeeded("WARNINGS: 3")
    assert not task_succeeded("WARNINGS: x") and not task_succeeded("startup for container '200' failed")


def test_a_locked_container_is_named_after_the_timeout(pve, module):
    module()
    pve.snapshot_lock(200, "backup")
    digest, seen = pve.ct(200).digest(), len(pve.requests)
    result = module(cores=12, timeout=1)
    assert result["failed"] is True
    assert result["locked"] == "backup"
    assert "CT 200 is locked (backup) and stayed locked for 1 s" in result["msg"]
    assert "pct unlock 200" in result["msg"]
    assert writes(pve, seen) == []
    assert pve.ct(200).digest() == digest
    # check mode does not wait: it says what a real run would do, and that it would wait
    check = module(cores=12, timeout=1, check=True)
    assert check["changed"] is True and check["actions"] == ["update cores"]
    assert any("locked (backup)" in w for w in check["task_warnings"])


def test_a_locked_container_is_waited_for(pve, module):
    """The module waits while the CT is locked and changes it only once the lock is gone (the order of
    the API calls PVE sees, not how long it took)."""
    module()
    pve.snapshot_lock(200, "backup")
    seen = len(pve.requests)
    unlocked_at: list[int] = []

    def unlock() -> None:
        unlocked_at.append(len(pve.requests))
        pve.unlock(200)

    threading.Timer(1.0, unlock).start()
    result = module(cores=12, timeout=30)
    assert result["changed"] is True, result
    assert pve.ct(200).config["cores"] == 12
    (at,) = unlocked_at
    puts = [
        i
        for i, (m, p, _) in enumerate(pve.requests)
        if i >= seen and m == "PUT" and p.endswith("/lxc/200/config")
    ]
    assert puts and min(puts) >= at, (puts, at)  # no change while locked, the change once unlocked


def test_a_lock_taken_between_read_and_write_is_waited_for(pve, module):
    """PVE's own refusal of a locked CT (check_lock: "CT is locked (backup)") is waited out and retried."""
    module()
    pve.fail("PUT", f"/nodes/{NODE}/lxc/200/config", 500, "CT is locked (backup)", times=1)
    result = module(cores=6)
    assert result["changed"] is True, result
    assert pve.ct(200).config["cores"] == 6


def test_new_devices_on_a_running_container_are_hot_plugged_without_restart(pve, module):
    module(state="started")
    check = module(state="started", devices=GPU_NODES, check=True)
    assert check["changed"] is True and check["restart_required"] is False
    result = module(state="started", devices=GPU_NODES)
    assert result["changed"] is True and result["restart_required"] is False, result
    assert pve.ct(200).pending == {}
    # changing an existing devN is not hot-plugged (pve-container skips "existing dev"): restart
    changed = [{"path": GPU_NODES[0], "mode": "0660"}, *GPU_NODES[1:]]
    assert module(state="started", devices=changed, check=True)["restart_required"] is True
    assert module(state="started", devices=changed)["restart_required"] is True


def test_a_device_the_node_lacks_is_refused_before_any_request(pve, module):
    result = module(devices=GPU_NODES, node_devices=GPU_NODES[:-2])
    assert result["failed"] is True and result["argument"] == "devices"
    assert "node 'pve1' has no dev9=/dev/nvidia-uvm, dev10=/dev/nvidia-uvm-tools" in result["msg"]
    assert "nvidia-modprobe -u -c 0" in result["msg"] and "-c 255" in result["msg"]
    assert pve.requests == []
    assert module(devices=GPU_NODES, node_devices=GPU_NODES)["changed"] is True


def test_bind_mounts_are_managed_and_need_root_password(pve, module):
    mounts = {"mp0": "/srv/models,mp=/models,ro=1"}
    result = module(mounts=mounts)
    assert result["changed"] is True, result
    assert pve.ct(200).config["mp0"] == "/srv/models,mp=/models,ro=1"
    assert module(mounts={"mp0": {"volume": "/srv/models/", "mp": "/models", "ro": True}})["changed"] is False
    assert module(mounts={})["actions"] == ["update mp0"]
    refused = module(mounts=mounts, auth="token")
    assert refused["failed"] is True and refused["argument"] == "mounts"
    assert "bind mounts of host directories (mp0)" in refused["msg"] and "API tokens" in refused["msg"]
