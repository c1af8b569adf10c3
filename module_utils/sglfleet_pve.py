"""The PVE login, written once for every sglfleet module that talks to the PVE API (proxmox_lxc, and
sglfleet_doctor under its `pve` entries), as community.proxmox's `proxmox_auth_argument_spec()` does. Used as

    from ansible.module_utils.sglfleet_pve import PVE_AUTH_RULES, pve_auth_argument_spec, pve_credentials

    module = AnsibleModule(argument_spec={**pve_auth_argument_spec(), ...}, **PVE_AUTH_RULES, ...)
    creds = Credentials(**pve_credentials(module.params))

with its documentation in the doc fragment `pve_auth` (doc_fragments/pve_auth.py; `sglfleet.ops.pve_auth`
in the collection), which tests/unit/modules/test_module_docs.py keeps equal to this spec. Standard library
only: it runs before the import guard has anything to say."""

from __future__ import annotations

from typing import Any

#: The option names, in the order the documentation lists them.
PVE_AUTH_OPTIONS = (
    "api_host",
    "api_port",
    "api_user",
    "api_token_id",
    "api_token_secret",
    "api_password",
    "validate_certs",
    "ca_cert",
)

#: How the login options go together: a token (id and secret) or a password, never both.
PVE_AUTH_RULES: dict[str, list[tuple[str, ...]]] = {
    "required_one_of": [("api_password", "api_token_id")],
    "mutually_exclusive": [("api_password", "api_token_id")],
    "required_together": [("api_token_id", "api_token_secret")],
}


def pve_auth_argument_spec() -> dict[str, dict[str, Any]]:
    """The PVE login options of an AnsibleModule's argument_spec (a new dict each call: callers add to it)."""
    return {
        "api_host": {"type": "str", "required": True},
        "api_port": {"type": "int", "default": 8006},
        "api_user": {"type": "str", "required": True},
        "api_token_id": {"type": "str"},
        "api_token_secret": {"type": "str", "no_log": True},
        "api_password": {"type": "str", "no_log": True},
        "validate_certs": {"type": "bool", "default": True},
        "ca_cert": {"type": "path"},
    }


def pve_credentials(params: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `sglfleet.pve.Credentials` from a module's (or an entry's) login options;
    an empty token or password (a playbook's `default('')`) is no token or password."""
    return {
        "host": params["api_host"],
        "port": params["api_port"],
        "user": params["api_user"],
        "token_id": params["api_token_id"] or None,
        "token_secret": params["api_token_secret"] or None,
        "password": params["api_password"] or None,
        "validate_certs": params["validate_certs"],
        "ca_cert": params["ca_cert"],
    }
