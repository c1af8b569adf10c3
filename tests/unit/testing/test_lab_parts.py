"""The lab's parts that need no root and no LXC: apt sources, host package access, the LXC config,
the template's preparation, and the inventory's agreement with the lab's settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from sglfleet_testing.lab.container import LxcHost, Shape, set_hostname
from sglfleet_testing.lab.hostaccess import HostAccess, apt_signed_by, pip_locations
from sglfleet_testing.lab.settings import LabSettings
from sglfleet_testing.lab.template import (
    DEFAULT_MIRROR,
    MASKED_UNITS,
    host_debian_mirror,
    mask_units,
    parse_sources,
    prepare_rootfs,
)
from support.paths import REPO


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ------------------------------------------------------------ apt sources


def test_the_mirror_is_the_hosts_debian_main_not_security(tmp_path):
    write(
        tmp_path / "etc/apt/sources.list.d/debian.sources",
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\n"
        "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\nComponents: main\n\n"
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\n"
        "Components: main contrib\n",
    )
    assert host_debian_mirror(tmp_path, "bookworm") == "http://mirror.example/debian"


def test_one_line_sources_with_options_are_read(tmp_path):
    source = write(
        tmp_path / "sources.list",
        "# deb http://old.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] http://one.example/debian bookworm main #\n"
        "deb-src http://one.example/debian bookworm main\n",
    )
    assert parse_sources(source) == [("http://one.example/debian", ["bookworm"], ["main"])]


def test_no_usable_source_falls_back_to_deb_debian_org(tmp_path):
    write(tmp_path / "etc/apt/sources.list", "deb http://x.example/ubuntu jammy main\n")
    assert host_debian_mirror(tmp_path, "bookworm") == DEFAULT_MIRROR


def test_signed_by_keyrings_are_found_in_both_formats(tmp_path):
    one = write(
        tmp_path / "a.list",
        "deb [signed-by=/usr/share/keyrings/a.gpg arch=amd64] https://a.example/ x main\n",
    )
    deb822 = write(
        tmp_path / "b.sources", "Types: deb\nURIs: https://b.example\nSigned-By: /etc/apt/keyrings/b.gpg\n"
    )
    assert apt_signed_by(one, deb822, tmp_path / "missing.list") == [
        "/usr/share/keyrings/a.gpg",
        "/etc/apt/keyrings/b.gpg",
    ]


# ------------------------------------------------------------ package access


@pytest.fixture
def host(tmp_path) -> Path:
    """A host tree with DNS, a CA bundle, pip settings naming local indexes, and apt settings."""
    root = tmp_path / "host"
    write(root / "etc/resolv.conf", "nameserver 10.1.2.3\n")
    write(root / "etc/ssl/certs/ca-certificates.crt", "BUNDLE\n")
    write(root / "usr/local/share/ca-certificates/corp.crt", "CORP CA\n")
    write(root / "etc/pip.conf", "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
    write(root / "etc/xdg/pip/pip.conf", "[global]\nconstraint = /etc/xdg/pip/constraints.txt\n")
    write(root / "etc/xdg/pip/constraints.txt", "torch<=2\n")
    write(
        root / "home/pip.d/.config/pip/pip.conf",
        "[global]\nfind-links = /opt/wheels\nextra-index-url = file:///opt/pypi/simple file:///opt/gone/simple\n",
    )
    (root / "opt/wheels").mkdir(parents=True)
    (root / "opt/pypi/simple").mkdir(parents=True)
    write(
        root / "etc/apt/sources.list.d/x.list",
        "deb [signed-by=/usr/share/keyrings/x.gpg] https://x.example/ x main\n",
    )
    write(root / "usr/share/keyrings/x.gpg", "KEY\n")
    write(root / "etc/apt/apt.conf.d/80proxy", 'Acquire::http::Proxy "http://proxy.example:3128";\n')
    write(root / "etc/apt/apt.conf.d/20hooks", 'DPkg::Post-Invoke { "true"; };\n')
    return root


def test_the_hosts_package_access_is_collected(host):
    environ = {
        "PIP_INDEX_URL": "https://idx.example/simple",
        "https_proxy": "http://proxy:3128",
        "HOME": "/x",
        "PATH": "/bin",
    }
    access = HostAccess.from_host(root=host, environ=environ, home=host / "home/pip.d")
    inside = dict((i, h) for h, i in access.files)
    for path in (
        "/etc/resolv.conf",
        "/etc/ssl/certs/ca-certificates.crt",
        "/usr/local/share/ca-certificates/corp.crt",
        "/etc/pip.conf",
        "/etc/xdg/pip/pip.conf",
        "/etc/xdg/pip/constraints.txt",
        "/root/.config/pip/pip.conf",
        "/etc/apt/sources.list.d/x.list",
        "/usr/share/keyrings/x.gpg",
        "/etc/apt/apt.conf.d/80proxy",
    ):
        assert path in inside, path
    assert "/etc/apt/apt.conf.d/20hooks" not in inside  # no Acquire settings in it
    # A file:// index's .../simple links to ../../files: its parent is mounted; a missing path is not.
    assert set(access.binds) == {(Path("/opt/wheels"), "dir"), (Path("/opt/pypi"), "dir")}
    assert dict(access.environment) == {
        "PIP_INDEX_URL": "https://idx.example/simple",
        "https_proxy": "http://proxy:3128",
    }
    assert sorted(access.mount_entries()) == [
        "/opt/pypi opt/pypi none ro,bind,create=dir 0 0",
        "/opt/wheels opt/wheels none ro,bind,create=dir 0 0",
    ]


def test_package_access_is_installed_into_a_rootfs(host, tmp_path):
    rootfs = tmp_path / "rootfs"
    write(rootfs / "etc/environment", 'LANG="C"\nPIP_INDEX_URL="old"\n')
    write(rootfs / "etc/apt/sources.list", "deb http://deb.debian.org/debian bookworm main\n")
    (rootfs / "etc/resolv.conf").symlink_to("/run/systemd/resolve/stub-resolv.conf")
    environ = {"PIP_INDEX_URL": 'https://idx.example/"q"'}
    HostAccess.from_host(root=host, environ=environ, home=host / "home/pip.d").install(rootfs)
    assert not (rootfs / "etc/resolv.conf").is_symlink()
    assert (rootfs / "etc/resolv.conf").read_text() == "nameserver 10.1.2.3\n"
    assert (rootfs / "root/.config/pip/pip.conf").read_text().startswith("[global]\nfind-links = /opt/wheels")
    assert (
        rootfs / "etc/environment"
    ).read_text() == 'LANG="C"\nPIP_INDEX_URL="https://idx.example/\\"q\\""\n'


def test_pip_environment_locations_are_mounted_too(tmp_path):
    assert pip_locations(
        [], [("PIP_FIND_LINKS", "/srv/wheels https://x.example/w"), ("PIP_TIMEOUT", "/nope")]
    ) == [Path("/srv/wheels")]


# ------------------------------------------------------------ LXC config


def test_the_lxc_config_shares_the_hosts_network_and_boots_systemd(tmp_path):
    settings = LabSettings(state_dir=tmp_path / "state", cache_dir=tmp_path / "cache")
    access = HostAccess(files=(), binds=((Path("/opt/wheels"), "dir"),), environment=())
    config = LxcHost(settings, access, cgroup_v2=False).config_text(200, Shape("ct200", cores=4, memory=2048))
    lines = config.splitlines()
    for line in (
        "lxc.net.0.type = none",
        "lxc.cap.drop = net_admin",
        "lxc.init.cmd = /sbin/init",
        "lxc.mount.auto = proc:mixed sys:ro cgroup:mixed",
        "lxc.uts.name = ct200",
        f"lxc.rootfs.path = dir:{tmp_path}/state/lxc/200/rootfs",
        f"lxc.cgroup.memory.limit_in_bytes = {2048 * 1024**2}",
        "lxc.cgroup.cpu.cfs_quota_us = 400000",
        "lxc.mount.entry = /opt/wheels opt/wheels none ro,bind,create=dir 0 0",
    ):
        assert line in lines, line
    assert not any(line.startswith("lxc.net.0.link") for line in lines)
    no_cores = LxcHost(settings, access, cgroup_v2=False).config_text(200, Shape("ct200"))
    assert "cfs_quota_us" not in no_cores


def test_limits_follow_the_hosts_cgroup_version(tmp_path):
    settings = LabSettings(state_dir=tmp_path)
    access = HostAccess(files=(), binds=(), environment=())
    shape = Shape("ct200", cores=2, memory=1024)
    v2 = LxcHost(settings, access, cgroup_v2=True)
    assert v2.limits(shape) == [
        ("lxc.cgroup2.memory.max", str(1024 * 1024**2)),
        ("lxc.cgroup2.cpu.max", "200000 100000"),
    ]
    assert v2.limits(Shape("ct200"), live=True)[1] == ("lxc.cgroup2.cpu.max", "max 100000")
    v1 = LxcHost(settings, access, cgroup_v2=False)
    assert v1.limits(Shape("ct200"), live=True)[1] == ("lxc.cgroup.cpu.cfs_quota_us", "-1")


def test_a_shape_takes_pve_defaults():
    assert Shape.from_config(201, {}) == Shape("CT201", None, 512, 512)
    assert Shape.from_config(200, {"hostname": "x", "cores": 8, "memory": "4096", "swap": 0}) == Shape(
        "x", 8, 4096, 0
    )


def test_the_ssh_port_follows_the_vmid():
    settings = LabSettings()
    assert settings.ssh_port(200) == 2222
    assert settings.ssh_port(100) == 2122


# ------------------------------------------------------------ template


def test_networking_units_are_masked(tmp_path):
    write(tmp_path / "etc/systemd/system/networking.service", "[Unit]\n")
    mask_units(tmp_path)
    mask_units(tmp_path)
    for unit in MASKED_UNITS:
        assert os.readlink(tmp_path / "etc/systemd/system" / unit) == "/dev/null", unit
    assert {
        "networking.service",
        "systemd-networkd.service",
        "ifup@.service",
        "NetworkManager.service",
    } <= set(MASKED_UNITS)


def test_the_template_has_no_per_container_identity(tmp_path):
    write(tmp_path / "etc/ssh/ssh_host_ed25519_key", "KEY")
    write(tmp_path / "etc/ssh/sshd_config", "x")
    write(tmp_path / "etc/machine-id", "0123456789abcdef\n")
    write(tmp_path / "var/cache/apt/archives/x.deb", "deb")
    prepare_rootfs(tmp_path)
    assert not (tmp_path / "etc/ssh/ssh_host_ed25519_key").exists()
    assert (tmp_path / "etc/ssh/sshd_config").exists()
    assert (tmp_path / "etc/machine-id").read_text() == ""
    assert not (tmp_path / "var/cache/apt/archives/x.deb").exists()


def test_the_hostname_is_written_as_pve_does(tmp_path):
    write(tmp_path / "etc/hosts", "127.0.0.1\tlocalhost\n127.0.1.1\told\n::1\tlocalhost ip6-localhost\n")
    set_hostname(tmp_path, "ct200")
    assert (tmp_path / "etc/hostname").read_text() == "ct200\n"
    hosts = (tmp_path / "etc/hosts").read_text().splitlines()
    assert hosts == ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost", "127.0.1.1\tct200"]


# ------------------------------------------------------------ inventory


def test_the_lab_inventory_names_what_the_lab_serves():
    settings = LabSettings()
    lab = yaml.safe_load((REPO / "inventory/lab/group_vars/all/lab.yml").read_text())
    hosts = yaml.safe_load((REPO / "inventory/lab/hosts.yml").read_text())
    ct200 = hosts["fleet"]["hosts"]["ct200"]
    assert (ct200["ansible_host"], ct200["ansible_port"]) == (
        settings.host,
        settings.ssh_port(lab["pve_vmid"]),
    )
    assert ct200["ansible_ssh_private_key_file"] == str(settings.ssh_key)
    assert lab["pve_vmid"] == 200
    assert {
        "pve_api_host": settings.host,
        "pve_api_port": settings.port,
        "pve_node": settings.node,
        "pve_ca_cert": str(settings.ca_cert),
        "pve_api_user": settings.user,
        "pve_api_password": settings.password,
        "pve_api_token_id": settings.token_name,
        "pve_api_token_secret": settings.token_secret,
        "pve_ostemplate": settings.ostemplate,
        "pve_template_storage": settings.template_storage,
        "pve_storage": settings.rootfs_storage,
        "pve_ssh_public_key_file": str(settings.ssh_key.with_suffix(".pub")),
    }.items() <= lab.items()


# ------------------------------------------------------------ the stand-in NVIDIA driver


def _payload(installer: Path, into: Path) -> Path:
    """Unpack the installer's payload (what follows __PAYLOAD__) without running the installer."""
    import base64
    import io
    import tarfile

    text = installer.read_text()
    data = base64.b64decode(text.split("\n__PAYLOAD__\n", 1)[1])
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(into, filter="data")
    return into


