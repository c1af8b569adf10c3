"""What `mix` and `merge` may write: checked before any reading, so that an input is never overwritten.

An output (the data file, the Markdown report, the JSON report next to it) is refused when it is the
same file as an input (same real path, or the same inode through another name or a hard link), lies
inside an input directory (a saved dataset), is a directory, is read-only, or cannot be created.
Writing itself goes through `atomic_writes`, so an error while writing (a full disk) leaves every
output as it was; `written` turns that error into a `DataError` naming the file (exit 7 for a full
disk), and first removes the temporary files of an earlier writer of the same outputs killed on the
way (`kill -9`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from sglfleet.atomicio import atomic_writes, remove_stale_temporaries
from sglfleet.data._errors import DataError
from sglfleet.exitcodes import ExitCode


def report_paths(report: Path) -> tuple[Path, Path]:
    """The Markdown report and the JSON report written next to it (same name, `.json`)."""
    if report.suffix.lower() == ".json":
        raise DataError(
            f"--report {report}: give the Markdown report's path (for example "
            f"{report.with_suffix('.md')}); the JSON report is written next to it as .json"
        )
    return report, report.with_suffix(".json")


def _same(a: Path, b: Path) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): not the same file
        return False


def _inside(path: Path, directory: Path) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(directory)
    return real.startswith(top.rstrip(os.sep) + os.sep)


def check_outputs(inputs: Mapping[str, Path], outputs: Mapping[str, Path]) -> None:
    """Refuse, before anything is read or written, outputs that would overwrite an input or fail.

    `inputs` and `outputs` map a label ("source 'chat'", "--report") to a path; the error names both.
    """
    seen: dict[str, str] = {}
    for label, out in outputs.items():
        for in_label, source in inputs.items():
            if _same(out, source) or (source.is_dir() and _inside(out, source)):
                what = "is" if _same(out, source) else "is inside"
                raise DataError(
                    f"{label} {out} {what} the {in_label} {source}: refusing to overwrite an input; "
                    "choose another path"
                )
        real = os.path.realpath(out)
        if real in seen:
            raise DataError(f"{label} {out} is the same file as {seen[real]}: choose another path")
        seen[real] = f"{label} {out}"
        _check_writable(label, out)


def _check_writable(label: str, path: Path) -> None:
    try:
        info = path.stat()
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise DataError(f"{label} {path}: cannot use it: {exc.strerror}") from None
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            raise DataError(f"{label} {path} is a directory: give a file path")
        if not info.st_mode & 0o222:
            raise DataError(
                f"{label} {path} is read-only (mode {stat.S_IMODE(info.st_mode):04o}): "
                "make it writable or choose another path"
            )
    parent = path.parent
    while not parent.exists():  # atomic_writes creates the missing directories
        parent = parent.parent
    if not parent.is_dir():
        raise DataError(f"{label} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DataError(f"{label} {path}: cannot write in {parent} (permission denied)")


@contextlib.contextmanager
def written(paths: Sequence[Path]) -> Iterator[list[BinaryIO]]:
    """`atomic_writes(paths)`, with an OS error (full disk, read-only file system) as a `DataError`."""
    for path in paths:  # what a killed earlier run left next to its outputs (GBs, for a big merge)
        remove_stale_temporaries(path)
    try:
        with atomic_writes(paths) as handles:
            yield handles
    except OSError as exc:
        outputs = ", ".join(map(str, paths))
        where = f"{exc.filename}: " if exc.filename else ""
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        raise DataError(
            f"cannot write {outputs}: {where}{exc.strerror or exc}; nothing was written or changed",
            ExitCode.DISK_FULL if full else ExitCode.FATAL,
        ) from None
