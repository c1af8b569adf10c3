"""`make collection`: roles/, library/, module_utils/, doc_fragments/ and playbooks/ as the collection
sglfleet.ops, with the sglfleet runtime wheel, which `ansible-galaxy collection install` accepts and whose
modules and roles ansible-doc then renders from the install alone (validate-modules runs on it in `make lint`,
through scripts/collection-sanity; tests/playbooks/test_collection.py runs its playbooks)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from support.paths import REPO

import sglfleet

pytestmark = pytest.mark.timeout(180)

ROOT = REPO
BIN = Path(sys.executable).parent
FQCN = "sglfleet.ops"
Installed = tuple[Path, dict[str, str]]
WHEEL = f"sglfleet-{sglfleet.__version__}-py3-none-any.whl"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The collection built and installed into a temporary directory; an environment that sees only it: no
    ansible.cfg of this checkout (cwd elsewhere), so nothing resolves from library/ or roles/ here."""
    tmp = tmp_path_factory.mktemp("collection")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env |= {"VENV_BIN": str(BIN), "ANSIBLE_COLLECTIONS_PATH": str(tmp), "ANSIBLE_NOCOLOR": "1"}
    built = subprocess.run(
        [str(ROOT / "scripts" / "build-collection"), "--output", str(tmp / "dist"), "--install", str(tmp)],
        env=env, capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp / "dist" / f"sglfleet-ops-{sglfleet.__version__}.tar.gz").is_file()
    return tmp / "ansible_collections" / "sglfleet" / "ops", env


def ansible_doc(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "ansible-doc"), *args]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_the_modules_use_the_collections_import_guard_and_doc_fragment(installed: Installed) -> None:
    root, _ = installed
    modules = sorted(p.name for p in (root / "plugins" / "modules").glob("*.py"))
    assert modules == sorted(p.name for p in (ROOT / "library").glob("*.py"))
    assert (root / "plugins" / "module_utils" / "sglfleet_deps.py").is_file()
    assert (root / "plugins" / "doc_fragments" / "attributes.py").is_file()
    for module in modules:
        text = (root / "plugins" / "modules" / module).read_text()
        assert f"ansible_collections.{FQCN}.plugins.module_utils.sglfleet_deps" in text, module
        assert f"  - {FQCN}.attributes\n" in text, module
        assert "  - attributes" not in text, f"{module}: a fragment name outside the collection"


def test_ansible_doc_renders_modules_and_roles_from_the_install_alone(installed: Installed) -> None:
    root, env = installed
    cwd = root.parents[2]
    for name in (f"{FQCN}.fleet_ledger", f"{FQCN}.generation_job", f"{FQCN}.gpu_facts"):
        doc = ansible_doc(env, cwd, "--json", name)
        assert doc.returncode == 0 and "[WARNING]" not in doc.stderr, doc.stderr
        attributes = next(iter(json.loads(doc.stdout).values()))["doc"]["attributes"]
        # the description comes from the fragment, the support from the module (or the fragment's variant)
        assert attributes["check_mode"]["support"] == "full" and attributes["check_mode"]["description"]
        assert attributes["diff_mode"]["description"], name
    role = ansible_doc(env, cwd, "-t", "role", f"{FQCN}.generate")
    assert role.returncode == 0 and "generate_max_failures" in role.stdout, role.stderr


def test_the_playbooks_are_the_checkouts_and_the_lab_stays_out(installed: Installed) -> None:
    root, _ = installed
    assert sorted(p.name for p in (root / "playbooks").glob("*.yml")) == sorted(
        p.name for p in (ROOT / "playbooks").glob("*.yml")
    )
    assert not list(root.rglob("lab_trainer.yml")) and not list(root.rglob("sglfleet_testing"))
    probe = root / "playbooks" / "files" / "sglfleet_doctor_probe.py"
    assert probe.read_text() == (ROOT / "python" / "sglfleet" / "doctor" / "_probe.py").read_text()


