"""Admission: every derived event is held to the rules against the log before it, whichever way it arrives.

The commit (:mod:`.commit`) calls :meth:`Admission.admit` inside its write transaction,
under the session's lock, for every summary node, spill, marker, attempt and redaction
of a batch; :meth:`Admission.rule_problems` holds a stored log to the same rules, for
``verify()``. The facts come from the structural index when the event reads only the
stored log, else from one pass over the stored log and the batch before the event.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .. import events as ev
from .. import merkle, retention, rules
from ..backends import Row
from ..content import content_digest_of
from ..errors import CompactStoreError, IntegrityError, InvalidEvent
from ..facts import Facts, FullFacts, IndexedFacts
from ..structure import build
from .heads import HASH
from .reader import Reader

#: Derived events the store admits only if they keep the rules (see :mod:`compactstore.rules`).
ADMITTED = (ev.Summary, ev.Spill, ev.RecoveryMarker, ev.Redaction, ev.Attempt, ev.Retention)
#: The same as exact types: a prepared event is always of a registered type (none subclasses
#: another), and ``type(e) in`` a set costs far less than ``isinstance`` through msgspec's metaclass.
ADMITTED_TYPES = frozenset(ADMITTED)


def is_position(value: object) -> bool:
    """Return whether ``value`` is an int position (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= ev.MAX_POSITION


class Pass:
    """One pass over a session's stored log and a batch after it: the facts of a commit the index cannot give."""

    def __init__(self, session: Reader, first: int, events: Sequence[ev.Event], leaves: Sequence[bytes]) -> None:
        records = list(session.scan(0, first))
        self.events = [r.event for r in records] + list(events)
        self.leaves = [r.leaf for r in records] + list(leaves)
        self.s = build(())

    def erase(self, positions: Iterable[int], by: int) -> None:
        """Take in a redaction of the batch (at ``by``): the events after it see ``positions`` erased."""
        for p in positions:
            if 0 <= p < len(self.events):
                self.events[p] = ev.Redacted(by=by)
        self.s = build(())

    def facts(self, size: int) -> FullFacts:
        """Return the facts of the first ``size`` events (the structure advances; it is rebuilt only to go back)."""
        if self.s.size > size:
            self.s = build(enumerate(self.events[:size]))
        for pos in range(self.s.size, size):
            self.s.add(pos, self.events[pos])
        leaves = self.leaves
        return FullFacts(self.events[:size], lambda a, b: merkle.span_root_of_leaves(leaves, a, b), self.s)


class Admission:
    """The admission of derived events into session ``reader.name``, reading the log through ``reader``."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.host = reader.host
        self.name = reader.name

    def admit(self, first: int, fresh: Sequence[ev.Prepared], rows: Sequence[Row], leaves: Sequence[bytes]) -> None:
        """Refuse the batch appended at ``first`` unless every derived event in it keeps the rules.

        Each summary node, spill, marker and attempt is held, by :mod:`compactstore.rules`,
        to the log before it as it stands under the lock; a node's span root and content digest
        to the span's bodies. The facts come from the structural index when the event
        reads only the stored log (what ``compact``, ``roll_up`` and ``mark`` append:
        spills and a node, or a marker, at the head), else from one pass over the stored
        log and the batch before the event.

        Raises:
            InvalidEvent, InvalidArgument: a derived event is malformed or contradicts the log.
            CompactionInvariantError: a node claims a loss class it does not meet, or loses
                what an open obligation needs.
            MarkerInvalid: a marker's conditions do not hold at its checkpoint.
            ReconstructionUnsoundError: an attempt acts on a literal other than an
                earlier attempt under its key used.
        """
        events = [p.event for p in fresh]
        sid = self.reader.sid()
        redacted = sid is not None and bool(self.host.backend.redactions(sid))
        reader = self.reader.reader(first)

        def get(pos: int) -> ev.Event | None:
            return events[pos - first] if first <= pos < first + len(events) else reader(pos)

        passed: Pass | None = None
        erased: list[tuple[list[int], int]] = []  # the batch's redactions so far, for the events after them
        for j, event in enumerate(events):
            if not isinstance(event, ADMITTED):
                continue
            pos = first + j
            if isinstance(event, ev.Redaction):
                self._redaction(event, first, events[:j])
                erased.append((list(event.positions), pos))
                if passed is not None:
                    passed.erase(*erased[-1])
                continue
            if isinstance(event, ev.Retention) and len(events) > 1:
                raise InvalidEvent(f"events[{j}]", "a retention is appended alone: what it drops is read as the log stands")
            gone = {p for positions, _ in erased for p in positions}
            if gone and rules.built_from(event, gone, {}):
                # Built before the erasure it follows (a later commit reads the erased body as gone).
                where = f"events[{j}]" if len(events) > 1 else "event"
                raise InvalidEvent(where, f"the {event.kind} at pos {pos} was built from positions the redaction "
                                   "before it in this batch erases: append it after the redaction commits")
            needs = event.size if isinstance(event, ev.RecoveryMarker) else pos
            # Spills give no structural facts: the index at ``first`` still answers after them.
            # A session's first batch has no stored log (nor, outside this transaction, an id) to index.
            stored = (first > 0 and not redacted and all(isinstance(e, ev.Spill) for e in events[:j])
                      and (not isinstance(event, ev.Summary) or event.stop <= first))
            f: Facts
            if stored:
                f = IndexedFacts(self.reader.index(), min(needs, first), get, self.reader.span_root, self.reader.nodes_before,
                                 readable=needs)
            else:
                if passed is None:
                    passed = Pass(self.reader, first, events, leaves)
                    for positions, by in erased:
                        passed.erase(positions, by)
                f = passed.facts(needs)
            try:
                self.one(f, event, pos, first, rows, settled=self.settled())
            except (InvalidEvent, IntegrityError) as exc:
                if len(events) == 1 or not isinstance(exc, InvalidEvent):
                    raise
                raise InvalidEvent(f"events[{j}].{exc.field}", exc.reason) from exc

    def after(self, positions: Iterable[int], first: int, batch: Sequence[ev.Event]) -> list[tuple[int, ev.Event]]:
        """Return ``(position, event)`` from the first of ``positions`` to the end of ``batch`` (appended at ``first``)."""
        lo = min((p for p in positions if is_position(p)), default=first + len(batch))
        logged = [(r.pos, r.event) for r in self.reader.scan(lo, first)] if lo < first else []
        return logged + [(first + i, e) for i, e in enumerate(batch) if first + i >= lo]

    def _redaction(self, redaction: ev.Redaction, first: int, batch: Sequence[ev.Event]) -> None:
        """Refuse a redaction (after ``batch``, appended at ``first``) that leaves a derived copy of what it erases."""
        after = self.after(redaction.positions, first, batch)
        named = set(redaction.positions)
        rules.admit_redaction({p: e for p, e in after if p in named}, after, redaction)

    def one(self, f: Facts, event: ev.Event, pos: int, first: int, rows: Sequence[Row],
                   content: bool = True, settled: set[int] | None = None) -> None:
        """Hold one derived event to the rules; ``settled`` is :meth:`_settled` when admission may use it (``verify`` does not)."""
        if isinstance(event, ev.Summary):
            rules.admit_node(f, event, pos)
            if content and rules.by_bodies(event):
                self._content(event, first, rows)
        elif isinstance(event, ev.Spill):
            rules.admit_spill(f, event, pos)
        elif isinstance(event, ev.Attempt):
            rules.admit_attempt(f, event, pos)
        elif isinstance(event, ev.Retention):
            retention.check(self.reader, f, event, pos, settled if settled is not None else ())
        elif isinstance(event, ev.RecoveryMarker):
            rules.admit_marker(f, event, pos, settled if settled is not None else ())
            if settled is not None:
                # Its cover met every condition; those over the nodes' own spans hold for good.
                settled.update(p for p in rules.marker_cover(event) if p < first)
            root = f.span_root(0, event.size) if event.size else merkle.empty_root(HASH)
            if event.root != root.hex():
                raise InvalidEvent("root", f"got {event.root[:16]}…, the log's root at size {event.size} is {root.hex()[:16]}…")
            # Its MAC is held to the key at resume: a copy into a store with another key keeps the source's.

    def settled(self) -> set[int]:
        """Return the positions of this session's stored nodes that met the marker conditions over their own spans.

        Those conditions read only the log before each node, which never changes but by a
        redaction: the set is kept per redaction count.
        """
        sid = self.reader.sid()
        if sid is None:
            return set()
        erasures = len(self.host.backend.erasures(sid))
        return self.host.caches.kept("settled", sid, erasures, set)

    def rule_problems(self) -> list[tuple[int, str]]:
        """Return ``(position, why)`` for each stored derived event that breaks a rule of its log.

        Each summary node, spill and marker is held to the log before it, as at admission,
        so a store written behind the library's back (rows inserted with valid hashes) is
        caught by :meth:`Store.verify`. Content digests are verify's own check. In a
        session with redactions only the events appended after the last one are held to
        the rules: an erased body no longer gives the facts the earlier ones were admitted on.
        """
        sid = self.reader.sid()
        if sid is None:
            return []
        size = self.reader.size
        # What a redaction or a retention erased is read as gone since: the events before
        # the last of them were admitted on bodies that no pass can read again.
        erased = self.host.backend.redactions(sid)
        erasers = self.host.backend.erasures(sid)
        after = max(erasers.values()) + 1 if erasers else 0
        found: list[tuple[int, str]] = []
        try:
            passed = Pass(self.reader, size, (), ()) if erased else None
        except CompactStoreError as exc:
            return [(-1, f"the log does not read: {exc}")]
        # A retention, once its bodies are gone, is held to what its facts still say.
        for by in sorted(set(erasers.values()) - set(erased.values())):
            try:
                event = self.reader.read(by).event
                if isinstance(event, ev.Retention):
                    at: Facts = passed.facts(by) if passed is not None else IndexedFacts(
                        self.reader.index(), by, self.reader.reader(by), self.reader.span_root, self.reader.nodes_before)
                    rows = self.reader.index_rows(list(ev.SpanSet(event.spans)))
                    found += [(by, why) for why in retention.stored_problems(at, event, by, rows)]
            except CompactStoreError as exc:
                found.append((by, str(exc)))
        for pos in self.host.backend.derived_positions(sid, after, size):
            try:
                event = self.reader.read(pos).event
                if not isinstance(event, ADMITTED):
                    continue
                needs = min(event.size, pos) if isinstance(event, ev.RecoveryMarker) else pos
                f: Facts = (passed.facts(needs) if passed is not None else
                            IndexedFacts(self.reader.index(), needs, self.reader.reader(needs), self.reader.span_root, self.reader.nodes_before))
                self.one(f, event, pos, pos, (), content=False)
            except CompactStoreError as exc:
                found.append((pos, str(exc)))
        return found

    def _content(self, node: ev.Summary, first: int, rows: Sequence[Row]) -> None:
        """Refuse a node whose span root or content digest is not that of its span's bodies.

        A node is trusted with its content digest only because nothing else can enter the
        log: a restoration that proves the node's leaf in a sealed head and matches the
        digest then has the very bodies the tree holds, without rehashing the tree. The
        bodies are the stored ones, or those of ``rows`` (the batch, from ``first``).
        """
        start, stop = node.start, node.stop
        try:
            if stop <= first:
                got = self.reader.span(start, stop)
                root, digest = got.span_root, got.digest
            else:
                root, digest = self._pending_span(start, stop, first, rows)
        except IntegrityError as exc:
            raise InvalidEvent("content_digest", exc.args[0]) from exc
        if root.hex() != node.span_root:
            raise InvalidEvent("span_root", f"[{start}, {stop}) gives {root.hex()[:16]}…, the node says {node.span_root[:16]}…")
        want = None if digest is None else digest.hex()
        if node.content_digest != want:
            if want is None:
                raise InvalidEvent("content_digest", f"[{start}, {stop}) holds a redacted body: nothing to digest")
            got_text = node.content_digest or "none"
            raise InvalidEvent("content_digest", f"got {got_text[:16]}…, the bodies of [{start}, {stop}) give {want[:16]}…")

    def _pending_span(self, start: int, stop: int, first: int, rows: Sequence[Row]) -> tuple[bytes, bytes | None]:
        """Return the span root and content digest of ``[start, stop)``, part of it in this batch's ``rows``."""
        stored = list(self.reader.scan(start, first)) if start < first else []
        if len(stored) != max(0, first - start):
            raise IntegrityError(f"[{start}, {first}) is not complete", session=self.name)
        leaves, bodies, redacted = [], [], False
        for r in stored:
            if r.kind == "redacted":
                redacted = True
            elif merkle.leaf_hash(r.body) != r.leaf:
                raise IntegrityError(f"the body at pos {r.pos} does not match its leaf", session=self.name, pos=r.pos)
            leaves.append(r.leaf)
            bodies.append(r.body)
        for row in rows[max(0, start - first) : stop - first]:
            leaves.append(row.leaf)
            bodies.append(row.body or b"")
        root = merkle.span_root_of_leaves(leaves, start, stop, first=start)
        return root, None if redacted else content_digest_of([bodies])

    def check_erasable(self, redaction: ev.Redaction, by: int) -> list[int]:
        """Refuse a redaction of positions already redacted; return those whose bodies it erases.

        A position retention dropped may be named (what was built from it goes with the
        redaction): its body is gone already, and it stays recorded as dropped.
        """
        positions = redaction.positions
        if not positions or len(set(positions)) != len(positions):
            raise InvalidEvent("positions", "must list distinct positions, at least one")
        sid = self.reader.require_sid()
        done = self.host.backend.erasures(sid)
        redacted = self.host.backend.redactions(sid) if done else {}
        for p in positions:
            if not 0 <= p < by:
                raise InvalidEvent("positions", f"{p} is not an earlier position (< {by})")
            if p in redacted:
                raise InvalidEvent("positions", f"{p} was already redacted by the event at pos {done[p]}")
        return [p for p in positions if p not in done]
