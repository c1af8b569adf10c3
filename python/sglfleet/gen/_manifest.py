"""``OUT.manifest.json``: what a generation job was asked, how far it got, and how fast.

The manifest ties an output to its input (SHA-256) and its generation parameters: a later run
with another input or other parameters is refused unless forced. It is rewritten atomically
(temporary file, ``fsync``, ``rename``) at the start, every few seconds, and at the end of a run,
so readers (the ``generation_job`` module) always see a whole document.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

Status = Literal["running", "complete", "complete_with_failures", "interrupted", "failed"]


class Counts(BaseModel):
    total: int = 0
    done: int = 0
    failed: int = 0
    remaining: int = 0
    sent_this_run: int = 0
    retries_this_run: int = 0


class Tokens(BaseModel):
    prompt: int = 0
    completion: int = 0


class Throughput(BaseModel):
    requests_per_s: float = 0.0
    output_tokens_per_s: float = 0.0


class Timings(BaseModel):
    first_started_at: str
    run_started_at: str
    updated_at: str
    run_elapsed_s: float = 0.0
    total_elapsed_s: float = 0.0
    runs: int = 1


class InputInfo(BaseModel):
    path: str
    sha256: str
    format: str
    requests: int


class Manifest(BaseModel):
    version: Literal[1] = 1
    status: Status
    input: InputInfo
    params: dict[str, Any]
    endpoints: list[str]
    counts: Counts
    tokens: Tokens
    throughput: Throughput
    timings: Timings
    errors_file: str
    message: str = ""
    endpoint_stats: dict[str, dict[str, float]] = Field(default_factory=dict)


class ManifestError(RuntimeError):
    pass


def manifest_path(output: Path) -> Path:
    return output.with_name(output.name + ".manifest.json")


def load(path: Path) -> Manifest | None:
    """The manifest at ``path``, or None when there is none."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    try:
        return Manifest.model_validate_json(text)
    except ValidationError as exc:
        raise ManifestError(f"{path} is not a generation manifest: {exc.errors()[0]['msg']}") from None


def save(path: Path, manifest: Manifest) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    data = json.dumps(manifest.model_dump(mode="json"), indent=2).encode() + b"\n"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def mismatches(previous: Manifest, sha256: str, params: dict[str, Any]) -> list[str]:
    """Why a run with this input and these parameters is not a continuation of ``previous``."""
    reasons = []
    if previous.input.sha256 != sha256:
        reasons.append(f"the input changed (sha256 {previous.input.sha256[:12]}… → {sha256[:12]}…)")
    if previous.params != params:
        keys = sorted(set(previous.params) | set(params))
        diff = [
            f"{k}: {previous.params.get(k)!r} → {params.get(k)!r}"
            for k in keys
            if previous.params.get(k) != params.get(k)
        ]
        reasons.append("the generation parameters changed (" + "; ".join(diff) + ")")
    return reasons
