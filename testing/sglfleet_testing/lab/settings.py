"""Where the lab keeps its state, and the fixed, lab-only names and secrets it serves.

The lab is one machine-wide resource: every checkout on the machine shares it, so its state lives
under /var (not in a worktree). The secrets below protect a fake API bound to loopback; they are
published on purpose (inventory/lab has the same values) and are worth nothing anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Fixed lab credentials: root@pam's password and a root@pam API token (PVE token ids are
# "USER@REALM!NAME"; the secret is a UUID, as PVE makes them).
LAB_PASSWORD = "sglfleet-lab"
LAB_TOKEN_NAME = "sglfleet"
LAB_TOKEN_SECRET = "5c1e7ab0-1a6b-4f7e-9d3c-51a6f1ee7200"


@dataclass(frozen=True)
class LabSettings:
    """Every path, address and name of the lab. The defaults are the lab; tests may point elsewhere."""

    state_dir: Path = Path("/var/lib/sglfleet-lab")
    cache_dir: Path = Path("/var/cache/sglfleet-lab")
    host: str = "127.0.0.1"
    port: int = 8006
    node: str = "kpro6"
    user: str = "root@pam"
    password: str = LAB_PASSWORD
    token_name: str = LAB_TOKEN_NAME
    token_secret: str = LAB_TOKEN_SECRET
    # The storage that holds the OS template (content vztmpl) and its volume name there.
    template_storage: str = "local"
    template_name: str = "debian-12-sglfleet_amd64.tar.zst"
    # The storage for container root filesystems, as on a stock PVE install.
    rootfs_storage: str = "local-lvm"
    release: str = "bookworm"
    # Held while `up` or `down` runs, so that two of them never interleave (a lock in /run, gone at boot).
    admin_lock: Path = Path("/run/lock/sglfleet-lab-admin.lock")
    # CT 200's sshd listens on 127.0.0.1:2222; CT N's on 2022 + N (they all share the host's network).
    ssh_port_base: int = 2022
    # The fake Hugging Face Hub (hfhub.py), plain HTTP on host:hub_port, served by the same daemon.
    hub_port: int = 8017

    # ------------------------------------------------------------ state dir

    @property
    def ca_cert(self) -> Path:
        """The certificate clients verify the API with (self-signed: it is its own CA)."""
        return self.state_dir / "pve-ca.pem"

    @property
    def tls_key(self) -> Path:
        return self.state_dir / "pve.key"

    @property
    def ssh_key(self) -> Path:
        """The private key whose public half the inventory hands to new containers."""
        return self.state_dir / "id_ed25519"

    @property
    def pidfile(self) -> Path:
        return self.state_dir / "fakepve.pid"

    @property
    def logfile(self) -> Path:
        return self.state_dir / "fakepve.log"

    @property
    def lxc_path(self) -> Path:
        """The LXC path (lxc-* -P) of the lab's containers: one directory per container, named by vmid."""
        return self.state_dir / "lxc"

    # ------------------------------------------------------------ cache dir

    @property
    def template_dir(self) -> Path:
        """Where storage `local` keeps vztmpl volumes (PVE: /var/lib/vz/template/cache)."""
        return self.cache_dir / "template" / "cache"

    @property
    def template_path(self) -> Path:
        return self.template_dir / self.template_name

    @property
    def ostemplate(self) -> str:
        """The template's volume id, as `ostemplate` takes it."""
        return f"{self.template_storage}:vztmpl/{self.template_name}"

    # ------------------------------------------------------------ API

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    @property
    def token_id(self) -> str:
        """The full token id, USER@REALM!NAME."""
        return f"{self.user}!{self.token_name}"

    def ssh_port(self, vmid: int) -> int:
        """The port the sshd of container vmid listens on (127.0.0.1 only)."""
        return self.ssh_port_base + vmid
