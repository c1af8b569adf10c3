"""The host's package access, carried into a lab container so that apt and pip work there as on the host.

What is carried: the DNS resolver (/etc/resolv.conf; the container shares the host's network, so even a
loopback resolver works), the trusted CA bundle, pip's configuration (/etc/pip.conf, /etc/xdg/pip/,
~/.config/pip/, ~/.pip/, $PIP_CONFIG_FILE, PIP_* variables), apt's sources, keyrings and Acquire
settings (proxies), and proxy / CA variables of the environment. Local paths that pip's settings name
(find-links directories, file:// indexes) are bind-mounted read-only at the same place.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

# Environment variables that say how to reach package registries.
ENV_PATTERN = re.compile(
    r"^(PIP_\w+|(?i:http_proxy|https_proxy|ftp_proxy|no_proxy|all_proxy)"
    r"|REQUESTS_CA_BUNDLE|SSL_CERT_FILE|SSL_CERT_DIR|CURL_CA_BUNDLE)$"
)
# pip settings whose values are locations (space- or newline-separated lists).
PIP_LOCATION_KEYS = (
    "index-url",
    "extra-index-url",
    "find-links",
    "cert",
    "client-cert",
    "constraint",
    "requirement",
    "build-constraint",
)
PIP_INDEX_KEYS = ("index-url", "extra-index-url")
# Where copied files land anyway: a location under one of these is copied, not bind-mounted.
COPIED_TREES = ("/etc", "/usr/local/share/ca-certificates", "/usr/share/keyrings")


@dataclass(frozen=True)
class HostAccess:
    """Files to copy (host path, path inside the container), read-only bind mounts (path, "dir" or
    "file"), variables, and files the container must not have because the host has not."""

    files: tuple[tuple[Path, str], ...]
    binds: tuple[tuple[Path, str], ...]
    environment: tuple[tuple[str, str], ...]
    removed: tuple[str, ...] = ()

    @classmethod
    def from_host(
        cls, root: Path = Path("/"), environ: Mapping[str, str] | None = None, home: Path | None = None
    ) -> HostAccess:
        """What the host at root (normally /) has; home is the invoking user's home (its pip config)."""
        environ = os.environ if environ is None else environ
        home = Path(environ.get("HOME", "/root")) if home is None else home
        files: dict[str, Path] = {}

        def add(host: Path, inside: str) -> None:
            if host.is_file():
                files.setdefault(inside, host)

        def add_tree(host: Path, inside: str) -> None:
            if host.is_dir():
                for path in sorted(host.rglob("*")):
                    add(path, inside + "/" + str(path.relative_to(host)))

        def at(path: str) -> Path:
            return root / path.lstrip("/")

        add(at("/etc/resolv.conf"), "/etc/resolv.conf")
        add(at("/etc/ssl/certs/ca-certificates.crt"), "/etc/ssl/certs/ca-certificates.crt")
        add_tree(at("/usr/local/share/ca-certificates"), "/usr/local/share/ca-certificates")
        # pip
        pip_configs = [at("/etc/pip.conf"), *sorted(at("/etc/xdg/pip").glob("*.conf"))]
        add(at("/etc/pip.conf"), "/etc/pip.conf")
        add_tree(at("/etc/xdg/pip"), "/etc/xdg/pip")
        for sub, inside in ((".config/pip", "/root/.config/pip"), (".pip", "/root/.pip")):
            add_tree(home / sub, inside)
            pip_configs += sorted((home / sub).glob("*.conf"))
        if environ.get("PIP_CONFIG_FILE"):
            add(at(environ["PIP_CONFIG_FILE"]), environ["PIP_CONFIG_FILE"])
            pip_configs.append(at(environ["PIP_CONFIG_FILE"]))
        # apt: sources, their keyrings, and the settings that say how to fetch (proxies and the like)
        add(at("/etc/apt/sources.list"), "/etc/apt/sources.list")
        add_tree(at("/etc/apt/sources.list.d"), "/etc/apt/sources.list.d")
        add(at("/etc/apt/trusted.gpg"), "/etc/apt/trusted.gpg")
        add_tree(at("/etc/apt/trusted.gpg.d"), "/etc/apt/trusted.gpg.d")
        add_tree(at("/etc/apt/keyrings"), "/etc/apt/keyrings")
        for keyring in apt_signed_by(
            at("/etc/apt/sources.list"), *sorted(at("/etc/apt/sources.list.d").glob("*"))
        ):
            add(at(keyring), keyring)
        for conf in [at("/etc/apt/apt.conf"), *sorted(at("/etc/apt/apt.conf.d").glob("*"))]:
            if conf.is_file() and re.search(r"acquire", conf.read_text(errors="replace"), re.I):
                add(conf, "/" + str(conf.relative_to(root)))
        environment = tuple(sorted((k, v) for k, v in environ.items() if ENV_PATTERN.match(k)))
        binds: list[tuple[Path, str]] = []
        for location in pip_locations(pip_configs, environment):
            if any(location == Path(tree) or Path(tree) in location.parents for tree in COPIED_TREES):
                add(at(str(location)), str(location))
            elif at(str(location)).exists() and location not in dict(binds):
                binds.append((location, "dir" if at(str(location)).is_dir() else "file"))
        # Sources only in sources.list.d: debootstrap's sources.list would list the mirror twice.
        removed = () if at("/etc/apt/sources.list").is_file() else ("/etc/apt/sources.list",)
        return cls(
            files=tuple(sorted((host, inside) for inside, host in files.items())),
            binds=tuple(binds),
            environment=environment,
            removed=removed,
        )

    def install(self, rootfs: Path) -> None:
        """Copy the files into rootfs (a container's root) and write the variables to /etc/environment."""
        for inside in self.removed:
            (rootfs / inside.lstrip("/")).unlink(missing_ok=True)
        for host, inside in self.files:
            target = rootfs / inside.lstrip("/")
            if target.is_symlink() or target.is_dir():
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                else:
                    target.unlink()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(host, target)
            shutil.copymode(host, target)
        if self.environment:
            env = rootfs / "etc" / "environment"
            kept = [
                line
                for line in (env.read_text().splitlines() if env.exists() else [])
                if line.split("=", 1)[0].strip() not in dict(self.environment)
            ]
            kept += [_env_line(k, v) for k, v in self.environment]
            env.write_text("\n".join(kept) + "\n")

    def mount_entries(self) -> list[str]:
        """lxc.mount.entry values for the read-only bind mounts."""
        return [f"{path} {str(path).lstrip('/')} none ro,bind,create={kind} 0 0" for path, kind in self.binds]


