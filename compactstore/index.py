"""The structural index: the facts the marker checks need, kept in step with the log.

Closure, negative-fact retention and the needed bindings of anchoring are facts about
a node's span and the session's open items, and reading them off the events costs a
pass over the whole log. The index keeps them as rows (see
:class:`compactstore.structure.IndexRow`), derived by
:class:`compactstore.structure.Deriver` from each event as it is appended and written
in the same transaction, so a marker check asks for what it needs in O(log n) queries
plus the size of the answer:

- the items open at a boundary: the snapshot at the multiple of SNAPSHOT_EVERY below
  it, then the opens and closes since (at most SNAPSHOT_EVERY positions); those open
  at a node's start and not at its stop are the ones its span closed (its ``resolved``);
- the negative facts of a span: the ``negative`` rows of its positions;
- the latest binding of a key before a position: one descending index probe.

Compaction asks the same questions of a span (:class:`compactstore.compaction.IndexedFacts`),
and a few more: the binding rows of the span or of given positions, the close rows
after an item, the negative rows at given positions; the summary nodes, which give no
rows, it reads from the log by their kind.

The index of every session is complete: each append writes its rows in its own
transaction. A session with redactions (a redacted body no longer gives the facts it
gave when appended) takes the full path over the events. ``verify()`` derives the whole
index again from the bodies and reports every row that differs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import msgspec

from . import events as ev
from .backends import all_heads
from .errors import IntegrityError, InvalidEvent
from . import structure
from .structure import STRUCTURAL_KINDS, Deriver, IndexRow, apply_items, superseded_text

if TYPE_CHECKING:
    from .backends import Backend, Writer

_RELS = frozenset({"open", "close", "negative", "binding", "attempt", "open_at"})
_PLAIN = ev.GraphState(id="-")  # stands for an event that gives no row
_CHUNK = 2048

#: ``(rels, lo, hi) -> rows``: a backend's or a writer's read of one session's index rows.
_Rows = Callable[[Sequence[str], int, int], list[IndexRow]]


def may_give_rows(body: bytes | None, kind: str) -> bool:
    """Return whether a stored row may give index rows, from its kind and bytes alone (no decoding).

    Only structural kinds and events with a ``status`` or ``supersedes`` can; a redacted
    row (no body) is counted in, as the derivation must meet it.
    """
    return body is None or kind in STRUCTURAL_KINDS or b'"status":' in body or b'"supersedes":' in body


def _event(body: bytes | None, kind: str) -> ev.Event:
    """Decode ``body``, or skip it when its kind and bytes show it gives no index row."""
    if not may_give_rows(body, kind):
        return _PLAIN
    if body is None:
        return ev.Redacted(by=-1)
    return ev.decode_canonical(body)


def _open_at(rows: _Rows, at: int) -> dict[int, str]:
    """Return the items open at boundary ``at`` (position -> item), from the index rows ``rows`` reads."""
    base = at - at % structure.SNAPSHOT_EVERY
    items = {r.num: r.key for r in rows(("open_at",), base, base + 1)} if base else {}
    apply_items(items, rows(("open", "close"), base, at))
    return items


class Index:
    """The structural index of one session, read through its backend's typed verbs."""

    def __init__(self, backend: Backend, session_id: int) -> None:
        """Read the index of session ``session_id`` of ``backend``."""
        self.backend = backend
        self.sid = session_id

    def _rows(self, rels: Sequence[str], lo: int, hi: int) -> list[IndexRow]:
        return self.backend.index_rows(self.sid, rels, lo, hi)

    def open_at(self, at: int) -> dict[int, str]:
        """Return the items open at boundary ``at`` (position -> item)."""
        return _open_at(self._rows, at)

    def negatives(self, start: int, stop: int) -> list[IndexRow]:
        """Return the ``negative`` rows a node over ``[start, stop)`` is held to, by position.

        Those of positions in the span, whatever made them negative when, and those of
        earlier positions that an event in the span made negative (their ``num``).
        """
        return [*self.backend.negatives_caused(self.sid, start, stop), *self._rows(("negative",), start, stop)]

    def latest_binding(self, key: str, before: int) -> IndexRow | None:
        """Return the ``binding`` row of the last binding of ``key`` before ``before``."""
        return self.backend.latest_binding(self.sid, key, before)

    def needs(self, positions: Sequence[int]) -> dict[int, list[str]]:
        """Return the bindings each obligation opened at ``positions`` needs.

        Raises:
            IntegrityError: a row does not hold a list of keys (the index was altered).
        """
        out = {}
        for r in self.backend.index_rows_at(self.sid, "open", positions):
            try:
                out[r.pos] = msgspec.json.decode(r.text, type=list[str])
            except msgspec.DecodeError:
                raise IntegrityError(f"structural index row at pos {r.pos} is not a list of keys", pos=r.pos) from None
        return out

    def negatives_at(self, positions: Iterable[int], before: int) -> dict[int, IndexRow]:
        """Return the ``negative`` rows at ``positions`` of the events negative at checkpoint ``before``.

        An event made negative only at or after ``before`` (superseded later) was not negative there.
        """
        wanted = sorted({p for p in positions if 0 <= p < before})
        return {r.pos: r for r in self.backend.index_rows_at(self.sid, "negative", wanted) if r.num < before}

    def bindings_at(self, positions: Iterable[int]) -> list[IndexRow]:
        """Return the ``binding`` rows at ``positions`` (those >= 0), by position."""
        return self.backend.index_rows_at(self.sid, "binding", sorted({p for p in positions if p >= 0}))

    def bindings_in(self, start: int, stop: int) -> list[IndexRow]:
        """Return the ``binding`` rows of positions ``[start, stop)``, by position."""
        return self._rows(("binding",), start, stop)

    def closes(self, start: int, stop: int) -> list[IndexRow]:
        """Return the ``close`` rows of positions ``[start, stop)``, by position."""
        return self._rows(("close",), start, stop) if start < stop else []

    def nodes(self, start: int, stop: int) -> list[tuple[int, ev.Summary]]:
        """Return ``(position, node)`` of the summary nodes at positions ``[start, stop)``, by position.

        Read from the log (nodes give no index rows): one query on the events' kind, and
        only the nodes' bodies decoded.
        """
        out = []
        for pos, body in self.backend.node_bodies(self.sid, start, stop):
            node = None if body is None else ev.decode_canonical(body)
            if isinstance(node, ev.Summary):
                out.append((pos, node))
        return out


    def rows_in(self, lo: int, hi: int) -> list[IndexRow]:
        """Return every row at positions ``[lo, hi)`` (any relation), by position."""
        return self._rows(sorted(_RELS), lo, hi)

    def rows_at(self, positions: Sequence[int]) -> list[IndexRow]:
        """Return every row at ``positions`` (any relation), by position."""
        wanted = set(positions)
        lo, hi = min(wanted), max(wanted) + 1
        return [r for r in self._rows(sorted(_RELS), lo, hi) if r.pos in wanted]

    def attempt_positions(self, key: str, before: int) -> list[int]:
        """Return the positions of the attempts under idempotency key ``key`` before ``before``, in order.

        The caller reads each through its checked read, so a body erased behind the
        store's back is an IntegrityError, not a forgotten attempt.
        """
        return [r.pos for r in self._rows(("attempt",), 0, before) if r.key == key]


