"""Data tools: build a prompt mix that fixes a skewed set, and merge generated results into it.

- `mix`: `build_mix(config, output)`: read sources, normalise, deduplicate (exact and MinHash LSH),
  fill category quotas, write OpenAI batch lines and a report.
- `merge`: `merge(...)`: results joined with their prompts, filtered, appended to the existing set.
- `categories`: the rule-based category of a prompt; `report`: the Markdown and JSON reports.
- `CategoryCache`: the existing set's category counts by content digest (mix leaves them, merge
  reuses them); `plan_lsh`: how near duplicates are found for a threshold (permutations, bands,
  expected recall).

`build_mix` and the mix config need the `mix` extra (numpy, datasketch, pyarrow); they load on first use,
so that merging works on a host without it.
"""

from typing import TYPE_CHECKING

from sglfleet._lazy import attach

# The public names, each written once: a name's submodule is imported when the name is first used
# (sglfleet._lazy reads this block; type checkers and readers see plain imports).
if TYPE_CHECKING:
    from sglfleet.data._adapters import Format, RowError, to_messages, user_text
    from sglfleet.data._categories import CATEGORIES, classify
    from sglfleet.data._dedupe import LshPlan, NearDeduper, plan_lsh
    from sglfleet.data._defaults import DEFAULT_DROP_FINISH_REASONS, DEFAULT_MIN_COMPLETION_TOKENS
    from sglfleet.data._errors import DataError
    from sglfleet.data._existing import CategoryCache, cache_dir
    from sglfleet.data._inputs import input_record
    from sglfleet.data._inputs import unchanged as inputs_unchanged
    from sglfleet.data._merge import merge, prompts_of
    from sglfleet.data._mix import build_mix, custom_id
    from sglfleet.data._mixconfig import MixConfig, load_config, parse_config
    from sglfleet.data._report import MergeReport, MixReport
    from sglfleet.data._sources import SourceType, read_rows

__getattr__, __dir__, __all__ = attach(__name__, __file__)
