"""The one commit of a session, and the admission of every derived event inside it.

:meth:`Writer.extend` is the only way into the log: it validates and encodes the events,
hashes their leaves, and in one backend write transaction compares the head it builds on
(a compare-and-append), refuses a head behind what this handle proved, admits every
derived event by the rules (:mod:`compactstore.rules`) against the log as it stands
under the lock, and writes the events, the subtree roots they complete, the structural
index rows and a sealed head. A refusal raises the rule's typed error and writes nothing.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat

import msgspec

from .. import events as ev
from .. import index as structure_index
from .. import merkle, retention, rules
from ..backends import HeadRow, Row, Rows
from ..errors import (
    ConflictError,
    IntegrityError,
    InvalidArgument,
    InvalidEvent,
    KeyRequired,
    SessionMoved,
    StaleHead,
)
from ..events import Record, as_list
from ..seal import seq_runs
from ..structure import IndexRow
from .caches import Prefix
from .heads import EMPTY_ROOT, HASH, position
from .admission import ADMITTED_TYPES, Admission, is_position
from .reader import Reader

#: The kind tag of each event type (what ``Event.kind`` returns), looked up once per row.
KINDS: dict[type[ev.Event], str] = {t: str(t.__struct_config__.tag) for t in ev.EVENT_TYPES}
new_tuple = tuple.__new__
#: A prepared event's parts, read in C by ``map``.
BODY, EVENT, KEY = operator.attrgetter("body"), operator.attrgetter("event"), operator.attrgetter("key")
SUPERSEDES = operator.attrgetter("supersedes")
NO_SUPERSEDES = frozenset({None})
#: How often a builder's compare-and-append is tried again when another writer moved the session.
RETRIES = 16


class Writer:
    """The commit of session ``name``, reading the log through ``reader``."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.host = reader.host
        self.name = reader.name
        self.admission = Admission(reader)

    def append(self, event: ev.Event, *, idempotency_key: str | None = None) -> Record:
        """Append one event and return its record.

        With ``idempotency_key``, a retry of the same event returns the first record and
        writes nothing (a timestamp the store stamped is not compared).

        Raises:
            InvalidEvent: naming the bad field; nothing is written.
            ConflictError: the key was already used for a different event.
        """
        if idempotency_key is None:
            prepared = self._prepare_plain([event])
        else:
            prepared = [self._prepare(0, event, idempotency_key, False)]
        return self._commit(lambda _pos: prepared, speculate=True)[0]

    def extend(
        self,
        events: Sequence[ev.Event],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
        expect_size: int | None = None,
    ) -> list[Record]:
        """Append events in one transaction; all are written or none.

        This is the one commit of the store: every other write (``append``, ``compact``,
        ``mark``, the adapters) goes through it.

        Args:
            idempotency_keys: one key (or None) per event; a retried event with the same
                key returns its first record and writes nothing.
            expect_size: compare-and-append: write only if the session holds exactly this
                many events when the write transaction has its lock.

        Raises:
            InvalidEvent: naming the event's index and field; nothing is written.
            SessionMoved: the session is not at ``expect_size``; nothing is written.
            ConflictError: an idempotency key was already used for a different event.
        """
        if expect_size is not None:
            position("expect_size", expect_size)
        events = as_list("events", events)
        if idempotency_keys is not None:
            idempotency_keys = as_list("idempotency_keys", idempotency_keys)
        if idempotency_keys is not None and len(idempotency_keys) != len(events):
            raise InvalidArgument("idempotency_keys", f"{len(idempotency_keys)} keys for {len(events)} events")
        if idempotency_keys is not None:
            given = [k for k in idempotency_keys if k is not None]
            if len(set(given)) != len(given):
                raise InvalidArgument("idempotency_keys", "a key appears twice in one batch")
        if idempotency_keys is None:
            prepared = self._prepare_plain(events)
        else:
            prepared = [self._prepare(i, e, idempotency_keys[i], len(events) > 1) for i, e in enumerate(events)]
        if not prepared:
            return []
        if expect_size is None:
            return self._commit(lambda _pos: prepared, speculate=True)

        def checked(size: int) -> list[ev.Prepared]:
            if size != expect_size:
                raise SessionMoved(session=self.name, got=size, want=expect_size)
            return prepared

        return self._commit(checked, speculate=True)

    def _prepare_plain(self, events: list[ev.Event]) -> list[ev.Prepared]:
        """Return what ``_prepare`` returns for each of ``events`` appended without idempotency keys."""
        batch = len(events) > 1
        # The common case (a registered event, no key, stamped here) in one loop; the rest as _prepare does it.
        return ev.prepare(events, self.host.clock, lambda i, e: self._prepare(i, e, None, batch))

    def _commit(self, build: Callable[[int], Sequence[ev.Prepared]], *, speculate: bool = False) -> list[Record]:
        """Append what ``build(first_position)`` returns, in one transaction under the session's lock.

        ``build`` runs inside the transaction and may refuse on the size it is given
        (the compare of a compare-and-append). Every derived event is admitted by the
        rules against the log as it stands under the lock (:meth:`_admit`).
        ``speculate``: the backend may build on the head it committed last and take the
        lock with the insert; if another writer appended meanwhile, nothing is written
        and the append is built again under the lock.
        """
        if self.host.keyed and not self.host.has_key:
            raise KeyRequired("append", session=self.name)
        if speculate:
            try:
                return self._commit_with(build, True)
            except (StaleHead, SessionMoved):
                pass  # the remembered head may be stale either way: decide again under the lock
        return self._commit_with(build, False)

    def _commit_with(self, build: Callable[[int], Sequence[ev.Prepared]], speculate: bool) -> list[Record]:
        store, backend = self.host, self.host.backend
        with backend.writer(self.name, speculate=speculate) as w:
            sid = w.session_id
            head = w.head()
            self._not_behind(sid, head, speculate)
            frontier = self._frontier(sid, head, w.hashes)
            prepared = build(frontier.size)
            # Retries of idempotent appends replay their first record and write nothing.
            replays: dict[int, Record] = {}
            fresh: list[ev.Prepared] = []
            erasures: list[tuple[ev.Redaction | ev.Retention, int]] = []
            first = frontier.size
            admitted, admit_types = False, ADMITTED_TYPES
            events = list(map(EVENT, prepared))
            # Most batches (no keys, nothing superseded, no derived event) take every event as
            # it is: checked in C, without the loop below.
            plain = (not any(map(KEY, prepared)) and NO_SUPERSEDES.issuperset(map(SUPERSEDES, events))
                     and admit_types.isdisjoint(map(type, events)))
            for i, p in enumerate(() if plain else prepared):
                event = p.event
                if p.key is not None:
                    earlier = w.find_idempotent(p.key)
                    if earlier is not None:
                        replays[i] = self._replay(earlier, p)
                        continue
                pos = first + len(fresh)
                if event.supersedes is not None and event.supersedes >= pos:
                    w.confirm()  # the position counts only if the head is the latest
                    where = f"events[{i}].supersedes" if len(prepared) > 1 else "supersedes"
                    raise InvalidEvent(where, f"must name an earlier position (< {pos}), got {event.supersedes}")
                fresh.append(p)
                if type(event) in admit_types:
                    admitted = True
                    if isinstance(event, ev.Redaction | ev.Retention):
                        erasures.append((event, pos))
            if plain:
                fresh = list(prepared)
            elif len(fresh) < len(prepared):
                events = list(map(EVENT, fresh))
            rows: Sequence[Row] = ()
            new: list[Record] = []
            proven: Prefix | None = None
            if fresh:
                seqs = w.next_seqs(len(fresh))
                # The leaves in one call (hashed side by side); the rows and records column by
                # column through map and zip, which run in C: a loop of bytecode per event cost
                # more than building them (no body is decoded again).
                bodies = list(map(BODY, fresh))
                leaves = merkle.leaf_hashes(bodies, HASH)
                kinds = list(map(KINDS.__getitem__, map(type, events)))
                at = range(first, first + len(fresh))
                if len(fresh) == 1:  # one append: the columns' maps and lists would cost more than they save
                    p, kind, leaf = fresh[0], kinds[0], leaves[0]
                    rows = [new_tuple(Row, (seqs[0], sid, first, kind, p.key, leaf, p.body))]
                    new = [Record(self.name, seqs[0], first, kind, p.event, p.body, leaf)]
                else:
                    rows = Rows(seqs, sid, at, kinds, list(map(KEY, fresh)), leaves, bodies)
                    new = list(map(Record, repeat(self.name), seqs, at, kinds, events, bodies, leaves))
                if admitted:
                    w.confirm()  # the rules read the log as it stands at this head
                    with self.reader.reading():  # one head check for every read the rules make
                        self.admission.admit(first, fresh, rows, leaves)
                prev = head.size if head else 0
                proven = self._proven_to(sid, head, frontier)
                nodes, root = frontier.extend_root(leaves, every=merkle.TILE_HEIGHT)  # the levels a store keeps
                runs = seq_runs(seqs)
                # seal() itself: seal_head's checks are for heads read back, these values are ours.
                new_head = new_tuple(HeadRow, (frontier.size, root, prev,
                                                store.seal_head(self.name, frontier.size, root, prev, runs), runs))
                # The index first: an insert may be the transaction's last statement (it
                # commits in the same message on PostgreSQL).
                structure_index.extend(w, sid, prev, events)
                w.insert(rows, nodes, new_head)
                for eraser, by in erasures:
                    if isinstance(eraser, ev.Retention):  # admitted against the log as it stands
                        w.erase(list(ev.SpanSet(eraser.spans)), by, kind="dropped")
                        continue
                    erased = self.admission.check_erasable(eraser, by)
                    if erased:
                        w.erase(erased, by)
        if rows:
            self.host.caches.keep_frontier(sid, frontier)
            if proven is not None:
                with store.caches.lock:
                    if len(proven.leaves) == 32 * prev and proven.size == prev:
                        proven.leaves += b"".join(leaves)
                        proven.size, proven.root, proven.sealed = new_head.size, new_head.root, new_head
            if store.watch is not None:  # after the commit: the witness holds only what is durable
                store.watch.acknowledge(self.name, frontier.size, root)
        if not replays:
            return new
        made = iter(new)
        return [replays[i] if i in replays else next(made) for i in range(len(prepared))]

    def _not_behind(self, sid: int, head: HeadRow | None, speculate: bool = False) -> None:
        """Refuse to write on a head behind what this handle proved, or that the witness does not hold.

        A store copied back from an older backup under an open handle would otherwise take
        positions past its end, or a second history at the same size.

        Raises:
            IntegrityError: the stored head is smaller than the size this handle proved, or
                of that size with another root; nothing is written.
            WitnessMismatch: the stored head does not extend the head the witness holds.
        """
        store = self.host
        if store.watch is not None:
            store.watch.check(self.name)
        with store.caches.lock:
            prefix = store.caches.prefixes.get(sid)
            known = (prefix.size, prefix.root) if prefix is not None and prefix.name == self.name else None
        size, root = (head.size, head.root) if head is not None else (0, EMPTY_ROOT)
        if known is not None and (size < known[0] or (size == known[0] and root != known[1])):
            if speculate:  # the head this backend committed last, not read: decide again under the lock
                raise StaleHead(f"session {self.name!r} moved on under another writer")
            raise IntegrityError(
                f"the store holds session {self.name!r} at size {size}, where this handle proved size {known[0]}"
                + ("" if size < known[0] else " with another root")
                + ": it was replaced by another copy; nothing was written",
                session=self.name, pos=size,
            )

    def _proven_to(self, sid: int, head: HeadRow | None, frontier: merkle.Frontier) -> Prefix | None:
        """Return the handle's proven prefix when every leaf under ``head`` is in it and ``frontier`` gives its root.

        A commit then adds its own leaves to the prefix under the head it seals: they are in
        that head by construction, so reading them back costs a comparison, not a proof.
        """
        size = head.size if head else 0
        with self.host.caches.lock:
            prefix = self.host.caches.prefixes.get(sid)
            if prefix is None and size == 0:
                prefix = self.host.caches.prefixes[sid] = Prefix(self.name, 0, EMPTY_ROOT)
            if (prefix is None or prefix.name != self.name or prefix.size != size
                    or len(prefix.leaves) != 32 * size or (head is not None and prefix.root != head.root)):
                return None
        return prefix if frontier.root() == prefix.root else None

    def _prepare(self, i: int, event: ev.Event, key: str | None, batch: bool) -> ev.Prepared:
        try:
            if key is not None:
                if not isinstance(key, str) or not key or len(key) > 1024:
                    raise InvalidEvent("idempotency_key", "must be a non-empty str of at most 1024 characters")
                if event.idempotency_key not in (None, key):
                    raise InvalidEvent("idempotency_key", "the event carries a different idempotency key")
                event = msgspec.structs.replace(event, idempotency_key=key)
            elif isinstance(event, ev.Event) and event.idempotency_key is not None:
                raise InvalidEvent("idempotency_key", "pass it as append(..., idempotency_key=...)")
            stamped = isinstance(event, ev.Event) and event.ts is None
            if stamped:
                event = msgspec.structs.replace(event, ts=self.host.clock())
            canon, body = ev.canonical(event)
        except InvalidEvent as exc:
            if not batch:
                raise
            raise InvalidEvent(f"events[{i}].{exc.field}", exc.reason) from exc
        return ev.Prepared(canon, body, key, stamped)

    def redact(self, positions: Sequence[int], reason: str) -> Record:
        """Append the redaction of ``positions`` and of every derived event built from or quoting them; see :meth:`Session.redact`.

        The copies are :func:`compactstore.rules.copies`; of each attempt it erases, the
        redaction keeps the guard (:func:`compactstore.rules.guard_of`).
        """
        given = [ev.as_position(f"positions[{i}]", p) for i, p in enumerate(ev.as_list("positions", positions))]
        reason = ev.as_text("reason", reason)

        def build(size: int) -> list[ev.Event]:
            named = {p for p in given if is_position(p) and p < size}
            after = self.admission.after(named, size, [])
            held = {p: e for p, e in after if p in named}
            erased = sorted([*given, *rules.copies(held, after)])
            at = dict(after)
            guards = [rules.guard_of(q, e) for q in erased if isinstance(e := at.get(q), ev.Attempt)]
            return [ev.Redaction(positions=erased, reason=reason, guards=guards)]

        return self.built(build)[0]

    def _replay(self, row: Row, p: ev.Prepared) -> Record:
        """Return the earlier record for ``p.key`` if ``p`` is the same event, else raise."""
        key = p.key
        earlier, event = ev.decode_canonical(row.body or b"{}") if row.body else None, p.event
        if earlier is not None and p.stamped:  # the store stamped it: not part of the comparison
            earlier = msgspec.structs.replace(earlier, ts=None)
            event = msgspec.structs.replace(event, ts=None)
        if earlier is None or ev.encode(earlier) != ev.encode(event):
            raise ConflictError(
                f"idempotency key {key!r} was used at pos {row.pos} for a different event",
                session=self.name,
                pos=row.pos,
            )
        return self.reader.record(row)

    def _frontier(
        self, sid: int, head: HeadRow | None, fetch: Callable[[Sequence[tuple[int, int]]], list[bytes]]
    ) -> merkle.Frontier:
        size = head.size if head else 0
        cached = self.host.caches.frontier(sid, size)
        if cached is not None:
            return cached
        coords = merkle.cover(0, size)
        found = merkle.resolve(coords, lambda c: fetch(c), HASH)
        return merkle.Frontier(size, [found[c] for c in coords], HASH)

    def replicate(self, records: Sequence[Record], erased: Mapping[int, int], index_rows: Sequence[IndexRow]) -> None:
        """Append another store's records as they are, erased bodies included, in one transaction.

        What :func:`compactstore.copy.copy` writes for a session with redacted or dropped
        positions: no body can be re-appended for those, so the rows carry the source's
        leaves without bodies, the erasure records (``erased``: position -> the eraser's
        position, each eraser among ``records``) and the source's index rows at the
        records' positions (``index_rows``; those of a dropped body cannot be derived
        again). Every present body must hash to its leaf and be a canonical event; the
        rules are not applied again: the source held its log to them, and the leaves make
        the copy the same tree (the caller compares its root with the source's).

        Raises:
            SessionMoved: the session does not end where ``records`` begin; nothing is written.
            IntegrityError: a body does not match its leaf, an erased row's eraser is not
                among the records or does not erase it so, or the index rows at what a
                retention dropped are not those it recorded.
        """
        if self.host.keyed and not self.host.has_key:
            raise KeyRequired("append", session=self.name)
        first = records[0].pos
        if [r.pos for r in records] != list(range(first, first + len(records))):
            raise InvalidArgument("records", "want records of consecutive positions")
        bodies: list[bytes | None] = []
        kinds: list[str] = []
        keys: list[str | None] = []
        for r in records:
            if not r.body:
                if r.kind not in ("redacted", "dropped") or not first <= erased.get(r.pos, -1) < first + len(records):
                    raise IntegrityError(f"pos {r.pos} has no body and no eraser among the records",
                                         session=self.name, pos=r.pos)
                bodies.append(None)
                kinds.append(r.kind)
                keys.append(None)
                continue
            if merkle.leaf_hash(r.body) != r.leaf:
                raise IntegrityError(f"the body at pos {r.pos} does not match its leaf", session=self.name, pos=r.pos)
            event = ev.decode_canonical(r.body)
            ev.check_entry(event, r.body)
            bodies.append(r.body)
            kinds.append(event.kind)
            keys.append(event.idempotency_key)
        leaves = [r.leaf for r in records]
        by: dict[int, list[int]] = {}
        for r in records:
            if not r.body:
                eraser = erased[r.pos]
                listed, how = ev.erases(records[eraser - first].event)
                if r.pos not in listed or how != r.kind:
                    raise IntegrityError(f"pos {r.pos} is {r.kind} by the event at pos {eraser}, which does not "
                                         f"{'redact' if r.kind == 'redacted' else 'drop'} it", session=self.name, pos=r.pos)
                by.setdefault(eraser, []).append(r.pos)
        for r in records:  # what a retention dropped keeps the index rows it recorded the digest of
            if isinstance(r.event, ev.Retention):
                dropped = ev.SpanSet(r.event.spans)
                if retention.index_digest([x for x in index_rows if x.pos in dropped]) != r.event.index_digest:
                    raise IntegrityError(f"the index rows given for what the retention at pos {r.pos} dropped are not "
                                         "those it recorded the digest of", session=self.name, pos=r.pos)
        store, backend = self.host, self.host.backend
        with backend.writer(self.name) as w:
            sid = w.session_id
            head = w.head()
            self._not_behind(sid, head)
            frontier = self._frontier(sid, head, w.hashes)
            if frontier.size != first:
                raise SessionMoved(session=self.name, got=frontier.size, want=first)
            seqs = w.next_seqs(len(records))
            # Rows one by one (a None body, which the column path of an append never holds).
            rows = [Row(q, sid, p, k, key, leaf, b)
                    for q, p, k, key, leaf, b in zip(seqs, range(first, first + len(records)), kinds, keys, leaves, bodies)]
            prev = head.size if head else 0
            nodes, root = frontier.extend_root(leaves, every=merkle.TILE_HEIGHT)
            runs = seq_runs(seqs)
            new_head = new_tuple(HeadRow, (frontier.size, root, prev,
                                            store.seal_head(self.name, frontier.size, root, prev, runs), runs))
            w.insert_index(index_rows)
            w.insert(rows, nodes, new_head)
            for eraser, positions in sorted(by.items()):
                w.note_erased(positions, eraser)
        self.host.caches.keep_frontier(sid, frontier)
        if store.watch is not None:
            store.watch.acknowledge(self.name, frontier.size, root)

    def built(self, build: Callable[[int], list[ev.Event]]) -> list[Record]:
        """Append what ``build(size)`` returns from the session at ``size``, building again if it moved meanwhile."""
        for _ in range(RETRIES):
            size = self.reader.size
            events = build(size)
            try:
                return self.extend(events, expect_size=size)
            except SessionMoved:
                continue
        raise ConflictError(f"session {self.name!r} kept moving while an append was built", session=self.name)
