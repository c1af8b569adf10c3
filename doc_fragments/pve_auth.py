"""The documentation of the PVE login options every sglfleet module that talks to the PVE API shares, as
community.proxmox's `proxmox` doc fragment does. The argument spec is module_utils/sglfleet_pve.py's
`pve_auth_argument_spec()`; tests/unit/modules/test_module_docs.py keeps the two equal. A module names it
in DOCUMENTATION (`sglfleet.ops.pve_auth` in the collection):

    extends_documentation_fragment:
      - pve_auth
"""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  api_host:
    description: PVE host name or address.
    type: str
    required: true
  api_port:
    description: PVE API port.
    type: int
    default: 8006
  api_user:
    description: PVE user, e.g. C(root@pam). With O(api_token_id), the token's owner.
    type: str
    required: true
  api_token_id:
    description:
      - API token id (the part after C(!)); mutually exclusive with O(api_password).
      - Empty is no token.
    type: str
  api_token_secret:
    description: API token secret (a UUID).
    type: str
  api_password:
    description:
      - Password of O(api_user). Empty is no password.
    type: str
  validate_certs:
    description: Verify the PVE TLS certificate.
    type: bool
    default: true
  ca_cert:
    description: CA certificate file to verify PVE with (e.g. a copy of C(/etc/pve/pve-root-ca.pem)).
    type: path
"""
