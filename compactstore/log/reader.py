"""The one verifying reader of a session: every read that decides, copies or serves goes through it.

A body is checked against its leaf; a leaf against the latest sealed head (its seal
checked under the key, the handle's proven prefix carried to it by a consistency proof,
the rest of a run hashed up with stored roots); the head against the witness, where one
is configured; a missing body against the redaction that erased it. Builders read a
session through a :class:`Reader` (it is their :class:`~compactstore.view.SessionView`),
and so do compaction, restoration, resume, copy, lookup and the proofs.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar, Token
from itertools import islice

from .. import events as ev
from .. import merkle
from ..backends import HeadRow, Row
from ..content import content_digest_of
from ..errors import IntegrityError, InvalidArgument, InvalidEvent, shown
from ..events import Record
from ..facts import Facts, FullFacts, IndexedFacts
from ..index import Index
from ..structure import IndexRow
from ..seal import seq_lookup
from ..view import EventReader, SpanRead
from .caches import Prefix
from .heads import EMPTY_ROOT, HASH, Heads, position

#: Rows per query of a scan.
CHUNK = 2048


class Reader(Heads):
    """The verifying reader of session ``name`` of ``host``: reads, facts and spans, held to the sealed head."""

    def record(self, row: Row, erasures: Erasures | None = None) -> Record:
        """Return the record of a stored row: the one checked read of a body.

        A body must hash to its leaf; a missing one must have been erased by a logged
        redaction (``erasures`` answers that, read once per call that passes it).

        Raises:
            IntegrityError: naming the position: the body does not match its leaf, or it
                is missing and no redaction event accounts for it.
        """
        if row.body is None:
            by, kind = (erasures or Erasures(self, row.session_id)).by(row.pos)
            if kind != row.kind:
                raise IntegrityError(f"the body at pos {row.pos} is missing, its row says {row.kind!r}, and the event "
                                     f"at pos {by} that erased it {'dropped' if kind == 'dropped' else 'redacted'} it",
                                     session=self.name, pos=row.pos)
            gone: ev.Event = ev.Redacted(by=by) if kind == "redacted" else ev.Dropped(by=by)
            return Record(self.name, row.seq, row.pos, kind, gone, b"", row.leaf)
        if merkle.leaf_hash(row.body) != row.leaf:
            raise IntegrityError(f"event at pos {row.pos} does not match its leaf", session=self.name, pos=row.pos)
        return Record(self.name, row.seq, row.pos, row.kind, ev.decode_canonical(row.body), row.body, row.leaf)

    def index(self) -> Index:
        """Return the session's structural index."""
        return Index(self.host.backend, self.require_sid())

    def nodes_before(self, size: int) -> list[tuple[int, ev.Summary]]:
        """Return ``(position, node)`` of the session's summary nodes before ``size``, reading only those not read yet.

        The log before a position never changes (a redaction appends), so each read
        starts where the last stopped.
        """
        sid = self.require_sid()
        return self.host.caches.nodes(sid, size, Index(self.host.backend, sid).nodes)

    def reader(self, size: int, *, deferred: bool = False) -> EventReader:
        """Return a reader of the events before ``size`` that checks each body against its leaf (:class:`CheckedEvents`).

        It keeps the leaves it checked (``leaves``), so that they can be held against a
        tree head with :meth:`root_with`. ``deferred``: the caller proves them itself, in
        one multi-proof, before acting on what it read.
        """
        return CheckedEvents(self, position("size", size), deferred=ev.as_flag("deferred", deferred))

    def facts(self, size: int | None = None, *, reader: EventReader | None = None) -> Facts:
        """Return the structural facts of the session at checkpoint ``size`` (default: now).

        From the structural index in O(log n) queries when it answers; from one pass over
        the events when the session has redactions (an erased body no longer gives the
        facts it gave). ``reader`` reads the events the facts name (default: a new one).
        """
        size, sid = self.bounded("size", size, 0)
        if reader is not None:
            ev.as_callable("reader", reader)
        backend = self.host.backend
        if sid is None or backend.redactions(sid):
            events = [r.event for r in self.scan(0, size)]
            return FullFacts(events, self.span_root)
        return IndexedFacts(self.index(), size, reader or self.reader(size), self.span_root, self.nodes_before)

    def read_span(self, start: int, stop: int, *, records: bool = False) -> SpanRead:
        """Read ``[start, stop)`` once, as :meth:`scan` reads it: its content digest and its span root from its leaves.

        Each body is checked against its leaf and each leaf against the latest sealed head
        (and the witness), so what a compaction or an admission builds on is what a plain
        read would serve.

        ``records``: also return the records. Memory stays flat however long the span
        when they are not asked for. The digest is None when a body of the span was
        redacted: nothing can certify that span any more.

        Raises:
            InvalidArgument: the span is not a non-empty span of the session.
            IntegrityError: a position is missing or a body does not match its leaf.
        """
        stop, sid = self.bounded("stop", stop, 1)
        ev.as_flag("records", records)
        if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start < stop or sid is None:
            raise InvalidArgument("start", f"must be in [0, {stop}), got {shown(start)}")
        backend = self.host.backend
        out: list[Record] = []
        leaves: list[bytes] = []
        redacted = False
        erasures = Erasures(self, sid)
        check = self.check()

        def bodies(chunk: list[Row]) -> list[bytes]:
            nonlocal redacted
            got = [r.body or b"" for r in chunk]
            for r in chunk:
                if r.body is None:
                    erasures.by(r.pos)  # a body erased behind the store's back is not a redaction
                    redacted = True
            for r, leaf in zip(chunk, merkle.leaf_hashes(got)):
                if r.body is not None and leaf != r.leaf:
                    raise IntegrityError(f"the body at pos {r.pos} does not match its leaf", session=self.name, pos=r.pos)
            check.run(chunk)  # each leaf is the one the latest sealed head holds, as a plain read holds it
            leaves.extend(r.leaf for r in chunk)
            if records:
                out.extend(self.record(r, erasures) for r in chunk)
            return got

        def stream() -> Iterator[list[bytes]]:
            pos, chunk = start, []
            for row in backend.rows(sid, start, stop, CHUNK):
                if row.pos != pos:
                    break
                pos += 1
                chunk.append(row)
                if len(chunk) == CHUNK:
                    yield bodies(chunk)
                    chunk = []
            if chunk:
                yield bodies(chunk)
            if pos != stop:
                raise IntegrityError(f"position {pos} is missing", session=self.name, pos=pos)

        digest = content_digest_of(stream())
        # The span's root from the leaves just proven, not from stored subtree roots.
        got = SpanRead(out, None if redacted else digest, merkle.span_root_of_leaves(leaves, start, stop, first=start))
        self.host.caches.keep_span((sid, start, stop), len(backend.erasures(sid)), got)
        return got

    def span(self, start: int, stop: int) -> SpanRead:
        """Return :meth:`read_span` of ``[start, stop)`` without records, from the last read when nothing was redacted since."""
        sid = self.require_sid()
        kept = self.host.caches.span((sid, start, stop), len(self.host.backend.erasures(sid)))
        return kept if kept is not None else self.read_span(start, stop)

    def root_with(self, leaves: Mapping[int, bytes], size: int) -> bytes:
        """Return the root of ``[0, size)`` from the ``leaves`` given and stored subtree roots for the rest.

        A subtree holding no given position comes from the store (O(log n) of them per
        run of given positions), so the root equals the stored tree's only if every
        given leaf is the one the tree holds. When many leaves are given and this
        handle's reads have proven every leaf of ``[0, size)`` in the sealed head, the
        rest come from those proven leaves instead, with the same meaning.

        Raises:
            IntegrityError: a stored subtree root is missing.
        """
        if not isinstance(leaves, Mapping):
            raise InvalidArgument("leaves", f"want a mapping of position to leaf hash, got {type(leaves).__name__}")
        size = position("size", size)
        for p, leaf in leaves.items():
            if not 0 <= position("leaves", p) < size or not isinstance(leaf, bytes) or len(leaf) != 32:
                raise InvalidArgument("leaves", f"want positions in [0, {size}) to 32-byte leaf hashes, got {shown(p)}: {shown(leaf)}")
        sid, backend = self.require_sid(), self.host.backend
        proven = self.proven_leaves(sid, size) if len(leaves) << (merkle.TILE_HEIGHT + 1) >= size else None
        if proven is not None:
            # Many leaves given and [0, size) proven by this handle's reads: hash the
            # proven leaves with the given ones in place, natively, rather than read
            # every stored tile that holds a given one.
            for p, leaf in leaves.items():
                proven[32 * p : 32 * p + 32] = leaf
            return merkle.root_of_leaves([bytes(proven[i : i + 32]) for i in range(0, 32 * size, 32)], HASH)
        try:
            return merkle.root_with(leaves, size, lambda coords: backend.hashes(sid, coords), HASH)
        except KeyError as exc:
            raise IntegrityError(f"a stored subtree root is missing: {exc}", session=self.name) from None

    def proven_leaves(self, sid: int, size: int) -> bytearray | None:
        """Return a copy of the leaves ``[0, size)`` this handle's reads proved in the sealed head, if they reach ``size``."""
        caches = self.host.caches
        with caches.lock:
            prefix = caches.prefixes.get(sid)
            if prefix is None or prefix.name != self.name or len(prefix.leaves) < 32 * size:
                return None
            return prefix.leaves[: 32 * size]

    def reading(self) -> AbstractContextManager[None]:
        """Return a context in which this session's verified reads check the latest sealed head once.

        The first verified read inside reads the session id and the head and checks its
        seal and the handle's proven prefix against it; later reads inside take that id and
        hold their rows to that same head (one reaching past it, or a scan from its size,
        reads the head again). A head changed meanwhile
        is caught by the first read after the context. Meant for one call of an adapter,
        which reads a session several times; nested contexts share the outermost's head.
        Not for sharing across threads: the context is this thread's (or task's).
        """
        return Reading((id(self.host), self.name))

    def check(self) -> ReadCheck:
        """Return the check of an open :meth:`reading` context, else a new one (which reads the id and the head).

        The context's check carries the session id it read with its head, so later reads
        inside look neither up again: the id, like the head, is the context's.
        """
        group = READING.get()
        key = (id(self.host), self.name)
        if group is None or key not in group:
            return ReadCheck(self, self.sid())
        check = group[key]
        if check is None or check.sid is None:  # an empty session may gain its first events meanwhile
            sid = self.sid()
            if check is None or check.sid != sid:
                check = group[key] = ReadCheck(self, sid)
                return check
        check.fresh = False
        return check

    def read(self, pos: int, *, verify: bool = True) -> Record:
        """Return the record at ``pos``, its body checked against its leaf and the leaf against the latest sealed head.

        ``verify=False`` skips the second check (the body is still checked against its
        leaf): one query fewer, but a body rewritten with its leaf, a row of another
        session or a row beyond the sealed head is then returned as it is.

        Raises:
            InvalidArgument: no event at ``pos``.
            IntegrityError: naming the position: the body does not match its leaf, the
                leaf is not in the tree of the latest sealed head, the head's seal does not
                verify, or the position is missing under the head.
        """
        position("pos", pos)
        ev.as_flag("verify", verify)
        # A row committed after the head was read is past it, and run() reads the head again.
        check = self.check() if verify else None
        sid = check.sid if check is not None else self.sid()
        row = self.host.backend.row(sid, pos) if sid is not None else None
        if row is None:
            if check is not None and pos < check.size:
                raise IntegrityError(f"position {pos} is missing under the sealed head of size {check.size}",
                                     session=self.name, pos=pos)
            raise InvalidArgument("pos", f"no event at {pos} in session {self.name!r} (size {self.size})")
        if check is not None:
            check.run([row])  # before the body is decoded: a forged body is an IntegrityError first
        return self.record(row)

    def scan(self, start: int = 0, stop: int | None = None, *, verify: bool = True) -> Iterator[Record]:
        """Yield the records at positions ``[start, stop)`` in order, streaming, each checked as :meth:`read` checks it.

        Each chunk of rows is held against the latest sealed head at once (its leaves
        hashed up and joined with stored roots of the rest, one query per chunk), before
        any of it is yielded; leaves proven once are kept per store handle, so reading
        them again costs a comparison. A scan starting at or past the latest sealed head
        reads no rows (none past it is served): the head read answers a poll for what is
        new. ``verify=False`` skips the check against the head, as in :meth:`read`, and
        does not notice missing positions.

        Raises:
            IntegrityError: as :meth:`read`; also when a position under the head is missing.
        """
        position("start", start)
        if stop is not None:
            position("stop", stop)
        ev.as_flag("verify", verify)
        check = self.check() if verify else None
        sid = check.sid if check is not None else self.sid()
        if sid is None:
            return
        erasures = Erasures(self, sid)  # read once, and only if a redacted row comes up
        if check is None:
            for row in self.host.backend.rows(sid, start, stop, CHUNK):
                yield self.record(row, erasures)
            return
        if start >= check.size:
            if not check.fresh:  # a reading() context's head, read earlier: a writer may have committed since
                check.renew()
            if start >= check.size:
                return
        pos = start
        while True:
            # Every head's rows commit with it: rows asked for after a head was read hold all of
            # its positions. A head read again meanwhile (a row came past the one held, so a
            # writer committed) may be ahead of the rows already asked for: ask again from pos.
            asked = check.reads
            rows = self.host.backend.rows(sid, pos, stop, CHUNK)
            while chunk := list(islice(rows, CHUNK)):
                # Positions come in increasing order, each once: the chunk is gapless when its ends are.
                gap = chunk[0].pos != pos or chunk[-1].pos != pos + len(chunk) - 1
                if gap:
                    chunk = chunk[: next(i for i, r in enumerate(chunk) if r.pos != pos + i)]
                    if not chunk:
                        break
                check.run(chunk)
                for row in chunk:
                    yield self.record(row, erasures)
                pos += len(chunk)
                if gap:
                    break
            want = check.size if stop is None else min(stop, check.size)
            if pos >= want:
                return
            if check.reads == asked:
                raise IntegrityError(f"position {pos} is missing under the sealed head of size {check.size}",
                                     session=self.name, pos=pos)

    def proven(self, pos: int) -> Record:
        """Return the record at ``pos``, its body checked against its leaf and the leaf proven in the sealed head.

        The inclusion proof is held against :meth:`sealed_head`, not against a root
        recomputed from the stored subtree table, in O(log n). A redacted record has
        only its leaf proven.

        Raises:
            KeyRequired: the store is keyed and was opened without its key.
            IntegrityError: the body, its leaf or the proof does not verify.
            InvalidArgument: no event at ``pos`` under the sealed head.
        """
        head = self.sealed_head()
        position("pos", pos)
        sid, backend = self.require_sid(), self.host.backend
        row = backend.row(sid, pos) if pos < head.size else None
        if row is None:
            raise InvalidArgument("pos", f"no event at {pos} in session {self.name!r} (size {head.size})")
        if row.body is not None and merkle.leaf_hash(row.body) != row.leaf:
            raise IntegrityError(f"event at pos {pos} does not match its leaf", session=self.name, pos=pos)
        proof = self.roots(merkle.inclusion_spans(pos, head.size), sid)
        if merkle.root_from_inclusion(row.leaf, pos, head.size, proof, HASH) != head.root:
            raise IntegrityError(f"event at pos {pos} is not in the tree of the sealed head", session=self.name, pos=pos)
        return self.record(row)

    def bodies(self, start: int, stop: int, sink: Callable[[list[bytes]], object] | None = None) -> list[bytes | None]:
        """Return the stored bodies of ``[start, stop)`` (None where one was erased), each batch passed to ``sink`` as read.

        Unchecked: for a reader that holds them to a digest it trusts (a restoration holds
        them to the content digest of a node proven in the sealed head). ``sink`` raises
        ``TypeError`` on a None body, as a digester does, and the read stops there.
        """
        sid = self.sid()
        if sid is None:
            return []
        got: list[bytes | None] = self.host.backend.bodies(sid, start, stop, sink)  # type: ignore[arg-type]
        return got

    def erasures(self) -> dict[int, int]:
        """Return every erased position (redacted or dropped) with the position of the event that erased it."""
        sid = self.sid()
        return {} if sid is None else self.host.backend.erasures(sid)

    def index_rows(self, positions: Sequence[int]) -> list[IndexRow]:
        """Return the structural index's rows at ``positions``."""
        return self.index().rows_at(positions) if positions else []

    def erased_by(self, pos: int) -> int:
        """Return the position of the logged redaction or retention that erased the body at ``pos``.

        Raises:
            IntegrityError: no logged redaction or retention erased it: it was erased behind the store's back.
        """
        return Erasures(self, self.require_sid()).by(pos)[0]


