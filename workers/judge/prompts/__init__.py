"""The judge's prompts, versioned: a changed wording gets a new file and a new ``PROMPT_VERSION``, so every
judgment records which text produced it and old judgments stay explainable.

Templates use ``string.Template`` placeholders (``${history}``): the prompts are full of ``\\boxed{...}``,
which ``str.format`` would read as fields.
"""

from functools import cache
from pathlib import Path
from string import Template

PROMPT_VERSION = "v1"
_DIR = Path(__file__).resolve().parent


@cache
def template(kind: str, version: str = PROMPT_VERSION) -> Template:
    """The template ``<kind>_<version>.txt`` (kind: "prm" or "hint")."""
    path = _DIR / f"{kind}_{version}.txt"
    if not path.is_file():
        raise ValueError(f"no judge prompt {path.name} in {_DIR}")
    return Template(path.read_text(encoding="utf-8"))


def render(kind: str, *, history: str, tools: str, response: str, next_state: str,
           version: str = PROMPT_VERSION) -> str:
    return template(kind, version).substitute(history=history, tools=tools, response=response,
                                              next_state=next_state)
