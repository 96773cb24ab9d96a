"""Reading judge outputs: the verdict in ``\\boxed{...}``, the majority of several votes, and hints.

Judge models write free text around the verdict, reason before it, and sometimes box intermediate numbers, so
the verdict is the LAST box whose content is a signed integer. LaTeX decorations inside the box
(``\\boxed{\\text{1}}``, ``\\boxed{ +1 }``, ``\\boxed{{-1}}``) are tolerated.
"""

import re
from collections import Counter
from collections.abc import Iterable

VALID_SCORES = (-1, 0, 1)
HINT_START = "[HINT_START]"
HINT_END = "[HINT_END]"
# A shorter "hint" is almost always a fragment ("Be nicer.") that would only add noise to distillation.
MIN_HINT_CHARS = 10

_BOX = re.compile(r"\\boxed\s*\{")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_SIGNED_INT = re.compile(r"[+-]?\d+")


def _box_contents(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}`` with balanced braces, in order. An unclosed box is ignored."""
    contents = []
    for match in _BOX.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    contents.append(text[start:i])
                    break
    return contents


def _as_int(content: str) -> int | None:
    bare = _LATEX_COMMAND.sub("", content)
    bare = re.sub(r"[\s{}$]", "", bare)
    return int(bare) if _SIGNED_INT.fullmatch(bare) else None


def boxed_score(text: str | None) -> int | None:
    """The signed integer in the last ``\\boxed{}`` that holds one, or None when no box does."""
    if not text:
        return None
    for content in reversed(_box_contents(text)):
        value = _as_int(content)
        if value is not None:
            return value
    return None


def majority_vote(scores: Iterable[int | None]) -> int:
    """The most common valid score (-1, 0 or 1). No valid vote, or a tie at the top, gives 0: the judge could
    not make up its mind, and 0 keeps the turn out of the binary reward."""
    counts = Counter(s for s in scores if s in VALID_SCORES)
    if not counts:
        return 0
    ranked = counts.most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return 0
    return ranked[0][0]


def extract_hint(text: str | None) -> str | None:
    """The text between the last ``[HINT_START]`` and the ``[HINT_END]`` after it, stripped; None when the
    markers are missing or the hint is not longer than ``MIN_HINT_CHARS`` characters."""
    if not text:
        return None
    start = text.rfind(HINT_START)
    if start < 0:
        return None
    start += len(HINT_START)
    end = text.find(HINT_END, start)
    if end < 0:
        return None
    hint = text[start:end].strip()
    return hint if len(hint) > MIN_HINT_CHARS else None
