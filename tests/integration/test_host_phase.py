"""The real-GPU-host steps against the lab's stand-ins: phase host on the stand-in PVE node, the driver
userspace in the session's CT (CT 200, or SGLFLEET_TEST_CT's) for the declared module version, and the
model downloaded from the fake Hub.

Needs the lab and its lock (the conftest takes it). The stand-ins: testing/sglfleet_testing/lab/driver.py,
node.py and hfhub.py (docs/lab.md).
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from proxmoxer import ProxmoxAPI
from sglfleet_testing.lab.container import NODE_VMID, LxcHost
from sglfleet_testing.lab.driver import (
    DEFAULT_MODULE_VERSION,
    build_installer,
    declare_module,
    module_changing,
)
from sglfleet_testing.lab.hfhub import HUB_TOKEN
from sglfleet_testing.lab.node import declare_node_driver, declare_node_gpus, reboot_node
from sglfleet_testing.lab.settings import LabSettings
from support.ansible_lab import Container, PlaybookRun

pytestmark = [pytest.mark.timeout(1800)]

SETTINGS = LabSettings()
NODE = "kpro6"


def recap(run: PlaybookRun, host: str) -> dict[str, int]:
    match = re.search(rf"^{host}\s*:\s*(.*)$", run.output, re.MULTILINE)
    assert match, run.explain()
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))}


def flat(run: PlaybookRun) -> str:
    """The output with whitespace collapsed (the yaml callback wraps long messages)."""
    return " ".join(run.output.split())


def on_node(command: str) -> subprocess.CompletedProcess[str]:
    argv = ["ssh", "-i", str(SETTINGS.ssh_key), "-p", str(SETTINGS.ssh_port(NODE_VMID))]
    argv += ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    argv += ["root@127.0.0.1", command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def ct_sees_the_module(ct: Container) -> Container:
    """The CT started with the lab's /proc/driver mount (a CT made before the stand-in driver existed is
    restarted once through the lab's PVE API, as a config change would need)."""
    with module_changing(SETTINGS):  # leaves the default declared
        pass
    if ct.run("test -r /proc/driver/nvidia/version", check=False).returncode != 0:
        pve = ProxmoxAPI(
            SETTINGS.host,
            port=SETTINGS.port,
            user=SETTINGS.user,
            password=SETTINGS.password,
            verify_ssl=str(SETTINGS.ca_cert),
        )
        lxc = pve.nodes(SETTINGS.node).lxc(ct.vmid)
        for verb in ("shutdown", "start"):
            upid = getattr(lxc.status, verb).post()
            while pve.nodes(SETTINGS.node).tasks(upid).status.get()["status"] != "stopped":
                time.sleep(0.3)
        deadline = time.monotonic() + 60
        while not ct.reachable():
            assert time.monotonic() < deadline
            time.sleep(0.5)
    assert DEFAULT_MODULE_VERSION in ct.out("cat /proc/driver/nvidia/version")
    return ct


# ------------------------------------------------------------------ phase host
# The node runs Debian's real kmod and nvidia-modprobe against a stand-in kernel (8 GPUs on its PCI bus,
# nvidia 195 and nvidia-uvm 511 in /proc/devices once loaded): node.py.

