"""The stand-in's tokenizer: whitespace-separated words cut into pieces of at most 8 characters.

`count_tokens(text)` is what `usage.prompt_tokens` and `completion_tokens` are measured with, so a
client can check the server's arithmetic: the model only ever emits words from `VOCAB` (4 letters,
one token each) joined by single spaces, so re-tokenizing a completion gives its token count.
"""

from __future__ import annotations

PIECE_CHARS = 8
EOS_TOKEN_ID = 2
VOCAB_OFFSET = 1000

_SYLLABLES = ("ba", "de", "fi", "go", "ku", "la", "me", "ni", "po", "ru", "sa", "te", "vi", "wo", "xu", "zy")
VOCAB: tuple[str, ...] = tuple(a + b for a in _SYLLABLES for b in _SYLLABLES)
_WORD_IDS = {word: VOCAB_OFFSET + i for i, word in enumerate(VOCAB)}


def count_tokens(text: str) -> int:
    """Number of tokens in `text`: each word counts one token per started 8 characters."""
    return sum((len(word) + PIECE_CHARS - 1) // PIECE_CHARS for word in text.split())


def token_ids(words: list[str]) -> list[int]:
    """Ids of vocabulary words (what `/generate` reports as `output_ids`)."""
    return [_WORD_IDS[word] for word in words]


def word_of(token_id: int) -> str:
    """The vocabulary word of an id, or a placeholder piece for any other id (for `input_ids`)."""
    index = token_id - VOCAB_OFFSET
    return VOCAB[index] if 0 <= index < len(VOCAB) else f"t{token_id % 10_000_000}"
