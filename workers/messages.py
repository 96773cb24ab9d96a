"""Chat messages as plain data (no Django, nothing of clawhub): shared by conversations (session identity,
pages) and the judge (prompts, rules), so both read a message's text the same way."""

from typing import Any

TEXT_PART_TYPES = ("text", "input_text", None)


def content_text(content: Any, *, placeholders: bool = False) -> str:
    """The text of a message's content, whether a string or a list of parts. Parts that are not text (images,
    audio) are left out, or with ``placeholders`` stand as ``[<type>]`` so a reader knows something was there.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") in TEXT_PART_TYPES:
                texts.append(str(part.get("text") or ""))
            elif isinstance(part, dict) and placeholders:
                texts.append(f"[{part.get('type')}]")
        return "\n".join(texts)
    return str(content)