class _Prior:
    """What came before a derivation, read from the index and the log inside the write transaction."""

    def __init__(self, writer: Writer, before: int, pending: Sequence[ev.Event]) -> None:
        self.writer = writer
        # The events of the append being indexed, from position ``before``: written in the
        # same transaction, after the index.
        self.before, self.pending = before, pending

    def is_negative(self, pos: int) -> bool:
        return bool(self.writer.index_rows_at("negative", [pos]))

    def latest_binding(self, key: str, before: int) -> int | None:
        got = self.writer.latest_binding(key, before)
        return None if got is None else got.pos

    def superseded_text(self, pos: int) -> str:
        if 0 <= pos - self.before < len(self.pending):
            return superseded_text(self.pending[pos - self.before])
        body = self.writer.body(pos)
        return "" if body is None else superseded_text(ev.decode_canonical(body))

    def open_at(self, pos: int) -> list[tuple[int, str]]:
        return sorted(_open_at(self.writer.index_rows, pos).items())


def extend(writer: Writer, session_id: int, before: int, fresh: Sequence[ev.Event]) -> None:
    """Write the index rows of ``fresh``, appended at ``before`` onwards, in their transaction (before their insert).

    ``session_id`` is the writer's session.
    """
    # Most appends (turns, checkpoints) that cross no snapshot boundary have nothing to write.
    every = structure.SNAPSHOT_EVERY
    if (before + len(fresh)) // every == before // every and structure.all_inert(fresh):
        return
    deriver = Deriver(before, _Prior(writer, before, fresh))
    deriver.extend(fresh)
    if deriver.rows:
        writer.insert_index(deriver.rows)


