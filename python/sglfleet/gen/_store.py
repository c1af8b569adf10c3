"""The output of a generation job: an append-only OpenAI Batch output file, exactly once by custom_id.

Files, for an output ``OUT``:

* ``OUT``: one OpenAI Batch output line per successful custom_id
  (``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}``; for
  conversation input, and with ``keep_reasoning`` for chat requests of batch input, also
  ``"conversations"``: the conversation with its regenerated assistant
  turns, the row ``sglfleet merge`` writes);
* ``OUT.errors.jsonl``: the permanent failures of the latest run, same shape with ``error`` set
  (they are retried by the next run, so the file is started afresh by each run).

Guarantees. Each line is written with a single ``write(2)`` on an ``O_APPEND`` descriptor, so once a
result is reported written it survives a crash of the process (``kill -9``); the files are
``fsync``-ed at most every ``fsync_interval`` seconds and when the store closes, so an OS crash or
power loss loses at most the results of that interval, which the next run regenerates. A crash in
the middle of a write leaves a torn last line: :meth:`OutputStore.open` cuts it before reading the
ids already done; a write that fails (a full disk) is cut back at once, so the file never holds
half a line. An exclusive ``flock`` on ``OUT`` refuses a second writer.

The lines are :mod:`sglfleet.records`' (written by its ``result_line`` / ``error_line``); on resume
an id is done only when ``OUT`` holds a well-formed success for it (``records.done_of``): any other
line is passed over and its id sent again. :meth:`OutputStore.summary` is what the manifest records
of ``OUT`` (its size, the success lines, a fingerprint of its end), which status and merge check the
file on disk against.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from sglfleet.gen._ids import IdSet, id_digest
from sglfleet.records import ResultsSummary, done_of, error_line, result_line, summarize

__all__ = ["OutputStore", "StoreError", "result_line"]


class StoreError(RuntimeError):
    """The output cannot be used (locked by another run, corrupt in the middle, unwritable)."""


@dataclass
class Resumed:
    """What an existing output already holds."""

    done: IdSet
    lines: int
    prompt_tokens: int
    completion_tokens: int
    torn_bytes_cut: int


def errors_path(output: Path) -> Path:
    return output.with_name(output.name + ".errors.jsonl")


class LineIds:
    """Batch output line ids, ``batch_req_<run><n>``: unique across runs without a syscall per line."""

    def __init__(self) -> None:
        self._prefix = "batch_req_" + os.urandom(8).hex()
        self._n = 0

    def __call__(self) -> str:
        self._n += 1
        return f"{self._prefix}{self._n:08x}"


def _cut_torn_tail(fd: int) -> int:
    """Truncate whatever follows the last newline (a write cut short); return the bytes cut."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0
    block = 1 << 16
    end = size
    while end > 0:
        start = max(0, end - block)
        chunk = os.pread(fd, end - start, start)
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            keep = start + nl + 1
            break
        end = start
    else:
        keep = 0
    if keep < size:
        os.ftruncate(fd, keep)
        os.fsync(fd)
    return size - keep


