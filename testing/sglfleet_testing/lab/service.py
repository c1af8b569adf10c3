"""Bring the lab up, take it down, say what runs: the functions behind `python -m sglfleet_testing.lab`.

`up` makes the lab's state (TLS certificate, SSH key, template) when missing and starts the PVE bridge
as a daemon (its own session, a pidfile, a log file); on a lab that is up it changes nothing.
`down` stops the daemon, removes every container and every file and directory the lab made.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import fcntl
import logging
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from .container import NODE_VMID, LxcHost
from .driver import (
    DEFAULT_MODULE_VERSION,
    build_installer,
    declare_module,
    declared_module,
    installer_path,
    proc_driver_dir,
)
from .hfhub import REPO_ID, FakeHub, start_hub
from .node import ensure_node
from .settings import LabSettings
from .template import ensure_template

Say = Callable[[str], None]
TOOLS = {
    "lxc-start": "lxc",
    "lxc-stop": "lxc",
    "lxc-info": "lxc",
    "lxc-attach": "lxc",
    "lxc-wait": "lxc",
    "lxc-cgroup": "lxc",
    "lxc-destroy": "lxc",
    "debootstrap": "debootstrap",
    "zstd": "zstd",
    "tar": "tar",
    "ssh-keygen": "openssh-client",
    "chroot": "coreutils",
    "gcc": "gcc",
}
START_TIMEOUT = 30.0
# A certificate this close to its end is made anew when the daemon starts.
CERT_MARGIN = datetime.timedelta(days=3)


class LabError(RuntimeError):
    """The lab cannot be brought up (or down); the message says what to do."""


# ------------------------------------------------------------ up


@contextlib.contextmanager
def admin_lock(settings: LabSettings, say: Say, timeout: float = 600) -> Iterator[None]:
    """Hold the lab's admin lock (one `up` or `down` at a time, machine-wide)."""
    settings.admin_lock.parent.mkdir(parents=True, exist_ok=True)
    with settings.admin_lock.open("a") as lock:
        deadline = time.monotonic() + timeout
        waiting = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LabError(f"another `lab up` or `lab down` holds {settings.admin_lock}") from None
                if not waiting:
                    say(f"waiting for another `lab up` or `lab down` ({settings.admin_lock})")
                    waiting = True
                time.sleep(0.5)
        yield


def up(settings: LabSettings, say: Say = print) -> bool:
    """Bring the lab up; True if anything was done, False if it was already up."""
    preflight()
    with admin_lock(settings, say):
        return _up(settings, say)


def _up(settings: LabSettings, say: Say) -> bool:
    did = False
    settings.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    settings.lxc_path.mkdir(mode=0o700, exist_ok=True)
    if not settings.ssh_key.is_file():
        make_ssh_key(settings)
        say(f"made the lab's SSH key {settings.ssh_key}")
        did = True
    start = time.monotonic()
    if ensure_template(settings, say):
        did = True
    pid = daemon_pid(settings)
    problem = api_problem(settings) if pid is not None else "not running"
    if problem:
        if pid is not None:
            say(f"fakepve pid {pid}: {problem}: restarting it")
            stop_daemon(settings)
        if ensure_tls(settings):
            say(f"made the lab's TLS certificate {settings.ca_cert}")
        pid = start_daemon(settings)
        say(f"fakepve pid {pid} serves the PVE API on {settings.url} (node {settings.node})")
        did = True
    # After the API: a failure here leaves the PVE API and the CTs serving, and says what failed.
    if ensure_driver(settings, say):
        did = True
    if ensure_node(settings, LxcHost(settings), settings.ssh_key.with_suffix(".pub").read_text()):
        say(
            f"stand-in PVE node {settings.node} (lab container {NODE_VMID}) runs, sshd on 127.0.0.1:"
            f"{settings.ssh_port(NODE_VMID)}"
        )
        did = True
    if did:
        say(f"lab up in {time.monotonic() - start:.1f} s")
    else:
        say(f"lab already up: fakepve pid {pid} on {settings.url} ({daemon_python(pid)})")
    return did


def ensure_driver(settings: LabSettings, say: Say) -> bool:
    """The stand-in driver: the module version the CTs see (declared once, kept across `up`s) and the
    installer of that version's userspace. True if anything was made."""
    did = False
    if declared_module(settings) is None and not (proc_driver_dir(settings) / "nvidia").is_dir():
        declare_module(settings, DEFAULT_MODULE_VERSION)
        say(f"declared the host's nvidia module {DEFAULT_MODULE_VERSION} in {proc_driver_dir(settings)}")
        did = True
    version = declared_module(settings) or DEFAULT_MODULE_VERSION
    if not installer_path(settings, version).is_file():
        installer = build_installer(settings, version)
        say(f"built the stand-in driver installer {installer.path}")
        did = True
    return did


