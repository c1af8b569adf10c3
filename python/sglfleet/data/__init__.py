"""Data tools: build a prompt mix that fixes a skewed set, and merge generated results into it.

- `mix`: `build_mix(config, output)`: read sources, normalise, deduplicate (exact and MinHash LSH),
  fill category quotas, write OpenAI batch lines and a report.
- `merge`: `merge(...)`: results joined with their prompts, filtered, appended to the existing set.
- `categories`: the rule-based category of a prompt; `report`: the Markdown and JSON reports.

`build_mix` and the mix config need the `mix` extra (numpy, datasketch, pyarrow); they load on first use,
so that merging works on a host without it.
"""

from typing import TYPE_CHECKING, Any

from sglfleet.data._categories import CATEGORIES, classify
from sglfleet.data._errors import DataError
from sglfleet.data._merge import DEFAULT_DROP_FINISH_REASONS, DEFAULT_MIN_COMPLETION_TOKENS, merge
from sglfleet.data._report import MergeReport, MixReport

if TYPE_CHECKING:
    from sglfleet.data._mix import build_mix
    from sglfleet.data._mixconfig import MixConfig, load_config

_LAZY = {"build_mix": "_mix", "MixConfig": "_mixconfig", "load_config": "_mixconfig"}

__all__ = [
    "CATEGORIES",
    "DEFAULT_DROP_FINISH_REASONS",
    "DEFAULT_MIN_COMPLETION_TOKENS",
    "DataError",
    "MergeReport",
    "MixConfig",
    "MixReport",
    "build_mix",
    "classify",
    "load_config",
    "merge",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"sglfleet.data.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'sglfleet.data' has no attribute {name!r}")
