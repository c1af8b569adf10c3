"""What `mix` and `merge` may write: checked before any reading, so that an input is never overwritten.

An output (the data file, the Markdown report, the JSON report next to it) is refused when it is the
same file as an input (same real path, or the same inode through another name or a hard link), lies
inside an input directory (a saved dataset), is not a regular file (a directory, a device, a FIFO, a
socket, or a symlink to one), is read-only, or cannot be created (`sglfleet.outpath.output_problem`,
the check `generate` makes too). While a mix or merge runs it holds a lock on each output, so that a
second one to the same output fails at once instead of racing the first one's rename.
Writing itself goes through `atomic_writes`, so an error while writing (a full disk) leaves every
output as it was; `written` turns that error into a `DataError` naming the file (exit 7 for a full
disk), and first removes the temporary files of an earlier writer of the same outputs killed on the
way (`kill -9`).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from sglfleet.atomicio import atomic_writes, remove_stale_temporaries
from sglfleet.data._errors import DataError
from sglfleet.exitcodes import ExitCode
from sglfleet.outpath import OutputLocked, output_lock, output_problem, target

__all__: list[str] = []


def report_paths(report: Path) -> tuple[Path, Path]:
    """The Markdown report and the JSON report written next to it (same name, `.json`)."""
    if report.suffix.lower() == ".json":
        raise DataError(
            f"--report {report}: give the Markdown report's path (for example "
            f"{report.with_suffix('.md')}); the JSON report is written next to it as .json"
        )
    return report, report.with_suffix(".json")


def _inside(path: Path, directory: Path) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(directory)
    return real.startswith(top.rstrip(os.sep) + os.sep)


def check_outputs(inputs: Mapping[str, Path], outputs: Mapping[str, Path]) -> None:
    """Refuse, before anything is read or written, outputs that would overwrite an input or fail
    (:func:`sglfleet.outpath.output_problem`: a device, FIFO, socket or directory, or a symlink to
    one, is refused as well as an input under another name).

    `inputs` and `outputs` map a label ("source 'chat'", "--report") to a path; the error names both.
    """
    seen: dict[str, str] = {}
    for label, out in outputs.items():
        for in_label, source in inputs.items():
            if source.is_dir() and _inside(out, source):
                raise DataError(
                    f"{label} {out} is inside the {in_label} {source}: refusing to overwrite an input; "
                    "choose another path"
                )
        problem = output_problem(out, label, inputs)
        if problem is not None:
            raise DataError(problem)
        real = os.path.realpath(out)
        if real in seen:
            raise DataError(f"{label} {out} is the same file as {seen[real]}: choose another path")
        seen[real] = f"{label} {out}"


CHART = "--report (its .png chart)"


def output_labels(output: Path, report_path: Path | None) -> dict[str, Path]:
    """The files a mix or merge writes, by the flag that names them: the output, and the report's
    Markdown and JSON when there is one, and the shares chart the CLI draws next to them (`CHART`,
    checked and locked with the others, written afterwards by `sglfleet.plot`, not by `written`)."""
    outputs = {"--output": output}
    if report_path is None:
        return outputs
    markdown, data = report_paths(report_path)
    return outputs | {
        "--report": markdown,
        "--report (its .json)": data,
        CHART: report_path.with_suffix(".png"),
    }


def data_outputs(outputs: Mapping[str, Path]) -> list[Path]:
    """The outputs the data stage writes itself (`written`): every one but the chart."""
    return [path for label, path in outputs.items() if label != CHART]


@contextlib.contextmanager
def locked(outputs: Mapping[str, Path], writer: str) -> Iterator[None]:
    """Hold the lock of every output (`sglfleet.outpath.output_lock`) while the block runs, once they
    are checked (`check_outputs`, against no input yet); another `writer` of any of them is refused
    at once with a `DataError` (exit 2), before it reads anything."""
    check_outputs({}, outputs)
    try:
        with output_lock(list(outputs.values()), writer):
            yield
    except OutputLocked as exc:
        raise DataError(str(exc)) from None


@contextlib.contextmanager
def written(paths: Sequence[Path]) -> Iterator[list[BinaryIO]]:
    """`atomic_writes(paths)`, with an OS error (full disk, read-only file system) as a `DataError`."""
    for path in paths:  # what a killed earlier run left next to its outputs (GBs, for a big merge)
        remove_stale_temporaries(target(path))
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
