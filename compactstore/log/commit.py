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
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat

import msgspec

from .. import events as ev
from .. import index as structure_index
from .. import merkle, rules
from ..backends import HeadRow, Row, Rows
from ..content import content_digest_of
from ..errors import (
    CompactStoreError,
    ConflictError,
    IntegrityError,
    InvalidArgument,
    InvalidEvent,
    KeyRequired,
    SessionMoved,
    StaleHead,
)
from ..events import Record, as_list
from ..facts import Facts, FullFacts, IndexedFacts
from ..seal import seq_runs
from ..structure import build
from .caches import Prefix
from .heads import EMPTY_ROOT, HASH, position
from .reader import Reader

#: The kind tag of each event type (what ``Event.kind`` returns), looked up once per row.
KINDS: dict[type[ev.Event], str] = {t: str(t.__struct_config__.tag) for t in ev.EVENT_TYPES}
new_tuple = tuple.__new__
#: A prepared event's parts, read in C by ``map``.
BODY, EVENT, KEY = operator.attrgetter("body"), operator.attrgetter("event"), operator.attrgetter("key")
SUPERSEDES = operator.attrgetter("supersedes")
NO_SUPERSEDES = frozenset({None})
#: Derived events the store admits only if they keep the rules (see :mod:`compactstore.rules`).
ADMITTED = (ev.Summary, ev.Spill, ev.RecoveryMarker, ev.Redaction, ev.Attempt)
#: The same as exact types: a prepared event is always of a registered type (none subclasses
#: another), and ``type(e) in`` a set costs far less than ``isinstance`` through msgspec's metaclass.
ADMITTED_TYPES = frozenset(ADMITTED)
#: How often a builder's compare-and-append is tried again when another writer moved the session.
RETRIES = 16


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


