"""The README's phase names are site.yml's tags: `--tags <phase>` selects exactly that phase's plays, whole,
and nothing of the others; a step's tag (--tags sglang_fleet_verify) selects that step and the facts it needs,
no other role's preflight. Read from `ansible-playbook --list-tasks` against inventory/lab (no host is
contacted)."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from support.paths import REPO

ROOT = REPO
BIN = Path(sys.executable).parent
ENV = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
# Ansible's own check of a role's arguments is tagged `always` by Ansible itself: it reads variables, on
# the controller, and touches no host.
ARG_CHECK = "Validating arguments against arg spec"

pytestmark = pytest.mark.timeout(300)


@dataclass
class Play:
    name: str
    tags: list[str]
    tasks: list[str]


@functools.cache
def list_tasks(*tags: str) -> list[Play]:
    argv = [str(BIN / "ansible-playbook"), "-i", "inventory/lab", "playbooks/site.yml", "--list-tasks"]
    if tags:
        argv += ["--tags", ",".join(tags)]
    done = subprocess.run(argv, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    plays: list[Play] = []
    for line in done.stdout.splitlines():
        head = re.match(r"\s+play #\d+ \((.*?)\): (.*)\tTAGS: \[(.*)\]$", line)
        if head:
            plays.append(Play(head.group(2), [t for t in head.group(3).split(", ") if t], []))
            continue
        task = re.match(r"\s{6}(\S.*?)\tTAGS: \[.*\]$", line)
        if task and ARG_CHECK not in task.group(1):
            plays[-1].tasks.append(task.group(1))
    return plays


def readme_phases() -> dict[str, str]:
    """The README's phase table: phase → its playbook."""
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| phase | what is true") :].split("\n\n", 1)[0]
    rows = [row.split("|")[1:-1] for row in table.splitlines()[2:]]
    # "router (optional)" is phase router; the playbook is the cell's first `*.yml`
    return {cells[0].split()[0].strip("`"): re.findall(r"[\w-]+\.yml", cells[2])[0] for cells in rows}


TAG_SETS = [*[(p,) for p in readme_phases()], ("generate", "merge"), ("status",)]
STEPS = [
    "sglang_fleet_verify",
    *(f"{r}_{s}" for r in ("pve_host", "cuda_toolchain", "sglang") for s in ("verify", "preflight")),
]


@pytest.fixture(scope="module")
def everything() -> list[Play]:
    """Every listing the tests read, made side by side (each is one ansible-playbook start-up)."""
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda tags: list_tasks(*tags), [(), *TAG_SETS, *((s,) for s in STEPS)]))
    return list_tasks()


def test_each_phase_of_the_readme_is_a_tag_of_its_plays(everything: list[Play]) -> None:
    phases = readme_phases()
    assert list(phases)[:3] == ["host", "provision", "training_stop"]
    tagged = {tag for play in everything for tag in play.tags}
    assert set(phases) | {"status"} == tagged, "site.yml's play tags are the README's phases (and status)"
    for play in everything:
        assert len(play.tags) == 1, f"play {play.name!r}: one phase tag, got {play.tags}"
    for phase, playbook in phases.items():
        plays = [p for p in yaml.safe_load((ROOT / "playbooks" / playbook).read_text()) if "hosts" in p]
        assert plays and all(p.get("tags") == [phase] for p in plays), (
            f"{playbook}: every play tagged {phase}"
        )


@pytest.mark.parametrize("tags", [*[[p] for p in readme_phases()], ["generate", "merge"], ["status"]])
def test_a_phase_tag_selects_its_plays_whole_and_nothing_else(
    everything: list[Play], tags: list[str]
) -> None:
    selected = list_tasks(*tags)
    assert [p.name for p in selected] == [p.name for p in everything]
    for mine, full in zip(selected, everything, strict=True):
        if set(full.tags) & set(tags):
            assert full.tasks, f"play {full.name!r} has tasks"
            assert mine.tasks == full.tasks, f"--tags {','.join(tags)}: all of play {full.name!r}"
        else:
            assert mine.tasks == [], f"--tags {','.join(tags)} runs tasks of play {full.name!r}: {mine.tasks}"


def test_a_step_tag_selects_that_step_and_the_facts_it_needs_only(everything: list[Play]) -> None:
    tasks = [task for play in list_tasks("sglang_fleet_verify") for task in play.tasks]
    assert tasks and all(task.startswith("sglang_fleet : ") for task in tasks), tasks
    assert "sglang_fleet : Probe every instance, by the model it serves" in tasks
    # the plan the verification needs (the instances laid out) runs with it; the other steps do not
    assert any(task.startswith("sglang_fleet : Lay out the instances") for task in tasks)
    assert not any("Start the instances" in task or "Install the template unit" in task for task in tasks)


@pytest.mark.parametrize(
    ("tag", "role"),
    [
        ("pve_host_verify", "pve_host"),
        ("cuda_toolchain_verify", "cuda_toolchain"),
        ("sglang_verify", "sglang"),
    ],
)
def test_a_roles_preflight_runs_with_its_own_steps_only(everything: list[Play], tag: str, role: str) -> None:
    """The preflight that used to be `always` runs with its own role's step (its facts are that step's), and
    with no other's."""
    tasks = [task for play in list_tasks(tag) for task in play.tasks]
    assert tasks and all(task.startswith(f"{role} : ") for task in tasks), tasks
    preflight = [t for play in list_tasks(f"{role}_preflight") for t in play.tasks]
    assert preflight and set(preflight) <= set(tasks)
