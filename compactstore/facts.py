"""The structural facts of a session at a checkpoint, behind one interface.

Every rule (:mod:`compactstore.rules`) reads a session through :class:`Facts`: which
events are negative facts, which items are open or closed where, where each binding
was bound, which obligations are open, the summary nodes, an event's body and a span's
root. Two sources serve it and give the same answers for every session (property tests
hold them side by side):

- :class:`FullFacts`, one pass over the events (:class:`compactstore.structure.Structure`):
  the reference, and the source for a session with redactions (an erased body no
  longer gives the facts it gave when appended);
- :class:`IndexedFacts`, the structural index written with each append
  (:class:`IndexSource`), plus the few events it names, in O(log n) queries plus the
  size of the answer.

Only the source of the facts varies; the rules are written once.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from . import events as ev
from .events import Fact, Item
from .structure import IndexRow, Structure, build, split_item

#: Reads the event at a position (None when there is none before the checkpoint).
Get = Callable[[int], "ev.Event | None"]
#: Returns the root the log gives for positions ``[start, stop)``.
SpanRoot = Callable[[int, int], bytes]


class Facts(Protocol):
    """What the rules read of a session at checkpoint ``size`` (positions ``[0, size)``)."""

    size: int

    def event(self, pos: int) -> ev.Event | None:
        """Return the event at ``pos``, or None when ``pos`` is not in ``[0, size)``."""
        ...

    def read(self, positions: Iterable[int]) -> None:
        """Read ahead the events at ``positions`` that :meth:`event` will be asked for, in one batch where the source can."""
        ...

    def span_root(self, start: int, stop: int) -> bytes:
        """Return the root the log gives for ``[start, stop)`` (``0 <= start < stop <= size``)."""
        ...

    def nodes(self) -> list[tuple[int, ev.Summary]]:
        """Return ``(position, node)`` of every summary node before ``size``, by position."""
        ...

    def negatives_in(self, start: int, stop: int) -> list[Fact]:
        """Return the negative facts a node over ``[start, stop)`` must retain (see :meth:`Structure.negatives_in`)."""
        ...

    def negatives_at(self, positions: Sequence[object]) -> Callable[[object], Fact | None]:
        """Return a lookup of the negative fact at each of ``positions`` (None: not one)."""
        ...

    def unresolved_at(self, start: int, stop: int) -> list[Item]:
        """Return the items opened in ``[start, stop)`` and still open at ``stop``."""
        ...

    def resolved_in(self, start: int, stop: int) -> list[Item]:
        """Return the items opened before ``start``, open there, and closed in ``[start, stop)``."""
        ...

    def resolved_before(self, items: Sequence[Item], stop: int) -> set[Item]:
        """Return those of ``items`` closed at a position after their opening and before ``stop``."""
        ...

    def latest_binding(self, key: str, before: int) -> tuple[int, bool] | None:
        """Return ``(position, regenerable)`` of the last binding of ``key`` before ``before``."""
        ...

    def binding(self, pos: int) -> ev.Binding:
        """Return the binding at ``pos`` (one a query above named)."""
        ...

    def keys_at(self, positions: Iterable[object]) -> set[str]:
        """Return the keys of the bindings at ``positions``."""
        ...

    def keys_in(self, start: int, stop: int) -> set[str]:
        """Return the keys bound at a position in ``[start, stop)``."""
        ...

    def open_obligations(self) -> list[tuple[int, str, list[str]]]:
        """Return ``(position, name, needs)`` of each obligation open at ``size``, by position."""
        ...

    def redacted_in(self, start: int, stop: int) -> list[int]:
        """Return the positions in ``[start, stop)`` whose bodies a redaction erased, by position.

        What such a position held is unknown: it gives no fact, and so nothing can show
        that a summary kept it.
        """
        ...

    def attempts(self, key: str) -> list[tuple[int, ev.Attempt | ev.Guard]]:
        """Return ``(position, attempt)`` of every attempt under idempotency key ``key`` before ``size``, by position.

        An attempt a redaction erased is given as the guard that redaction kept of it.
        """
        ...


class FullFacts:
    """:class:`Facts` from one pass over the events ``[0, size)``."""

    def __init__(self, events: Sequence[ev.Event], span_root: SpanRoot, structure: Structure | None = None) -> None:
        self.events = events
        self.size = len(events)
        self.s = structure if structure is not None else build(enumerate(events))
        self._span_root = span_root
        self._bound: dict[int, ev.Binding] | None = None
        self._redacted: list[int] | None = None

    def event(self, pos: int) -> ev.Event | None:
        return self.events[pos] if 0 <= pos < self.size else None

    def read(self, positions: Iterable[int]) -> None:
        pass  # every event is in memory

    def span_root(self, start: int, stop: int) -> bytes:
        return self._span_root(start, stop)

    def nodes(self) -> list[tuple[int, ev.Summary]]:
        return sorted(self.s.nodes.items())

    def negatives_in(self, start: int, stop: int) -> list[Fact]:
        return self.s.negatives_in(start, stop)

    def negatives_at(self, positions: Sequence[object]) -> Callable[[object], Fact | None]:
        negatives = self.s.negatives
        return lambda p: negatives.get(p) if isinstance(p, int) else None

    def unresolved_at(self, start: int, stop: int) -> list[Item]:
        return self.s.unresolved_at(start, stop)

    def resolved_in(self, start: int, stop: int) -> list[Item]:
        return self.s.resolved_in(start, stop)

    def resolved_before(self, items: Sequence[Item], stop: int) -> set[Item]:
        return {i for i in items if self.s.resolved_before(i, stop)}

    def latest_binding(self, key: str, before: int) -> tuple[int, bool] | None:
        found = self.s.latest_binding(key, before)
        return None if found is None else (found[0], found[1].regenerable)

    def binding(self, pos: int) -> ev.Binding:
        if self._bound is None:
            self._bound = {p: b for bound in self.s.bindings.values() for p, b in bound}
        return self._bound[pos]

    def keys_at(self, positions: Iterable[object]) -> set[str]:
        at = set(positions)
        return {key for key, bound in self.s.bindings.items() if any(p in at for p, _ in bound)}

    def keys_in(self, start: int, stop: int) -> set[str]:
        return {k for k, bound in self.s.bindings.items() if any(start <= p < stop for p, _ in bound)}

    def open_obligations(self) -> list[tuple[int, str, list[str]]]:
        return [(pos, o.name, list(o.needs)) for pos, o in self.s.open_obligations()]

    def redacted_in(self, start: int, stop: int) -> list[int]:
        if self._redacted is None:
            self._redacted = [p for p, e in enumerate(self.events) if isinstance(e, ev.Redacted)]
        found = self._redacted
        return found[bisect_left(found, start) : bisect_left(found, stop)]

    def attempts(self, key: str) -> list[tuple[int, ev.Attempt | ev.Guard]]:
        return [(p, a) for p, a in self.s.attempts.get(key, []) if p < self.size]


class IndexSource(Protocol):
    """The structural index of one session (see :class:`compactstore.index.Index`)."""

    def open_at(self, at: int) -> dict[int, str]:
        """Return the items open at boundary ``at`` (position -> item)."""
        ...

    def negatives(self, start: int, stop: int) -> list[IndexRow]:
        """Return the ``negative`` rows a node over ``[start, stop)`` is held to, by position."""
        ...

    def negatives_at(self, positions: Iterable[int], before: int) -> dict[int, IndexRow]:
        """Return the ``negative`` rows at ``positions`` of the events negative at checkpoint ``before``."""
        ...

    def latest_binding(self, key: str, before: int) -> IndexRow | None:
        """Return the ``binding`` row of the last binding of ``key`` before ``before``."""
        ...

    def needs(self, positions: Sequence[int]) -> dict[int, list[str]]:
        """Return the bindings each obligation opened at ``positions`` needs."""
        ...

    def bindings_at(self, positions: Iterable[int]) -> list[IndexRow]:
        """Return the ``binding`` rows at ``positions``, by position."""
        ...

    def bindings_in(self, start: int, stop: int) -> list[IndexRow]:
        """Return the ``binding`` rows of positions ``[start, stop)``, by position."""
        ...

    def closes(self, start: int, stop: int) -> list[IndexRow]:
        """Return the ``close`` rows of positions ``[start, stop)``, by position."""
        ...

    def attempt_positions(self, key: str, before: int) -> list[int]:
        """Return the positions of the attempts under ``key`` before ``before``, in order."""
        ...


def _positions(values: Iterable[object], size: int) -> list[int]:
    """Return the positions among ``values`` (ints, bools counted as ints, as a dict lookup does) before ``size``."""
    return sorted({int(v) for v in values if isinstance(v, int) and 0 <= v < size})


def _item(pos: int, name: str) -> Item:
    kind, ident = split_item(name)
    return Item(pos, kind, ident)  # type: ignore[arg-type]


class IndexedFacts:
    """:class:`Facts` from the structural index, the summary nodes and a few events read one by one.

    ``get`` reads an event, checking its body against its leaf (and that a missing body
    was redacted); ``span_root`` serves a span's root from the stored tree, and
    ``nodes`` lists the summary nodes before a size (they give no index rows). Every
    event a fact names (a negative fact, an open or closed item, a binding, an
    obligation) is read through ``get`` before the fact is served: a rule then never
    decides on an index row whose body was erased or changed behind the store's back.
    ``redacted`` lists the positions a redaction erased (the index holds what they gave
    when appended, which is no longer known).
    """

    def __init__(
        self, index: IndexSource, size: int, get: Get, span_root: SpanRoot,
        nodes: Callable[[int], list[tuple[int, ev.Summary]]], *, readable: int | None = None,
        redacted: Iterable[int] = (),
    ) -> None:
        self.index, self.size = index, size
        #: events before this position may be read (after ``size`` only when the index
        #: gives the same facts there, as it does across spills)
        self.readable = size if readable is None else readable
        self._get, self._span_root, self._nodes_before = get, span_root, nodes
        self._nodes: list[tuple[int, ev.Summary]] | None = None
        self._open: dict[int, dict[int, str]] = {}
        self._redacted = sorted(p for p in redacted if 0 <= p < size)

    def _read(self, positions: Iterable[int]) -> None:
        """Read the events at ``positions`` through ``get``, which raises on a body that no longer holds them."""
        wanted = sorted({p for p in positions if 0 <= p < self.readable})
        prefetch = getattr(self._get, "prefetch", None)
        if prefetch is not None:
            prefetch(wanted)  # one query for all of them, when the reader can
        for p in wanted:
            self._get(p)

    def _open_at(self, at: int) -> dict[int, str]:
        if at not in self._open:
            self._open[at] = self.index.open_at(at)
        return self._open[at]

    def event(self, pos: int) -> ev.Event | None:
        return self._get(pos) if 0 <= pos < self.readable else None

    def read(self, positions: Iterable[int]) -> None:
        self._read(positions)

    def span_root(self, start: int, stop: int) -> bytes:
        return self._span_root(start, stop)

    def nodes(self) -> list[tuple[int, ev.Summary]]:
        if self._nodes is None:
            self._nodes = self._nodes_before(self.size)
        return self._nodes

    def negatives_in(self, start: int, stop: int) -> list[Fact]:
        # A position made negative only at or after the boundary was not negative there.
        rows = [r for r in self.index.negatives(start, stop) if r.num < stop]
        self._read(r.pos for r in rows)
        return [Fact(r.pos, r.key, r.text) for r in rows]  # type: ignore[arg-type]

    def negatives_at(self, positions: Sequence[object]) -> Callable[[object], Fact | None]:
        rows = self.index.negatives_at(_positions(positions, self.size), self.size)
        self._read(rows)
        found = {p: Fact(r.pos, r.key, r.text) for p, r in rows.items()}  # type: ignore[arg-type]
        return lambda p: found.get(int(p)) if isinstance(p, int) and 0 <= p < self.size else None

    def unresolved_at(self, start: int, stop: int) -> list[Item]:
        got = [_item(p, name) for p, name in sorted(self._open_at(stop).items()) if start <= p]
        self._read(i.pos for i in got)
        return got

    def resolved_in(self, start: int, stop: int) -> list[Item]:
        # Open at the start and no longer at the stop: closed inside the span (a close
        # closes every earlier open of its item).
        at_stop = self._open_at(stop)
        got = [_item(p, name) for p, name in self._open_at(start).items() if p not in at_stop]
        self._read(i.pos for i in got)
        return sorted(got, key=lambda i: (i.pos, i.kind, i.id))

    def resolved_before(self, items: Sequence[Item], stop: int) -> set[Item]:
        if not items:
            return set()
        closes: dict[tuple[str, str], list[int]] = {}
        for r in self.index.closes(max(0, min(i.pos for i in items) + 1), stop):
            closes.setdefault(split_item(r.key), []).append(r.pos)
        return {i for i in items if any(i.pos < c < stop for c in closes.get((i.kind, i.id), []))}

    def latest_binding(self, key: str, before: int) -> tuple[int, bool] | None:
        row = self.index.latest_binding(key, before)
        if row is None:
            return None
        self._read([row.pos])
        return (row.pos, bool(row.num))

    def binding(self, pos: int) -> ev.Binding:
        event = self._get(pos)
        assert isinstance(event, ev.Binding), (pos, event)  # the index named it
        return event

    def keys_at(self, positions: Iterable[object]) -> set[str]:
        return {r.key for r in self.index.bindings_at(_positions(positions, self.size))}

    def keys_in(self, start: int, stop: int) -> set[str]:
        return {r.key for r in self.index.bindings_in(start, stop)}

    def open_obligations(self) -> list[tuple[int, str, list[str]]]:
        obligations = {p: _item(p, name).id for p, name in self._open_at(self.size).items()
                       if split_item(name)[0] == "obligation"}
        needs = self.index.needs(sorted(obligations))
        self._read(obligations)
        return [(p, name, needs.get(p, [])) for p, name in sorted(obligations.items())]

    def redacted_in(self, start: int, stop: int) -> list[int]:
        found = self._redacted
        return found[bisect_left(found, start) : bisect_left(found, stop)]

    def attempts(self, key: str) -> list[tuple[int, ev.Attempt | ev.Guard]]:
        # Each read is checked: an attempt erased behind the store's back raises, never resets the guard.
        out: list[tuple[int, ev.Attempt | ev.Guard]] = []
        for p in self.index.attempt_positions(key, self.size):
            a = self._get(p)
            if isinstance(a, ev.Attempt) and a.key == key:
                out.append((p, a))
            elif isinstance(a, ev.Redacted):
                # Erased: the redaction that erased it kept its guard (admission refuses one without).
                redaction = self._get(a.by)
                guards = redaction.guards if isinstance(redaction, ev.Redaction) else []
                out += [(p, g) for g in guards if g.pos == p and g.key == key]
        return out