def preflight() -> None:
    """Root, and the tools the lab runs."""
    if os.geteuid() != 0:
        raise LabError("the lab needs root (it runs LXC containers): run it as root")
    missing = sorted({pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None})
    if missing:
        raise LabError(f"missing tools: apt-get install {' '.join(missing)}")


def make_ssh_key(settings: LabSettings) -> None:
    for path in (settings.ssh_key, settings.ssh_key.with_suffix(".pub")):
        path.unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sglfleet-lab", "-f", str(settings.ssh_key)],
        check=True,
        capture_output=True,
    )


def ensure_tls(settings: LabSettings) -> bool:
    """A certificate for 127.0.0.1 (self-signed, so it is its own CA); True if made now."""
    from cryptography import x509
    from fakepve.certs import make_cert

    if settings.ca_cert.is_file() and settings.tls_key.is_file():
        cert = x509.load_pem_x509_certificate(settings.ca_cert.read_bytes())
        if cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC) > CERT_MARGIN:
            return False
    certfile, keyfile, _ = make_cert(str(settings.state_dir), name="pve", hosts=(settings.host,))
    os.replace(keyfile, settings.tls_key)
    os.replace(certfile, settings.ca_cert)
    settings.ca_cert.chmod(0o644)
    return True


def start_daemon(settings: LabSettings) -> int:
    """Start `python -m sglfleet_testing.lab serve` in its own session; returns its pid once it answers."""
    with settings.logfile.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglfleet_testing.lab", "serve"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd="/",
        )
    settings.pidfile.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            if settings.pidfile.is_file() and settings.pidfile.read_text().strip() == str(proc.pid):
                settings.pidfile.unlink()
            raise LabError(f"fakepve exited with {proc.returncode}:\n{log_tail(settings)}")
        if api_ready(settings):
            return proc.pid
        time.sleep(0.2)
    stop_daemon(settings)
    raise LabError(
        f"fakepve did not answer on {settings.url} within {START_TIMEOUT:.0f} s:\n{log_tail(settings)}"
    )


def log_tail(settings: LabSettings, lines: int = 20) -> str:
    if not settings.logfile.is_file():
        return "(no log)"
    return "\n".join(settings.logfile.read_text(errors="replace").splitlines()[-lines:])


def api_ready(settings: LabSettings) -> bool:
    """True if the API answers /version to the lab's token, over TLS verified with the lab's CA."""
    return api_problem(settings) is None


def api_problem(settings: LabSettings) -> str | None:
    """Why the API does not answer /version to the lab's token over verified TLS, or None when it does."""
    if not settings.ca_cert.is_file():
        return f"{settings.ca_cert} is missing"
    try:
        answer = httpx.get(
            f"{settings.url}/api2/json/version",
            verify=ssl.create_default_context(cafile=str(settings.ca_cert)),
            timeout=3,
            headers={"Authorization": f"PVEAPIToken={settings.token_id}={settings.token_secret}"},
        )
    except httpx.ConnectError as e:
        if "CERTIFICATE_VERIFY_FAILED" in str(e):
            return f"its TLS certificate is not {settings.ca_cert}"
        return f"no answer on {settings.url} ({e})"
    except httpx.HTTPError as e:
        return f"no answer on {settings.url} ({e})"
    if answer.status_code != 200:
        return f"{settings.url} answers {answer.status_code} to the lab's token"
    return None


