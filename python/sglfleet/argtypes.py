"""Argument types: how a setting's text on a command line becomes its value, or an
:class:`argparse.ArgumentTypeError` naming what is wrong (argparse prefixes the option).

Shared by the command line (:mod:`sglfleet.cli`) and the settings models that declare their own
arguments (:mod:`sglfleet.gen._config`), which sit below the CLI and must not import it.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

__all__ = ["finite_float", "json_object", "non_negative_float", "port", "positive_float"]


def finite_float(text: str) -> float:
    """A number argument that must be finite (argparse's `float` takes "nan", "inf", "-inf")."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def positive_float(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def non_negative_float(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not 0 or more")
    return value


def port(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (0-65535; 0: any free one)")
    return value


def json_object(text: str) -> dict[str, Any]:
    """A JSON object (NaN and Infinity, which JSON lacks, refused)."""
    try:
        value = json.loads(text, parse_constant=_not_finite)
    except (json.JSONDecodeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def _not_finite(text: str) -> float:
    raise ValueError(f"{text} is not a finite number")
