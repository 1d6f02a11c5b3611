"""The structural facts of a session, read from event fields and never from prose.

One pass over a session's events gives what the gate, the marker checks and the audit
need: which events are negative facts (failed, rejected, superseded), which tool calls,
handles and obligations were opened and closed where, where each binding was bound,
which steps need which bindings, and the summary nodes written so far.

:class:`Deriver` gives the same facts event by event, as rows of the structural index
that the store writes with each append (see :mod:`compactstore.index`).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from . import events as ev

TEXT_LIMIT = 160

#: Opening and closing kinds, by the kind of item they open.
_OPENS = {"tool_call": "tool_call", "handle_opened": "handle", "obligation": "obligation"}
_CLOSES = {"tool_result": "tool_call", "handle_closed": "handle", "fulfilment": "obligation"}
#: Kinds whose events can give index rows whatever their fields: items, bindings and attempts.
STRUCTURAL_KINDS = frozenset({*_OPENS, *_CLOSES, "binding", "attempt"})
#: Event types that give an index row only through ``status`` or ``supersedes``.
_INERT = frozenset(t for t in ev.EVENT_TYPES if t.__struct_config__.tag not in STRUCTURAL_KINDS)
#: What :func:`inert` allows of an event's ``supersedes`` and ``status``.
_NO_SUPERSEDES, _INERT_STATUSES = frozenset({None}), frozenset({None, "ok"})
_SUPERSEDES, _STATUS = operator.attrgetter("supersedes"), operator.attrgetter("status")


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


def fact_text(event: ev.Event) -> str:
    """Return the text a negative fact records for ``event``.

    A failed tool result's is its exact output, neither cut nor re-spaced: the exact
    error string is what a resumed agent must not have to guess. Any other event's is
    its one-line rendering (:func:`text_of`).
    """
    if isinstance(event, ev.ToolResult) and (not event.ok or event.status == "failed"):
        out = event.output if isinstance(event.output, str) else ev.encode_json(event.output)
        return f"result {event.call_id} failed: {out}"
    return text_of(event)


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
    #: attempt key -> (position, attempt) in order.
    #: and, of an attempt a redaction erased, the guard the redaction kept of it, at its position.
    attempts: dict[str, list[tuple[int, ev.Attempt | ev.Guard]]] = field(default_factory=dict)
    #: texts of events named by a ``supersedes``, filled in as they are met.
    _texts: dict[int, str] = field(default_factory=dict)

    def add(self, pos: int, event: ev.Event) -> None:
        """Take in the event at ``pos`` (positions must come in order)."""
        self.size = pos + 1
        derived = event.kind in ev.DERIVED_KINDS
        status = None if derived else _negative_status(event)
        if status is not None:
            self.negatives[pos] = ev.Fact(pos, status, fact_text(event))
            self.cause[pos] = pos
        elif not derived:
            self._texts[pos] = fact_text(event)
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
        elif isinstance(event, ev.Attempt):
            self.attempts.setdefault(event.key, []).append((pos, event))
        elif isinstance(event, ev.Redaction):
            for g in event.guards:
                kept = self.attempts.setdefault(g.key, [])
                kept.append((g.pos, g))
                kept.sort(key=lambda a: a[0])
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

    def resolved_in(self, start: int, stop: int) -> list[ev.Item]:
        """Return the items opened before ``start``, still open there, and closed in ``[start, stop)``.

        A resumed context shows their opening raw (it is before the span) and their
        closing only through the node, so the node must say they were closed.
        """
        out = []
        for (kind, ident), opens in self.opened.items():
            closes = self.closed.get((kind, ident), [])
            for p in opens:
                if p < start and not any(p < c < start for c in closes) and any(start <= c < stop for c in closes):
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


# --- the structural index: the same facts, persisted as they are appended -----------------

#: A snapshot of the open items is stored at every multiple of this position, so the items
#: open at any boundary are one snapshot plus at most this many positions of opens and closes.
SNAPSHOT_EVERY = 64


class IndexRow(NamedTuple):
    """One row of the structural index of a session.

    ``rel`` says what the row records (``open``, ``close``, ``negative``, ``binding``,
    ``attempt``, ``open_at``); ``key``, ``num`` and ``text`` are its fields:

    - ``open`` / ``close`` at ``pos``: ``key`` is the item (``kind/id``); an obligation's
      ``text`` is the JSON list of the bindings it needs.
    - ``negative`` at ``pos``: ``key`` the status, ``num`` the position that made it
      negative (itself, or what superseded it), ``text`` the fact's text.
    - ``binding`` at ``pos``: ``key`` the binding key, ``num`` 1 when regenerable.
    - ``attempt`` at ``pos``: ``key`` the attempt's idempotency key (the retry guard
      reads the attempts under a key from these rows, each body through a checked read).
    - ``open_at`` at a multiple ``pos`` of SNAPSHOT_EVERY: the item ``key`` opened at
      ``num`` and open at that boundary.
    """

    pos: int
    rel: str
    key: str
    num: int
    text: str


class Prior(Protocol):
    """What a derivation starting at a position needs to know of the positions before it."""

    def is_negative(self, pos: int) -> bool:
        """Return whether the event at ``pos`` (before the start) is already a negative fact."""
        ...

    def latest_binding(self, key: str, before: int) -> int | None:
        """Return the position of the last binding of ``key`` before ``before`` (and before the start)."""
        ...

    def superseded_text(self, pos: int) -> str:
        """Return the text a supersede records for the event at ``pos`` ("" for a derived event)."""
        ...

    def open_at(self, pos: int) -> list[tuple[int, str]]:
        """Return the ``(position, item)`` open at boundary ``pos`` (the start)."""
        ...


def item_key(kind: str, ident: str) -> str:
    """Return the index's name of an item: its kind, a slash, its id (kinds hold no slash)."""
    return f"{kind}/{ident}"


