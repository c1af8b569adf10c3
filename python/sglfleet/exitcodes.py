"""The exit codes of `sglfleet mix`, `sglfleet merge` and `sglfleet generate`: one scheme for all three.

Every code but 0, 2 and 3 leaves the work resumable by rerunning the same command (generate resumes
where it stopped; mix and merge write nothing until they succeed). docs/exit-codes.md is the table a
user reads; tests/unit/package/test_exit_codes.py pins each code.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0  # done: every request has its result / the output is written
    FATAL = 1  # the run could not go on (an error while writing, a missing extra, ...)
    BAD_INPUT = 2  # bad input or arguments, found before anything was sent or written
    FAILURES = 3  # generate: done, but some requests failed permanently (see OUT.errors.jsonl)
    AUTH = 4  # generate: 401/403, the API key is wrong or missing; rerun once it is fixed
    NO_ENDPOINT = 5  # generate: no endpoint answers (at the start, or for --down-timeout)
    INPUT_CHANGED = 6  # generate: the input is not what the output's manifest (or this run) validated
    DISK_FULL = 7  # no space left for an output; nothing half-written
    INTERRUPTED = 130  # SIGINT/SIGTERM
