"""The real SGLang router (`sglang-router` from PyPI) in front of stand-ins, for tests and benchmarks.

The router (a Rust binary behind `python -m sglang_router.launch_router`) loads a tokenizer for the
model its workers name in `/get_model_info` (`model_path`); given a path that is not a local
directory it asks the Hugging Face Hub. :func:`write_model_dir` writes a model directory with a
`tokenizer.json` matching the stand-in's tokenizer (its vocabulary words, one token each), so the
stand-ins are started with `--model-path DIR` and the router loads from DIR, never the network.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from sglfleet_testing.standin.process import HOST, free_port
from sglfleet_testing.standin.tokenizer import EOS_TOKEN_ID, VOCAB, VOCAB_OFFSET


def tokenizer_json() -> dict:
    """A Hugging Face `tokenizers` WordLevel tokenizer: the stand-in's words, split on whitespace."""
    vocab = {"[UNK]": 0, "</s>": EOS_TOKEN_ID, **{w: VOCAB_OFFSET + i for i, w in enumerate(VOCAB)}}
    special = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
        | {"special": True}
        for t, i in (("[UNK]", 0), ("</s>", EOS_TOKEN_ID))
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }


def write_model_dir(path: Path) -> Path:
    """A model directory holding only what a client's tokenizer needs (`tokenizer.json`)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    return path


def router_argv(port: int, workers: list[str], policy: str, model_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sglang_router.launch_router",
        "--host",
        HOST,
        "--port",
        str(port),
        "--worker-urls",
        *workers,
        "--policy",
        policy,
        "--model-path",
        str(model_dir),
        "--tokenizer-path",
        str(model_dir),
        "--log-level",
        "warn",
        # its Prometheus exporter listens on 0.0.0.0:29000 by default: two routers would collide
        "--prometheus-host",
        HOST,
        "--prometheus-port",
        str(free_port()),
        *extra,
    ]


def _workers_registered(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/get_server_info", timeout=2) as resp:
            return int(json.load(resp).get("workers_count", 0))
    except (OSError, ValueError, urllib.error.URLError):
        return -1


@contextlib.contextmanager
def running_router(
    workers: list[str], model_dir: Path, policy: str = "cache_aware", *extra: str, timeout: float = 60.0
) -> Iterator[str]:
    """The real router on a free loopback port, every worker registered; its base URL."""
    port = free_port()
    url = f"http://{HOST}:{port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            router_argv(port, workers, policy, model_dir, *extra),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            deadline = time.monotonic() + timeout
            while _workers_registered(url) < len(workers):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    tail = log.read().decode(errors="replace")[-2000:]
                    raise RuntimeError(f"the router did not come up (exit {proc.poll()}): {tail}")
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