class Writer:
    """The commit of session ``name``, reading the log through ``reader``."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.host = reader.host
        self.name = reader.name

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
            erasures: list[tuple[ev.Redaction, int]] = []
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
                    if isinstance(event, ev.Redaction):
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
                        self._admit(first, fresh, rows, leaves)
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
                for redaction, by in erasures:
                    self._check_erasable(redaction, by)
                    w.erase(redaction.positions, by)
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

    def _admit(self, first: int, fresh: Sequence[ev.Prepared], rows: Sequence[Row], leaves: Sequence[bytes]) -> None:
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
                self._admit_redaction(event, first, events[:j])
                erased.append((list(event.positions), pos))
                if passed is not None:
                    passed.erase(*erased[-1])
                continue
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
                self._admit_one(f, event, pos, first, rows, settled=self._settled())
            except (InvalidEvent, IntegrityError) as exc:
                if len(events) == 1 or not isinstance(exc, InvalidEvent):
                    raise
                raise InvalidEvent(f"events[{j}].{exc.field}", exc.reason) from exc

    def _after(self, positions: Iterable[int], first: int, batch: Sequence[ev.Event]) -> list[tuple[int, ev.Event]]:
        """Return ``(position, event)`` from the first of ``positions`` to the end of ``batch`` (appended at ``first``)."""
        lo = min((p for p in positions if is_position(p)), default=first + len(batch))
        logged = [(r.pos, r.event) for r in self.reader.scan(lo, first)] if lo < first else []
        return logged + [(first + i, e) for i, e in enumerate(batch) if first + i >= lo]

    def _admit_redaction(self, redaction: ev.Redaction, first: int, batch: Sequence[ev.Event]) -> None:
        """Refuse a redaction (after ``batch``, appended at ``first``) that leaves a derived copy of what it erases."""
        after = self._after(redaction.positions, first, batch)
        named = set(redaction.positions)
        rules.admit_redaction({p: e for p, e in after if p in named}, after, redaction)

    def _admit_one(self, f: Facts, event: ev.Event, pos: int, first: int, rows: Sequence[Row],
                   content: bool = True, settled: set[int] | None = None) -> None:
        """Hold one derived event to the rules; ``settled`` is :meth:`_settled` when admission may use it (``verify`` does not)."""
        if isinstance(event, ev.Summary):
            rules.admit_node(f, event, pos)
            if content and rules.by_bodies(event):
                self._check_content(event, first, rows)
        elif isinstance(event, ev.Spill):
            rules.admit_spill(f, event, pos)
        elif isinstance(event, ev.Attempt):
            rules.admit_attempt(f, event, pos)
        elif isinstance(event, ev.RecoveryMarker):
            rules.admit_marker(f, event, pos, settled if settled is not None else ())
            if settled is not None:
                # Its cover met every condition; those over the nodes' own spans hold for good.
                settled.update(p for p in rules.marker_cover(event) if p < first)
            root = f.span_root(0, event.size) if event.size else merkle.empty_root(HASH)
            if event.root != root.hex():
                raise InvalidEvent("root", f"got {event.root[:16]}…, the log's root at size {event.size} is {root.hex()[:16]}…")
            # Its MAC is held to the key at resume: a copy into a store with another key keeps the source's.

    def _settled(self) -> set[int]:
        """Return the positions of this session's stored nodes that met the marker conditions over their own spans.

        Those conditions read only the log before each node, which never changes but by a
        redaction: the set is kept per redaction count.
        """
        sid = self.reader.sid()
        if sid is None:
            return set()
        redactions = len(self.host.backend.redactions(sid))
        return self.host.caches.kept("settled", sid, redactions, set)

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
        erased = self.host.backend.redactions(sid)
        after = max(erased.values()) + 1 if erased else 0
        found: list[tuple[int, str]] = []
        try:
            passed = Pass(self.reader, size, (), ()) if erased else None
        except CompactStoreError as exc:
            return [(-1, f"the log does not read: {exc}")]
        for pos in self.host.backend.derived_positions(sid, after, size):
            try:
                event = self.reader.read(pos).event
                if not isinstance(event, ADMITTED):
                    continue
                needs = min(event.size, pos) if isinstance(event, ev.RecoveryMarker) else pos
                f: Facts = (passed.facts(needs) if passed is not None else
                            IndexedFacts(self.reader.index(), needs, self.reader.reader(needs), self.reader.span_root, self.reader.nodes_before))
                self._admit_one(f, event, pos, pos, (), content=False)
            except CompactStoreError as exc:
                found.append((pos, str(exc)))
        return found

    def _check_content(self, node: ev.Summary, first: int, rows: Sequence[Row]) -> None:
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

    def _check_erasable(self, redaction: ev.Redaction, by: int) -> None:
        positions = redaction.positions
        if not positions or len(set(positions)) != len(positions):
            raise InvalidEvent("positions", "must list distinct positions, at least one")
        done = self.host.backend.redactions(self.reader.require_sid())
        for p in positions:
            if not 0 <= p < by:
                raise InvalidEvent("positions", f"{p} is not an earlier position (< {by})")
            if p in done:
                raise InvalidEvent("positions", f"{p} was already redacted by the event at pos {done[p]}")

    def redact(self, positions: Sequence[int], reason: str) -> Record:
        """Erase the bodies at ``positions`` and every derived copy of them, recording a redaction event that says why.

        A derived event (summary node, spill, attempt) is a copy, and is erased with
        them, when it quotes one of them (:func:`compactstore.rules.quotes`): by
        structure, a spill of one, or a node keeping an excerpt of one, retaining one as
        a negative fact or pointing at a spill of one; by text, a spill's value, a
        node's summary, fact texts, kept values or contract, or an attempt's literals
        that contain one of their literals (each string or number of their content,
        arguments, output, value or metadata of at least ``rules.QUOTE_MIN``
        characters). The redaction event lists every position it erases, copies
        included; a redaction appended by other means must list them too.

        The leaves stay, so the tree, its heads and proofs still verify and ``verify()``
        reports the positions as redacted, not tampered. Reading them gives a
        :class:`~compactstore.events.Redacted` placeholder. A redacted position is
        unknown to the rules, not empty: a marker over a span holding one resumes as
        ``fallback`` and cannot be emitted, a node over one cannot be LOSSLESS, and a
        span holding one cannot be restored.

        Raises:
            InvalidEvent: a position is out of range or already redacted; nothing is written.
        """
        given = [ev.as_position(f"positions[{i}]", p) for i, p in enumerate(ev.as_list("positions", positions))]
        reason = ev.as_text("reason", reason)

        def build(size: int) -> list[ev.Event]:
            named = {p for p in given if is_position(p) and p < size}
            after = self._after(named, size, [])
            held = {p: e for p, e in after if p in named}
            return [ev.Redaction(positions=sorted([*given, *rules.copies(held, after)]), reason=reason)]

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
