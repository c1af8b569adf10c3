"""The lab's fake Hugging Face Hub, downloaded from by the real `hf download` (huggingface_hub 2.4.0,
the version role model_weights pins), with HF_ENDPOINT and HF_TOKEN in its environment only."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sglfleet_testing.lab.hfhub import COMMIT, HUB_TOKEN, REPO_ID, FakeHub, start_hub

HF = Path(sys.executable).parent / "hf"
pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(not HF.exists(), reason="no hf CLI in this venv")]


@pytest.fixture
def hub():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fake = FakeHub()
    loop = asyncio.new_event_loop()
    runner = loop.run_until_complete(start_hub(fake, "127.0.0.1", port))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield fake, f"http://127.0.0.1:{port}"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.run_until_complete(runner.cleanup())
    loop.close()


def download(endpoint: str, into: Path, token: str | None, revision: str = COMMIT):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(into.parent / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1")
    if token:
        env["HF_TOKEN"] = token
    argv = [str(HF), "download", REPO_ID, "--revision", revision, "--local-dir", str(into)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90, check=False)


def test_hf_download_of_the_pinned_revision_gets_the_repo(hub, tmp_path):
    fake, endpoint = hub
    run = download(endpoint, tmp_path / "model", HUB_TOKEN)
    assert run.returncode == 0, run.stderr
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["model_type"] == "standin"
    assert sorted(p.name for p in (tmp_path / "model").iterdir() if p.is_file()) == sorted(fake.files)
    assert all(ok for _, _, ok in fake.requests)
    assert any(path.endswith(f"/resolve/{COMMIT}/config.json") for _, path, _ in fake.requests)


def test_without_the_token_the_private_repo_is_not_found(hub, tmp_path):
    _, endpoint = hub
    run = download(endpoint, tmp_path / "model", None)
    assert run.returncode != 0
    assert f"Model '{REPO_ID}' not found" in run.stderr and "private" in run.stderr
    assert not (tmp_path / "model" / "config.json").exists()


def test_an_unknown_revision_is_named(hub, tmp_path):
    _, endpoint = hub
    run = download(endpoint, tmp_path / "model", HUB_TOKEN, revision="0" * 40)
    assert run.returncode != 0
    assert f"Revision not found in model '{REPO_ID}'" in run.stderr