def _env_line(name: str, value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'{name}="{escaped}"'


def apt_signed_by(*sources: Path) -> list[str]:
    """Keyring files named by Signed-By / signed-by= in apt source files (one-line and deb822)."""
    out: list[str] = []
    for source in sources:
        if not source.is_file():
            continue
        text = source.read_text(errors="replace")
        for found in re.findall(r"(?im)^\s*Signed-By:\s*(/\S+)\s*$|signed-by=(/[^\s\]]+)", text):
            path = found[0] or found[1]
            if path not in out:
                out.append(path)
    return out


def pip_locations(configs: Iterable[Path], environment: Iterable[tuple[str, str]]) -> list[Path]:
    """Local paths that pip settings name: file:// URLs and absolute paths (an index's .../simple
    gives its parent, since such indexes link to ../../files/)."""
    values: list[tuple[str, str]] = []
    for conf in configs:
        if not conf.is_file():
            continue
        parser = configparser.RawConfigParser()
        try:
            parser.read(conf)
        except configparser.Error:
            continue
        for section in parser.sections():
            values += [
                (key, parser.get(section, key))
                for key in PIP_LOCATION_KEYS
                if parser.has_option(section, key)
            ]
    for name, value in environment:
        key = name[4:].lower().replace("_", "-") if name.startswith("PIP_") else ""
        if key in PIP_LOCATION_KEYS:
            values.append((key, value))
    out: list[Path] = []
    for key, value in values:
        for item in shlex.split(value.replace("\n", " ")):
            if item.startswith("file://"):
                path = Path(unquote(urlparse(item).path))
            elif item.startswith("/"):
                path = Path(item)
            else:
                continue
            if key in PIP_INDEX_KEYS and path.name == "simple":
                path = path.parent
            if path not in out:
                out.append(path)
    return out
