"""A turn's messages rendered for a judge's prompt: history, tools, reply and next state as plain text, within
a judge model's context (``judges.prompt_fields`` puts them together)."""

from __future__ import annotations

from typing import Any

from workers.messages import content_text

# Judge models have a context limit too. Long tool outputs are cut in the middle (their start and end say the
# most), and the oldest messages go first when the history is over budget: the reply and its next state
# matter most.
MAX_MESSAGE_CHARS = 4000
MAX_HISTORY_CHARS = 16000


def _clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def render_message(message: dict[str, Any]) -> str:
    role = str(message.get("role") or "unknown")
    label = f"[{role}" + (f" {message['name']}" if message.get("name") else "") + "]"
    lines = [label]
    text = content_text(message.get("content"), placeholders=True).strip()
    if text:
        lines.append(_clip(text))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        lines.append(f"-> calls {function.get('name')}({_clip(str(function.get('arguments') or ''), 1000)})")
    return "\n".join(lines)


def render_history(messages: list[dict[str, Any]]) -> str:
    rendered = [render_message(m) for m in messages]
    kept: list[str] = []
    used = 0
    for text in reversed(rendered):
        if kept and used + len(text) > MAX_HISTORY_CHARS:
            kept.append(f"[... {len(rendered) - len(kept)} earlier messages left out ...]")
            break
        kept.append(text)
        used += len(text)
    return "\n\n".join(reversed(kept)) or "(empty)"


def render_tools(tools: list[dict[str, Any]]) -> str:
    names = []
    for tool in tools or []:
        function = tool.get("function") or tool
        description = str(function.get("description") or "").strip().splitlines()
        names.append(f"- {function.get('name')}" + (f": {description[0][:200]}" if description else ""))
    return "\n".join(names) or "(none)"