def test_stand_in_driver_libraries_answer_like_a_driver_without_a_gpu(tmp_path):
    import ctypes
    import subprocess

    from sglfleet_testing.lab.driver import build_installer

    settings = LabSettings(state_dir=tmp_path / "state")
    installer = build_installer(settings, "580.95.05")
    assert installer.path.name == "NVIDIA-Linux-x86_64-580.95.05.run"
    assert installer.path.with_name(installer.path.name + ".sha256").read_text().startswith(installer.sha256)
    files = _payload(installer.path, tmp_path / "payload")
    soname = subprocess.run(
        ["readelf", "-d", str(files / "libcuda.so")], capture_output=True, text=True, check=False
    )
    assert "Library soname: [libcuda.so.1]" in soname.stdout
    cuda = ctypes.CDLL(str(files / "libcuda.so"))
    assert cuda.cuInit(0) == 100  # CUDA_ERROR_NO_DEVICE
    version = ctypes.c_int()
    assert cuda.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value == 13000
    for symbol in ("cuLaunchKernel", "cuLaunchKernelEx", "cuGetProcAddress_v2", "cuTensorMapEncodeTiled"):
        assert hasattr(cuda, symbol)
    nvml = ctypes.CDLL(str(files / "libnvidia-ml.so"))
    buf = ctypes.create_string_buffer(32)
    assert nvml.nvmlInit_v2() == 0 and nvml.nvmlSystemGetDriverVersion(buf, 32) == 0
    assert buf.value == b"580.95.05"
    # the same version twice is the same file (the inventory's checksum stays valid)
    assert build_installer(settings, "580.95.05").sha256 == installer.sha256