def _log(backend: Backend, session_id: int, start: int, stop: int) -> Iterator[tuple[int, ev.Event]]:
    """Yield ``(position, event)`` of the stored log ``[start, stop)``, skipping the decoding of plain events."""
    for r in backend.rows(session_id, start, stop, _CHUNK):
        yield int(r.pos), _event(None if r.body is None else bytes(r.body), str(r.kind))


# --- verification ------------------------------------------------------------------


class _Rebuilt:
    """The prior of a derivation from position 0: nothing came before; texts come from the log."""

    def __init__(self, backend: Backend, session_id: int) -> None:
        self.backend, self.sid = backend, session_id

    def is_negative(self, pos: int) -> bool:
        return False

    def latest_binding(self, key: str, before: int) -> int | None:
        return None

    def superseded_text(self, pos: int) -> str:
        body = self.backend.body(self.sid, pos)
        try:
            return "" if body is None else superseded_text(ev.decode_canonical(body))
        except InvalidEvent:
            return ""

    def open_at(self, pos: int) -> list[tuple[int, str]]:
        return []


def verify_session(
    backend: Backend, session_id: int, heads: Iterable[int], add: Callable[[int | None, str], None], *,
    full: bool = True,
    derived: Rederivation | None = None,
) -> None:
    """Derive the session's index again from its bodies and report every row that differs.

    ``heads`` are the sizes of the session's stored tree heads: the index must hold
    what the log up to the latest gives. ``add(pos, what)`` reports a problem. With
    ``full`` false (a session with redactions, whose erased bodies no longer give their
    facts, and whose index is never read: see :meth:`Index.of`) only the kinds of the
    rows are checked. ``derived``: the index already derived from the log by a pass
    that read it (else it is read here).
    """
    stored = _stream(backend, session_id)
    if not full:
        for r in stored:
            if r.rel not in _RELS:
                add(r.pos, f"row {tuple(r)} is not an index row")
        return
    try:
        # A derivation up to another size (rows written since it started) is done again here.
        size = max(heads, default=0)
        rows = derived.rows() if derived is not None and derived.stop == size else derive(backend, session_id, size)
    except (InvalidEvent, AssertionError):
        rows = None
    if rows is None:
        add(None, "the log cannot be read in order to derive the index again")  # the log's own checks say why
        return
    want = sorted(rows, key=_order)
    got = sorted(stored, key=_order)
    if want != got:
        wanted, have = set(want), set(got)
        for r in sorted(have - wanted, key=_order)[:20]:
            add(r.pos, f"row {tuple(r)} is not what the log gives")
        for r in sorted(wanted - have, key=_order)[:20]:
            add(r.pos, f"row {tuple(r)} is missing")
        if len(got) != len(set(got)):
            add(None, "a row is stored twice")


def derive(backend: Backend, session_id: int, size: int) -> list[IndexRow]:
    """Return the index of the first ``size`` positions of a session, derived from its stored log alone.

    Raises:
        InvalidEvent: a body is not a valid event.
    """
    deriver = Deriver(0, _Rebuilt(backend, session_id))
    for pos, event in _log(backend, session_id, 0, size):
        deriver.add(pos, event)
    return deriver.rows


def missing_rows(backend: Backend, session_id: int, size: int) -> list[IndexRow]:
    """Return the rows the index of a session's first ``size`` positions lacks, derived from its log (a migration's).

    The index is insert-only, so what a schema adds to it is new rows; a stored row the
    derivation does not give is not the store's own.

    Raises:
        IntegrityError: the index holds a row the log does not give (it was altered).
        InvalidEvent: a body is not a valid event.
    """
    want = set(derive(backend, session_id, size))
    stored = _stream(backend, session_id)
    extra = [r for r in stored if r not in want]
    if extra:
        raise IntegrityError(f"structural index row {tuple(extra[0])} is not what the log gives", pos=extra[0].pos)
    have = set(stored)
    return sorted((r for r in want if r not in have), key=_order)