class CheckedEvents:
    """Reads events of a session before a checkpoint, each once, checking each body against its leaf.

    The leaves checked are kept in ``leaves``, so that the caller can hold them against
    a tree head (:meth:`Reader.root_with`). Each read also holds its leaves to the latest
    sealed head, as a plain read does, unless ``deferred``: the caller then proves every
    leaf read in one multi-proof before it acts on what it read (a resume does, against
    the checkpoint root its marker names).
    """

    def __init__(self, session: Reader, size: int, *, deferred: bool = False) -> None:
        self.session, self.size, self.deferred = session, size, deferred
        self.events: dict[int, ev.Event] = {}
        self.leaves: dict[int, bytes] = {}

    def __call__(self, pos: int) -> ev.Event | None:
        """Return the event at ``pos``, or None when ``pos`` is not before the checkpoint."""
        if not 0 <= pos < self.size:
            return None
        if pos not in self.events:
            self.add(self.session.read(pos, verify=not self.deferred))
        return self.events[pos]

    def prefetch(self, positions: Iterable[int]) -> None:
        """Read the events at ``positions`` (those before the checkpoint and not read yet) in one query.

        Their leaves are held to the latest sealed head as :meth:`Reader.read` holds one.

        Raises:
            IntegrityError: a body does not match its leaf, or a leaf is not the one the head holds.
        """
        session = self.session
        wanted = sorted({p for p in positions if 0 <= p < self.size and p not in self.events})
        if not wanted:
            return
        check = None if self.deferred else session.check()
        sid = session.sid() if check is None else check.sid
        if sid is None:
            return
        erasures = Erasures(session, sid)
        rows = sorted(session.host.backend.rows_at(sid, wanted), key=lambda r: r.pos)
        if rows and check is not None:  # scattered positions: held to the head by one multi-proof, not one per run
            check.scattered(rows)
        for row in rows:
            self.add(session.record(row, erasures))

    def add(self, record: Record) -> None:
        """Take in a record read elsewhere, checking it like the ones read here.

        Raises:
            IntegrityError: its body does not match its leaf.
        """
        leaf = record.leaf if isinstance(record.event, ev.ERASED) else merkle.leaf_hash(record.body)
        if leaf != record.leaf:
            raise IntegrityError(
                f"event at pos {record.pos} does not match its leaf", session=self.session.name, pos=record.pos
            )
        self.leaves[record.pos] = leaf
        self.events[record.pos] = record.event