MODULE_UTILS = ("modprobe", "rmmod", "lsmod", "depmod")
# nvidia-installer's search path after $PATH (misc.c:500, EXTRA_PATH)
EXTRA_PATH = ("/bin", "/usr/bin", "/sbin", "/usr/sbin", "/usr/X11R6/bin", "/usr/bin/X11")


def _kmod_dir(tmp_path: Path, utils=MODULE_UTILS) -> Path:
    """A directory with executables of kmod's names (what the installer looks for, not what it runs)."""
    bin_dir = tmp_path / "kmod-bin"
    bin_dir.mkdir(exist_ok=True)
    for util in utils:
        (bin_dir / util).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / util).chmod(0o755)
    return bin_dir


def test_stand_in_installer_refuses_what_the_real_one_cannot_do(tmp_path):
    import subprocess

    from sglfleet_testing.lab.driver import build_installer

    installer = build_installer(LabSettings(state_dir=tmp_path / "state"), "580.95.05").path
    env = {**os.environ, "PATH": f"{_kmod_dir(tmp_path)}:{os.environ['PATH']}"}

    def run(*args):
        return subprocess.run(
            ["sh", str(installer), *args], capture_output=True, text=True, check=False, env=env
        )

    done = run("--silent")
    assert done.returncode == 1 and "Unable to find the kernel source tree" in done.stderr
    for spelling in ("--no-kernel-modules", "--no-kernel-module"):  # the option and its alias
        done = run(spelling)
        assert done.returncode == 1 and "--silent" in done.stderr
    assert run("--version").stdout.strip() == "nvidia-installer:  version 580.95.05"
    done = run("--frobnicate")
    assert done.returncode == 1 and "Unrecognized option" in done.stderr