def split_item(key: str) -> tuple[str, str]:
    """Return ``(kind, id)`` of an item named by :func:`item_key`."""
    kind, _, ident = key.partition("/")
    return kind, ident


def inert(event: ev.Event) -> bool:
    """Return whether ``event`` gives no index row (a run of them gives only snapshots)."""
    return type(event) in _INERT and event.supersedes is None and event.status in (None, "ok")


def all_inert(events: Sequence[ev.Event]) -> bool:
    """Return whether no event of ``events`` gives an index row: :func:`inert` of each.

    Three passes through ``map`` and ``set``, which run in C: one loop of bytecode over
    a batch cost more than the three.
    """
    return (_INERT.issuperset(map(type, events)) and _NO_SUPERSEDES.issuperset(map(_SUPERSEDES, events))
            and _INERT_STATUSES.issuperset(map(_STATUS, events)))


def superseded_text(event: ev.Event) -> str:
    """Return the text a supersede records for ``event``: as :meth:`Structure._supersede` does."""
    return "" if event.kind in ev.DERIVED_KINDS else fact_text(event)


def apply_items(open_items: dict[int, str], rows: Iterable[IndexRow]) -> None:
    """Advance the open items (``position -> item``) over ``open`` and ``close`` rows, in position order.

    A close closes every earlier open of its item, as :meth:`Structure.unresolved_at` reads it.
    """
    for r in rows:
        if r.rel == "open":
            open_items[r.pos] = r.key
        elif r.rel == "close":
            for p in [p for p, k in open_items.items() if k == r.key and p < r.pos]:
                del open_items[p]