#: the checks of the :meth:`Reader.reading` contexts open here, by (store handle, session name)
READING: ContextVar[dict[tuple[int, str], ReadCheck | None] | None] = ContextVar("compactstore_reading", default=None)


class Reading:
    """The context :meth:`Reader.reading` returns: it opens the slot of one session's check in this context's group."""

    __slots__ = ("key", "token", "opened")
    token: Token[dict[tuple[int, str], ReadCheck | None] | None] | None

    def __init__(self, key: tuple[int, str]) -> None:
        self.key, self.token, self.opened = key, None, False

    def __enter__(self) -> None:
        group = READING.get()
        if group is None:
            group = {}
            self.token = READING.set(group)
        if self.key not in group:  # else an outer context of this session serves
            group[self.key] = None
            self.opened = True

    def __exit__(self, *exc: object) -> None:
        group = READING.get()
        if self.opened and group is not None:
            group.pop(self.key, None)
        if self.token is not None:
            READING.reset(self.token)


#: the proven prefix of a check under an empty head (no read reaches under it, so none adds leaves)
NO_PREFIX = Prefix("", 0, EMPTY_ROOT)


#: A run that does not give the head's root names the first of its positions whose inclusion
#: proof fails. That proof's siblings come from the stored rows, so a forged row fails it
#: for every position whose path passes through it: the forged one is the named or another
#: the named one's proof rests on.
NOT_IN_TREE = ("the event at pos {pos} is not in the tree of the latest sealed head (size {size}), "
                "or a stored row its proof rests on was altered")


