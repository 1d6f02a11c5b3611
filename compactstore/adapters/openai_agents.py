"""An OpenAI Agents SDK session whose items are events in a compactstore session.

    from agents import Agent, Runner
    from compactstore.adapters.openai_agents import CompactStoreSession

    result = await Runner.run(agent, "hi", session=CompactStoreSession("chat-42", "agent.db"))

How a session maps onto the log:

- SDK session ``session_id`` is the compactstore session ``"openai-agents:" +
  session_id`` (``"openai-agents:#" +`` the hex BLAKE3 of the id when that is not a
  valid session name, or the id starts with ``#``).
- Every item is one event. A ``function_call`` (and the other tool calls that have an
  output item: custom, computer, local shell) is a ``ToolCall`` whose ``call_id`` its
  output item, a ``ToolResult`` holding the ``output``, closes; every other item is a
  ``Turn`` whose ``role`` is the item's role (or its type) and whose ``content`` is its
  text. The rest of the item is kept in ``meta["item"]`` (after the JSON round trip
  ``SQLiteSession`` gives it too), so it comes back exactly. Compaction sees which
  calls are still open, and markers and resume work on a conversation as on any
  session.
- ``pop_item`` and ``clear_session`` redact: the items read as gone, the tree still
  verifies, and ``Store.verify`` counts the erased positions.

``get_items``, ``add_items``, ``pop_item`` and ``clear_session`` behave as the SDK's
``SQLiteSession`` does (the same limits, ``session_settings`` included, and order); they
run the store's calls in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

from agents.memory.session_settings import SessionSettings, resolve_session_limit

from .. import events as ev
from ..errors import InvalidEvent
from ..store import Record, Session, Store
from .tail import RETRIES, StoreUser, Tail, read_many, session_name

__all__ = ["CompactStoreSession", "PREFIX"]

#: Every SDK session's compactstore session name starts with this.
PREFIX = "openai-agents:"
#: Item types that call a tool, with the type of the item that carries the call's output.
CALLS = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "computer_call": "computer_call_output",
    "local_shell_call": "local_shell_call_output",
}
OUTPUTS = frozenset(CALLS.values())
#: Item fields an event may carry in its own field rather than in ``meta["item"]``.
MOVABLE = frozenset({"content", "output"})

Item = dict[str, Any]


class _Items(Tail):
    """The live item positions of one session, in order."""

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self.items: list[int] = []

    def apply(self, record: Record) -> None:
        meta = record.event.meta
        if isinstance(meta, dict) and "item" in meta:
            self.items.append(record.pos)

    def forget(self, positions: Sequence[int]) -> None:
        gone = set(positions)
        if gone:
            self.items = [p for p in self.items if p not in gone]


def event_of(item: Item) -> ev.Event:
    """Return the event that stores ``item``: a tool call, its result, or a turn.

    The item goes into ``meta["item"]``, less a field the event carries itself (a turn's
    text ``content``, a result's ``output``), which ``meta["moved"]`` names; so nothing
    is stored twice, and :func:`item_of` puts the item back together exactly.
    """
    return _event_of(item, owned=False)


def _event_of(item: Item, *, owned: bool) -> ev.Event:
    """Return :func:`event_of` of ``item``; ``owned``: no one else holds it, so it may go into the event as it is."""
    kind = item.get("type")
    call_id = item.get("call_id")
    if isinstance(call_id, str) and call_id:
        if kind in CALLS:
            name = item.get("name")
            return ev.ToolCall(call_id=call_id, name=name if isinstance(name, str) and name else str(kind),
                               meta={"item": item})
        if kind in OUTPUTS:
            if "output" not in item:
                return ev.ToolResult(call_id=call_id, meta={"item": item})
            output = item["output"]
            return ev.ToolResult(call_id=call_id, output=output, meta=_moved(item, "output", owned))
    role = item.get("role")
    role = role if isinstance(role, str) and role else kind if isinstance(kind, str) and kind else "item"
    content = item.get("content")
    if isinstance(content, str):
        return ev.Turn(role=role, content=content, meta=_moved(item, "content", owned))
    return ev.Turn(role=role, content=_text(item), meta={"item": item})


def item_of(event: ev.Event) -> Item | None:
    """Return the item ``event`` stores (None when it stores none, or was redacted)."""
    meta = event.meta
    item = meta.get("item") if isinstance(meta, dict) else None
    if not isinstance(item, dict):
        return None
    moved = meta.get("moved") if isinstance(meta, dict) else None
    if not moved:
        return item
    out = dict(item)
    for name in moved:
        if name in MOVABLE:
            out[name] = getattr(event, name)
    return out


def _moved(item: Item, name: str, owned: bool) -> dict[str, Any]:
    if owned:  # a private copy: drop the field rather than copy the rest
        del item[name]
        return {"item": item, "moved": [name]}
    return {"item": {k: v for k, v in item.items() if k != name}, "moved": [name]}


def _text(item: Item) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                text = part.get("text") or part.get("refusal")
                parts.append(text if isinstance(text, str) else f"[{part.get('type', 'part')}]")
        return "\n".join(parts)
    return ""


class CompactStoreSession(StoreUser):
    """An OpenAI Agents SDK ``Session`` kept as a tamper-evident compactstore session.

    Args:
        session_id: the SDK's session id.
        store: an open :class:`compactstore.Store`, or a target to open (a SQLite path,
            ``":memory:"`` or a ``postgresql://`` URL); a store opened here is closed by
            :meth:`close`.
        session_settings: the default ``limit`` of :meth:`get_items`, as for the SDK's sessions.
        prefix: the start of the compactstore session's name.
    """

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str,
        store: Store | str,
        *,
        session_settings: SessionSettings | None = None,
        prefix: str = PREFIX,
    ) -> None:
        self.session_id = session_id
        self.session_settings = session_settings if session_settings is not None else SessionSettings()
        self._use(store)
        #: the compactstore session holding the items: compact, mark and resume it like any other
        self.log: Session = self.store.session(session_name(prefix, str(session_id)))
        self._items = _Items(self.log)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the store if this session opened it, without blocking the event loop.

        Calls still running in worker threads (those of a cancelled ``await``) finish
        first; any they start after raise :class:`~compactstore.errors.StoreClosed`.
        """
        await asyncio.to_thread(self.close)

    async def get_items(self, limit: int | None = None) -> list[Item]:
        """Return the session's items, oldest first: all of them, or the latest ``limit``.

        ``limit`` None falls back to ``session_settings.limit``; 0 gives none and a
        negative limit all, as in ``SQLiteSession``.
        """
        return await asyncio.to_thread(self._get, resolve_session_limit(limit, self.session_settings))

    def _get(self, limit: int | None) -> list[Item]:
        index = self._items
        with index.lock:
            for _ in range(RETRIES):
                index.refresh()
                positions = index.items if limit is None or limit < 0 else index.items[-limit:] if limit else []
                records = read_many(self.log, positions)
                items = [_item_of(records.get(p)) for p in positions]
                if all(i is not None for i in items):
                    return [i for i in items if i is not None]
            # Still racing another process's redactions: return what is there.
            return [i for i in items if i is not None]

    async def add_items(self, items: list[Item]) -> None:
        """Append ``items`` in one transaction, in order.

        Raises:
            InvalidEvent: an item is not JSON (or holds NaN); nothing is written.
        """
        if not items:
            return
        # What SQLiteSession's JSON round trip gives, taken now (as it does) so that the
        # caller changing an item later changes nothing stored.
        events = [_event_of(_round_trip(item), owned=True) for item in items]
        await asyncio.to_thread(self._add, events)

    def _add(self, events: list[ev.Event]) -> None:
        with self._items.lock:
            self._items.own(self.log.extend(events))

    async def pop_item(self) -> Item | None:
        """Redact the latest item and return it; None when the session has no items."""
        return await asyncio.to_thread(self._pop)

    def _pop(self) -> Item | None:
        index = self._items
        with index.lock:
            for _ in range(RETRIES):
                index.refresh()
                if not index.items:
                    return None
                pos = index.items[-1]
                item = _item_of(self.log.read(pos))
                if item is None:
                    continue
                try:
                    index.own([self.log.redact([pos], "openai-agents pop_item")])
                except InvalidEvent:
                    continue  # another process popped it first
                return item
        return None

    async def clear_session(self) -> None:
        """Redact every item of the session, and the summaries and markers made from them."""
        await asyncio.to_thread(self._clear)

    def _clear(self) -> None:
        index = self._items
        with index.lock:
            index.refresh()
            index.erase(set(index.live), "openai-agents clear_session")


class _NotPlain(Exception):
    """A value whose JSON round trip is not simply a copy of it."""


def _round_trip(item: Any) -> Any:
    """Return ``json.loads(json.dumps(item))``, as SQLiteSession stores and reads an item.

    Items are almost always plain JSON (dicts with str keys, lists, str, int, bool,
    None, finite floats), whose round trip is a deep copy: made directly, that is
    several times faster. Anything else (tuples, non-str keys, NaN, subclasses) takes
    the round trip itself, so the result and any error are exactly SQLiteSession's.
    """
    try:
        return _copy(item, 0)
    except _NotPlain:
        return json.loads(json.dumps(item))


def _copy(value: Any, depth: int) -> Any:
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if depth > 64:
        raise _NotPlain
    if kind is dict:
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                raise _NotPlain
            t = type(v)
            out[k] = v if t is str or t is int or t is bool or v is None else _copy(v, depth + 1)
        return out
    if kind is list:
        return [v if type(v) is str else _copy(v, depth + 1) for v in value]
    if kind is float and math.isfinite(value):
        return value
    raise _NotPlain


def _item_of(record: Record | None) -> Item | None:
    return item_of(record.event) if record is not None else None