def test_stand_in_installer_needs_kmod_as_the_real_one_does(tmp_path):
    """nvidia-installer 590.48.01 looks for modprobe, rmmod, lsmod and depmod first, even with
    --no-kernel-module (nvidia-installer.c:705-706, misc.c:600-623), on $PATH then EXTRA_PATH."""
    import subprocess

    from sglfleet_testing.lab.driver import build_installer

    here = [util for util in MODULE_UTILS if any(Path(d, util).is_file() for d in EXTRA_PATH)]
    if here:
        pytest.skip(f"this machine has {', '.join(here)} in the installer's fixed search path")
    installer = build_installer(LabSettings(state_dir=tmp_path / "state"), "580.95.05").path
    args = ["sh", str(installer), "--no-kernel-modules", "--silent"]
    for missing in MODULE_UTILS:
        present = [util for util in MODULE_UTILS if util != missing]
        (tmp_path / missing).mkdir()
        env = {**os.environ, "PATH": f"{_kmod_dir(tmp_path / missing, present)}:/usr/bin:/bin"}
        done = subprocess.run(args, capture_output=True, text=True, check=False, env=env)
        assert done.returncode == 1
        assert (
            f"ERROR: Unable to find the module utility `{missing}`; please make sure you have the package "
            "'module-init-tools' or 'kmod' installed.  If you do have 'module-init-tools' or 'kmod' "
            f"installed, then please check that `{missing}` is in your PATH."
        ) in done.stderr, done.stderr
    assert not list(tmp_path.glob("**/libcuda.so*"))  # nothing was installed


