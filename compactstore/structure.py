"""The structural facts of a session, read from event fields and never from prose.

One pass over a session's events gives what the gate, the marker checks and the audit
need: which events are negative facts (failed, rejected, superseded), which tool calls,
handles and obligations were opened and closed where, where each binding was bound,
which steps need which bindings, and the summary nodes written so far.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from . import events as ev

TEXT_LIMIT = 160

#: Opening and closing kinds, by the kind of item they open.
_OPENS = {"tool_call": "tool_call", "handle_opened": "handle", "obligation": "obligation"}
_CLOSES = {"tool_result": "tool_call", "handle_closed": "handle", "fulfilment": "obligation"}


def text_of(event: ev.Event) -> str:
    """Return a one-line rendering of an event, cut to TEXT_LIMIT characters."""
    if isinstance(event, ev.Turn):
        text = f"{event.role}: {event.content}"
    elif isinstance(event, ev.ToolCall):
        text = f"call {event.call_id} {event.name}({ev.encode_json(event.args)})"
    elif isinstance(event, ev.ToolResult):
        out = event.output if isinstance(event.output, str) else ev.encode_json(event.output)
        text = f"result {event.call_id} {'ok' if event.ok else 'failed'}: {out}"
    elif isinstance(event, ev.Binding):
        text = f"bound {event.key}"
    elif isinstance(event, ev.Obligation):
        text = f"obliged {event.name} (needs {', '.join(event.needs) or 'nothing'})"
    elif isinstance(event, ev.Fulfilment):
        text = f"fulfilled {event.name}"
    elif isinstance(event, ev.HandleOpened):
        text = f"opened {event.resource} {event.handle} {event.detail}".rstrip()
    elif isinstance(event, ev.HandleClosed):
        text = f"closed {event.handle}"
    elif isinstance(event, ev.Summary):
        text = f"L{event.tier} node over [{event.start}, {event.stop})"
    else:
        text = event.kind
    text = " ".join(text.split())
    return text if len(text) <= TEXT_LIMIT else text[: TEXT_LIMIT - 1] + "…"


def _negative_status(event: ev.Event) -> ev.Status | None:
    if event.status in ("failed", "rejected", "superseded"):
        return event.status
    if isinstance(event, ev.ToolResult) and not event.ok:
        return "failed"
    return None


@dataclass
class Structure:
    """What a pass over positions ``[0, size)`` of a session found."""

    size: int = 0
    #: negative facts by position (derived events excluded).
    negatives: dict[int, ev.Fact] = field(default_factory=dict)
    #: position -> the position that made it negative (itself, or what superseded it).
    cause: dict[int, int] = field(default_factory=dict)
    #: (item kind, id) -> positions where it was opened, in order.
    opened: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    #: (item kind, id) -> positions where it was closed, in order.
    closed: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    #: binding key -> (position, binding) in order.
    bindings: dict[str, list[tuple[int, ev.Binding]]] = field(default_factory=dict)
    #: (position, key, how): steps that need a binding, by an obligation or ``uses``.
    needs: list[tuple[int, str, str]] = field(default_factory=list)
    #: obligations by position.
    obligations: dict[int, ev.Obligation] = field(default_factory=dict)
    #: summary nodes by position.
    nodes: dict[int, ev.Summary] = field(default_factory=dict)
    #: texts of events named by a ``supersedes``, filled in as they are met.
    _texts: dict[int, str] = field(default_factory=dict)

    def add(self, pos: int, event: ev.Event) -> None:
        """Take in the event at ``pos`` (positions must come in order)."""
        self.size = pos + 1
        derived = event.kind in ev.DERIVED_KINDS
        status = None if derived else _negative_status(event)
        if status is not None:
            self.negatives[pos] = ev.Fact(pos, status, text_of(event))
            self.cause[pos] = pos
        elif not derived:
            self._texts[pos] = text_of(event)
        if event.supersedes is not None:
            self._supersede(event.supersedes, pos)
        if isinstance(event, ev.Binding) and event.key in self.bindings:
            # Re-binding a key supersedes its earlier value: a summary that keeps the old
            # value must also say it is no longer current.
            self._supersede(self.bindings[event.key][-1][0], pos)
        kind = event.kind
        if kind in _OPENS:
            self.opened.setdefault((_OPENS[kind], _item_id(event)), []).append(pos)
        elif kind in _CLOSES:
            self.closed.setdefault((_CLOSES[kind], _item_id(event)), []).append(pos)
        if isinstance(event, ev.Binding):
            self.bindings.setdefault(event.key, []).append((pos, event))
        elif isinstance(event, ev.Obligation):
            self.obligations[pos] = event
            self.needs.extend((pos, key, f"obligation {event.name!r}") for key in event.needs)
        elif isinstance(event, ev.Summary):
            self.nodes[pos] = event
        for key in event.uses or ():
            self.needs.append((pos, key, f"{kind} uses it"))

    def _supersede(self, old: int, by: int) -> None:
        if old not in self.negatives:
            self.negatives[old] = ev.Fact(old, "superseded", self._texts.pop(old, ""))
            self.cause[old] = by

    def negatives_in(self, start: int, stop: int) -> list[ev.Fact]:
        """Return the negative facts a node over ``[start, stop)`` must retain, by position.

        These are the facts at positions in the span known by ``stop`` (an event superseded
        only after ``stop`` was not yet negative at that boundary), and the facts at
        positions before the span that an event in it made negative: a resumed context
        shows those events raw, and only the node can say they are no longer current.
        """
        return [
            f for p, f in sorted(self.negatives.items())
            if p < stop and self.cause[p] < stop and (p >= start or self.cause[p] >= start)
        ]

    def unresolved_at(self, start: int, stop: int) -> list[ev.Item]:
        """Return the items opened in ``[start, stop)`` and not closed before ``stop``."""
        out = []
        for (kind, ident), opens in self.opened.items():
            closes = self.closed.get((kind, ident), [])
            for p in opens:
                if start <= p < stop and not any(p < c < stop for c in closes):
                    out.append(ev.Item(p, kind, ident))  # type: ignore[arg-type]
        return sorted(out, key=lambda i: (i.pos, i.kind, i.id))

    def resolved_before(self, item: ev.Item, stop: int) -> bool:
        """Return whether ``item`` is closed at a position after it and before ``stop``."""
        return any(item.pos < c < stop for c in self.closed.get((item.kind, item.id), []))

    def open_obligations(self) -> list[tuple[int, ev.Obligation]]:
        """Return the obligations still open at the end of the pass, as ``(position, obligation)``."""
        out = []
        for pos, obligation in self.obligations.items():
            closes = self.closed.get(("obligation", obligation.name), [])
            if not any(c > pos for c in closes):
                out.append((pos, obligation))
        return out

    def latest_binding(self, key: str, before: int) -> tuple[int, ev.Binding] | None:
        """Return the last binding of ``key`` at a position before ``before``."""
        found = [b for b in self.bindings.get(key, []) if b[0] < before]
        return found[-1] if found else None


def _item_id(event: ev.Event) -> str:
    for name in ("call_id", "handle", "name"):
        value = getattr(event, name, None)
        if isinstance(value, str):
            return value
    raise AssertionError(event.kind)


def build(records: Iterable[tuple[int, ev.Event]]) -> Structure:
    """Return the structure of ``records`` (``(position, event)`` from position 0, in order)."""
    s = Structure()
    for pos, event in records:
        s.add(pos, event)
    return s
