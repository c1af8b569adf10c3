"""The data phase's default settings, in a module that imports nothing: `sglfleet merge --help` shows
them without loading the merge itself (its process pool, the classifier)."""

from __future__ import annotations

# A block-16 drafter needs at least block + 1 supervised tokens: shorter answers are dropped.
DEFAULT_MIN_COMPLETION_TOKENS = 17
# Answers cut by max_tokens are dropped (a drafter learns no ending from them).
DEFAULT_DROP_FINISH_REASONS = ("length",)
