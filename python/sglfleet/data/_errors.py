"""The one error type of the data phase (mix, merge): it says what is wrong and where."""

from __future__ import annotations

from sglfleet.exitcodes import ExitCode

__all__ = ["DataError"]


class DataError(Exception):
    """Bad configuration or bad input data; the message names the file, source, row or field.

    ``code``: the exit code it ends `sglfleet mix` / `sglfleet merge` with (docs/exit-codes.md): bad
    input (2) unless said otherwise (a full disk while writing: 7; another write error: 1)."""

    def __init__(self, message: str, code: ExitCode = ExitCode.BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code
