"""House rules every role keeps, checked for each role under roles/: the argument specs document exactly
the defaults (same names, same values, each with a description), variables carry the role's prefix,
registers are internal (`__<role>_`), and tasks/main.yml is a table of contents whose every step has a tag."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.paths import REPO

ROOT = REPO
# Every role; a role without tasks (sglfleet: the variables the phases share) keeps the same rules on its
# variables, and has no table of contents to check.
ALL_ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "main.yml").is_file())
ROLES = [role for role in ALL_ROLES if (ROOT / "roles" / role / "tasks" / "main.yml").is_file()]
# The data phases' roles take the shared variables from role sglfleet, as a dependency.
DATA_ROLES = ["prompt_mix", "generate", "merge"]


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def walk(tasks: list[dict[str, Any]] | None) -> Iterator[dict[str, Any]]:
    for task in tasks or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from walk(task.get(key))


def test_there_are_roles() -> None:
    assert {"proxmox_lxc", "sglfleet_runtime", "training_stop", "sglang_fleet", *DATA_ROLES} <= set(ROLES)
    assert "sglfleet" in ALL_ROLES


@pytest.mark.parametrize("role", ALL_ROLES)
def test_argument_specs_document_exactly_the_defaults(role: str) -> None:
    defaults = load(ROOT / "roles" / role / "defaults" / "main.yml") or {}
    specs = load(ROOT / "roles" / role / "meta" / "argument_specs.yml")
    assert specs, f"roles/{role}/meta/argument_specs.yml is missing"
    options = specs["argument_specs"]["main"].get("options") or {}
    assert sorted(options) == sorted(defaults), "documented and defaulted variables differ"
    for name, spec in options.items():
        assert spec.get("description"), f"{name} has no description"
        if spec.get("required"):
            # A required variable has no real default: defaults/main.yml only names it, empty (or 0).
            assert defaults[name] in ("", None, 0, [], {}), (
                f"{name} is required but defaults to {defaults[name]!r}"
            )
        else:
            assert spec.get("default") == defaults[name], (
                f"{name}: spec default differs from defaults/main.yml"
            )


@pytest.mark.parametrize("role", ALL_ROLES)
def test_variables_carry_the_role_prefix(role: str) -> None:
    for name in load(ROOT / "roles" / role / "defaults" / "main.yml") or {}:
        assert name.startswith(f"{role}_"), name
    for name in load(ROOT / "roles" / role / "vars" / "main.yml") or {}:
        assert name.startswith(f"__{role}_"), name


@pytest.mark.parametrize("role", ROLES)
def test_registers_are_internal(role: str) -> None:
    for path in sorted((ROOT / "roles" / role).glob("*/*.yml")):
        if path.parent.name not in ("tasks", "handlers"):
            continue
        for task in walk(load(path)):
            if "register" in task:
                assert task["register"].startswith(f"__{role}_"), f"{path.name}: {task['register']}"


@pytest.mark.parametrize("role", ROLES)
def test_main_is_a_table_of_contents_with_a_tag_per_step(role: str) -> None:
    steps = [t for t in walk(load(ROOT / "roles" / role / "tasks" / "main.yml")) if "block" not in t]
    assert steps
    for step in steps:
        includes = [k for k in step if k.endswith(("import_tasks", "include_tasks"))]
        assert includes, f"tasks/main.yml holds a task of its own: {step.get('name')}"
        tags = step.get("tags") or []
        assert role in tags or any(str(tag).startswith(role) for tag in tags), step.get("name")


@pytest.mark.parametrize("role", DATA_ROLES)
def test_data_phases_share_their_variables_through_role_sglfleet(role: str) -> None:
    deps = load(ROOT / "roles" / role / "meta" / "main.yml")["dependencies"]
    assert {"role": "sglfleet"} in deps or "sglfleet" in deps
    shared = set(load(ROOT / "roles" / "sglfleet" / "defaults" / "main.yml"))
    # the shared paths are written once: in role sglfleet's defaults, nowhere else in the phase's role
    for path in sorted((ROOT / "roles" / role).rglob("*.yml")):
        text = path.read_text()
        assert "/var/lib/sglfleet/ledger.json" not in text, path
        for name in shared & set(load(path) or {} if path.parent.name in ("defaults", "vars") else {}):
            raise AssertionError(f"{path}: redefines {name}")


def test_playbooks_of_the_data_phases_are_thin() -> None:
    for playbook, role in (
        ("prompts.yml", "prompt_mix"),
        ("generate.yml", "generate"),
        ("merge.yml", "merge"),
    ):
        (play,) = load(ROOT / "playbooks" / playbook)
        assert play["roles"] == [{"role": role}], playbook
        assert "tasks" not in play and "vars" not in play, f"{playbook}: logic or vars outside the role"