def test_declared_module_version_reads_back_in_the_real_format(tmp_path):
    from sglfleet_testing.lab.driver import DriverError, declare_module, declared_module, proc_driver_dir

    settings = LabSettings(state_dir=tmp_path / "state")
    path = declare_module(settings, "570.172.08")
    assert path == proc_driver_dir(settings) / "nvidia" / "version"
    assert path.read_text().startswith("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.172.08 ")
    assert declared_module(settings) == "570.172.08"
    declare_module(settings, None)
    assert declared_module(settings) is None
    with pytest.raises(DriverError, match="not an NVIDIA driver version"):
        declare_module(settings, "latest")


def test_lab_containers_see_the_declared_proc_driver(tmp_path):
    settings = LabSettings(state_dir=tmp_path / "state")
    host = LxcHost(settings, access=HostAccess(files=(), binds=(), environment=()))
    assert "proc/driver" not in host.config_text(200, Shape(hostname="ct200", cores=1, memory=512, swap=0))
    (settings.state_dir / "proc-driver").mkdir(parents=True)
    text = host.config_text(200, Shape(hostname="ct200", cores=1, memory=512, swap=0))
    assert f"lxc.mount.entry = {settings.state_dir / 'proc-driver'} proc/driver none ro,bind 0 0" in text


def test_the_stand_in_node_gets_its_own_kernel_files(tmp_path):
    from sglfleet_testing.lab.container import NODE_VMID

    settings = LabSettings(state_dir=tmp_path / "state")
    (settings.state_dir / "proc-driver").mkdir(parents=True)
    host = LxcHost(settings, access=HostAccess(files=(), binds=(), environment=()))
    text = host.config_text(NODE_VMID, Shape(hostname="kpro6"))
    node = settings.state_dir / "node"
    assert f"lxc.mount.entry = {node / 'proc-driver'} proc/driver none bind 0 0" in text
    assert f"lxc.mount.entry = {node / 'proc-devices'} proc/devices none bind 0 0" in text
    assert f"lxc.mount.entry = {node / 'sys-module'} sys/module none bind 0 0" in text
    assert f"lxc.mount.entry = {node / 'pci-devices'} sys/bus/pci/devices none ro,bind 0 0" in text
    assert "lxc.mount.entry = tmpfs dev/char tmpfs" in text  # nvidia-modprobe links /dev/char/MAJ:MIN
    assert f"{settings.state_dir / 'proc-driver'} proc/driver none ro,bind" not in text  # not the CTs' view
    assert settings.ssh_port(NODE_VMID) == 2022


def _pci_matches(pci: Path) -> list[str]:
    """nvidia-modprobe's match over config space (pci-sysfs.c find_matches; modprobe_helper's id_match):
    vendor 0x10DE at bytes 0-1, (class & 0xff00) == 0x0300 from bytes 10-11."""
    found = []
    for fn in sorted(pci.iterdir()):
        config = (fn / "config").read_bytes()[:48]
        vendor = config[0] | config[1] << 8
        device_class = config[10] | config[11] << 8
        if len(config) == 48 and vendor == 0x10DE and device_class & 0xFF00 == 0x0300:
            found.append(fn.name)
    return found


