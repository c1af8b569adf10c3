"""The doctor's PVE row: credentials of the wrong shape and a CA path that is no file are BLOCKER rows
naming the variable, found before any call to PVE (nothing listens at the address given)."""

from __future__ import annotations

from pathlib import Path

from sglfleet.doctor import ProvisionNeeds, Status, check_pve
from sglfleet.pve import Credentials, credential_problems

SECRET = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"
NEEDS = ProvisionNeeds(node="pve", vmid=200, storage="local-lvm", template_storage="local")
# Port 9 on loopback: a call would fail with "connection refused", which no assertion below accepts.
HOST = "127.0.0.1"


def creds(**kw) -> Credentials:
    base = {"host": HOST, "port": 9, "user": "root@pam", "token_id": "sglfleet", "token_secret": SECRET}
    return Credentials(**{**base, **kw})


def test_a_full_token_id_is_refused_with_the_name_and_user_to_set() -> None:
    rows = check_pve("ct200", creds(user="sgl@pve", token_id="root@pam!sglfleet"), NEEDS)
    assert [(r.check, r.status) for r in rows] == [("PVE privileges", Status.BLOCKER)]
    assert (
        rows[0].found == "proxmox_lxc_api_token_id is 'root@pam!sglfleet', a full token id; "
        "the token's name alone is expected"
    )
    assert (
        rows[0].fix
        == "set proxmox_lxc_api_token_id: 'sglfleet' and proxmox_lxc_api_user: 'root@pam' (now 'sgl@pve')"
    )


def test_a_secret_that_is_no_uuid_is_refused_without_showing_it() -> None:
    (row,) = check_pve("ct200", creds(token_secret="hunter2-not-a-uuid"), NEEDS)
    assert (
        row.status is Status.BLOCKER
        and "proxmox_lxc_api_token_secret is not a UUID (18 characters" in row.found
    )
    assert "hunter2" not in row.found + row.fix
    assert [p.variable for p in credential_problems(creds(token_id="9bad name", token_secret=""))] == [
        "proxmox_lxc_api_token_id",
        "proxmox_lxc_api_token_secret",
    ]
    assert credential_problems(creds()) == []
    assert credential_problems(creds(token_id=None, token_secret=None, password="pw")) == []


def test_a_ca_path_that_is_no_file_is_a_blocker_with_provisions_fix(tmp_path: Path) -> None:
    missing = tmp_path / "files" / "pve-root-ca.pem"
    rows = check_pve(
        "ct200", creds(token_id=None, token_secret=None, password="pw", ca_cert=str(missing)), NEEDS
    )
    assert [r.status for r in rows] == [Status.BLOCKER]
    assert rows[0].found == f"proxmox_lxc_ca_cert is {missing}, which is not a file on the controller"
    assert rows[0].fix == (
        "copy the PVE host's /etc/pve/pve-root-ca.pem there, "
        'or set proxmox_lxc_ca_cert: "" to use the system CAs'
    )
