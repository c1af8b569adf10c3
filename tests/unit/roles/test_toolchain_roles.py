"""Static checks of roles cuda_toolchain and sglang that a user relies on, without running them:
the task names the verification messages tell the user to run exist, and the release table pins
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


def test_every_fix_the_toolchain_verification_names_is_a_task() -> None:
    role_vars = load(ROOT / "roles" / "cuda_toolchain" / "vars" / "main.yml")
    fixes = {key: value for key, value in role_vars.items() if key.startswith("__cuda_toolchain_fix_")}
    assert len(fixes) == 7
    names = task_names("cuda_toolchain")
    for key, fix in fixes.items():
        assert fix in names, (key, fix)


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
            assert re.fullmatch(r"\d+\.\d+\.\d+", row[component]), (release, component)
        assert re.fullmatch(r"\d+\.\d+", row["ptx_isa"])
    assert role_vars["__cuda_toolchain_releases"]["13.2.2"]["nvvm"] == "13.2.86"


def test_backend_table_matches_the_documented_choices() -> None:
    role_vars = load(ROOT / "roles" / "sglang" / "vars" / "main.yml")
    table = role_vars["__sglang_attention_backends"]
    assert table == {"9.0": "fa3", "10": "trtllm_mha", "12": "flashinfer"}
    assert role_vars["__sglang_attention_backend_default"] == "flashinfer"
    for backend in [*table.values(), *role_vars["__sglang_attention_backend_allowed"]]:
        assert backend in role_vars["__sglang_known_backends"], backend
