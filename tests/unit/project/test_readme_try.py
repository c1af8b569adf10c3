"""The README's "Try it" runs as written: its commands are read from the README's own block (so the page and
the test cannot drift apart) and run in bash, in a directory of their own, with this venv in place of the
fresh one the block makes (the same lock, requirements.txt; making a venv is minutes of pip) and a free
port in place of the README's. No root, no LXC: a stand-in server, a job on a few prompts, its status."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO

ROOT = REPO
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.timeout(180)


def try_block() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Try it") :]
    block = re.search(r"^```console\n(.*?)^```", section, re.S | re.M)
    assert block, "README: no console block under 'Try it'"
    return block.group(1).splitlines()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_install_lines_use_the_lock_and_no_lab_package() -> None:
    lines = try_block()
    assert lines[0].startswith("python3 -m venv ") and "sudo" not in "\n".join(lines)
    install = lines[1].split()
    assert install[:4] == ["pip", "install", "-c", "requirements.txt"], lines[1]
    for source in install[4:]:
        assert (ROOT / source.split("[")[0] / "pyproject.toml").is_file(), source
    # `testing` without its `lab` extra: the stand-in needs no fakepve and no LXC
    assert "./testing" in install[4:] and not any("[lab]" in s for s in install)


def test_the_try_runs_as_written(tmp_path: Path) -> None:
    lines = try_block()
    port = free_port()
    script = "\n".join(lines[2:]).replace("31000", str(port))  # after making the venv and installing
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLFLEET_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"  # `python` and `sglfleet` are this venv's, as after activate
    proc = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = (
        (tmp_path / "try" / "standin.log").read_text() if (tmp_path / "try" / "standin.log").exists() else ""
    )
    assert proc.returncode == 0, f"{script}\n---\n{out}\n--- stand-in:\n{log}"
    assert "all 1 instances healthy" in out
    assert "8/8 done (100.0%), 0 failed" in out  # sglfleet job status
    results = [json.loads(line) for line in (tmp_path / "try" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["custom_id"] for r in results) == [f"try-{i}" for i in range(1, 9)]
    assert all(r["response"]["status_code"] == 200 and r["error"] is None for r in results)
