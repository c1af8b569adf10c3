"""A rule-based prompt classifier: code, math, reasoning, multilingual, writing or chat.

Cheap on purpose (it runs over a million-row training set): it looks at the first few thousand
characters of what the user asked and scores keyword and pattern hits per category. The rules are
heuristics, good for telling a 77%-code set from a balanced one, not a benchmark-grade labeller.
"""

from __future__ import annotations

import re

CATEGORIES: tuple[str, ...] = ("code", "math", "reasoning", "multilingual", "writing", "chat")
CHAT = "chat"

_HEAD = 4000  # characters of a prompt that the rules look at

_RULES: dict[str, tuple[tuple[re.Pattern[str], int], ...]] = {
    "code": (
        (re.compile(r"```|^\s{4}\S.*[;{}()]\s*$", re.M), 3),
        (
            re.compile(
                r"\b(python|javascript|typescript|java|golang|rust|sql|bash|kotlin|swift|php|ruby|html|css|"
                r"haskell|scala|perl|powershell|numpy|pandas|react|django|node\.js)\b|(?<!\w)(c\+\+|c#)(?!\w)|"
                r"\bin Go\b",
                re.I,
            ),
            2,
        ),
        (
            re.compile(
                r"\b(functions?|methods?|class(es)?|compiler?|debug|bugs?|stack ?trace|exceptions?|refactor|"
                r"unit tests?|algorithm|binary search|recursion|array|linked list|git|docker|kubernetes|"
                r"regex|api|json|yaml|code|program|script|implement|null pointer|variables?|loops?|"
                r"segfault|runtime error|string)\b",
                re.I,
            ),
            1,
        ),
        (
            re.compile(
                r"\b(def|return|import|public static|#include|console\.log|printf|lambda)\b|=>|::|\w+\(\)"
            ),
            2,
        ),
    ),
    "math": (
        (re.compile(r"\\(frac|sum|int|sqrt|cdot|alpha|beta|pi|theta)\b|\$[^$\n]+\$"), 3),
        (re.compile(r"\b\d+(\.\d+)?\s*[-+*/^\u00d7\u00f7=]\s*\d+", re.I), 3),
        (re.compile(r"\b\d+(\.\d+)?\b"), 1),
        (
            re.compile(
                r"\b(solve|equation|integral|derivative|probability|theorem|prove|proof|calculate|compute|"
                r"polynomial|matrix|vector|prime|factor|fraction|percent(age)?|geometry|triangle|"
                r"algebra|arithmetic|sum of|how many|how much|remainder|divisible)\b",
                re.I,
            ),
            1,
        ),
    ),
    "reasoning": (
        (
            re.compile(
                r"\b(step[- ]by[- ]step|puzzle|riddle|deduce|which of the following|true or false|"
                r"syllogism|logic puzzle|lateral thinking)\b",
                re.I,
            ),
            2,
        ),
        (
            re.compile(
                r"\b(reason(ing)?|logic(al)?|infer|implies|explain why|why (does|do|is|are|would)|"
                r"what would happen|if .{1,60} then|assume|conclude|argument|premise|hypothes[ie]s)\b",
                re.I,
            ),
            1,
        ),
    ),
    "writing": (
        (
            re.compile(
                r"\b(write|draft|compose|rewrite|paraphrase|summari[sz]e|translate)\b.{0,40}\b(story|poem|essay|"
                r"email|letter|article|blog|speech|song|lyrics|haiku|summary|paragraph|cover letter|tweet)\b",
                re.I,
            ),
            3,
        ),
        (re.compile(r"\b(story|poem|essay|novel|fiction|character|plot|tone|persuasive)\b", re.I), 1),
    ),
}

_MIN_SCORE = {"code": 2, "math": 3, "reasoning": 2, "writing": 3}

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
_WORD = re.compile(r"[^\W\d_]+")


def is_multilingual(text: str) -> bool:
    """Mostly non-Latin letters, or Latin-script words that are mostly not English."""
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return False
    non_ascii = sum(1 for c in letters if ord(c) > 0x24F)  # past Latin Extended-B: other scripts
    if non_ascii / len(letters) > 0.3:
        return True
    words = [w.lower() for w in _WORD.findall(text)]
    if len(words) < 4:
        return False
    foreign = sum(1 for w in words if w in _FOREIGN)
    english = sum(1 for w in words if w in _ENGLISH)
    return foreign >= 2 and foreign > 2 * english


def classify(text: str) -> str:
    """The category of a prompt (the user text): the best-scoring rule set, `chat` when none fires."""
    head = text[:_HEAD]
    if is_multilingual(head):
        return "multilingual"
    best, best_score = CHAT, 0
    for category, rules in _RULES.items():
        score = sum(weight * min(len(pattern.findall(head)), 3) for pattern, weight in rules)
        if score >= _MIN_SCORE[category] and score > best_score:
            best, best_score = category, score
    return best
