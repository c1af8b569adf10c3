"""The one error type of the data phase (mix, merge): it says what is wrong and where."""

from __future__ import annotations


class DataError(Exception):
    """Bad configuration or bad input data; the message names the file, source, row or field."""