class Deriver:
    """Derive the structural index rows of positions ``[start, ...)``, fed in order.

    Gives, position by position, the same facts :class:`Structure` finds in one pass,
    reading what came before ``start`` through ``prior`` (the index itself when
    appending, nothing when verify rebuilds it from position 0).
    """

    def __init__(self, start: int, prior: Prior) -> None:
        self.start = self.size = start
        self.prior = prior
        self.rows: list[IndexRow] = []
        self._negative: set[int] = set()
        self._bindings: dict[str, int] = {}
        self._open: dict[int, str] | None = None  # tracked from the first snapshot needed
        self._items: list[IndexRow] = []  # open and close rows of this run, until tracked

    def add(self, pos: int, event: ev.Event) -> None:
        """Take in the event at ``pos`` (positions must come in order, from ``start``)."""
        assert pos == self.size, (pos, self.size)
        self.size = pos + 1
        if inert(event):
            # Most of a log (turns, checkpoints): nothing to record but a snapshot boundary.
            if self.size % SNAPSHOT_EVERY == 0:
                self._snapshot(self.size)
            return
        rows = self.rows
        derived = event.kind in ev.DERIVED_KINDS
        status = None if derived else _negative_status(event)
        if status is not None:
            rows.append(IndexRow(pos, "negative", status, pos, fact_text(event)))
            self._negative.add(pos)
        if event.supersedes is not None:
            self._supersede(event.supersedes, pos)
        if isinstance(event, ev.Binding):
            previous = self._bindings.get(event.key)
            if previous is None:
                previous = self.prior.latest_binding(event.key, self.start)
            if previous is not None:
                self._supersede(previous, pos)
            self._bindings[event.key] = pos
            rows.append(IndexRow(pos, "binding", event.key, int(event.regenerable), ""))
        elif isinstance(event, ev.Attempt):
            rows.append(IndexRow(pos, "attempt", event.key, 0, ""))
        kind = event.kind
        item = None
        if kind in _OPENS:
            needs = ev.encode_json(event.needs) if isinstance(event, ev.Obligation) else ""
            item = IndexRow(pos, "open", item_key(_OPENS[kind], _item_id(event)), 0, needs)
        elif kind in _CLOSES:
            item = IndexRow(pos, "close", item_key(_CLOSES[kind], _item_id(event)), 0, "")
        if item is not None:
            rows.append(item)
            if self._open is not None:
                apply_items(self._open, [item])
            else:
                self._items.append(item)
        if self.size % SNAPSHOT_EVERY == 0:
            self._snapshot(self.size)

    def extend(self, events: Iterable[ev.Event]) -> None:
        """Take in ``events`` at the next positions, as :meth:`add` would one by one.

        A run of inert events is taken in one :meth:`skip`: most of a batch costs a type
        test each, not a call.
        """
        events = events if isinstance(events, list | tuple) else list(events)
        kinds, pos = _INERT, self.size
        if all_inert(events):  # most batches: checked in C
            self.skip(pos + len(events))
            return
        for event in events:
            if type(event) in kinds and event.supersedes is None and event.status in (None, "ok"):
                pos += 1
                continue
            self.skip(pos)
            self.add(pos, event)
            pos += 1
        self.skip(pos)

    def skip(self, stop: int) -> None:
        """Take positions up to ``stop`` known to give no row: only the snapshots they cross are written."""
        while self.size < stop:
            boundary = (self.size // SNAPSHOT_EVERY + 1) * SNAPSHOT_EVERY
            if boundary > stop:
                self.size = stop
            else:
                self.size = boundary
                self._snapshot(boundary)

    def _supersede(self, old: int, by: int) -> None:
        if old in self._negative or (old < self.start and self.prior.is_negative(old)):
            return
        self._negative.add(old)
        self.rows.append(IndexRow(old, "negative", "superseded", by, self.prior.superseded_text(old)))

    def _snapshot(self, at: int) -> None:
        if self._open is None:
            self._open = dict(self.prior.open_at(self.start))
            apply_items(self._open, self._items)
            self._items = []
        self.rows.extend(IndexRow(at, "open_at", k, p, "") for p, k in sorted(self._open.items()))