def event_of(body: bytes | None, kind: str) -> ev.Event | None:
    """Return a stored row's event as :func:`derive` reads it, or None for one that gives no index row.

    Raises:
        InvalidEvent: the body is one to decode and is not a valid event.
    """
    event = _event(body, kind)
    return None if event is _PLAIN else event


class Rederivation:
    """The index of a session derived again from rows read elsewhere, in position order (verify's pass).

    It takes what :func:`derive` would read of positions ``[0, stop)``: the positions of
    the rows, and the events of those that may give index rows (:func:`event_of`, None
    for a body that cannot be read). The rows in between give no row of their own and
    are only counted, so a plain log costs O(1) per batch of rows, not a pass over it.
    """

    def __init__(self, backend: Backend, session_id: int, stop: int) -> None:
        #: the position past the last one derived: the size of the session's latest head
        self.stop = stop
        self._deriver = Deriver(0, _Rebuilt(backend, session_id))
        self._next = 0  # the position the next row must have
        self._failed = False

    def take(self, positions: Sequence[int], events: Iterable[tuple[int, ev.Event | None]]) -> None:
        """Take the next rows: their positions in order (a ``range`` when consecutive) and the events among them."""
        if self._failed:
            return
        stop, nxt = self.stop, self._next
        if isinstance(positions, range) and positions.step == 1:
            lo, hi = max(positions.start, 0), min(positions.stop, stop)
            ok = lo >= hi or lo == nxt
            nxt = max(nxt, hi)
        else:
            kept = [p for p in positions if 0 <= p < stop]
            ok = kept == list(range(nxt, nxt + len(kept)))
            nxt += len(kept)
        if not ok:
            self._failed = True  # derive() stops at the first position out of order: its outcome is the same
            return
        for pos, event in events:
            if 0 <= pos < stop:
                if event is None:
                    self._failed = True
                    return
                self._plain_upto(pos)
                self._deriver.add(pos, event)
        self._next = nxt

    def rows(self) -> list[IndexRow] | None:
        """Return what :func:`derive` gives up to ``stop``.

        None where :func:`derive` raises: a body is not a valid event, or the positions
        are not 0, 1, 2, ...
        """
        if self._failed:
            return None
        self._plain_upto(self._next)
        return list(self._deriver.rows)

    def _plain_upto(self, pos: int) -> None:
        """Take the plain events at the positions up to ``pos``."""
        self._deriver.skip(pos)


def _order(r: IndexRow) -> tuple[int, str, int, str, str]:
    return (r.pos, r.rel, r.num, r.key, r.text)


def _stream(backend: Backend, session_id: int) -> list[IndexRow]:
    out: list[IndexRow] = []
    after: tuple[int, str, int] = (-(2**62), "", -(2**62))
    while True:
        got = backend.index_after(session_id, after, _CHUNK)
        out.extend(got)
        if len(got) < _CHUNK:
            return out
        after = (got[-1].pos, got[-1].rel, got[-1].num)


def orphans(backend: Backend) -> list[object]:
    """Return the session ids the index names that no session has, as stored."""
    return backend.index_orphans()


def verify_index(backend: Backend, sessions: Sequence[tuple[int, str]], add: Callable[[str | None, int | None, str], None]) -> None:
    """Check the structural index of every session of a store; ``add(session, pos, what)`` reports a problem.

    Called by :meth:`Store.verify` once the log itself is checked.
    """
    verify_orphans(backend, lambda pos, what: add(None, pos, what))
    for sid, name in sessions:
        verify_stored_session(backend, sid, lambda pos, what, name=name: add(name, pos, what))  # type: ignore[misc]


def verify_orphans(backend: Backend, add: Callable[[int | None, str], None]) -> None:
    """Report the index's rows of sessions that do not exist; ``add(pos, what)``."""
    for sid in orphans(backend):
        add(None, f"rows name session id {sid!r}, which does not exist")


def verify_stored_session(
    backend: Backend, sid: int, add: Callable[[int | None, str], None], derived: Rederivation | None = None
) -> None:
    """Check the structural index of one session of ``backend``, against ``derived`` if given (see :func:`verify_session`)."""
    heads = [h.size for h in all_heads(backend, sid, _CHUNK)]
    verify_session(backend, sid, heads, add, full=not backend.erasures(sid), derived=derived)
