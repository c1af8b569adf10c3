"""Static checks of roles cuda_toolchain and sglang that a user relies on, without running them:
the task names the verification messages tell the user to run exist (cuda_toolchain's are checked in
tests/unit/toolchain), and the release table pins
every component (the house rules every role keeps are in test_roles.py)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from support.paths import REPO

ROOT = REPO
ROLES = ["cuda_toolchain", "sglang"]


def load(path: Path):
    return yaml.safe_load(path.read_text())


def task_names(role: str) -> set[str]:
    names: set[str] = set()

    def walk(tasks) -> None:
        for task in tasks or []:
            if "name" in task:
                names.add(f"{role} : {task['name']}")
            for key in ("block", "rescue", "always"):
                walk(task.get(key))

    for path in (ROOT / "roles" / role / "tasks").glob("*.yml"):
        walk(load(path))
    return names


def test_the_toolchain_verification_decides_in_python_not_in_jinja() -> None:
    """The messages and the task names they give are sglfleet.toolchain's (its tests check that each is a
    task of the role); verify.yml matches no error text and names no task itself."""
    text = " ".join((ROOT / "roles" / "cuda_toolchain" / "tasks" / "verify.yml").read_text().split())
    assert not re.findall(r"'(cuda_toolchain : [^']+)'", text)
    assert "regex_search" not in text and " in __cuda_toolchain_" not in text
    role_vars = load(ROOT / "roles" / "cuda_toolchain" / "vars" / "main.yml")
    assert not [key for key in role_vars if key.startswith("__cuda_toolchain_fix_")]


def test_every_task_the_sglang_messages_name_exists() -> None:
    names = task_names("sglang")
    text = " ".join((ROOT / "roles" / "sglang" / "tasks" / "verify.yml").read_text().split())
    flat = set(re.findall(r'"(sglang : [^"]+)"', text))
    assert flat, "the verification names no task"
    for name in flat:
        if name.endswith("..."):
            continue
        assert name in names, name


def test_release_table_pins_every_component_to_one_exact_version() -> None:
    role_vars = load(ROOT / "roles" / "cuda_toolchain" / "vars" / "main.yml")
    wheels = role_vars["__cuda_toolchain_wheels"]
    for release, row in role_vars["__cuda_toolchain_releases"].items():
        assert re.fullmatch(r"\d+\.\d+\.\d+", release)
        assert set(wheels) <= set(row), release
        for component in wheels:
            assert re.fullmatch(r"\d+\.\d+\.\d+(\.\d+)?", row[component]), (release, component)
        assert re.fullmatch(r"\d+\.\d+", row["ptx_isa"])
    assert role_vars["__cuda_toolchain_releases"]["13.2.2"]["nvvm"] == "13.2.86"
