"""Every module in library/ documents itself the way `ansible-doc -M library` renders and validate-modules
accepts: DOCUMENTATION, EXAMPLES and RETURN render without a warning, the examples use documented options,
the author is valid, check_mode and diff_mode are described under attributes, the choices are the
package's own lists, and a host without the sglfleet package gets Ansible's missing-library error (the one
import guard in module_utils/), not a traceback."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from support.module_runner import LIBRARY, assert_examples_use_documented_options, module_argv, module_doc

from sglfleet.fleet import PHASES, STATUSES
from sglfleet.pve import STATES

MODULES = sorted(p.stem for p in LIBRARY.glob("*.py"))
# Arguments each module accepts, so that it gets past its argument checks to the import guard.
VALID_ARGS = {
    "fleet_ledger": {"state": "read", "path": "/nonexistent/ledger.json"},
    "generation_job": {"name": "x", "input": "/nonexistent/in.jsonl", "output": "/nonexistent/out.jsonl"},
    "gpu_facts": {},
    "proxmox_lxc": {
        "api_host": "127.0.0.1",
        "api_user": "root@pam",
        "api_password": "x",
        "node": "n",
        "vmid": 100,
        "state": "absent",
    },
    "sglang_health": {"count": 1},
    "sglang_instances": {"instances": 1, "check_gpus": False},
    "training_jobs": {},
    "fleet_drain": {},
    "training_dataset": {"path": "/nonexistent/train.jsonl", "sha256": "0" * 64},
    "training_launch": {"dataset": "/nonexistent/train.jsonl", "command": "true"},
    "sglfleet_doctor": {"hosts": [{"host": "ct", "role": "ct"}]},
    "sglang_backend": {"toolchain_version": "13.2.2"},
    "sglang_wheels": {
        "python_version": "3.11",
        "machine": "x86_64",
        "sglang_version": "0.5.12",
        "torch_version": "2.11.0",
    },
    "fleet_endpoints": {"ledgers": {}},
    "router_workers": {"router_url": "http://127.0.0.1:9", "urls": ["http://127.0.0.1:30000"]},
    "toolchain_verdict": {"facts": {}},
    "device_nodes": {"gpu_count": 1},
}


def test_there_are_modules() -> None:
    assert {"fleet_ledger", "generation_job", "gpu_facts", "proxmox_lxc", "sglang_health"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_documentation_renders_and_is_complete(name: str) -> None:
    doc = module_doc(name)
    assert_examples_use_documented_options(name, doc)
    assert doc["return"], "RETURN is empty"
    authors = doc["doc"]["author"]
    assert all("(@" in author for author in authors), authors
    attributes = doc["doc"].get("attributes") or {}
    for attribute in ("check_mode", "diff_mode"):
        assert attribute in attributes, f"attributes.{attribute} is missing"
        assert attributes[attribute].get("description"), f"attributes.{attribute} has no description"
        assert attributes[attribute]["support"] in ("full", "partial", "none")


@pytest.mark.parametrize("name", MODULES)
def test_what_the_attributes_mean_is_written_once_in_the_doc_fragment(name: str) -> None:
    """doc_fragments/attributes.py describes check_mode and diff_mode; a module gives only its support and
    its own details (or takes the read-only variant whole)."""
    tree = ast.parse((LIBRARY / f"{name}.py").read_text())
    (text,) = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "DOCUMENTATION"
    ]
    raw = yaml.safe_load(text)
    assert "attributes" in raw["extends_documentation_fragment"]
    for attribute, spec in (raw.get("attributes") or {}).items():
        assert "description" not in spec, f"attributes.{attribute}: its description is the fragment's"


@pytest.mark.parametrize("name", MODULES)
def test_every_module_uses_the_shared_import_guard(name: str) -> None:
    text = (LIBRARY / f"{name}.py").read_text()
    assert "from ansible.module_utils.sglfleet_deps import SGLFLEET" in text
    assert "SGLFLEET.require(module)" in text
    assert "except ImportError" not in text, "a module-local import guard"


def test_choices_are_the_packages_own_lists() -> None:
    ledger = module_doc("fleet_ledger")["doc"]["options"]
    assert ledger["phase"]["choices"] == list(PHASES)
    assert ledger["status"]["choices"] == list(STATUSES)
    assert module_doc("proxmox_lxc")["doc"]["options"]["state"]["choices"] == list(STATES)


@pytest.mark.parametrize("name", MODULES)
def test_without_the_package_the_module_says_which_library_is_missing(name: str, tmp_path: Path) -> None:
    # A package directory named sglfleet that cannot be imported shadows the installed one, as on a host
    # that runs the module with an interpreter lacking sglfleet.
    shadow = tmp_path / "shadow" / "sglfleet"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'sglfleet'\", name='sglfleet')\n"
    )
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": VALID_ARGS[name]}))
    proc = subprocess.run(
        module_argv(name, args),
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(shadow.parent), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    result = json.loads(proc.stdout)
    assert result["failed"] is True
    assert "Failed to import the required Python library (sglfleet)" in result["msg"], result["msg"]
    assert "/opt/sglfleet/venv/bin/python" in result["msg"]
