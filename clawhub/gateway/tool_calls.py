"""Calls only to declared tools: whatever the model wrote, a /v1 chat reply never carries a call to a tool the
request did not declare in ``tools``.

A small model (or a tool parser reading its text) can produce a call to a tool nobody offered (``calculator``,
``get_weather``); an agent then fails the turn or runs something it never meant to expose. Such a call is
taken out of ``tool_calls`` and given back as text, the way the model wrote it in the Hermes convention
(``<tool_call>{"name": …, "arguments": …}</tool_call>``), so the reply still says what the model meant. The
calls kept are renumbered 0, 1, … (clients join streamed calls by index), and a choice left without calls
finishes with ``stop`` instead of ``tool_calls``.

    declared = declared_tools(request_body)           # None: nothing to police (not a chat request)
    filter_message(choice["message"], choice, declared)  # a JSON reply, each choice
    stream = ToolCallStream(declared); stream.filter(choice)  # each streamed chunk's choices
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


def declared_tools(body: dict) -> frozenset[str] | None:
    """The function names ``body`` declares (an empty set if none) for a chat request; None otherwise."""
    if "messages" not in body:
        return None
    tools = body.get("tools")
    names = set()
    for tool in tools if isinstance(tools, list) else ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return frozenset(names)


def as_text(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {arguments or "{}"}}}\n</tool_call>'


def _name(call: dict) -> str | None:
    function = call.get("function")
    return function.get("name") if isinstance(function, dict) else None


def filter_message(message: dict, choice: dict, declared: frozenset[str]) -> None:
    """A whole reply's message (and its choice's finish_reason), changed in place."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        return
    kept = [call for call in calls if isinstance(call, dict) and _name(call) in declared]
    dropped = [call for call in calls if isinstance(call, dict) and _name(call) not in declared]
    if len(kept) == len(calls):
        return
    texts = [as_text(str(_name(call) or ""), str((call.get("function") or {}).get("arguments") or ""))
             for call in dropped]
    message["content"] = "\n".join([text for text in (message.get("content"), *texts) if text])
    if kept:
        message["tool_calls"] = kept
    else:
        message.pop("tool_calls", None)
        if choice.get("finish_reason") == "tool_calls":
            choice["finish_reason"] = "stop"


@dataclass
class _Dropped:
    name: str
    arguments: list[str] = field(default_factory=list)


@dataclass
class _ChoiceCalls:
    kept: dict[int, int] = field(default_factory=dict)  # the upstream's index -> the index the client sees
    dropped: dict[int, _Dropped] = field(default_factory=dict)


class ToolCallStream:
    """The same rule over a stream: a call's first delta names its tool; an undeclared call's deltas are held
    back and given as text content when its choice finishes."""

    def __init__(self, declared: frozenset[str]):
        self.declared = declared
        self.choices: dict[int, _ChoiceCalls] = {}

    def filter(self, choice: dict) -> None:
        """One streamed choice, changed in place."""
        delta = choice.get("delta")
        calls = delta.get("tool_calls") if isinstance(delta, dict) else None
        if not calls and choice.get("finish_reason") is None:
            return  # most chunks: a delta of text, nothing to hold back or give out
        state = self.choices.setdefault(choice.get("index") or 0, _ChoiceCalls())
        if isinstance(calls, list) and calls:
            passed = []
            for call in calls:
                if not isinstance(call, dict):
                    continue
                index = call.get("index") or 0
                if index not in state.kept and index not in state.dropped:
                    name = _name(call)
                    if name in self.declared:
                        state.kept[index] = len(state.kept)
                    else:
                        state.dropped[index] = _Dropped(str(name or ""))
                if index in state.kept:
                    passed.append({**call, "index": state.kept[index]})
                else:
                    arguments = (call.get("function") or {}).get("arguments")
                    if isinstance(arguments, str):
                        state.dropped[index].arguments.append(arguments)
            if passed:
                delta["tool_calls"] = passed
            else:
                delta.pop("tool_calls", None)
        if choice.get("finish_reason") is not None and state.dropped:
            text = "\n".join(as_text(d.name, "".join(d.arguments)) for d in state.dropped.values())
            delta = choice.setdefault("delta", {})
            delta["content"] = f"{delta.get('content') or ''}\n{text}" if delta.get("content") else text
            state.dropped.clear()
            if not state.kept and choice["finish_reason"] == "tool_calls":
                choice["finish_reason"] = "stop"