def test_the_runtime_wheel_is_carried_and_the_roles_default_to_it(installed: Installed) -> None:
    root, _ = installed
    wheel = root / "roles" / "sglfleet_runtime" / "files" / WHEEL
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        assert "sglfleet/__init__.py" in names and "sglfleet/gen/_engine.py" in names
        assert not any(n.startswith("sglfleet_testing/") for n in names), "test tooling in the runtime wheel"
    bundled = "{{ role_path }}/../sglfleet_runtime/files/" + WHEEL
    for role, var in (
        ("sglfleet_runtime", "sglfleet_runtime_source"),
        ("sglang", "sglang_sglfleet_source"),
        ("sglang_router", "sglang_router_sglfleet_source"),
    ):
        defaults = yaml.safe_load((root / "roles" / role / "defaults" / "main.yml").read_text())
        specs = yaml.safe_load((root / "roles" / role / "meta" / "argument_specs.yml").read_text())
        assert defaults[var] == bundled, role
        assert specs["argument_specs"]["main"]["options"][var]["default"] == bundled, role
        # from any role of the collection, role_path/.. is roles/
        assert (root / "roles" / role / ".." / "sglfleet_runtime" / "files" / WHEEL).is_file()


def test_build_wheels_takes_a_built_wheel_as_it_is(installed: Installed, tmp_path: Path) -> None:
    """What role sglfleet_runtime runs on the controller, given the collection's wheel: no build, no cache."""
    root, _ = installed
    wheel = root / "roles" / "sglfleet_runtime" / "files" / WHEEL
    cache = tmp_path / "cache"
    build_wheels = str(root / "roles" / "sglfleet_runtime" / "files" / "build_wheels.py")
    done = subprocess.run(
        [sys.executable, build_wheels, str(cache), str(wheel)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (entry,) = json.loads(done.stdout)["wheels"]
    assert entry["path"] == str(wheel) and entry["name"] == WHEEL
    assert entry["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert not cache.exists(), "a wheel taken as it is needs no cache"
    bad = subprocess.run(
        [sys.executable, build_wheels, str(cache), str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "neither a built wheel nor a directory with pyproject.toml" in bad.stderr


def galaxy() -> dict:
    return yaml.safe_load((ROOT / "collection" / "galaxy.yml").read_text())


def test_galaxy_yml_is_kept_in_the_repository_with_the_packages_version() -> None:
    meta = galaxy()
    assert (meta["namespace"], meta["name"]) == tuple(FQCN.split("."))
    assert meta["version"] == sglfleet.__version__


def test_the_tarball_carries_the_tracked_galaxy_yml_license_and_changelog(installed: Installed) -> None:
    root, _ = installed
    # ansible-galaxy builds MANIFEST.json from galaxy.yml: the tracked one, as it is
    info = json.loads((root / "MANIFEST.json").read_text())["collection_info"]
    for key in ("namespace", "name", "version", "authors", "description", "license", "tags", "repository"):
        assert info[key] == galaxy()[key], key
    assert (root / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    assert (root / "CHANGELOG.md").read_text() == (ROOT / "CHANGELOG.md").read_text()
    assert not (root / "LICENSE").is_symlink() and not (root / "CHANGELOG.md").is_symlink()
    assert (root / "meta" / "runtime.yml").read_text() == (ROOT / "collection/meta/runtime.yml").read_text()


def test_docs_collection_md_names_the_version_the_tarball_says(installed: Installed) -> None:
    root, _ = installed
    version = json.loads((root / "MANIFEST.json").read_text())["collection_info"]["version"]
    page = (ROOT / "docs" / "collection.md").read_text()
    named = set(re.findall(r"sglfleet-ops-([0-9][^\s`/]*?)\.tar\.gz", page))
    named |= set(re.findall(r"sglfleet-([0-9][^\s`/-]*?)-py3-none-any\.whl", page))
    assert named == {version}, f"docs/collection.md names {sorted(named)}, the tarball is {version}"
