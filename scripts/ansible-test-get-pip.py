"""Stand-in for ansible-test's pip bootstrap script (get-pip-<version>.py from ci-files.testing.ansible.com,
which this network cannot reach): ansible-test runs it in an empty venv with pip's install arguments.
It bootstraps pip from the interpreter's own bundled wheel (ensurepip), then runs `pip <args>` against the
package index pip is configured for, which is what get-pip.py does after unpacking its embedded pip."""

import ensurepip
import os
import runpy
import sys

ensurepip.bootstrap(upgrade=True)
# get-pip.py's own options (do not install setuptools / wheel) are no pip install options
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
# ansible-test runs this with a reduced environment: keep the machine's CA bundle (a TLS proxy's CA)
bundle = "/etc/ssl/certs/ca-certificates.crt"
cert = ["--cert", bundle] if os.path.isfile(bundle) else []
sys.argv = ["pip", "install", *cert, *(args[1:] if args[:1] == ["install"] else args)]
runpy.run_module("pip", run_name="__main__", alter_sys=True)