def test_the_stand_in_pci_bus_has_the_gpus_as_nvidia_modprobe_reads_them(tmp_path):
    from sglfleet_testing.lab.node import declare_node_gpus

    settings = LabSettings(state_dir=tmp_path / "state")
    declare_node_gpus(settings)
    pci = settings.state_dir / "node" / "pci-devices"
    assert len(_pci_matches(pci)) == 8 and len(list(pci.iterdir())) == 9  # and a host bridge
    assert {(pci / fn / "vendor").read_text() for fn in _pci_matches(pci)} == {"0x10de\n"}
    assert {(pci / fn / "class").read_text() for fn in _pci_matches(pci)} == {"0x030200\n"}
    declare_node_gpus(settings, 6)
    assert len(_pci_matches(pci)) == 6


def _standin_kernel(tmp_path: Path, gpus: int = 8, driver: str | None = "580.95.05"):
    import subprocess

    from sglfleet_testing.lab.node import LOAD, declare_node_gpus, loader_text

    assert "@MODULE_LINE@" in LOAD and "@" not in loader_text().replace("sglfleet-lab@stand-in", "")
    root = tmp_path / "root"
    for sub in ("sys/module", "proc/driver", "etc/sglfleet-standin", "sys/bus/pci"):
        (root / sub).mkdir(parents=True)
    (root / "proc/devices").write_text("Character devices:\n  1 mem\n254 ndctl\n\nBlock devices:\n  7 loop\n")
    if driver:
        (root / "etc/sglfleet-standin/driver").write_text(driver + "\n")
    settings = LabSettings(state_dir=tmp_path / "state")
    declare_node_gpus(settings, gpus)
    (root / "sys/bus/pci/devices").symlink_to(settings.state_dir / "node" / "pci-devices")
    script = tmp_path / "load"
    script.write_text(loader_text())

    def load(module):
        env = {"PATH": "/usr/bin:/bin", "SGLFLEET_STANDIN_ROOT": str(root)}
        argv = ["python3", str(script), module]
        return subprocess.run(argv, capture_output=True, text=True, env=env, check=False)

    return root, load


def test_the_stand_in_kernel_loads_as_the_nvidia_modules_register(tmp_path):
    root, load = _standin_kernel(tmp_path)
    done = load("nvidia-uvm")  # before nvidia: its symbols are missing, as insmod says
    assert done.returncode == 1 and "Unknown symbol in module" in done.stderr
    assert load("nvidia").returncode == 0
    assert (root / "sys/module/nvidia/initstate").read_text() == "live\n"
    assert "Open Kernel Module for x86_64  580.95.05  " in (root / "proc/driver/nvidia/version").read_text()
    assert "ModifyDeviceFiles: 1\n" in (root / "proc/driver/nvidia/params").read_text()
    assert load("nvidia_uvm").returncode == 0 and load("nvidia_uvm").returncode == 0  # loaded: a no-op
    assert (root / "proc/devices").read_text() == (
        "Character devices:\n  1 mem\n195 nvidia\n195 nvidiactl\n236 nvidia-caps\n254 ndctl\n511 nvidia-uvm\n"
        "\nBlock devices:\n  7 loop\n"
    )


def test_the_stand_in_kernel_refuses_nvidia_without_a_gpu(tmp_path):
    root, load = _standin_kernel(tmp_path, gpus=0)
    done = load("nvidia")
    assert done.returncode == 1 and "could not insert 'nvidia': No such device" in done.stderr
    assert not (root / "sys/module/nvidia").exists()


def test_the_node_runs_debians_packages_pinned():
    from sglfleet_testing.lab.node import MODPROBE_INSTALL, NODE_PACKAGES

    assert {(p.name, p.suite, p.component) for p in NODE_PACKAGES} == {
        ("kmod", "bookworm", "main"),
        ("nvidia-modprobe", "trixie", "contrib"),
    }
    assert [p.deb for p in NODE_PACKAGES] == [
        "kmod_30+20221128-1_amd64.deb",
        "nvidia-modprobe_570.133.07-1_amd64.deb",
    ]
    # modprobe.d(5): the install commands the real modprobe runs in place of inserting the modules
    assert "install nvidia /usr/local/lib/sglfleet-standin/load nvidia\n" in MODPROBE_INSTALL
    assert "install nvidia_uvm /sbin/modprobe nvidia && " in MODPROBE_INSTALL
