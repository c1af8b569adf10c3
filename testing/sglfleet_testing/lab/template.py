"""The lab's OS template: a Debian rootfs built once with debootstrap, cached as a vztmpl volume.

The template is what `ostemplate` names (local:vztmpl/debian-12-sglfleet_amd64.tar.zst); it is
rebuilt only when the file is missing. It comes from the Debian mirror the host's apt uses, through
the host's apt proxy if it has one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from .settings import LabSettings

PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "python3",
    "python3-venv",
    "python3-pip",
    "sudo",
    "openssh-server",
    "ca-certificates",
    "curl",
    "iproute2",
    "procps",
)
# Units that would configure (or listen on) the network: the container shares the host's network
# namespace, so none of them may ever run there.
MASKED_UNITS = (
    "networking.service",
    "ifupdown-pre.service",
    "ifupdown-wait-online.service",
    "ifup@.service",
    "dhclient.service",
    "dhcpcd.service",
    "systemd-networkd.service",
    "systemd-networkd.socket",
    "systemd-networkd-wait-online.service",
    "systemd-resolved.service",
    "systemd-timesyncd.service",
    "NetworkManager.service",
    "NetworkManager-wait-online.service",
    "NetworkManager-dispatcher.service",
    "wpa_supplicant.service",
    "ModemManager.service",
    "connman.service",
    "avahi-daemon.service",
    "avahi-daemon.socket",
    "systemd-udevd.service",
    "systemd-udev-trigger.service",
)
DEFAULT_MIRROR = "http://deb.debian.org/debian"

Say = Callable[[str], None]


class TemplateError(RuntimeError):
    """The template could not be built."""


def ensure_template(settings: LabSettings, say: Say) -> bool:
    """Build the template unless it is there; True if it was built now."""
    if settings.template_path.is_file():
        return False
    build_template(settings, say)
    return True


def build_template(settings: LabSettings, say: Say) -> Path:
    """Debootstrap a rootfs, prepare it, pack it as template_path (atomically); returns the path."""
    for tool in ("debootstrap", "tar", "zstd"):
        if shutil.which(tool) is None:
            raise TemplateError(f"{tool} is not installed: apt-get install debootstrap tar zstd")
    mirror = host_debian_mirror(release=settings.release)
    build = settings.cache_dir / "build"
    rootfs = build / "rootfs"
    if build.exists():
        shutil.rmtree(build)
    build.mkdir(parents=True)
    start = time.monotonic()
    say(f"building the template: debootstrap {settings.release} from {mirror} (about a minute)")
    cmd = [
        "debootstrap",
        "--variant=minbase",
        "--include=" + ",".join(PACKAGES),
        settings.release,
        str(rootfs),
        mirror,
    ]
    done = subprocess.run(
        cmd, env={**os.environ, **apt_proxy_env()}, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        log = rootfs / "debootstrap" / "debootstrap.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else done.stderr[-2000:]
        raise TemplateError(f"debootstrap failed (exit {done.returncode}):\n{done.stdout[-1000:]}\n{tail}")
    prepare_rootfs(rootfs)
    settings.template_dir.mkdir(parents=True, exist_ok=True)
    partial = settings.template_path.with_name(settings.template_path.name + ".partial")
    with partial.open("wb") as out:
        tar = subprocess.Popen(
            ["tar", "--numeric-owner", "--xattrs", "--acls", "-C", str(rootfs), "-cf", "-", "."],
            stdout=subprocess.PIPE,
        )
        zstd = subprocess.run(["zstd", "-q", "-T0", "-3"], stdin=tar.stdout, stdout=out, check=False)
        assert tar.stdout is not None
        tar.stdout.close()
        if tar.wait() != 0 or zstd.returncode != 0:
            partial.unlink()
            raise TemplateError("packing the template failed (tar or zstd)")
    partial.rename(settings.template_path)
    shutil.rmtree(build)
    size = settings.template_path.stat().st_size / 1024**2
    say(f"template {settings.ostemplate} built in {time.monotonic() - start:.0f} s ({size:.0f} MiB)")
    return settings.template_path


def prepare_rootfs(rootfs: Path) -> None:
    """What every container made from the template needs before its first boot."""
    mask_units(rootfs)
    # Per-container identity: sshd host keys and the machine id are made when a container is created.
    for key in (rootfs / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()
    (rootfs / "etc" / "machine-id").write_text("")
    dbus_id = rootfs / "var" / "lib" / "dbus" / "machine-id"
    if dbus_id.exists() or dbus_id.is_symlink():
        dbus_id.unlink()
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for item in (rootfs / cache).glob("*"):
            if item.is_file() and item.name != "lock":
                item.unlink()
    shutil.rmtree(rootfs / "debootstrap", ignore_errors=True)


def mask_units(rootfs: Path) -> None:
    """Mask the networking units (a link to /dev/null in /etc/systemd/system)."""
    system = rootfs / "etc" / "systemd" / "system"
    system.mkdir(parents=True, exist_ok=True)
    for unit in MASKED_UNITS:
        link = system / unit
        if link.is_symlink() or link.exists():
            if link.is_symlink() and os.readlink(link) == "/dev/null":
                continue
            link.unlink()
        link.symlink_to("/dev/null")


def host_debian_mirror(root: Path = Path("/"), release: str = "bookworm") -> str:
    """The first Debian mirror in the host's apt sources that serves release/main (not -security)."""
    sources = [root / "etc/apt/sources.list", *sorted((root / "etc/apt/sources.list.d").glob("*"))]
    for source in sources:
        if not source.is_file():
            continue
        for uri, suites, components in parse_sources(source):
            if release in suites and "main" in components and "security" not in uri:
                return uri.rstrip("/")
    return DEFAULT_MIRROR


def parse_sources(source: Path) -> list[tuple[str, list[str], list[str]]]:
    """(URI, suites, components) of each `deb` entry of an apt source file, one-line or deb822."""
    text = source.read_text(errors="replace")
    out: list[tuple[str, list[str], list[str]]] = []
    if source.suffix == ".sources":
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line:
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
            if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
                for uri in fields.get("uris", "").split():
                    out.append((uri, fields.get("suites", "").split(), fields.get("components", "").split()))
        return out
    for line in text.splitlines():
        line = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()  # noqa: PLW2901
        if len(line) >= 3 and line[0] == "deb":
            out.append((line[1], [line[2]], line[3:]))
    return out


def apt_proxy_env() -> dict[str, str]:
    """http_proxy / https_proxy for debootstrap, from the host's apt settings (empty when none)."""
    if shutil.which("apt-config") is None:
        return {}
    done = subprocess.run(
        ["apt-config", "shell", "HTTP", "Acquire::http::Proxy", "HTTPS", "Acquire::https::Proxy"],
        capture_output=True,
        text=True,
        check=False,
    )
    env = {}
    for line in done.stdout.splitlines():
        name, _, value = line.partition("=")
        value = value.strip().strip("'")
        if value and value.upper() != "DIRECT":
            env[name.lower() + "_proxy"] = value
    return env
