"""`cuda_toolchain_modules_python` / `sglang_modules_python` empty mean "the play's interpreter": a play
that sets ansible_python_interpreter in its own vars (not the inventory) gets that one for the sglfleet
modules, not the discovered python (which lacks sglfleet). Run with ansible_connection=local."""

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

ROOT = REPO


def include(name: str, role: str, tasks_from: str) -> dict:
    return {"name": name, "ansible.builtin.include_role": {"name": role, "tasks_from": tasks_from}}


def test_empty_modules_python_is_the_interpreter_the_play_sets(tmp_path: Path) -> None:
    # The inventory names no interpreter: discovery would pick the system python, which has no sglfleet.
    (tmp_path / "hosts.ini").write_text("[fleet]\nlocalhost ansible_connection=local\n")
    cuda_home = tmp_path / "cuda"
    (cuda_home / "bin").mkdir(parents=True)
    (cuda_home / "bin" / "nvcc").write_text("")
    result = tmp_path / "pythons.json"
    ledger_path = tmp_path / "ledger.json"
    (tmp_path / "play.yml").write_text(
        json.dumps(
            [
                {
                    "name": "A play that sets the interpreter in its own vars",
                    "hosts": "fleet",
                    "gather_facts": False,
                    "vars": {
                        "ansible_python_interpreter": sys.executable,
                        "sglang_cuda_home": str(cuda_home),
                        "cuda_toolchain_ledger_path": str(ledger_path),
                    },
                    "tasks": [
                        include("Preflight of role sglang", "sglang", "preflight"),
                        include("Preflight of role cuda_toolchain", "cuda_toolchain", "preflight"),
                        # module fleet_ledger imports sglfleet: it fails with the discovered python
                        include("Record of role cuda_toolchain", "cuda_toolchain", "record"),
                        {
                            "name": "Save the interpreters the roles chose",
                            "ansible.builtin.copy": {
                                "content": "{{ {'sglang': __sglang_modules_python,"
                                " 'cuda_toolchain': __cuda_toolchain_modules_python} | to_json }}",
                                "dest": str(result),
                                "mode": "0644",
                            },
                        },
                    ],
                }
            ]
        )
    )
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "hosts.ini", "play.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env={
            **os.environ,
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
            "ANSIBLE_LIBRARY": str(ROOT / "library"),
            "ANSIBLE_NOCOLOR": "1",
        },
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert json.loads(result.read_text()) == {"sglang": sys.executable, "cuda_toolchain": sys.executable}
    assert load_ledger(ledger_path).phases["toolchain"].status == "done"