class ReadCheck:
    """Holds the rows one read returns to the session's latest sealed head.

    The head's seal is checked (a keyed MAC when the store has its key; a keyed store
    opened without its key can only hold the rows to the stored head's root). The
    handle's proven prefix is carried to the head by a consistency proof, so a leaf
    proven before is checked by one comparison; the rest of a run of rows is hashed up
    and joined with stored roots (:func:`merkle.run_root_with`), which must give the
    head's root: an edited stored root does not pass. The rows the head's own commit
    added must carry the global seqs it seals; older rows' seqs are held by ``verify()``.
    """

    __slots__ = ("session", "sid", "size", "root", "prefix", "tail", "seqs", "fresh", "reads")

    def __init__(self, session: Reader, sid: int | None) -> None:
        self.session, self.sid = session, sid
        self.size, self.root = 0, EMPTY_ROOT
        #: the latest head's ``prev`` and ``seqs``: the first position of its commit and the seqs it seals
        self.tail, self.seqs = 0, b""
        #: whether the head was read for the read at hand (a reading() context's check is not, once reused)
        self.fresh = True
        self.prefix = NO_PREFIX  # nothing is proven under an empty head: no read adds to it
        #: how many times the head was read: rows asked for before the latest reading may miss some of its commits
        self.reads = 0
        if sid is not None:
            self._head(sid)
        elif session.host.watch is not None:  # a session deleted under the witness has no id left
            session.host.watch.check(session.name)

    def renew(self) -> None:
        """Read the latest sealed head again (checked as on creation), for a read that reaches past this one."""
        if self.sid is not None:
            self._head(self.sid)

    def _fail(self, message: str, pos: int | None) -> IntegrityError:
        return IntegrityError(message, session=self.session.name, pos=pos)

    def _head(self, sid: int) -> None:
        """Read the latest sealed head, check its seal and carry the handle's proven prefix to it.

        Where a witness is configured, the stored head must extend the one it holds first.
        """
        session = self.session
        store = session.host
        if store.watch is not None:
            store.watch.check(session.name)
        self.reads += 1
        row = store.backend.head(sid)
        if row is None:
            return
        with store.caches.lock:
            prefix = store.caches.prefixes.get(sid)
            # The head row this handle last checked, its seal and its root: the proven prefix is at it already.
            if (prefix is not None and prefix.sealed == row and prefix.name == session.name
                    and prefix.size == row.size and prefix.root == row.root):
                self.size, self.root, self.prefix, self.tail, self.seqs = row.size, row.root, prefix, row.prev, row.seqs
                return
        row = self._sealed(sid, row)
        prefix, known, known_root = self._known(sid, row)
        if known > row.size:
            # Another thread of this handle may have read a newer head meanwhile: read it again once.
            again = store.backend.head(sid)
            if again is None:
                raise self._fail(f"the sealed heads are gone, though this handle proved size {known}", 0)
            row = self._sealed(sid, again)
            prefix, known, known_root = self._known(sid, row)
        # The head is taken only once it passed: a check kept for a reading() context never holds one that failed.
        if known > row.size:
            raise self._fail(f"the latest sealed head is at size {row.size}, below the size {known} this handle proved", row.size)
        if known == row.size:
            if known_root != row.root:
                raise self._fail(f"the sealed head of size {known} changed its root", known)
            self.size, self.root, self.prefix, self.tail, self.seqs = row.size, row.root, prefix, row.prev, row.seqs
            return
        proof = session.roots(merkle.consistency_spans(known, row.size), sid)
        if known and not merkle.verify_consistency(known, row.size, known_root, row.root, proof, HASH):
            raise self._fail(f"the tree of size {known} this handle proved is not a prefix of the latest sealed head "
                             f"(size {row.size})", known)
        with store.caches.lock:
            if prefix.size < row.size:
                prefix.size, prefix.root = row.size, row.root
        self.size, self.root, self.prefix, self.tail, self.seqs = row.size, row.root, prefix, row.prev, row.seqs

    def _sealed(self, sid: int, row: HeadRow) -> HeadRow:
        """Return ``row``, the latest stored head, its seal checked."""
        store, name = self.session.host, self.session.name
        if store.keyed and not store.has_key:
            return row
        with store.caches.lock:
            prefix = store.caches.prefixes.get(sid)
            if prefix is not None and prefix.name == name and prefix.sealed == row:
                return row
        if row.seal != store.seal_head(name, row.size, row.root, row.prev, row.seqs):
            raise self._fail(f"the latest tree head (size {row.size}) has a seal that does not verify", row.size)
        if prefix is not None and prefix.name == name:
            prefix.sealed = row
        return row

    def _known(self, sid: int, row: HeadRow) -> tuple[Prefix, int, bytes]:
        """Return the handle's proven prefix of the session (a new one at ``row``), its head size and root."""
        store = self.session.host
        with store.caches.lock:
            prefix = store.caches.prefixes.get(sid)
            if prefix is None or prefix.name != self.session.name:
                prefix = store.caches.prefixes[sid] = Prefix(self.session.name, row.size, row.root)
            return prefix, prefix.size, prefix.root

    def run(self, rows: Sequence[Row]) -> None:
        """Check a run of rows at consecutive positions (each body already checked against its leaf).

        Raises:
            IntegrityError: naming the first position whose leaf is not the one the sealed head holds,
                or, among the latest commit's rows, whose seq is not the one it seals.
        """
        first, stop = rows[0].pos, rows[-1].pos + 1
        if stop > self.size and self.sid is not None:
            self._head(self.sid)  # a writer may have committed since the head was read
        if stop > self.size:
            raise self._fail(f"the event at pos {max(first, self.size)} is not under the latest sealed head "
                             f"(size {self.size})", max(first, self.size))
        leaves = [r.leaf for r in rows]
        prefix, lock = self.prefix, self.session.host.caches.lock
        with lock:
            known = len(prefix.leaves) // 32
            inside = min(stop, known) - first
            proven = bytes(prefix.leaves[32 * first : 32 * (first + inside)]) if inside > 0 else b""
        if inside > 0 and b"".join(leaves[:inside]) != proven:
            bad = next(first + i for i in range(inside) if leaves[i] != proven[32 * i : 32 * i + 32])
            raise self._fail(f"the event at pos {bad} is not the one the sealed head holds", bad)
        rest = max(first, known)
        if rest < stop and not self._extend(rest, leaves[rest - first :]):
            bad = self._first_bad(rest, leaves[rest - first :])
            raise self._fail(NOT_IN_TREE.format(pos=bad, size=self.size), bad)
        if stop > self.tail:
            self._seqs(rows[max(0, self.tail - first):])

    def _extend(self, start: int, leaves: Sequence[bytes]) -> bool:
        """Prove ``leaves`` at ``start..`` (the prefix ends at ``start`` or later) and add them to the proven prefix.

        They are hashed up and joined with stored roots for the rest of the head's tree
        (:func:`merkle.run_root_with`), which must give the head's root; returns whether
        they did.
        """
        sid, backend = self.sid, self.session.host.backend
        assert sid is not None
        if merkle.run_root_with(start, leaves, self.size, lambda c: backend.hashes(sid, c), HASH) != self.root:
            return False
        with self.session.host.caches.lock:
            if len(self.prefix.leaves) == 32 * start:
                self.prefix.leaves += b"".join(leaves)
        return True

    def scattered(self, rows: Sequence[Row]) -> None:
        """Check rows at any positions, in position order, with one multi-proof from stored roots.

        Leaves in the proven prefix cost a comparison each; the others, with stored
        subtree roots for every subtree that holds none of them (``Reader.root_with``,
        one fetch), must give the head's root. Where that would read half the leaves
        past the prefix or more, the rest of the tree is proven instead (one range of
        leaves), and the rows compare against it.

        Raises:
            IntegrityError: naming the first position whose leaf is not the one the sealed head holds.
        """
        stop = rows[-1].pos + 1
        if stop > self.size and self.sid is not None:
            self._head(self.sid)  # a writer may have committed since the head was read
        if stop > self.size:
            bad = next(r.pos for r in rows if r.pos >= self.size)
            raise self._fail(f"the event at pos {bad} is not under the latest sealed head (size {self.size})", bad)
        with self.session.host.caches.lock:
            known = len(self.prefix.leaves) // 32
        rest = [r for r in rows if r.pos >= known]
        # A multi-proof reads every leaf of each stored tile that holds a row; where that
        # is half the rest of the tree or more, prove the whole rest once instead: one
        # range read, hashed natively, and every later read of the session compares.
        # Should that fail (a leaf was edited somewhere), the rows' own multi-proof below
        # decides, and names the first of them that is not the head's.
        if rest and len({r.pos >> merkle.TILE_HEIGHT for r in rest}) << (merkle.TILE_HEIGHT + 1) >= self.size - known:
            sid = self.sid
            assert sid is not None
            leaves = self.session.host.backend.leaves(sid, known, self.size)
            if len(leaves) == self.size - known and self._extend(known, leaves):
                with self.session.host.caches.lock:
                    known = len(self.prefix.leaves) // 32  # another thread's proof may have come first
                rest = [r for r in rows if r.pos >= known]
        with self.session.host.caches.lock:
            proven = {r.pos: bytes(self.prefix.leaves[32 * r.pos : 32 * r.pos + 32]) for r in rows if r.pos < known}
        for r in rows:
            if r.pos in proven and proven[r.pos] != r.leaf:
                raise self._fail(f"the event at pos {r.pos} is not the one the sealed head holds", r.pos)
        if rest and self.session.root_with({r.pos: r.leaf for r in rest}, self.size) != self.root:
            bad = next((r.pos for r in rest if self._fails(r)), rest[0].pos)
            raise self._fail(NOT_IN_TREE.format(pos=bad, size=self.size), bad)
        if stop > self.tail:
            self._seqs([r for r in rows if r.pos >= self.tail])

    def _seqs(self, rows: Sequence[Row]) -> None:
        """Check the global seqs of rows of the latest head's commit against those its seal covers."""
        tail, at = self.tail, seq_lookup(self.seqs)  # the runs unpacked once per check, not per row
        for r in rows:
            want = at(r.pos - tail)
            if r.seq != want:
                raise self._fail(f"the event at pos {r.pos} has seq {r.seq}, where the latest sealed head holds "
                                 f"{want}", r.pos)

    def _fails(self, row: Row) -> bool:
        """Return whether ``row``'s leaf fails its own inclusion proof from stored roots."""
        sid = self.sid
        assert sid is not None
        path = merkle.inclusion_spans(row.pos, self.size)
        proof = self.session.roots(path, sid)
        return merkle.root_from_inclusion(row.leaf, row.pos, self.size, proof, HASH) != self.root

    def _first_bad(self, start: int, leaves: Sequence[bytes]) -> int:
        """Return the first of ``leaves`` (from ``start``) whose inclusion proof from stored roots fails."""
        sid = self.sid
        assert sid is not None
        spans = [merkle.inclusion_spans(start + i, self.size) for i in range(len(leaves))]
        roots = self.session.roots([s for path in spans for s in path], sid)
        k = 0
        for i, path in enumerate(spans):
            proof, k = roots[k : k + len(path)], k + len(path)
            if merkle.root_from_inclusion(leaves[i], start + i, self.size, proof, HASH) != self.root:
                return start + i
        return start


