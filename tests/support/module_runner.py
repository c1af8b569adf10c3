"""Run a module from library/ the way Ansible does: a separate Python process given an args file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "library"
MODULE_UTILS = ROOT / "module_utils"
# Ansible ships module_utils/ (ansible.cfg's module_utils) inside the module's payload as
# ansible.module_utils.<name>; run directly, the module finds them the same way through this path.
_RUN_AS_ANSIBLE = (
    "import runpy, sys, ansible.module_utils as m; m.__path__.append(sys.argv[1]); "
    "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def module_argv(name: str, args_file: Path) -> list[str]:
    """The command that runs library/<name>.py with `args_file` as Ansible would (module_utils/ found)."""
    return [
        sys.executable,
        "-c",
        _RUN_AS_ANSIBLE,
        str(MODULE_UTILS),
        str(LIBRARY / f"{name}.py"),
        str(args_file),
    ]


def run_module(
    name: str,
    args: dict[str, Any],
    tmp_path: Path,
    *,
    check: bool = False,
    diff: bool = False,
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> dict[str, Any]:
    """Run library/<name>.py with `args`; return its JSON result (`failed` is set when it failed)."""
    payload = {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check, "_ansible_diff": diff}}
    args_file = tmp_path / f"{name}-args.json"
    args_file.write_text(json.dumps(payload))
    proc = subprocess.run(
        module_argv(name, args_file),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(
            f"{name} printed no JSON (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        ) from exc
    assert bool(result.get("failed")) == (proc.returncode != 0), (proc.returncode, result)
    return result


def module_doc(name: str) -> dict[str, Any]:
    """`ansible-doc --json` of library/<name>.py: fails when the documentation does not render."""
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-doc"), "-M", str(LIBRARY), "--json", name],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[WARNING]" not in proc.stderr and "[ERROR]" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)[name]


def assert_examples_use_documented_options(name: str, doc: dict[str, Any]) -> None:
    """EXAMPLES call `name` by its collection name, sglfleet.ops.NAME (a short name does not resolve pasted
    outside this checkout), with options DOCUMENTATION lists (so the examples stay true). A task that
    registers what the example then uses (another module, ansible.builtin.*) is allowed beside them."""
    import yaml

    options = set(doc["doc"]["options"])
    fqcn = f"sglfleet.ops.{name}"
    tasks = yaml.safe_load(doc["examples"])
    assert tasks, "EXAMPLES is empty"
    assert any(fqcn in task for task in tasks), f"no example calls {fqcn}"
    for task in tasks:
        assert name not in task, f"example {task.get('name')!r} calls {name} by its short name, not {fqcn}"
        if fqcn not in task:
            continue
        unknown = set(task[fqcn] or {}) - options
        assert not unknown, f"example {task.get('name')!r} uses undocumented options {sorted(unknown)}"