class OutputStore:
    """Open with :meth:`open`, append with :meth:`write_result` / :meth:`write_error`, then :meth:`close`."""

    def __init__(self, output: Path, fsync_interval: float = 1.0) -> None:
        self.output = Path(output)
        self.errors_path = errors_path(self.output)
        self.fsync_interval = fsync_interval
        self._fd = -1
        self._err_fd = -1
        self._dirty = False
        self._last_sync = 0.0
        self._line_ids = LineIds()
        self._size = 0  # bytes of the output, as this store left it
        self._results = 0  # success lines in it

    def open(self) -> Resumed:
        """Lock the output, cut a torn last line, read the ids already done, start the errors file."""
        self.output.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._fd = os.open(self.output, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot open output {self.output}: {exc.strerror}") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = -1
            raise StoreError(f"{self.output} is being written by another run (locked)") from None
        try:
            cut = _cut_torn_tail(self._fd)
            resumed = self._read_done(cut)
            self._err_fd = os.open(
                self.errors_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644
            )
        except BaseException:
            self.close()
            raise
        self._last_sync = time.monotonic()
        return resumed

    def _read_done(self, cut: int) -> Resumed:
        """The ids of the well-formed success lines (:func:`sglfleet.records.done_of`); any other JSON
        line (an error record, an input line, a result of the wrong shape) is passed over, and its
        id sent again. A line that is not JSON is corrupt, unless it is the last one (then it is cut)."""
        done = IdSet()
        add = done.add_digest
        prompt = completion = lines = 0
        with open(self.output, "rb") as fh:
            for number, raw in enumerate(fh, start=1):
                try:
                    parsed = done_of(raw)
                except orjson.JSONDecodeError:
                    if fh.peek(1) == b"":  # the last line: written whole but garbage (e.g. power loss)
                        self._truncate_to(fh.tell() - len(raw))
                        cut += len(raw)
                        break
                    if not raw.strip():
                        continue
                    raise StoreError(
                        f"{self.output} line {number} is not an output record; the file is corrupt "
                        "(not a torn last line): move it away or repair it"
                    ) from None
                if parsed is None:
                    continue
                cid, p, c = parsed
                add(id_digest(cid))
                prompt += p
                completion += c
                lines += 1
        done.freeze()
        if done.repeated:
            raise StoreError(
                f"{self.output} holds {len(done.repeated)} custom_id(s) more than once "
                f"({self._repeated_lines(done.repeated)}): keep one result of each and rerun"
            )
        self._size = os.fstat(self._fd).st_size
        self._results = lines
        return Resumed(done, lines, prompt, completion, cut)

    def _repeated_lines(self, digests: set[int], shown: int = 3) -> str:
        """Where the results of the repeated ids are (read again only when there are some): ``id 'x'
        on lines 3 and 11``, for the first ``shown`` of them."""
        lines: dict[str, list[int]] = {}
        with open(self.output, "rb") as fh:
            for number, raw in enumerate(fh, start=1):
                try:
                    parsed = done_of(raw)
                except orjson.JSONDecodeError:
                    continue
                if parsed is not None and id_digest(parsed[0]) in digests:
                    lines.setdefault(parsed[0], []).append(number)
        found = [(cid, at) for cid, at in lines.items() if len(at) > 1][:shown]
        words = "; ".join(f"id {cid!r} on lines {', '.join(map(str, at))}" for cid, at in found)
        return words + ("; ..." if len(digests) > shown else "")

    def _truncate_to(self, size: int) -> None:
        os.ftruncate(self._fd, size)
        os.fsync(self._fd)

    @staticmethod
    def _write(fd: int, line: bytes) -> None:
        """Append ``line`` whole, or cut back what part of it got written and raise (e.g. ENOSPC)."""
        view = memoryview(line)
        n = os.write(fd, view)  # the common case: one write(2) of the whole line
        if n == len(line):
            return
        start = os.fstat(fd).st_size - n
        try:
            view = view[n:]
            while view:
                n = os.write(fd, view)
                if n <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view = view[n:]
        except OSError:
            os.ftruncate(fd, start)
            raise

    def add_result(
        self,
        custom_id: str,
        request_id: str,
        body: Any,
        raw_body: bytes | None = None,
        conversations: list[dict[str, Any]] | None = None,
    ) -> None:
        """Append the success line of ``custom_id`` (``raw_body``: the server's bytes, kept if compact)."""
        line = result_line(
            custom_id, request_id, body, raw_body, self._line_ids(), conversations=conversations
        )
        self._write(self._fd, line)
        self._size += len(line)
        self._results += 1
        self._after_write()

    def add_error(
        self, custom_id: str, code: str, message: str, status_code: int | None = None, body: Any = None
    ) -> None:
        """Append the failure line of ``custom_id`` to the errors file."""
        self._write(
            self._err_fd,
            error_line(
                custom_id, code, message, status_code=status_code, body=body, line_id=self._line_ids()
            ),
        )
        self._after_write()

    def summary(self) -> ResultsSummary | None:
        """What the manifest records of the output (None when it is not open)."""
        if self._fd < 0:
            return None
        return summarize(self._fd, self._size, self._results)

    def _after_write(self) -> None:
        self._dirty = True
        now = time.monotonic()
        if now - self._last_sync >= self.fsync_interval:
            self.sync(now)

    def sync(self, now: float | None = None) -> None:
        if self._dirty:
            for fd in (self._fd, self._err_fd):
                if fd >= 0:
                    os.fsync(fd)
            self._dirty = False
        self._last_sync = time.monotonic() if now is None else now

    def close(self) -> None:
        try:
            if self._fd >= 0 or self._err_fd >= 0:
                self._dirty = True
                self.sync()
        finally:  # the descriptors are closed even when the sync fails (a file that cannot be synced)
            for attr in ("_err_fd", "_fd"):
                fd = getattr(self, attr)
                if fd >= 0:
                    os.close(fd)  # closing the descriptor releases the flock
                    setattr(self, attr, -1)