class Erasures:
    """Which erased bodies of a session a logged redaction or retention accounts for, read as they come up.

    A body may be missing only where the redactions table names the event that erased
    it, and that event, itself matching its leaf, lists the position: a redaction among
    its ``positions``, a retention in its ``spans``.
    """

    def __init__(self, session: Reader, sid: int) -> None:
        self.session, self.sid = session, sid
        self.table: dict[int, int] | None = None
        #: eraser position -> (the positions it lists, "redacted" or "dropped")
        self.listed: dict[int, tuple[Container[int], str]] = {}

    def by(self, pos: int) -> tuple[int, str]:
        """Return the position of the event that erased ``pos``, and ``redacted`` or ``dropped`` (what it did).

        Raises:
            IntegrityError: no logged redaction or retention erased it: the body was erased behind the store's back.
        """
        backend = self.session.host.backend
        if self.table is None:
            self.table = backend.erasures(self.sid)
        by = self.table.get(pos)
        if by is not None and by not in self.listed:
            row = backend.row(self.sid, by)
            listed: tuple[Container[int], str] = (frozenset(), "")
            if row is not None and row.body is not None and merkle.leaf_hash(row.body) == row.leaf:
                try:
                    event: ev.Event | None = ev.decode(row.body)
                except InvalidEvent:
                    event = None
                if event is not None:
                    listed = ev.erases(event)
            self.listed[by] = listed
        if by is None or not pos < by or pos not in self.listed[by][0]:
            raise IntegrityError(
                f"the body at pos {pos} is missing and no redaction or retention event erased it",
                session=self.session.name, pos=pos,
            )
        return by, self.listed[by][1]
