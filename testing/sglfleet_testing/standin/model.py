"""The deterministic "model": same prompt and seed in, same completion out.

A completion is a stream of vocabulary words drawn from a RNG seeded by (server seed, request
seed, prompt). The model "emits EOS" after a natural length drawn from the same RNG, so a longer
`max_new_tokens` extends a shorter completion's text instead of changing it. Stop strings and
stop token ids end it early the way SGLang does: the text is cut before the stop string and
`completion_tokens` counts up to the token that completed it, so
`count_tokens(text + matched) == completion_tokens`; otherwise `count_tokens(text) == completion_tokens`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Sequence
from typing import Any

from sglfleet_testing.standin.tokenizer import EOS_TOKEN_ID, VOCAB, token_ids

assert len(VOCAB) == 256


@dataclasses.dataclass(frozen=True)
class Completion:
    text: str
    output_ids: list[int]
    completion_tokens: int
    finish_reason: dict[str, Any]  # SGLang's meta_info.finish_reason: {"type", "matched"|"length"}

    @property
    def finish_type(self) -> str:
        return self.finish_reason["type"]

    @property
    def matched(self) -> str | int | None:
        return self.finish_reason.get("matched")


@dataclasses.dataclass(frozen=True)
class DeterministicModel:
    seed: int = 0
    natural_tokens: tuple[int, int] = (16, 256)

    def _rng(self, prompt: str, request_seed: int | None) -> random.Random:
        key = f"{self.seed}\x00{request_seed}\x00{prompt}".encode()
        return random.Random(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little"))

    def complete(
        self,
        prompt: str,
        *,
        max_new_tokens: int,
        stop: Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        request_seed: int | None = None,
    ) -> Completion:
        """Generate at most `max_new_tokens` tokens for `prompt`."""
        rng = self._rng(prompt, request_seed)
        natural = rng.randint(*self.natural_tokens)
        count = max_new_tokens if ignore_eos else min(natural, max_new_tokens)
        # One byte per word (VOCAB has exactly 256); whole 32-bit draws keep shorter budgets prefixes.
        words = [VOCAB[i] for i in rng.randbytes(-(-count // 4) * 4)[:count]]
        ids = token_ids(words)
        if stop_token_ids:
            stops = set(stop_token_ids)
            for index, token_id in enumerate(ids):
                if token_id in stops:
                    # The matched stop token is generated but not shown in the text.
                    return Completion(
                        " ".join(words[:index]),
                        ids[: index + 1],
                        index + 1,
                        {"type": "stop", "matched": token_id},
                    )
        text = " ".join(words)
        if stop:
            best: tuple[int, int, str] | None = None  # (end, start, stop string)
            for string in stop:
                if not string:
                    continue
                start = text.find(string)
                if start >= 0 and (best is None or start + len(string) < best[0]):
                    best = (start + len(string), start, string)
            if best is not None:
                end, start, string = best
                tokens = text.count(" ", 0, end) + 1
                return Completion(text[:start], ids[:tokens], tokens, {"type": "stop", "matched": string})
        if count < max_new_tokens:
            return Completion(text, ids, count, {"type": "stop", "matched": EOS_TOKEN_ID})
        return Completion(text, ids, count, {"type": "length", "length": count})
