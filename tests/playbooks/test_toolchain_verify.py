"""Role cuda_toolchain's verify step as a play runs it (local connection, no lab CT): every check runs,
module toolchain_verdict judges what they printed, and the play fails at the first check that did not
pass with the message the package decided; the ledger records that failure. The tree is a stand-in whose
nvcc emits PTX of another release (nvvm 13.5 beside ptxas 13.2), so the PTX check is the first to fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO

from sglfleet.fleet import load_ledger

pytestmark = pytest.mark.timeout(200)

# nvcc as a tree whose nvvm is 13.5's: --version is the release's, -ptx writes PTX ISA 9.5, and ptxas
# (any other compile) refuses it with ptxas's own line.
NVCC = """#!/bin/sh
case "$*" in
  --version) printf 'nvcc: NVIDIA (R) Cuda compiler driver\\n'
             printf 'Cuda compilation tools, release 13.2, V13.2.86\\n'
             printf 'Build cuda_13.2.r13.2/compiler.0\\n' ;;
  *-ptx*) out=$(echo "$*" | sed 's/.*-o //'); printf '.version 9.5\\n.target sm_120\\n' > "$out" ;;
  *) echo "ptxas fatal   : Unsupported .version 9.5; current version is '9.2'" >&2; exit 255 ;;
esac
"""


def test_a_failed_check_fails_the_play_with_the_packages_message_and_is_recorded(tmp_path: Path) -> None:
    prefix = tmp_path / "cuda"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "nvcc").write_text(NVCC)
    (prefix / "bin" / "nvcc").chmod(0o755)
    (prefix / "venv" / "bin").mkdir(parents=True)
    (prefix / "venv" / "bin" / "python").symlink_to(sys.executable)  # none of the NVIDIA wheels
    ledger = tmp_path / "ledger.json"
    (tmp_path / "hosts.ini").write_text("[fleet]\nlocalhost ansible_connection=local\n")
    play = [
        {
            "name": "Verify a stand-in tree",
            "hosts": "fleet",
            "gather_facts": False,
            "vars": {
                "ansible_python_interpreter": sys.executable,
                "cuda_toolchain_prefix": str(prefix),
                "cuda_toolchain_profile_path": str(tmp_path / "profile.sh"),
                "cuda_toolchain_env_file": str(tmp_path / "cuda.env"),
                "cuda_toolchain_ledger_path": str(ledger),
                "cuda_toolchain_install_prerequisites": False,
                "cuda_toolchain_verify_triton": False,
                "sglfleet_gpus_expected": False,
            },
            "tasks": [
                {
                    "name": f"The {step} step of role cuda_toolchain",
                    "ansible.builtin.include_role": {"name": "cuda_toolchain", "tasks_from": step},
                }
                for step in ("preflight", "verify")
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "hosts.ini", "play.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env={
            **os.environ,
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
            "ANSIBLE_LIBRARY": str(REPO / "library"),
            "ANSIBLE_NOCOLOR": "1",
        },
        check=False,
    )
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0, out[-3000:]
    expected = (
        "Check the PTX ISA version and target: PTX version mismatch: nvvm emits PTX ISA 9.5, release "
        "13.2.2's ptxas accepts 9.2 (ptxas: \"Unsupported .version 9.5; current version is '9.2'\")."
    )
    phase = load_ledger(ledger).phases["toolchain"]
    assert phase.status == "failed"
    error = phase.evidence["error"]
    assert error.startswith(expected), error
    assert "nvidia-nvvm is missing, release 13.2.2 pins 13.2.86" in error  # the drift, from the probe
    assert "task 'cuda_toolchain : Install every CUDA component pinned to one release'" in error
    assert "PTX version mismatch: nvvm emits PTX ISA 9.5" in out  # what the operator sees
    assert not (tmp_path / "cuda-toolchain-verify.").exists()
