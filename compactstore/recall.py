"""Fetch, by handle, what a model's input names instead of quoting it, through the verified reads.

A note of :mod:`compactstore.render` counts or names what it does not quote with a
handle; :func:`recall` returns, as text for the model, what the handle holds and what
was certified about it. The adapters give it to a model as a tool named
:data:`compactstore.render.RECALL_TOOL` (``CompactStoreSaver.recall_tool``,
``CompactStoreSession.recall_tool``). The grammar, parsed by :func:`parse` alone:

- ``spill:N``: the value spilled at position N (:meth:`Session.spilled`: proven in the
  sealed head and checked against its digest);
- ``pos:N``: the event at position N, derived ones included (:meth:`Session.proven`);
- ``span:A-B``: the raw events of positions ``[A, B)``, derived events left out, at most
  :data:`SPAN_EVENTS` (and about :data:`SPAN_CHARACTERS` characters) per call, the text
  ending with the handle of the rest (each held to the sealed head by :meth:`Session.scan`);
- ``facts:A-B``: the failed, rejected and superseded facts at positions ``[A, B)`` as
  the log stands now (:meth:`Session.facts`), at most :data:`FACTS_PER_CALL` per call,
  each event read and held to the sealed head;
- ``binding:KEY``: the current value of binding ``KEY`` (:meth:`Session.lookup`: every
  body up to the sealed head re-hashed into its root).

``N``, ``A`` and ``B`` are ASCII decimal positions (at most 19 digits, below 2**63),
``A < B``; surrounding whitespace is ignored. Anything else is refused with
:class:`~compactstore.errors.InvalidArgument` naming ``handle``, nothing read.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from . import events as ev
from .errors import InvalidArgument, shown
from .store import Session
from .structure import fact_text

__all__ = ["DESCRIPTION", "FACTS_PER_CALL", "Handle", "MAX_HANDLE", "SPAN_CHARACTERS", "SPAN_EVENTS", "parse", "recall"]

#: What the adapters' recall tools tell the model they do.
DESCRIPTION = (
    "Fetch from this conversation's verified log what the memory note names by a handle instead of quoting it: "
    "spill:N (a spilled value), pos:N (the event at a position), span:A-B (raw events of positions A to B-1), "
    "facts:A-B (failed, rejected or superseded facts there) or binding:KEY (a binding's current value). "
    "Returns the value and what was verified."
)

#: Raw events one ``span:A-B`` call returns at most.
SPAN_EVENTS = 20
#: Characters of events one ``span:A-B`` call returns, about: it stops after the event
#: that reaches them (one event at least, whole).
SPAN_CHARACTERS = 8000
#: Facts one ``facts:A-B`` call returns at most.
FACTS_PER_CALL = 40
#: Characters a handle may have (a ``binding:KEY`` handle is the longest).
MAX_HANDLE = 1100
#: Positions whose facts are looked up at a time.
_FACT_CHUNK = 512

Kind = Literal["spill", "pos", "span", "facts", "binding"]

_NUMBER = r"([0-9]{1,19})"
_GRAMMAR = re.compile(rf"(spill|pos):{_NUMBER}|(span|facts):{_NUMBER}-{_NUMBER}|binding:(.+)", re.DOTALL)


class Handle(msgspec.Struct, frozen=True):
    """A parsed handle: ``kind``, and its position (``start``), range (``[start, stop)``) or ``key``."""

    kind: Kind
    start: int = 0
    stop: int = 0
    key: str = ""

    def __str__(self) -> str:
        if self.kind in ("spill", "pos"):
            return f"{self.kind}:{self.start}"
        if self.kind in ("span", "facts"):
            return f"{self.kind}:{self.start}-{self.stop}"
        return f"binding:{self.key}"


def parse(handle: object) -> Handle:
    """Return the :class:`Handle` that ``handle`` names (see the module's docstring for the grammar).

    Raises:
        InvalidArgument: naming ``handle``: not a str, too long, not in the grammar, a
            number out of range, an empty range, or a key :meth:`Session.lookup` would
            read as a position.
    """
    if type(handle) is not str:  # exactly: a subclass's strip() or len() may say anything
        raise InvalidArgument("handle", f"want a str such as 'spill:84' or 'span:10-20', got {type(handle).__name__}")
    if len(handle) > MAX_HANDLE:
        raise InvalidArgument("handle", f"at most {MAX_HANDLE} characters, got {len(handle)}")
    text = handle.strip(" \t\r\n")
    m = _GRAMMAR.fullmatch(text)
    if m is None:
        raise InvalidArgument("handle", f"want spill:N, pos:N, span:A-B, facts:A-B or binding:KEY, got {shown(handle, 80)}")
    if m.group(1):
        return Handle(m.group(1), start=_position(m.group(2)))  # type: ignore[arg-type]
    if m.group(3):
        start, stop = _position(m.group(4)), _position(m.group(5))
        if start >= stop:
            raise InvalidArgument("handle", f"{m.group(3)}:A-B wants A < B, got {shown(text, 80)}")
        return Handle(m.group(3), start=start, stop=stop)  # type: ignore[arg-type]
    key = m.group(6)
    if ev.names_position(key):
        raise InvalidArgument("handle", f"binding:{shown(key, 60)} would be read as a position and a path: "
                                        "use pos:N for the binding event")
    return Handle("binding", key=key)


def _position(digits: str) -> int:
    return ev.as_position_text("handle", digits)


def recall(session: Session, handle: str) -> str:
    """Return, as text for a model, what ``handle`` holds in ``session`` and what was certified about it.

    Every read goes through the session's verified reads; the text says which: the
    sealed head (size and root) the value is proven in, and how.

    Raises:
        InvalidArgument: naming ``handle``: a malformed handle (:func:`parse`), a position
            past the sealed head, an empty session, or ``spill:N`` naming no spill.
        ReconstructionUnsoundError: ``spill:N`` names a spill that was redacted.
        KeyRequired: the store is keyed and was opened without its key.
        IntegrityError: what was read does not match its leaf, the sealed head or a digest.
    """
    h = parse(handle)
    if session.size == 0:
        raise InvalidArgument("handle", f"session {session.name!r} has no events")
    head = session.sealed_head()
    at = f"the sealed head of size {head.size}, root {head.root.hex()}"
    if h.kind != "binding" and h.start >= head.size:
        raise InvalidArgument("handle", f"{h}: the log has positions 0 to {head.size - 1}")
    if h.kind == "spill":
        return _spill(session, h.start, at)
    if h.kind == "pos":
        record = session.view.proven(h.start)
        return f"pos:{h.start}, proven in {at}:\n{_shown(record)}"
    if h.kind == "span":
        return _span(session, h, head.size, at)
    if h.kind == "facts":
        return _facts(session, h, head.size, at)
    value = session.lookup(h.key)
    if value is not None:
        return f"binding:{h.key} = {ev.encode_json(value)}\n(its latest binding; every event up to {at} re-hashed into that root)"
    found = session.view.facts(head.size).latest_binding(h.key, head.size)
    if found is None:
        return f"binding:{h.key}: no binding of this key is logged up to {at}"
    return (f"binding:{h.key}: its latest value is unknown: the binding at pos {found[0]} or a later position was "
            f"redacted (read up to {at})")


def _spill(session: Session, pos: int, at: str) -> str:
    record = session.view.proven(pos)
    spill = record.event
    if not isinstance(spill, ev.Spill | ev.Redacted):
        raise InvalidArgument("handle", f"spill:{pos} names a {record.kind!r} event, not a spill: pos:{pos} reads it")
    value = session.spilled(f"spill:{pos}")  # a redacted one raises ReconstructionUnsoundError
    assert isinstance(spill, ev.Spill)
    return (f"spill:{pos} = {ev.encode_json(value)}\n(the value of binding {spill.key!r} bound at pos {spill.source}, "
            f"proven in {at} and checked against its digest)")


def _shown(record: ev.Record) -> str:
    """Return a record as a model reads it: position, kind, status, and its canonical body whole."""
    event = record.event
    if isinstance(event, ev.Redacted):
        return f"pos {record.pos}: redacted by the event at pos {event.by}: its content is gone"
    if isinstance(event, ev.Dropped):
        return (f"pos {record.pos}: its body was dropped by the retention at pos {event.by}: "
                "the certified summary that covers it stands for it")
    body = record.body.decode("utf-8", "replace")
    status = f" [{event.status}]" if event.status not in (None, "ok") else ""
    return f"pos {record.pos} {record.kind}{status}: {body}"


def _span(session: Session, h: Handle, size: int, at: str) -> str:
    stop = min(h.stop, size)
    lines: list[str] = []
    used, rest = 0, None
    for record in session.scan(h.start, stop):
        if record.kind in ev.DERIVED_KINDS:
            continue
        if len(lines) == SPAN_EVENTS or (lines and used >= SPAN_CHARACTERS):
            rest = record.pos
            break
        line = _shown(record)
        lines.append(line)
        used += len(line)
    head = (f"span:{h.start}-{h.stop}: the raw events of [{h.start}, {stop}) (derived events left out), "
            f"each held to {at}:")
    if not lines:
        return f"{head}\n(none)"
    tail = [f"(more: span:{rest}-{stop})"] if rest is not None else []
    return "\n".join([head, *lines, *tail])


def _facts(session: Session, h: Handle, size: int, at: str) -> str:
    stop = min(h.stop, size)
    f = session.view.facts(size)
    found: list[ev.Fact] = []
    rest = None
    for first in range(h.start, stop, _FACT_CHUNK):
        chunk = range(first, min(first + _FACT_CHUNK, stop))
        fact_at = f.negatives_at(chunk)
        for p in chunk:
            fact = fact_at(p)
            if fact is None:
                continue
            if len(found) == FACTS_PER_CALL:
                rest = p
                break
            found.append(fact)
        if rest is not None:
            break
    head = (f"facts:{h.start}-{h.stop}: the failed, rejected and superseded facts at positions [{h.start}, {stop}), "
            f"each event read and held to {at}:")
    lines = []
    with session.reading():
        for fact in found:
            record = session.read(fact.pos)
            lines.append(f"- pos {fact.pos} {fact.status}: {fact_text(record.event)} (pos:{fact.pos} gives it whole)")
    if not lines:
        return f"{head}\n(none)"
    tail = [f"(more: facts:{rest}-{stop})"] if rest is not None else []
    return "\n".join([head, *lines, *tail])