GPU_NODES = [f"/dev/nvidia{i}" for i in range(8)]
ALL_NODES = [*GPU_NODES, "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def reboot() -> None:
    """A boot of the stand-in node, returning once its sshd answers."""
    reboot_node(SETTINGS, LxcHost(SETTINGS))
    deadline = time.monotonic() + 60
    while on_node("true").returncode != 0:
        assert time.monotonic() < deadline, "the node's sshd did not come back after a reboot"
        time.sleep(0.5)


def node_numbers() -> dict[str, str]:
    """The node's NVIDIA character devices, path => "major:minor" (stat, following links)."""
    done = on_node("stat -L --format='%n %Hr:%Lr %F' /dev/nvidia* 2>/dev/null; true")
    return {
        line.split()[0]: line.split()[1]
        for line in done.stdout.splitlines()
        if line.endswith("character special file")
    }


def majors() -> dict[str, int]:
    """The majors the node's (stand-in) kernel lists in /proc/devices, by name."""
    chars = on_node("cat /proc/devices").stdout.split("\n\n")[0]
    return {line.split()[1]: int(line.split()[0]) for line in chars.splitlines()[1:] if line.strip()}


def the_ten_nodes() -> dict[str, str]:
    found = majors()
    nvidia, uvm = found["nvidia"], found["nvidia-uvm"]
    # the stand-in kernel's, as a 580+ nv.c registers 195 ("nvidia", "nvidiactl"); uvm deliberately not 510
    assert (nvidia, found["nvidiactl"], uvm) == (195, 195, 511)
    want = {path: f"{nvidia}:{i}" for i, path in enumerate(GPU_NODES)}
    want |= {
        "/dev/nvidiactl": f"{nvidia}:255",
        "/dev/nvidia-uvm": f"{uvm}:0",
        "/dev/nvidia-uvm-tools": f"{uvm}:1",
    }
    return want


def test_host_phase_loads_makes_nodes_and_survives_a_reboot(ct: Container) -> None:
    declare_node_driver(SETTINGS, DEFAULT_MODULE_VERSION)
    first = ct.playbook("playbooks/host.yml")
    assert first.rc == 0, first.explain()
    assert node_numbers() == the_ten_nodes()
    # (its re-run at changed=0 and check mode changing nothing: test_site's second and --check --diff runs)
    # a boot: nothing loaded, /dev fresh; the unit ordered before pve-guests.service makes the nodes by the
    # real nvidia-modprobe, and nvidia-persistenced starts after it
    reboot_node(SETTINGS, LxcHost(SETTINGS))
    deadline = time.monotonic() + 60
    while on_node("systemctl is-active sglfleet-nvidia-devices.service").stdout.strip() != "active":
        assert time.monotonic() < deadline, "the device unit did not run at boot"
        time.sleep(0.5)
    assert node_numbers() == the_ten_nodes()
    assert on_node("systemctl is-active nvidia-persistenced.service").stdout.strip() == "active"
    assert recap(ct.playbook("playbooks/host.yml"), NODE)["changed"] == 0


def test_the_old_per_gpu_uvm_loop_makes_no_gpu_node_and_the_role_repairs_it(ct: Container) -> None:
    """What the role's unit ran before (`nvidia-modprobe -u -cN` per GPU), run by the real nvidia-modprobe on
    a freshly booted node: only the UVM nodes, at base minor 7, and no /dev/nvidiaN, no /dev/nvidiactl."""
    on_node("systemctl disable sglfleet-nvidia-devices.service nvidia-persistenced.service")
    try:
        reboot()
        old = on_node("for i in 0 1 2 3 4 5 6 7; do nvidia-modprobe -u -c$i || exit 1; done")
        assert old.returncode == 0, old.stderr
        assert node_numbers() == {"/dev/nvidia-uvm": "511:7", "/dev/nvidia-uvm-tools": "511:8"}
        # verify names each wrong node with what it found, and the command that makes it right
        check = ct.playbook("playbooks/host.yml", "--tags", "pve_host_verify")
        assert check.rc != 0
        text = flat(check)
        assert "/dev/nvidia0 195:0 (found no character device)" in text, check.explain()
        assert "/dev/nvidia-uvm 511:0 (found 511:7)" in text
        assert "nvidia-modprobe -u -c 0" in text
        assert recap(ct.playbook("playbooks/host.yml", "--check"), NODE)["changed"] > 0
        run = ct.playbook("playbooks/host.yml")
        assert run.rc == 0, run.explain()
        assert node_numbers() == the_ten_nodes()
    finally:
        on_node("systemctl enable sglfleet-nvidia-devices.service nvidia-persistenced.service")


def test_verify_checks_each_node_against_proc_devices(ct: Container) -> None:
    assert ct.playbook("playbooks/host.yml").rc == 0
    # a UVM node of another major (510 hardcoded, as some guides do) is a character device, but not one the
    # module serves
    on_node("rm -f /dev/nvidia-uvm && mknod -m 666 /dev/nvidia-uvm c 510 0")
    run = ct.playbook("playbooks/host.yml", "--tags", "pve_host_verify")
    assert run.rc != 0
    assert "/dev/nvidia-uvm 511:0 (found 510:0)" in flat(run), run.explain()
    # The role's repair of a wrong node is test_the_old_per_gpu_uvm_loop_...'s: put the right one back.
    on_node("rm -f /dev/nvidia-uvm && mknod -m 666 /dev/nvidia-uvm c 511 0")
    assert node_numbers() == the_ten_nodes()


def test_host_phase_refuses_a_gpu_count_that_differs(ct: Container) -> None:
    declare_node_gpus(SETTINGS, 6)
    try:
        run = ct.playbook("playbooks/host.yml")
        assert run.rc != 0
        assert "kpro6 has 6 NVIDIA GPU(s) among its PCI functions" in flat(run), run.explain()
        assert "but pve_host_gpu_count is 8" in flat(run)
    finally:
        declare_node_gpus(SETTINGS, 8)


def test_host_phase_refuses_a_driver_older_than_580(ct: Container) -> None:
    declare_node_driver(SETTINGS, "570.172.08")
    try:
        reboot()
        run = ct.playbook("playbooks/host.yml")
        assert run.rc != 0
        expected = "the NVIDIA kernel module is 570.172.08, driver branch 570; CUDA 13 needs branch 580"
        assert expected in flat(run)
    finally:
        declare_node_driver(SETTINGS, DEFAULT_MODULE_VERSION)
        reboot_node(SETTINGS, LxcHost(SETTINGS))


def test_host_phase_names_a_missing_driver(ct: Container) -> None:
    declare_node_driver(SETTINGS, None)
    try:
        reboot()
        run = ct.playbook("playbooks/host.yml")
        assert run.rc != 0
        # the real kmod's own words
        assert "modprobe: FATAL: Module nvidia not found in directory /lib/modules/" in flat(run)
    finally:
        declare_node_driver(SETTINGS, DEFAULT_MODULE_VERSION)
        reboot_node(SETTINGS, LxcHost(SETTINGS))


# ------------------------------------------------------------------ the driver userspace in the CT


def userspace(ct: Container, *args: str) -> PlaybookRun:
    return ct.playbook("playbooks/toolchain.yml", "--tags", "nvidia_userspace", *args)


def test_userspace_matches_the_module_and_follows_it(ct: Container, ct_sees_the_module: Container) -> None:
    build_installer(SETTINGS, DEFAULT_MODULE_VERSION)
    run = userspace(ct)
    assert run.rc == 0, run.explain()
    smi = "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
    assert set(ct.out(smi).split()) == {DEFAULT_MODULE_VERSION}
    assert "libcuda.so.1 (libc6,x86-64)" in ct.out("ldconfig -p")
    assert userspace(ct).total("changed") == 0
    # the host's module changed: check mode says so, a run reinstalls
    build_installer(SETTINGS, "580.105.08")
    with module_changing(SETTINGS):
        declare_module(SETTINGS, "580.105.08")
        assert "Driver/library version mismatch" in ct.run(smi, check=False).stdout
        assert userspace(ct, "--check").total("changed") > 0
        run = userspace(ct)
        assert run.rc == 0, run.explain()
        assert set(ct.out(smi).split()) == {"580.105.08"}
    assert userspace(ct).rc == 0
    assert set(ct.out(smi).split()) == {DEFAULT_MODULE_VERSION}


def test_userspace_refuses_an_old_branch_and_an_unknown_checksum(
    ct: Container, ct_sees_the_module: Container
) -> None:
    with module_changing(SETTINGS):
        declare_module(SETTINGS, "570.172.08")
        run = userspace(ct)
        assert run.rc != 0
        assert "driver branch 570; CUDA 13 needs branch 580 or newer" in flat(run)
        declare_module(SETTINGS, "580.999.01")  # no installer, so no checksum declared for it
        run = userspace(ct)
        assert run.rc != 0
        expected = 'nvidia_userspace_checksums has no "sha256:HEX" for NVIDIA-Linux-x86_64-580.999.01.run'
        assert expected in flat(run)
        declare_module(SETTINGS, None)
        run = userspace(ct)
        assert run.rc != 0 and "the host's nvidia kernel module is not loaded" in flat(run)


# ------------------------------------------------------------------ the model


def test_model_downloads_once_verified_and_the_token_stays_out(ct: Container) -> None:
    ct.run("rm -f /srv/models/standin-7b/.sglfleet-model.json", check=False)
    run = ct.playbook("playbooks/model.yml", "-v")
    assert run.rc == 0, run.explain()
    assert HUB_TOKEN not in run.output
    assert '"model_type": "standin"' in ct.out("cat /srv/models/standin-7b/config.json")
    again = ct.playbook("playbooks/model.yml")
    assert again.total("changed") == 0, again.explain()
    elsewhere = ["-e", "model_weights_dir=/srv/models/other", "-e", "model_weights_hf_token=hf_wrong"]
    bad = ct.playbook("playbooks/model.yml", *elsewhere)
    assert bad.rc != 0
    assert "Model 'sglfleet-lab/standin-7b' not found" in flat(bad) and "hf_wrong" not in bad.output
