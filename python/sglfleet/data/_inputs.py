"""What a mix or a merge was built from, and whether running it again would build the same thing.

`input_record(files, options)` is what the report JSON keeps under `inputs`: the SHA-256 of every
input file (of every file under a directory, for a saved Hugging Face dataset; None for a path that
is not there) and the options that change the output. `unchanged(record, output, report)`: the
output and both reports are there and the report JSON holds the same record, so a run with
`--skip-unchanged` has nothing to do (and `--check` predicts that). This is how phases prompts and
merge stay idempotent: the commands decide, the roles only read the answer.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from sglfleet.data._existing import file_digest
from sglfleet.data._outputs import report_paths

__all__ = ["input_record", "unchanged"]


def path_digest(path: Path) -> str | None:
    """SHA-256 of a file's bytes; of a directory, over each file's relative path and digest (sorted);
    None when the path is not there."""
    if path.is_file():
        return file_digest(path)
    if not path.is_dir():
        return None
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path).as_posix()}\0{file_digest(file)}\n".encode())
    return digest.hexdigest()


def input_record(files: Mapping[str, Path | None], options: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs of a run as its report JSON keeps them: each file's absolute path and SHA-256 by
    label (a file not known yet is null), and the options that change the output."""
    return {
        "files": {
            label: None if path is None else {"path": os.path.abspath(path), "sha256": path_digest(path)}
            for label, path in files.items()
        },
        "options": dict(options),
    }


def unchanged(record: dict[str, Any], output: Path, report: Path | None) -> bool:
    """True when `output` and the reports (Markdown and JSON) are there and the JSON report says it was
    built from exactly `record`; always False without a report, or with an input that is not there."""
    if report is None or any(f is None or f["sha256"] is None for f in record["files"].values()):
        return False
    markdown, data = report_paths(report)
    if not (output.is_file() and markdown.is_file() and data.is_file()):
        return False
    try:
        previous = orjson.loads(data.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False
    return isinstance(previous, dict) and previous.get("inputs") == orjson.loads(orjson.dumps(record))
