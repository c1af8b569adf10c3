"""Write a file all at once or not at all: a temporary file next to it, renamed over it when done."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_write(path: Path, *, durable: bool = False) -> Iterator[BinaryIO]:
    """Yield a binary file; on success it replaces `path`, on an exception `path` is left untouched.

    `durable`: fsync the file before the rename and the directory after it, so that the new content
    (not just "old or new") survives a power loss once this returns.
    """
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb", buffering=1 << 20) as fh:
            yield fh
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