def daemon_pid(settings: LabSettings) -> int | None:
    """The pid of the lab's fakepve: the one the pidfile names, else one found running (its pidfile lost)."""
    try:
        pid = int(settings.pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pid = None
    if pid is not None and _is_daemon(pid):
        return pid
    found = sorted(
        int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _is_daemon(int(p.name))
    )
    return found[0] if found else None


def daemon_python(pid: int) -> str:
    """The interpreter a daemon runs (its venv says which checkout's code it serves)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except (OSError, IndexError):
        return "?"


def _is_daemon(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"sglfleet_testing.lab" in cmdline and b"serve" in cmdline


def stop_daemon(settings: LabSettings, timeout: float = 10.0) -> int | None:
    """SIGTERM the daemon (SIGKILL after timeout); returns the pid it had."""
    pid = daemon_pid(settings)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while daemon_pid(settings) == pid and Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if Path(f"/proc/{pid}").exists() and daemon_pid(settings) == pid:
            os.kill(pid, signal.SIGKILL)
    settings.pidfile.unlink(missing_ok=True)
    return pid


# ------------------------------------------------------------ down


def down(settings: LabSettings, say: Say = print, keep_template: bool = False) -> None:
    """Stop the daemon, remove every container and every file the lab made."""
    if os.geteuid() != 0:
        raise LabError("the lab needs root: run `lab down` as root")
    with admin_lock(settings, say):
        _down(settings, say, keep_template)
        settings.admin_lock.unlink(missing_ok=True)


def _down(settings: LabSettings, say: Say, keep_template: bool) -> None:
    pid = stop_daemon(settings)
    if pid is not None:
        say(f"stopped fakepve pid {pid}")
    lxc = LxcHost(settings)
    for vmid in lxc.vmids():
        lxc.destroy(vmid)
        say(f"removed container {vmid}")
    remove_lxc_leftovers(settings, lxc)
    if settings.state_dir.exists():
        shutil.rmtree(settings.state_dir)
        say(f"removed {settings.state_dir}")
    if keep_template:
        say(f"kept the downloads in {settings.cache_dir} (the template, the node's Debian packages)")
    elif settings.cache_dir.exists():
        shutil.rmtree(settings.cache_dir)
        say(f"removed {settings.cache_dir}")
    say("lab down")


def remove_lxc_leftovers(
    settings: LabSettings, lxc: LxcHost, cgroup_root: Path = Path("/sys/fs/cgroup")
) -> None:
    """LXC's lock directory for the lab's LXC path and empty cgroups it left for the lab's containers."""
    lock = Path("/run/lxc/lock") / str(settings.lxc_path).lstrip("/")
    if lock.exists():
        shutil.rmtree(lock, ignore_errors=True)
        parent = lock.parent
        while parent != Path("/run/lxc/lock") and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    if not cgroup_root.is_dir():
        return
    hierarchies = [cgroup_root] + [p for p in cgroup_root.iterdir() if p.is_dir()]
    others = False
    for hierarchy in hierarchies:
        for child in sorted(hierarchy.glob("lxc.*")):
            name = child.name.split(".", 2)[-1]
            if (
                child.name.startswith(("lxc.payload.", "lxc.monitor."))
                and name.isdigit()
                and not lxc.exists(int(name))
            ):
                _rmdir_tree(child)
            elif child.name.startswith("lxc.payload."):
                others = True
    if not others:
        for hierarchy in hierarchies:
            pivot = hierarchy / "lxc.pivot"
            if pivot.is_dir():
                _rmdir_tree(pivot)


def _rmdir_tree(cgroup: Path) -> None:
    """Remove a cgroup directory and its empty children (rmdir only: a cgroup in use stays)."""
    for sub in [*sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)), cgroup]:
        with contextlib.suppress(OSError):
            sub.rmdir()


# ------------------------------------------------------------ status


@dataclass
class Status:
    """What of the lab runs."""

    pid: int | None
    url: str
    answering: bool
    python: str | None  # the interpreter the daemon runs: which checkout's code it serves
    template: Path
    template_size: int | None
    containers: list[tuple[int, str, int]] = field(default_factory=list)  # (vmid, state, ssh port)

    @property
    def up(self) -> bool:
        return self.pid is not None and self.answering

    def lines(self) -> list[str]:
        out = []
        if self.pid is None:
            out.append("fakepve: not running")
        else:
            answer = "answers" if self.answering else "does NOT answer"
            out.append(f"fakepve: pid {self.pid} ({self.python}), {self.url} {answer}")
        if self.template_size is None:
            out.append(f"template: missing ({self.template})")
        else:
            out.append(f"template: {self.template} ({self.template_size / 1024**2:.0f} MiB)")
        if not self.containers:
            out.append("containers: none")
        for vmid, state, port in self.containers:
            out.append(f"container {vmid}: {state}, ssh root@127.0.0.1 -p {port}")
        return out


def status(settings: LabSettings) -> Status:
    pid = daemon_pid(settings)
    lxc = LxcHost(settings)
    template = settings.template_path
    containers = [
        (vmid, "running" if lxc.state(vmid).running else "stopped", settings.ssh_port(vmid))
        for vmid in lxc.vmids()
    ]
    return Status(
        pid=pid,
        url=settings.url,
        answering=pid is not None and api_ready(settings),
        python=daemon_python(pid) if pid is not None else None,
        template=template,
        template_size=template.stat().st_size if template.is_file() else None,
        containers=containers,
    )


# ------------------------------------------------------------ serve


def serve(settings: LabSettings) -> None:
    """Run the PVE bridge in the foreground until SIGTERM or SIGINT (what the daemon runs)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    asyncio.run(_serve(settings))


async def _serve(settings: LabSettings) -> None:
    from .pve import LabPve

    log = logging.getLogger("sglfleet.lab")
    pve = LabPve(settings)
    adopted = pve.adopt()
    await pve.start(str(settings.ca_cert), str(settings.tls_key))
    # The fake Hugging Face Hub (hfhub.py) for the model-download path, on loopback, in the same daemon.
    hub = await start_hub(FakeHub(), settings.host, settings.hub_port)
    log.info("fake Hugging Face Hub on http://%s:%s (repo %s)", settings.host, settings.hub_port, REPO_ID)
    log.info(
        "serving %s (node %s), template %s, adopted %s",
        pve.url,
        settings.node,
        settings.ostemplate,
        adopted or "no containers",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await hub.cleanup()
    await pve.stop()
    log.info("stopped")
