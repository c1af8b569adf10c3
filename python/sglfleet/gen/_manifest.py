"""``OUT.manifest.json``: what a generation job was asked, how far it got, and how fast.

The manifest ties an output to its input (SHA-256 and size) and its generation parameters: a
later run with another input or other parameters is refused unless forced. It is rewritten
atomically (a temporary file written whole and checked, ``fsync``, ``rename``, the directory
``fsync``-ed) at the start, every few seconds, and at the end of a run, so readers (``sglfleet job
status``, the ``generation_job`` module) always see a whole document, and a full disk or a short
write leaves the previous manifest as it was and no temporary file behind.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
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
    resent_this_run: int = 0  # requests sent to a second endpoint because theirs stalled


class Tokens(BaseModel):
    prompt: int = 0
    completion: int = 0


class Throughput(BaseModel):
    requests_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    eta_s: float | None = None  # seconds left at the recent rate; None: unknown (nothing answering lately)


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
    size: int | None = None  # bytes validated and sent from (None: a manifest from before it was kept)


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
    pid: int | None = None  # of the run that wrote it


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
    except OSError as exc:  # a directory, unreadable, ...
        raise ManifestError(f"{path}: cannot read it as a manifest: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ManifestError(f"{path} is not a generation manifest: not UTF-8 text") from None
    try:
        return Manifest.model_validate_json(text)
    except ValidationError as exc:
        raise ManifestError(f"{path} is not a generation manifest: {exc.errors()[0]['msg']}") from None


def save(path: Path, manifest: Manifest) -> None:
    """Replace ``path`` with ``manifest``, whole or not at all (OSError, e.g. ENOSPC, on failure)."""
    path = Path(path)
    data = json.dumps(manifest.model_dump(mode="json"), indent=2).encode() + b"\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                if n <= 0:  # a write that makes no progress: treat as a full disk
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)
                view = view[n:]
            os.fsync(fd)
            if os.fstat(fd).st_size != len(data):
                raise OSError(errno.EIO, f"short write: {os.fstat(fd).st_size} of {len(data)} bytes", tmp)
        finally:
            os.close(fd)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def input_change(previous: Manifest, sha256: str, size: int, prefix_sha256: str | None) -> str | None:
    """What changed in the input since ``previous`` was written, in words; None when nothing did.

    ``prefix_sha256``: the hash of the input's first ``previous.input.size`` bytes as it is now."""
    if previous.input.sha256 == sha256:
        return None
    old = previous.input.size
    if old is None:
        return f"the input changed (sha256 {previous.input.sha256[:12]}… → {sha256[:12]}…)"
    if size > old and prefix_sha256 == previous.input.sha256:
        return (
            f"the input grew from {old} to {size} bytes (lines were appended; the first {old} are unchanged)"
        )
    if size < old:
        return f"the input shrank from {old} to {size} bytes"
    was, now = previous.input.sha256[:12], sha256[:12]
    return f"the input was edited within its first {old} bytes (sha256 {was}… → {now}…)"


def mismatches(
    previous: Manifest,
    sha256: str,
    params: dict[str, Any],
    size: int | None = None,
    prefix_sha256: str | None = None,
) -> list[str]:
    """Why a run with this input and these parameters is not a continuation of ``previous``."""
    reasons = []
    change = input_change(previous, sha256, size if size is not None else -1, prefix_sha256)
    if change:
        reasons.append(change)
    if previous.params != params:
        keys = sorted(set(previous.params) | set(params))
        diff = [
            f"{k}: {previous.params.get(k)!r} → {params.get(k)!r}"
            for k in keys
            if previous.params.get(k) != params.get(k)
        ]
        reasons.append("the generation parameters changed (" + "; ".join(diff) + ")")
    return reasons
