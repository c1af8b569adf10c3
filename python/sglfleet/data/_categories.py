"""A rule-based prompt classifier: code, math, reasoning, multilingual, writing or chat.

Cheap on purpose (it runs over a million-row training set): it looks at the first few thousand
characters of what the user asked and scores keyword and pattern hits per category. The rules are
heuristics, good for telling a 77%-code set from a balanced one, not a benchmark-grade labeller.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CATEGORIES", "classify"]

CATEGORIES: tuple[str, ...] = ("code", "math", "reasoning", "multilingual", "writing", "chat")
CHAT = "chat"

_HEAD = 2000  # characters of a prompt that the rules look at


@dataclass(frozen=True)
class Rule:
    """Hits of one kind add `weight` each (up to 3 hits count): words (whole tokens of the lower-cased
    text), phrases (substrings of it), and a regex that runs only when one of the `gate` substrings is
    in the text and one of the `gate_words` among its tokens (the cheap checks first)."""

    category: str
    weight: int
    words: frozenset[str] = frozenset()
    phrases: tuple[str, ...] = ()
    pattern: re.Pattern[str] | None = None
    gate: tuple[str, ...] = ()
    gate_words: frozenset[str] = frozenset()


def _w(text: str) -> frozenset[str]:
    return frozenset(text.split())


_RULES: tuple[Rule, ...] = (
    Rule("code", 3, pattern=re.compile(r"```|^\s{4}\S.*[;{}()]\s*$", re.M), gate=("```", "    ")),
    Rule(
        "code",
        2,
        _w(
            "python javascript typescript java golang rust sql bash kotlin swift php ruby html css haskell "
            "scala perl powershell numpy pandas react django c++ c# node.js"
        ),
        pattern=re.compile(r"\bin Go\b"),
        gate=(" Go",),
    ),
    Rule(
        "code",
        1,
        _w(
            "function functions method methods class classes compile compiler debug bug bugs stacktrace "
            "exception exceptions refactor algorithm recursion array git docker kubernetes regex api json "
            "yaml code program script implement variable variables loop loops segfault string"
        ),
        ("stack trace", "unit test", "binary search", "linked list", "null pointer", "runtime error"),
    ),
    Rule(
        "code",
        2,
        _w("def lambda printf"),
        ("()", "=>", "::", "#include", "console.log", "public static"),
    ),
    Rule(
        "math",
        3,
        pattern=re.compile(r"\\(frac|sum|int|sqrt|cdot|alpha|beta|pi|theta)\b|\$[^$\n]+\$"),
        gate=("\\", "$"),
    ),
    Rule("math", 3, pattern=re.compile(r"\d+(\.\d+)?\s*[-+*/^\u00d7\u00f7=]\s*\d+")),
    Rule("math", 1, pattern=re.compile(r"\d+(?:\.\d+)?")),
    Rule(
        "math",
        1,
        _w(
            "solve equation equations integral derivative probability theorem prove proof calculate compute "
            "polynomial matrix vector prime factor fraction percent percentage geometry triangle algebra "
            "arithmetic remainder divisible"
        ),
        ("sum of", "how many", "how much"),
    ),
    Rule(
        "reasoning",
        2,
        _w("puzzle riddle deduce syllogism"),
        ("step by step", "step-by-step", "which of the following", "true or false", "lateral thinking"),
    ),
    Rule(
        "reasoning",
        1,
        _w("reason reasoning logic logical infer implies assume conclude argument premise")
        | _w("hypothesis hypotheses"),
        ("explain why", "why does", "why do ", "why is", "why are", "why would", "what would happen"),
        re.compile(r"\bif\b.{1,60}\bthen\b", re.I),
        gate_words=_w("then"),
    ),
    Rule(
        "writing",
        3,
        pattern=re.compile(
            r"\b(write|draft|compose|rewrite|paraphrase|summari[sz]e|translate)\b.{0,40}\b(story|poem|essay|"
            r"email|letter|article|blog|speech|song|lyrics|haiku|summary|paragraph|cover letter|tweet)\b",
            re.I,
        ),
        gate_words=_w("story poem essay email letter article blog speech song lyrics haiku summary paragraph")
        | _w("tweet"),
    ),
    Rule("writing", 1, _w("story poem essay novel fiction character plot tone persuasive")),
)

_MIN_SCORE = {"code": 2, "math": 3, "reasoning": 2, "writing": 3}
_DIGIT = re.compile(r"\d")
_STRIP = ".,;:!?()[]{}<>\"'`*/\\|=~^&%$@-_"  # stripped from the ends of tokens (c++, c#, node.js stay whole)
_WORD_RULES: dict[str, tuple[int, ...]] = {}
for _i, _rule in enumerate(_RULES):
    for _word in _rule.words:
        _WORD_RULES[_word] = (*_WORD_RULES.get(_word, ()), _i)

# A phrase is counted only when its first word is among the tokens (None: a symbol, always counted).
_PHRASES: tuple[tuple[int, str, str | None], ...] = tuple(
    (i, p, p.split()[0] if p.replace(" ", "").replace("-", "").isalpha() else None)
    for i, rule in enumerate(_RULES)
    for p in rule.phrases
)
_PATTERNS: tuple[tuple[int, Rule], ...] = tuple((i, r) for i, r in enumerate(_RULES) if r.pattern is not None)


def tokens(lower: str) -> list[str]:
    """The words of a lower-cased text, punctuation stripped from their ends."""
    return [t for t in (w.strip(_STRIP) for w in lower.split()) if t]


# Words that mark a Latin-script prompt as not English.
_FOREIGN_WORDS = """
el la los las que por para con una est les des une dans pour avec der die das und nicht ist mit ein eine
dem den och att det är som på het een niet van wat zijn não uma com você della degli sono questo perché
cómo qué está también pero muy de del y es en os são em minha como posso mais muito kan ik als veel heb
hoe jak się nie sind von zu auf für wie ich wir je nous vous qui où très il per che non gli più di da
"""
_ENGLISH_WORDS = "the and is are of to in that it for you with on this what how"
_FOREIGN = frozenset(_FOREIGN_WORDS.split())
_ENGLISH = frozenset(_ENGLISH_WORDS.split())


_LETTER = re.compile(r"[^\W\d_]")
_NON_LATIN = re.compile(r"[^\W\d_\u0000-\u024f]")  # letters past Latin Extended-B: other scripts


def is_multilingual(text: str, words: list[str] | None = None) -> bool:
    """Mostly non-Latin letters, or Latin-script words that are mostly not English.

    `words`: the lower-cased tokens of `text` when the caller has them already.
    """
    if not text.isascii():
        letters = len(_LETTER.findall(text))
        if letters and len(_NON_LATIN.findall(text)) / letters > 0.3:
            return True
    if words is None:
        words = tokens(text.lower())
    if len(words) < 4:
        return False
    foreign = sum(map(_FOREIGN.__contains__, words))
    if foreign < 2:
        return False
    return foreign > 2 * sum(map(_ENGLISH.__contains__, words))


def classify(text: str) -> str:
    """The category of a prompt (the user text): the best-scoring rule set, `chat` when none fires.

    A rule's hits count up to 3; a category needs its minimum score; the highest score wins.
    """
    head = text[:_HEAD]
    lower = head.lower()
    words = tokens(lower)
    if is_multilingual(head, words):
        return "multilingual"
    present = set(words)
    hits = [0] * len(_RULES)
    for word in words:
        for i in _WORD_RULES.get(word, ()):
            hits[i] += 1
    for i, phrase, key in _PHRASES:
        if key is None or key in present:
            hits[i] += lower.count(phrase)
    has_digit = _DIGIT.search(head) is not None
    for i, rule in _PATTERNS:
        if hits[i] >= 3:
            continue
        if rule.gate and not any(g in head for g in rule.gate):
            continue
        if rule.gate_words and rule.gate_words.isdisjoint(present):
            continue
        if rule.category == "math" and not has_digit:
            continue
        hits[i] += len(rule.pattern.findall(head))  # type: ignore[union-attr]
    scores: dict[str, int] = {}
    for i, count in enumerate(hits):
        if count:
            rule = _RULES[i]
            scores[rule.category] = scores.get(rule.category, 0) + rule.weight * min(count, 3)
    best, best_score = CHAT, 0
    for category, score in scores.items():
        if score >= _MIN_SCORE[category] and score > best_score:
            best, best_score = category, score
    return best
