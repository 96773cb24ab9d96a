"""How a turn's prompt is stored: what it adds to the prompt of an earlier turn (its base), O(n) per session.

A session of n turns that resends its history holds n prompts of up to n messages each; stored whole that is
O(n²) messages (and, for OpenClaw, a 50 KB system prompt per turn). Instead each turn keeps a reference to a
base turn (its parent: the turn whose prompt + reply it extends), how many of the base's messages it starts
with, and the messages after those as a JSON array in a text column (text, not jsonb, so the rebuilt prompt is
byte for byte the JSON the gateway forwarded: jsonb would reorder keys). The prompt token ids vLLM returned
are kept the same way, as a count shared with the base's prompt + reply ids and the rest as packed uint32.

Pure functions over plain values; capture writes, ``selectors.turn_messages`` / ``turn_prompt_token_ids``
read.
"""

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(slots=True)
class Stored:
    """One turn's stored prompt, as read from its row."""

    base_id: int | None
    messages_shared: int
    messages_added: str  # "" = a row from before this storage: its messages are in ``legacy_messages``
    legacy_messages: list | None
    ids_shared: int
    ids_added: bytes | None
    id_count: int | None
    response_ids: list[int] | None


def dumps(messages: Sequence[Any]) -> str:
    return orjson.dumps(list(messages)).decode()


def common_prefix(left: Sequence[Any], right: Sequence[Any]) -> int:
    """How many leading items of ``left`` and ``right`` are equal (as JSON: key order and types too)."""
    n = 0
    for a, b in zip(left, right, strict=False):
        if a is not b and orjson.dumps(a) != orjson.dumps(b):
            break
        n += 1
    return n


def common_id_prefix(left: Sequence[int], right: Sequence[int]) -> int:
    n = 0
    for a, b in zip(left, right, strict=False):
        if a != b:
            break
        n += 1
    return n


def pack_ids(ids: Sequence[int]) -> bytes:
    packed = array("I", ids)
    if packed.itemsize != 4:  # pragma: no cover - every platform Python supports has a 4-byte unsigned int
        raise RuntimeError("array('I') is not 32 bits here")
    return packed.tobytes()


def unpack_ids(data: bytes | memoryview | None) -> list[int]:
    if not data:
        return []
    out = array("I")
    out.frombytes(bytes(data))
    return out.tolist()


def split_messages(messages: Sequence[Any], base_messages: Sequence[Any] | None) -> tuple[int, str]:
    """(messages shared with the base's prompt, the rest as JSON text)."""
    shared = common_prefix(messages, base_messages) if base_messages else 0
    return shared, dumps(messages[shared:])


def split_ids(ids: Sequence[int] | bytes, base_ids: Sequence[int] | bytes | None) -> tuple[int, bytes]:
    """(ids shared with the base's prompt + reply ids, the rest packed). Either may be given packed."""
    packed = ids if isinstance(ids, bytes) else pack_ids(ids)
    if not base_ids:
        return 0, packed
    base = base_ids if isinstance(base_ids, bytes) else pack_ids(base_ids)
    shared = _common_bytes(packed, base) // 4
    return shared, packed[shared * 4:]


def _common_bytes(left: bytes, right: bytes) -> int:
    """Length of the common prefix of two byte strings, by bisection over slices compared in C (thousands of
    ids compared one by one in Python cost more than the rest of storing the turn)."""
    low, high = 0, min(len(left), len(right))
    if left[:high] == right[:high]:
        return high
    view_l, view_r = memoryview(left), memoryview(right)
    while low < high:  # invariant: the first ``low`` bytes agree, the first ``high`` do not
        middle = (low + high + 1) // 2
        if view_l[low:middle] == view_r[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


class Rebuilder:
    """Rebuilds prompts from stored rows, each base once (rows of one session are usually all loaded)."""

    def __init__(self, rows: Mapping[int, Stored]):
        self.rows = rows
        self._messages: dict[int, list | None] = {}
        self._ids: dict[int, list[int] | None] = {}

    def messages(self, turn_id: int) -> list | None:
        """The full prompt messages, or None when a base row it needs is missing."""
        if turn_id in self._messages:
            return self._messages[turn_id]
        # Iterative: a 1,000-turn session is a 1,000-deep chain of bases.
        chain: list[int] = []
        current: int | None = turn_id
        while current is not None and current not in self._messages:
            row = self.rows.get(current)
            if row is None:
                self._messages[current] = None
                break
            chain.append(current)
            current = row.base_id if row.messages_added and row.messages_shared else None
        for tid in reversed(chain):
            row = self.rows[tid]
            if not row.messages_added:
                self._messages[tid] = list(row.legacy_messages) if row.legacy_messages is not None else None
                continue
            added = orjson.loads(row.messages_added)
            if row.messages_shared:
                base = self._messages.get(row.base_id) if row.base_id is not None else None
                if base is None or len(base) < row.messages_shared:
                    self._messages[tid] = None
                    continue
                self._messages[tid] = base[: row.messages_shared] + added
            else:
                self._messages[tid] = added
        return self._messages.get(turn_id)

    def prompt_ids(self, turn_id: int) -> list[int] | None:
        """The prompt token ids vLLM reported, or None (not served with ids, or a base row is missing)."""
        if turn_id in self._ids:
            return self._ids[turn_id]
        chain: list[int] = []
        current: int | None = turn_id
        while current is not None and current not in self._ids:
            row = self.rows.get(current)
            if row is None or row.id_count is None:
                self._ids[current] = None
                break
            chain.append(current)
            current = row.base_id if row.ids_shared else None
        for tid in reversed(chain):
            row = self.rows[tid]
            added = unpack_ids(row.ids_added)
            if row.ids_shared:
                base_row = self.rows.get(row.base_id) if row.base_id is not None else None
                base = self._ids.get(row.base_id) if row.base_id is not None else None
                if base is None or base_row is None:
                    self._ids[tid] = None
                    continue
                context = base + list(base_row.response_ids or [])
                if len(context) < row.ids_shared:
                    self._ids[tid] = None
                    continue
                ids = context[: row.ids_shared] + added
            else:
                ids = added
            self._ids[tid] = ids if len(ids) == row.id_count else None
        return self._ids.get(turn_id)
