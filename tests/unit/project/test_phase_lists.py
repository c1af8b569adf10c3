"""One source for the phase list: the `Phase` Literal of sglfleet.fleet._ledger. The module fleet_ledger's
choices come from it (and, without the package, from its DOCUMENTATION, which test_module_docs keeps equal),
and site.yml runs the phases in its order, each play tagged with its phase. Read statically: no playbook
runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from support.paths import REPO

from sglfleet.fleet import PHASES, STATUSES

ROOT = REPO
PLAYBOOKS = ROOT / "playbooks"


def phase_tags_in_site_order() -> list[str]:
    """Each play's phase tag, in the order site.yml runs them (its imports followed, each tag once)."""
    order: list[str] = []

    def walk(path: Path) -> None:
        for entry in yaml.safe_load(path.read_text()):
            if "ansible.builtin.import_playbook" in entry:
                walk(path.parent / entry["ansible.builtin.import_playbook"])
                continue
            tags = entry.get("tags") or []
            assert len(tags) == 1, f"{path.name}: play {entry.get('name')!r} has one phase tag, got {tags}"
            if tags[0] not in order:
                order.append(tags[0])

    walk(PLAYBOOKS / "site.yml")
    return order


def test_site_runs_the_phases_in_the_ledgers_order() -> None:
    assert phase_tags_in_site_order() == [*PHASES, "status"]


def test_without_the_package_fleet_ledger_offers_the_same_phases() -> None:
    # the fallback ansible-test sanity and ansible-doc tooling see: an interpreter without sglfleet
    probe = (
        "import runpy, sys, ansible.module_utils as m\n"
        f"m.__path__.append({str(ROOT / 'module_utils')!r})\n"
        "sys.modules['sglfleet'] = None\n"
        f"ns = runpy.run_path({str(ROOT / 'library' / 'fleet_ledger.py')!r}, run_name='probe')\n"
        "print(__import__('json').dumps([ns['PHASES'], ns['STATUSES']]))\n"
    )
    argv = [sys.executable, "-c", probe]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    phases, statuses = json.loads(done.stdout)
    assert phases == list(PHASES)
    assert statuses == list(STATUSES)


def test_the_readmes_phase_table_is_in_the_ledgers_order() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| phase | what is true") :].split("\n\n", 1)[0]
    # "router (optional, ...)" is phase router
    phases = [row.split("|")[1].split()[0].strip("`") for row in table.splitlines()[2:]]
    assert phases == list(PHASES)
