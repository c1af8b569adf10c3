"""Write files all at once or not at all: temporary files next to them, renamed over them when done.

`atomic_write(path)` writes one file; `atomic_writes(paths)` writes several that belong together
(a data set and its report): every one is written, flushed and closed before the first rename, so a
full disk or any other error leaves all of them as they were, with no temporary file behind.
A temporary file is 0600 from its birth until it is renamed (then `mode`, 0644 unless told: 0600 for a
file that holds a secret, which is then never readable by others, whatever the file it replaces was).
A path that is a symlink is written through: the file it names is replaced, the link stays. A path
that is not a regular file when the renames come (a FIFO or a device put there meanwhile: the writers
refuse those up front with `sglfleet.outpath.output_problem`) fails the write, nothing renamed.
A temporary file is named `.NAME.PID.XXXXXXXX.tmp`: `remove_stale_temporaries` removes those of
writers killed before they could clean up (`kill -9`), and only those.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from sglfleet.outpath import not_a_file, target


def _temp_prefix(path: Path, pid: int) -> str:
    return f".{path.name}.{pid}."


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporary files a killed writer of ``path`` left next to it (``kill -9`` skips the
    cleanup): those named for a process that no longer runs. A live writer's are left alone."""
    removed = []
    prefix = f".{path.name}."
    try:
        candidates = [
            p for p in path.parent.iterdir() if p.name.startswith(prefix) and p.name.endswith(".tmp")
        ]
    except OSError:
        return removed
    for tmp in candidates:
        pid_text = tmp.name[len(prefix) :].split(".", 1)[0]
        if not pid_text.isdigit():
            continue  # not one of ours (or from before the pid was in the name): left alone
        try:
            os.kill(int(pid_text), 0)
            continue  # its writer still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # another user's process
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
            removed.append(tmp)
    return removed


@contextlib.contextmanager
def atomic_writes(
    paths: Sequence[Path], *, durable: bool = False, mode: int = 0o644
) -> Iterator[list[BinaryIO]]:
    """Yield one binary file per path; on success each replaces its path, on an exception none does.

    `durable`: fsync each file before the renames and the directories after them, so that the new
    content (not just "old or new") survives a power loss once this returns. `mode`: the files' mode
    (each is 0600 while it is written, whatever `mode` says).
    """
    paths = [target(p) for p in paths]
    temps: list[str] = []
    handles: list[BinaryIO] = []
    try:
        for path in paths:
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path, os.getpid()), suffix=".tmp", dir=path.parent)
            temps.append(tmp)
            handles.append(os.fdopen(fd, "wb", buffering=1 << 20))
        yield handles
        for handle in handles:  # a full disk shows here at the latest, before anything is renamed
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
            handle.close()
        for tmp in temps:
            os.chmod(tmp, mode)
        for path in paths:  # a rename over a device node or a FIFO would replace it, system-wide
            problem = not_a_file(path, "refusing to replace")
            if problem is not None:
                raise OSError(errno.EEXIST, problem, str(path))
        for tmp, path in zip(temps, paths, strict=True):
            os.replace(tmp, path)
    except BaseException:
        for handle in handles:
            with contextlib.suppress(OSError):
                handle.close()
        for tmp in temps:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise
    if durable:
        for directory in dict.fromkeys(p.parent for p in paths):
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


@contextlib.contextmanager
def atomic_write(path: Path, *, durable: bool = False, mode: int = 0o644) -> Iterator[BinaryIO]:
    """Yield a binary file; on success it replaces `path`, on an exception `path` is left untouched."""
    with atomic_writes([path], durable=durable, mode=mode) as (handle,):
        yield handle


def write_text(path: Path, text: str, *, mode: int = 0o644, durable: bool = True) -> None:
    """Replace `path` with `text` (UTF-8) at once: `atomic_write` for a small file written whole."""
    with atomic_write(path, durable=durable, mode=mode) as fh:
        fh.write(text.encode())
