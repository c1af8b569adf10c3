"""What a writer may write to: the one check of an output path, and the lock on it, for every writer.

`generate` (its output, errors file and manifest), `mix` and `merge` (their outputs and reports) all
ask :func:`output_problem` before anything is read, sent or written. A path may be written when it is
absent or a regular file (through a symlink too: the file it names is what is written). Anything
else is refused, naming the path and what it is: a directory, a character or block device, a FIFO, a
socket, or a symlink to one of them. As root a write through an atomic rename would otherwise replace
a device node (`/dev/null`, `/dev/stdout`) with a regular file, system-wide; an append would block on
a FIFO nobody reads. An output that is the same file as an input (the same path, through a symlink, or
a hard link: the same ``st_dev``/``st_ino``) is refused too, and so is a read-only file.

:func:`output_lock` holds an exclusive ``flock`` per output for the writers that replace their
outputs by a rename (`mix`, `merge`; `generate` locks its append-only output itself): a second writer
of the same output fails at once, before it reads anything, instead of racing the first one's rename.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path


class OutputLocked(RuntimeError):
    """Another process holds the lock of an output (it is writing it now)."""


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def kind_of(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words ("a regular file", "a FIFO (named pipe)", ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def not_a_file(path: Path, label: str, hint: str = "give a file path") -> str | None:
    """Why ``path`` cannot be written as a regular file (it exists and is something else, or a symlink
    to something else); None when it is absent, a regular file, or a symlink to either."""
    try:
        st = path.stat()  # follows a symlink: what the link names is what would be written
    except FileNotFoundError:
        return None  # absent (or a dangling symlink: the file it names is created)
    except OSError as exc:
        return f"{label} {path}: cannot use it: {exc.strerror or exc}"
    if stat.S_ISREG(st.st_mode):
        return None
    what = kind_of(st.st_mode)
    if path.is_symlink():
        what = f"a symlink to {os.readlink(path)}, {what}"
    return f"{label} {path} is {what}: {hint}"


def same_file(a: Path, b: Path) -> bool:
    """``a`` and ``b`` are one file: the same real path, or the same inode (a hard link)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        sa, sb = a.stat(), b.stat()
    except OSError:  # one of them does not exist (yet): not the same file
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def output_problem(
    path: Path,
    label: str,
    inputs: Mapping[str, Path] | None = None,
    *,
    hint: str = "give a file path",
) -> str | None:
    """Why ``path`` (called ``label`` in the message, e.g. "--output") must not be written; None when
    it may. In order: the same file as one of ``inputs`` (label -> path); not a regular file; a
    read-only file; a place where no file can be created (the nearest existing directory above it is
    not one, or is not writable). Missing directories above it are fine: the writers create them."""
    for in_label, source in (inputs or {}).items():
        if same_file(path, source):
            return (
                f"{label} {path} is the {in_label} {source}: refusing to overwrite an input; "
                "choose another path"
            )
    problem = not_a_file(path, label, hint)
    if problem is not None:
        return problem
    try:
        st: os.stat_result | None = path.stat()
    except FileNotFoundError:
        st = None
    except OSError as exc:
        return f"{label} {path}: cannot use it: {exc.strerror or exc}"
    if st is not None and not st.st_mode & 0o222:
        return (
            f"{label} {path} is read-only (mode {stat.S_IMODE(st.st_mode):04o}): "
            "make it writable or choose another path"
        )
    parent = Path(os.path.realpath(path)).parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{label} {path}: cannot use it: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{label} {path}: cannot write in {parent} (permission denied)"
    return None


def target(path: Path) -> Path:
    """The file a write to ``path`` lands in: the one a symlink names, else ``path`` itself.

    The kernel resolves the link (``O_PATH``), not ``os.path.realpath``, so that ``fs.protected_symlinks``
    applies: root writing to ``/tmp/out.jsonl`` does not follow another user's link there to a file of
    its choice (EACCES instead). A dangling link is replaced itself, not followed to create a file."""
    if not path.is_symlink():
        return path
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return path
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    finally:
        os.close(fd)


def lock_path(path: Path) -> Path:
    """The lock file of ``path``: ``.NAME.lock`` next to the file the path names (it exists only while
    a writer holds it)."""
    real = target(path)
    return real.with_name(f".{real.name}.lock")


@contextlib.contextmanager
def output_lock(paths: Sequence[Path], writer: str) -> Iterator[None]:
    """Hold an exclusive lock on each of ``paths`` while the block runs; :class:`OutputLocked` at once
    when another process holds one (``writer``, e.g. "sglfleet merge", names who is refused). The lock
    files are removed on the way out, by their holder, while still locked; a writer that opened one
    just before checks that what it locked is still the file at the lock's path, else locks anew."""
    with contextlib.ExitStack() as stack:
        for path in paths:
            stack.enter_context(_locked(path, writer))
        yield


@contextlib.contextmanager
def _locked(path: Path, writer: str) -> Iterator[None]:
    lock = lock_path(path)
    lock.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputLocked(
                f"{path} is being written by another {writer} (it holds {lock}): wait for it to end, "
                "or choose another path"
            ) from None
        held = os.fstat(fd)
        try:
            now = os.stat(lock)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            break
        os.close(fd)  # its holder removed it between our open and our lock: lock the new one
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)
