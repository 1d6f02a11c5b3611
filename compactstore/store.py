"""The store and its sessions: append, read, tree heads, proofs.

A session is one append-only log with gapless positions from 0 and one Merkle tree
over its events. Every write transaction stores the subtree roots it completes and a
sealed tree head, so span roots, heads and proofs for any size are served in O(log n)
from stored roots, and the frontier (the compact range of the whole tree) is cached
between appends and re-read only when another writer has moved the session on.
"""

from __future__ import annotations

import asyncio
import operator
import os
import re
import threading
from contextlib import AbstractContextManager
from contextvars import ContextVar, Token
from itertools import islice, repeat
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Literal

import msgspec

from . import compaction, markers, merkle, resolver, rules
from . import index as structure_index
from . import policy as policies
from . import events as ev
from . import witness as witnesses
from .backends import SCHEMA_VERSION, Backend, HeadRow, Row, Rows, open_backend
from .compaction import AUTO, Auto, Finding, Node, OnRisk
from .content import content_digest_of, digester, unhex
from .errors import (
    CompactionInvariantError,
    CompactStoreError,
    ConflictError,
    ForeignReference,
    IntegrityError,
    InvalidArgument,
    InvalidEvent,
    KeyRequired,
    MarkerInvalid,
    ReconstructionUnsoundError,
    SessionMoved,
    StaleHead,
    shown,
)
from .events import LossClass, Record as Record, TreeHead as TreeHead, as_list
from .facts import Facts, FullFacts, IndexedFacts
from .index import Index
from .markers import Marker
from .policy import CompactionPolicy, Maintenance, Step
from .resolver import Artifact, Resolution, RestoredSpan
from .seal import derive_key, head_mac, key_check, seal, seq_lookup, seq_runs, store_id, store_id_ok
from .structure import build
from .summarize import Summarizer
from .verify import Problem, VerifyReport, verify_store
from .view import EventReader, SpanRead

HASH = "blake3"
MAX_SESSION_NAME = 512
_CHUNK = 2048
#: The kind tag of each event type (what ``Event.kind`` returns), looked up once per row.
_KINDS: dict[type[ev.Event], str] = {t: str(t.__struct_config__.tag) for t in ev.EVENT_TYPES}
_new_tuple = tuple.__new__
#: A prepared event's parts, read in C by ``map``.
_BODY, _EVENT, _KEY = operator.attrgetter("body"), operator.attrgetter("event"), operator.attrgetter("key")
_SUPERSEDES = operator.attrgetter("supersedes")
_NO_SUPERSEDES = frozenset({None})


#: Derived events the store admits only if they keep the rules (see :mod:`compactstore.rules`).
_ADMITTED = (ev.Summary, ev.Spill, ev.RecoveryMarker, ev.Redaction, ev.Attempt)
#: The same as exact types: a prepared event is always of a registered type (none subclasses
#: another), and ``type(e) in`` a set costs far less than ``isinstance`` through msgspec's metaclass.
_ADMITTED_TYPES = frozenset(_ADMITTED)
#: How often a builder's compare-and-append is tried again when another writer moved the session.
_RETRIES = 16
#: Spans whose read was checked against their leaves, kept per store for the commit that follows.
_SPANS_KEPT = 64


def open(  # noqa: A001 - the public name the API promises
    target: str = "compactstore.db",
    *,
    key: bytes | str | None = None,
    clock: ev.Clock | None = None,
    durable: bool = False,
    witness: str | os.PathLike[str] | witnesses.Witness | None = None,
    create: bool = True,
) -> Store:
    """Open (creating if needed) the store at ``target``.

    Args:
        target: a SQLite file path or ``":memory:"``.
        key: a secret; tree heads are then sealed with a keyed BLAKE3 MAC. A store
            created with a key must be opened with the same key to append or verify.
        clock: returns microseconds since the epoch; stamps events that carry no ``ts``.
        durable: survive power loss (``synchronous=FULL``), not only a process crash.
        witness: a file path outside the store, or a :class:`~compactstore.witness.Witness`:
            each session's latest head is saved there after every commit, and the
            store's trees are held to it on open, on reads and in ``verify()``.
        create: make a store where there is none: a missing or 0-byte file, a SQLite
            database without tables, a PostgreSQL database (or schema) without ours.
            Pass False to open only an existing store (as a reader or a checker
            should): anything else is then refused and left untouched.

    Raises:
        NotAStore: no store is there and ``create`` is false; or the target is
            something else (not a SQLite file, or one holding other tables), whatever ``create``.
        IntegrityError: the key does not match the store's.
        WitnessMismatch: a session does not extend the head the witness holds for it.
        CompactStoreError: the target is not a compactstore store, or is of a newer schema.
    """
    if isinstance(target, os.PathLike):
        target = os.fspath(target)
    if not isinstance(target, str) or not target or "\x00" in target:
        raise InvalidArgument("target", f"want a non-empty path or postgresql:// URL without NUL, got {shown(target)}")
    if key is not None:
        derive_key(key)  # a bad key is refused before anything is created
    if clock is not None:
        ev.as_callable("clock", clock)
    ev.as_flag("durable", durable)
    ev.as_flag("create", create)
    if witness is not None:
        witness = witnesses.as_witness(witness)
        if isinstance(witness, witnesses.FileWitness) and "://" not in target and target != ":memory:" and (
            os.path.abspath(witness.path) == os.path.abspath(target)
        ):
            raise InvalidArgument("witness", "must be a file outside the store, not the store itself")
    store = Store(open_backend(target, durable=durable, create=create), key=key, clock=clock, witness=witness,
                  create=create)
    store.target = target
    return store


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidArgument("session", "must be a non-empty str")
    if len(name) > MAX_SESSION_NAME or re.search(r"[\x00-\x1f\x7f]", name):
        raise InvalidArgument("session", f"at most {MAX_SESSION_NAME} characters, no control characters")
    _utf8("session", name)
    return name


def _utf8(field: str, text: str) -> None:
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidArgument(field, f"not valid Unicode text: {exc.reason} at {exc.start}") from None


MAX_POS = 2**63 - 1


def _is_position(value: object) -> bool:
    """Return whether ``value`` is an int position (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_POS


_position = ev.as_position


class _Pass:
    """One pass over a session's stored log and a batch after it: the facts of a commit the index cannot give."""

    def __init__(self, session: Session, first: int, events: Sequence[ev.Event], leaves: Sequence[bytes]) -> None:
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


class Store:
    """A compactstore: named sessions, each an append-only log with its own Merkle tree.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        key: bytes | str | None = None,
        clock: ev.Clock | None = None,
        witness: witnesses.Witness | None = None,
        create: bool = True,
    ) -> None:
        """Wrap an open backend. Prefer :func:`open`.

        ``create``: the store may be new, and then takes its identity here; without it, a
        store without an identity yet (its maker between the schema and the meta row) is
        refused as :class:`NotAStore`, and opening takes no write lock.
        """
        self._create = create
        self.backend = backend
        #: where the store lives (a path or URL), so worker processes can open it too
        self.target = ""
        self.clock: ev.Clock = ev.as_callable("clock", clock) if clock is not None else ev.system_clock
        self._mac_key = derive_key(key) if key is not None else None
        self._frontiers: dict[int, merkle.Frontier] = {}
        #: summary nodes read so far per session: ``sid -> (read up to, [(pos, node)])``
        self._nodes: dict[int, tuple[int, list[tuple[int, ev.Summary]]]] = {}
        #: spans read and checked against their leaves: ``(sid, start, stop) -> (redactions, read)``
        self._spans: dict[tuple[int, int, int], tuple[int, SpanRead]] = {}
        #: markers' certified resolutions per session: ``sid -> (redactions, kept)``
        self._certified: dict[int, tuple[int, resolver.Certified]] = {}
        #: nodes that met the marker conditions over their own spans: ``sid -> (redactions, positions)``
        self._settled: dict[int, tuple[int, set[int]]] = {}
        #: each session's maintenance plan, with the redaction count it was read under
        self._plans: dict[int, tuple[int, policies.Plan]] = {}
        #: leaves proven in a session's latest sealed head by earlier reads: ``sid -> prefix``
        self._verified: dict[int, _Prefix] = {}
        self._cache_lock = threading.Lock()
        #: the witness this store's heads are held to, if any
        self.watch: witnesses.Watch | None = None
        try:
            self._check_meta()
            if witness is not None:
                self.watch = witnesses.Watch(witness, self.store_id, self._latest, self._prove, self._witness_mac)
                problems = self.watch.load()
                if problems:
                    self.watch.check(problems[0][0])  # raises, naming the first session that fails
        except BaseException:
            backend.close()
            raise

    def _check_meta(self) -> None:
        # Only a new store takes this identity: init_meta writes into an empty table alone.
        wanted = {"hash": HASH, "keyed": "1" if self._mac_key else "0", "store_id": store_id(os.urandom(16))}
        if self._mac_key:
            wanted["key_check"] = key_check(self._mac_key)
        meta = self.backend.init_meta(wanted, create=self._create)
        if meta.get("schema_version") != SCHEMA_VERSION:
            raise CompactStoreError(
                f"unsupported schema version {meta.get('schema_version')!r}; this library reads {SCHEMA_VERSION!r}",
                hint="open the store with the compactstore version that wrote it",
            )
        if meta.get("hash") != HASH:
            raise CompactStoreError(f"unsupported hash {meta.get('hash')!r}; want {HASH!r}")
        if meta.get("keyed") not in ("0", "1") or ("key_check" in meta) != (meta.get("keyed") == "1"):
            raise IntegrityError(f"meta table is inconsistent: {sorted(meta)}")
        self.keyed = meta.get("keyed") == "1"
        if not store_id_ok(meta.get("store_id")):
            raise IntegrityError(f"meta table: the store's identity is missing or does not check: {meta.get('store_id')!r}")
        #: this store's identity, bound into every artifact it makes
        self.store_id = str(meta["store_id"])
        if self._mac_key and not self.keyed:
            raise IntegrityError("the store was created without a key", hint="open it without key=")
        if self._mac_key and meta.get("key_check") != wanted["key_check"]:
            raise IntegrityError("wrong key for this store")

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self.close()

    def close(self) -> None:
        """Close the store's connections, once the backend calls in flight have finished.

        Safe from any thread, while others still use the store, and more than once.
        Every later call that needs the database raises :class:`~compactstore.errors.StoreClosed`.
        """
        self.backend.close()

    def session(self, name: str) -> Session:
        """Return the session ``name``; it is created by its first append."""
        return Session(self, _check_name(name))

    def sessions(self) -> list[str]:
        """Return the names of every session with at least one event, sorted."""
        return [name for _, name in self.backend.sessions()]

    def verify(
        self, *, progress: Callable[[int, int], None] | None = None, workers: int | None = None
    ) -> VerifyReport:
        """Re-hash every body, rebuild every tree and check every stored node, head and seal.

        Also re-derives the structural index and each node's content digest from the
        bodies, and holds every stored summary node, spill and marker to the rules
        (:meth:`Session.rule_problems`), so a row written behind the library's back that
        admission would have refused is a problem too. Streams: memory stays flat however long
        the log and however large its bodies. ``progress(done, total)`` is called as events
        are checked. ``workers`` processes (default: one per usable CPU from
        ``verify.PARALLEL_FROM`` events or a database file of ``verify.PARALLEL_BYTES`` on,
        else none) check 4,096-position chunks, each summarised by its subtree root and its
        part of every head, and this process joins the summaries in order; the report is
        the same either way. A process with other threads checks a SQLite store alone: a
        worker forked while another thread is in a call into SQLite could wait for ever.
        """
        if progress is not None:
            ev.as_callable("progress", progress)
        if workers is not None:
            ev.as_position("workers", workers)
        report = verify_store(self, progress=progress, workers=workers)
        # The rules are held over a log that verifies: a damaged one is already reported.
        damaged = {p.session for p in report.problems}
        broken = [Problem(name, "events", pos, f"breaks a rule: {why}")
                  for name in self.sessions() if name not in damaged and None not in damaged
                  for pos, why in self.session(name).rule_problems()]
        if self.watch is not None:
            try:
                broken += [Problem(name, "witness", None, why) for name, why in self.watch.load()]
            except IntegrityError as exc:
                broken.append(Problem(None, "witness", None, str(exc)))
        if not broken:
            return report
        problems = report.problems + broken
        return msgspec.structs.replace(report, ok=False, problems=problems)

    def _latest(self, name: str) -> tuple[int, bytes]:
        sid = self.backend.session_id(name)
        head = self.backend.head(sid) if sid is not None else None
        return (head.size, head.root) if head else (0, b"")

    def _prove(self, name: str, old_size: int, new_size: int) -> list[bytes]:
        return self.session(name)._consistency(old_size, new_size)

    def _witness_mac(self, name: str, size: int, root: bytes) -> bytes | None:
        return self.head_mac(name, size, root)

    @property
    def has_key(self) -> bool:
        """Return whether this handle was opened with the store's key (so it can seal, MAC and certify)."""
        return self._mac_key is not None

    def same_key(self, other: Store) -> bool:
        """Return whether ``other`` was opened with the same key as this handle (both without one counts)."""
        if not isinstance(other, Store):
            raise InvalidArgument("other", f"want a Store, got {type(other).__name__}")
        return self._mac_key == other._mac_key

    def head_mac(self, session: str, size: int, root: bytes) -> bytes | None:
        """Return the MAC a tree head of ``session`` at ``size`` and ``root`` carries under this handle's key (None without one)."""
        return head_mac(self._mac_key, session, size, root) if self._mac_key is not None else None

    def check_head(self, head: TreeHead) -> bool:
        """Return whether ``head`` carries a valid MAC under this store's key.

        Raises:
            CompactStoreError: the store was opened without a key.
        """
        if not isinstance(head, TreeHead):
            raise InvalidArgument("head", f"want a TreeHead, got {type(head).__name__}")
        if self._mac_key is None:
            raise CompactStoreError("no key: open the store with its key to check head MACs")
        return head.mac is not None and head.mac == head_mac(self._mac_key, head.session, head.size, head.root)

    def seal_head(self, session: str, size: int, root: bytes, prev: int, seqs: bytes) -> bytes:
        """Return the seal a stored head of ``session`` must carry (a keyed MAC when the store has a key).

        ``seqs``: the global sequence numbers of its events, as :func:`compactstore.seal.seq_runs` packs them.
        """
        # Sizes are not checked as positions: verify seals the heads it reads, a tampered negative one included.
        ev.as_int("size", size)
        ev.as_int("prev", prev)
        if not isinstance(session, str) or not isinstance(root, bytes) or not isinstance(seqs, bytes):
            field = "session" if not isinstance(session, str) else "root" if not isinstance(root, bytes) else "seqs"
            raise InvalidArgument(field, f"want a str session, bytes root and seqs, got {type(session).__name__}, "
                                  f"{type(root).__name__}, {type(seqs).__name__}")
        return seal(self._mac_key, session, size, root, prev, seqs)


class Session:
    """One named, append-only log with its Merkle tree. Obtain with :meth:`Store.session`."""

    def __init__(self, store: Store, name: str) -> None:
        self.store = store
        self.name = name

    def __repr__(self) -> str:
        return f"Session({self.name!r})"

    def _sid(self) -> int | None:
        return self.store.backend.session_id(self.name)

    @property
    def size(self) -> int:
        """Return the number of events in the session."""
        sid = self._sid()
        head = self.store.backend.head(sid) if sid is not None else None
        return head.size if head else 0

    # --- writing ---------------------------------------------------------------

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
            _position("expect_size", expect_size)
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
        return ev.prepare(events, self.store.clock, lambda i, e: self._prepare(i, e, None, batch))

    def _commit(self, build: Callable[[int], Sequence[ev.Prepared]], *, speculate: bool = False) -> list[Record]:
        """Append what ``build(first_position)`` returns, in one transaction under the session's lock.

        ``build`` runs inside the transaction and may refuse on the size it is given
        (the compare of a compare-and-append). Every derived event is admitted by the
        rules against the log as it stands under the lock (:meth:`_admit`).
        ``speculate``: the backend may build on the head it committed last and take the
        lock with the insert; if another writer appended meanwhile, nothing is written
        and the append is built again under the lock.
        """
        if self.store.keyed and not self.store.has_key:
            raise KeyRequired("append", session=self.name)
        if speculate:
            try:
                return self._commit_with(build, True)
            except (StaleHead, SessionMoved):
                pass  # the remembered head may be stale either way: decide again under the lock
        return self._commit_with(build, False)

    def _commit_with(self, build: Callable[[int], Sequence[ev.Prepared]], speculate: bool) -> list[Record]:
        store, backend = self.store, self.store.backend
        with backend.writer(self.name, speculate=speculate) as w:
            sid = w.session_id
            head = w.head()
            self._not_behind(sid, head)
            frontier = self._frontier(sid, head, w.hashes)
            prepared = build(frontier.size)
            # Retries of idempotent appends replay their first record and write nothing.
            replays: dict[int, Record] = {}
            fresh: list[ev.Prepared] = []
            erasures: list[tuple[ev.Redaction, int]] = []
            first = frontier.size
            admitted, admit_types = False, _ADMITTED_TYPES
            events = list(map(_EVENT, prepared))
            # Most batches (no keys, nothing superseded, no derived event) take every event as
            # it is: checked in C, without the loop below.
            plain = (not any(map(_KEY, prepared)) and _NO_SUPERSEDES.issuperset(map(_SUPERSEDES, events))
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
                events = list(map(_EVENT, fresh))
            rows: Sequence[Row] = ()
            new: list[Record] = []
            proven: _Prefix | None = None
            if fresh:
                seqs = w.next_seqs(len(fresh))
                # The leaves in one call (hashed side by side); the rows and records column by
                # column through map and zip, which run in C: a loop of bytecode per event cost
                # more than building them (no body is decoded again).
                bodies = list(map(_BODY, fresh))
                leaves = merkle.leaf_hashes(bodies, HASH)
                kinds = list(map(_KINDS.__getitem__, map(type, events)))
                at = range(first, first + len(fresh))
                if len(fresh) == 1:  # one append: the columns' maps and lists would cost more than they save
                    p, kind, leaf = fresh[0], kinds[0], leaves[0]
                    rows = [_new_tuple(Row, (seqs[0], sid, first, kind, p.key, leaf, p.body))]
                    new = [Record(self.name, seqs[0], first, kind, p.event, p.body, leaf)]
                else:
                    rows = Rows(seqs, sid, at, kinds, list(map(_KEY, fresh)), leaves, bodies)
                    new = list(map(Record, repeat(self.name), seqs, at, kinds, events, bodies, leaves))
                if admitted:
                    w.confirm()  # the rules read the log as it stands at this head
                    with self.reading():  # one head check for every read the rules make
                        self._admit(first, fresh, rows, leaves)
                prev = head.size if head else 0
                proven = self._proven_to(sid, head, frontier)
                nodes, root = frontier.extend_root(leaves, every=merkle.TILE_HEIGHT)  # the levels a store keeps
                runs = seq_runs(seqs)
                # seal() itself: seal_head's checks are for heads read back, these values are ours.
                new_head = _new_tuple(HeadRow, (frontier.size, root, prev,
                                                seal(store._mac_key, self.name, frontier.size, root, prev, runs), runs))
                # The index first: an insert may be the transaction's last statement (it
                # commits in the same message on PostgreSQL).
                structure_index.extend(w, sid, prev, events)
                w.insert(rows, nodes, new_head)
                for redaction, by in erasures:
                    self._check_erasable(redaction, by)
                    w.erase(redaction.positions, by)
        if rows:
            self.store._frontiers[sid] = frontier
            if proven is not None:
                with store._cache_lock:
                    if len(proven.leaves) == 32 * prev and proven.size == prev:
                        proven.leaves += b"".join(leaves)
                        proven.size, proven.root, proven.sealed = new_head.size, new_head.root, new_head
            if store.watch is not None:  # after the commit: the witness holds only what is durable
                store.watch.acknowledge(self.name, frontier.size, root)
        if not replays:
            return new
        made = iter(new)
        return [replays[i] if i in replays else next(made) for i in range(len(prepared))]

    def _not_behind(self, sid: int, head: HeadRow | None) -> None:
        """Refuse to write on a head behind what this handle proved, or that the witness does not hold.

        A store copied back from an older backup under an open handle would otherwise take
        positions past its end, or a second history at the same size.

        Raises:
            IntegrityError: the stored head is smaller than the size this handle proved, or
                of that size with another root; nothing is written.
            WitnessMismatch: the stored head does not extend the head the witness holds.
        """
        store = self.store
        if store.watch is not None:
            store.watch.check(self.name)
        with store._cache_lock:
            prefix = store._verified.get(sid)
            known = (prefix.size, prefix.root) if prefix is not None and prefix.name == self.name else None
        size, root = (head.size, head.root) if head is not None else (0, _EMPTY_ROOT)
        if known is not None and (size < known[0] or (size == known[0] and root != known[1])):
            raise IntegrityError(
                f"the store holds session {self.name!r} at size {size}, where this handle proved size {known[0]}"
                + ("" if size < known[0] else " with another root")
                + ": it was replaced by another copy; nothing was written",
                session=self.name, pos=size,
            )

    def _proven_to(self, sid: int, head: HeadRow | None, frontier: merkle.Frontier) -> _Prefix | None:
        """Return the handle's proven prefix when every leaf under ``head`` is in it and ``frontier`` gives its root.

        A commit then adds its own leaves to the prefix under the head it seals: they are in
        that head by construction, so reading them back costs a comparison, not a proof.
        """
        size = head.size if head else 0
        with self.store._cache_lock:
            prefix = self.store._verified.get(sid)
            if prefix is None and size == 0:
                prefix = self.store._verified[sid] = _Prefix(self.name, 0, _EMPTY_ROOT)
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
                event = msgspec.structs.replace(event, ts=self.store.clock())
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
        sid = self._sid()
        redacted = sid is not None and bool(self.store.backend.redactions(sid))
        reader = self.reader(first)

        def get(pos: int) -> ev.Event | None:
            return events[pos - first] if first <= pos < first + len(events) else reader(pos)

        passed: _Pass | None = None
        erased: list[tuple[list[int], int]] = []  # the batch's redactions so far, for the events after them
        for j, event in enumerate(events):
            if not isinstance(event, _ADMITTED):
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
                f = IndexedFacts(self._index(), min(needs, first), get, self.span_root, self._nodes_before,
                                 readable=needs)
            else:
                if passed is None:
                    passed = _Pass(self, first, events, leaves)
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
        lo = min((p for p in positions if _is_position(p)), default=first + len(batch))
        logged = [(r.pos, r.event) for r in self.scan(lo, first)] if lo < first else []
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
        sid = self._sid()
        if sid is None:
            return set()
        redactions = len(self.store.backend.redactions(sid))
        with self.store._cache_lock:
            kept = self.store._settled.get(sid)
            if kept is None or kept[0] != redactions:
                kept = self.store._settled[sid] = (redactions, set())
        return kept[1]

    def rule_problems(self) -> list[tuple[int, str]]:
        """Return ``(position, why)`` for each stored derived event that breaks a rule of its log.

        Each summary node, spill and marker is held to the log before it, as at admission,
        so a store written behind the library's back (rows inserted with valid hashes) is
        caught by :meth:`Store.verify`. Content digests are verify's own check. In a
        session with redactions only the events appended after the last one are held to
        the rules: an erased body no longer gives the facts the earlier ones were admitted on.
        """
        sid = self._sid()
        if sid is None:
            return []
        size = self.size
        erased = self.store.backend.redactions(sid)
        after = max(erased.values()) + 1 if erased else 0
        found: list[tuple[int, str]] = []
        try:
            passed = _Pass(self, size, (), ()) if erased else None
        except CompactStoreError as exc:
            return [(-1, f"the log does not read: {exc}")]
        for pos in self.store.backend.derived_positions(sid, after, size):
            try:
                event = self.read(pos).event
                if not isinstance(event, _ADMITTED):
                    continue
                needs = min(event.size, pos) if isinstance(event, ev.RecoveryMarker) else pos
                f: Facts = (passed.facts(needs) if passed is not None else
                            IndexedFacts(self._index(), needs, self.reader(needs), self.span_root, self._nodes_before))
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
                got = self._span(start, stop)
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
        stored = list(self.scan(start, first)) if start < first else []
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
        done = self.store.backend.redactions(self._require_sid())
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
            named = {p for p in given if _is_position(p) and p < size}
            after = self._after(named, size, [])
            held = {p: e for p, e in after if p in named}
            return [ev.Redaction(positions=sorted([*given, *rules.copies(held, after)]), reason=reason)]

        return self._built(build)[0]

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
        return self._record(row)

    def _frontier(
        self, sid: int, head: HeadRow | None, fetch: Callable[[Sequence[tuple[int, int]]], list[bytes]]
    ) -> merkle.Frontier:
        size = head.size if head else 0
        cached = self.store._frontiers.get(sid)
        if cached is not None and cached.size == size:
            return cached.copy()
        coords = merkle.cover(0, size)
        found = merkle.resolve(coords, lambda c: fetch(c), HASH)
        return merkle.Frontier(size, [found[c] for c in coords], HASH)

    # --- structural facts and compaction ---------------------------------------

    def bind(self, key: str, value: ev.JSON, *, regenerable: bool = False, how: str | None = None) -> Record:
        """Record binding ``key`` = ``value``: a literal a later step may need.

        Args:
            regenerable: whether it can be re-fetched (a path you can list, an id you can
                re-query); ``how`` says how. A non-regenerable binding exists only here.
        """
        return self.append(ev.Binding(key=key, value=value, regenerable=regenerable, how=how))

    def oblige(self, name: str, needs: Sequence[str] = (), *, allow_unbound: bool = False) -> Record:
        """Open obligation ``name``, which will need the bindings ``needs``.

        Each need must name a binding the session already holds: a need that names
        none (a typo) would make the gate protect nothing. Pass ``allow_unbound=True``
        to open an obligation on bindings that will be bound later.

        Raises:
            InvalidArgument: naming ``needs``: a need names no binding of the session
                (and ``allow_unbound`` is False); nothing is written.
        """
        event = ev.Obligation(name=name, needs=ev.as_texts("needs", needs))
        if ev.as_flag("allow_unbound", allow_unbound) or not event.needs:
            return self.append(event)

        def build(size: int) -> list[ev.Event]:
            missing = rules.unbound_needs(self.facts(size), event.needs)
            if missing:
                raise InvalidArgument(
                    "needs", f"no binding {missing[0]!r} in session {self.name!r}" if len(missing) == 1 else
                    f"no bindings {missing} in session {self.name!r}",
                    hint="bind it first, or pass allow_unbound=True if it will be bound later")
            return [event]

        return self._built(build)[0]

    def fulfil(self, name: str) -> Record:
        """Close obligation ``name``.

        Raises:
            InvalidArgument: no such obligation is open.
        """
        ev.as_text("name", name)

        def build(size: int) -> list[ev.Event]:
            if not any(n == name for _, n, _ in self.facts(size).open_obligations()):
                raise InvalidArgument("name", f"no open obligation {name!r} in session {self.name!r}")
            return [ev.Fulfilment(name=name)]

        return self._built(build)[0]

    def _built(self, build: Callable[[int], list[ev.Event]]) -> list[Record]:
        """Append what ``build(size)`` returns from the session at ``size``, building again if it moved meanwhile."""
        for _ in range(_RETRIES):
            size = self.size
            events = build(size)
            try:
                return self.extend(events, expect_size=size)
            except SessionMoved:
                continue
        raise ConflictError(f"session {self.name!r} kept moving while an append was built", session=self.name)

    def compact(
        self,
        start: int,
        stop: int,
        *,
        summary: str | None = None,
        summarizer: Summarizer | None = None,
        loss: LossClass | Auto = LossClass.LOSSY_GIST,
        negative_facts: Iterable[ev.Fact | int] | Auto = AUTO,
        unresolved: Iterable[ev.Item | str] | Auto = AUTO,
        keep: Iterable[str | tuple[int, str]] | Auto = (),
        on_risk: OnRisk = "refuse",
        resolved: Iterable[ev.Item | str] | Auto = AUTO,
    ) -> Node:
        """Append a compaction: an L1 summary node over raw positions ``[start, stop)``.

        The node records the span root (from the tree, O(log n)), the content digest of
        the span's bodies (see :meth:`restore_span`), the summary (given,
        or made by ``summarizer`` from the span's records; the extractive one by
        default), its loss class, the negative facts it retains, the items it lists
        as unresolved and those opened before the span and closed in it it lists as
        resolved (all filled from the log's structure unless given), and the bindings
        in ``keep`` (keys, each kept by its latest value before ``stop``, or
        ``(pos, field path)``) verbatim; ``keep=AUTO`` keeps every literal of the span
        (:func:`compactstore.rules.span_literals`). ``loss=AUTO`` picks the honest class:
        LOSSLESS when every literal, negative fact and item of the span is kept, else
        LOSSY_LITERAL.

        Before a lossy compaction the gate runs: an open obligation that needs a
        non-regenerable binding bound in the span makes it refuse (``on_risk="refuse"``),
        keep the binding verbatim (``"preserve"``) or spill it to the store (``"spill"``).

        Raises:
            CompactionInvariantError: the gate refused, or LOSSLESS was claimed for a node
                that does not keep every literal and fact of its span.
            InvalidEvent: a given negative fact or item is not the log's (naming the field).
            InvalidArgument: the span is empty, out of range, or overlaps an L1 node.
        """
        return self._node_of(self._built(lambda size: compaction.compaction(
            self, size, start, stop, summary=summary, summarizer=summarizer, loss=loss,
            negative_facts=negative_facts, unresolved=unresolved, keep=keep, on_risk=on_risk, resolved=resolved,
        ))[-1])

    def roll_up(
        self,
        nodes: Sequence[Node | int],
        *,
        summary: str | None = None,
        summarizer: Summarizer | None = None,
        loss: LossClass | Auto | None = None,
        negative_facts: Iterable[ev.Fact | int] | Auto = AUTO,
        unresolved: Iterable[ev.Item | str] | Auto = AUTO,
        resolved: Iterable[ev.Item | str] | Auto = AUTO,
    ) -> Node:
        """Append an L2 node over contiguous L1 ``nodes``, carrying their retained facts forward.

        To grow the session digest, pass the current digest (an L2 node) followed by
        the L1 nodes after it: the new L2 covers their union and supersedes it (a
        digest already rolled up is refused; grow the newer one). Its negative facts,
        open items, kept literals and spills are carried over, held to the log again.
        ``resolved`` (filled from the log's structure unless given) lists the items opened
        before its span and closed anywhere in it. Its loss class defaults to the weakest
        of its children's (LOSSY_LITERAL when that is LOSSLESS and the node itself does
        not keep every literal, fact and item of its span), and cannot be stronger.

        Raises:
            InvalidArgument: the nodes are not contiguous L1 nodes (after at most one
                digest), overlap an L2 node, or the digest was already rolled up.
            CompactionInvariantError: ``loss`` claims more than the children give.
        """
        return self._node_of(self._built(lambda size: compaction.roll_up(
            self, size, nodes, summary=summary, summarizer=summarizer, loss=loss,
            negative_facts=negative_facts, unresolved=unresolved, resolved=resolved,
        ))[-1])

    def assert_compaction_safe(self, start: int, stop: int, keep: Iterable[str] = ()) -> None:
        """Raise CompactionInvariantError if a lossy compaction of ``[start, stop)`` loses a needed binding.

        Every open obligation is classified by whether the bindings it needs are
        regenerable; the error's ``risks`` list each obligation and binding at risk.
        """
        kept = set(ev.as_texts("keep", keep))
        size = self.size
        if not 0 <= ev.as_int("start", start) < ev.as_int("stop", stop) <= size:
            raise InvalidArgument("span", f"[{start}, {stop}) is not a non-empty span of the session's {size} positions")
        found = rules.risks(self.facts(size), start, stop, kept)
        if found:
            raise rules.gate_error(found, start, stop)

    def spilled(self, handle: str) -> ev.JSON:
        """Return the exact value spilled under ``handle``, proven in the sealed head and checked against its digest.

        Raises:
            InvalidArgument: ``handle`` names no spill.
            IntegrityError: the spill does not match its leaf, the sealed head or its digest.
            KeyRequired: the store is keyed and was opened without its key.
            ReconstructionUnsoundError: the spill was redacted.
        """
        pos = rules.spill_position(handle) if isinstance(handle, str) else None
        if pos is None:
            raise InvalidArgument("handle", f"want 'spill:<pos>', got {shown(handle)}")
        record = self.proven(pos)
        spill = record.event
        if isinstance(spill, ev.Redacted):
            raise ReconstructionUnsoundError(f"{handle} was redacted by the event at pos {spill.by}: its value is gone")
        if not isinstance(spill, ev.Spill):
            raise InvalidArgument("handle", f"{handle} names a {record.kind!r} event, not a spill")
        if rules.value_digest(spill.value) != spill.digest:
            raise IntegrityError(f"spill {handle}: value does not match its digest", session=self.name, pos=pos)
        return spill.value

    def node(self, pos: int) -> Node:
        """Return the summary node at ``pos``, with its loss manifest (``Node.lost``) read from the log."""
        return self._node_of(self.read(pos))

    def nodes(self) -> list[Node]:
        """Return every summary node of the session, by position, each with its loss manifest."""
        return [self._node_of(r) for r in self.scan() if r.kind == "node"]

    def _node_of(self, record: Record | Sequence[Record]) -> Node:
        """Return the node of ``record`` (or of the last of a batch) with its loss manifest, reading its span once."""
        if not isinstance(record, Record):
            record = record[-1]
        node = Node.from_record(record)
        summary, pos = record.event, record.pos
        assert isinstance(summary, ev.Summary)
        reader = self.reader(pos)
        reader.prefetch(range(node.start, min(node.stop, pos)))
        return msgspec.structs.replace(node, lost=rules.lost(self.facts(pos, reader=reader), summary, pos))

    def cover(self, size: int | None = None) -> list[Node]:
        """Return the nodes a marker at ``size`` (default: now) resolves to: the newest digest, the L1 nodes after it.

        Every node before ``size`` that no later node rolls up, in span order (see
        :func:`compactstore.rules.cover`); a resumed context holds them and the raw
        events outside their spans.
        """
        size, _ = self._bounded("size", size, 0)
        return [Node.from_record(self.read(p)) for p in rules.cover(self.facts(size))]

    def audit(self) -> list[Finding]:
        """Return each non-regenerable binding a lossy compaction swallowed and a later step needed."""
        return compaction.audit(self)

    # --- markers, resume and reconstruction -----------------------------------------

    def mark(self, node: Node | int | None = None) -> Marker:
        """Emit a recovery marker pointing at ``node``, or at the session's cover, at the current raw checkpoint.

        Without ``node`` the marker points at the cover (:meth:`cover`): the newest
        session digest and the L1 nodes after it, and a resume gives those nodes and
        the raw events outside their spans. Checks closure, negative-fact retention and
        anchoring first, over every node of the cover (see
        :func:`compactstore.rules.check_cover`), and records them as certified.

        Raises:
            MarkerInvalid: a condition fails; ``violations`` names each condition,
                position and item. Nothing is written; ``mark_raw`` is the safe fallback.
            InvalidArgument: no ``node`` given and the session has no summary node.
        """
        if node is None:
            return Marker.from_record(self._built(lambda size: [markers.cover_marker(self, size)])[-1])
        pos = resolver.position_of(self, "node", node)
        return Marker.from_record(self._built(lambda size: [markers.marker(self, size, pos)])[-1])

    def mark_raw(self, size: int | None = None) -> Marker:
        """Emit a raw-checkpoint marker at ``size`` (default: now); it resumes in ``fallback`` mode."""

        def build(now: int) -> list[ev.Event]:
            at = now if size is None else size
            if not isinstance(at, int) or isinstance(at, bool) or not 0 <= at <= now:
                raise InvalidArgument("size", f"must be in [0, {now}], got {shown(at)}")
            return [markers.raw_marker(self, at)]

        return Marker.from_record(self._built(build)[-1])

    def resume(self, marker: Marker | int, *, rehash: bool = False) -> Resolution:
        """Resume from ``marker``: certified summary tier, or exactly the raw events up to its checkpoint.

        The marker is trusted wholesale or not at all: every emission check is re-run
        and any failure gives ``fallback`` with the reasons. The same marker always
        gives a byte-identical ``digest``.

        What is re-hashed: by default, a certified resume costs O(log n) in the length
        of the session. It reads and re-hashes every body it looks at or returns (the
        marker, the nodes on the path, their excerpts' and spills' sources, the events
        behind the negative facts the node retains, the raw events of the context) and
        holds them against the checkpoint root the marker names; the structural facts
        of the span come from the structural index, and the bodies it does not read are
        vouched for by the stored tree (:meth:`Store.verify` re-hashes every one). A
        fallback, whose context is every raw event, re-hashes them all. With
        ``rehash=True`` every body up to the marker is re-hashed and the checks run over
        the events themselves: a changed byte anywhere under the checkpoint is found.

        Raises:
            IntegrityError: a body read does not match its leaf, or the bodies read do
                not give the checkpoint root (with ``rehash``: any body up to the marker).
        """
        pos = resolver.position_of(self, "marker", marker if isinstance(marker, Marker) else _position("marker", marker))
        return resolver.resume(self, pos, rehash=ev.as_flag("rehash", rehash))

    def context(self) -> Resolution:
        """Return what a resumed agent loads now: the latest certifying marker's cover and the raw events since.

        The session's markers are found latest first through the backend (a scan down
        the positions that stops at the markers it meets, not a read of the log). The
        first that certifies at its checkpoint (:meth:`resume`, on the same checks) and
        whose cover still keeps what every obligation open now needs gives the context:
        its cover, then the raw events after its checkpoint, derived events left out,
        each body re-hashed and held against the sealed head. ``size`` and ``root`` are
        the sealed head's. When no marker certifies, the mode is ``fallback``, the
        context is the raw log, ``marker`` is -1 and ``reasons`` say why each marker
        failed. The same log gives a byte-identical digest, on every backend.

        Raises:
            KeyRequired: the store is keyed and was opened without its key.
            IntegrityError: a body read does not match its leaf or the sealed head.
        """
        if self.store.watch is not None:
            self.store.watch.check(self.name)
        sid = self._sid()
        if sid is None:
            return resolver.empty_context(self.name)
        redactions = len(self.store.backend.redactions(sid))
        with self.store._cache_lock:
            kept = self.store._certified.get(sid)
            if kept is None or kept[0] != redactions:
                kept = self.store._certified[sid] = (redactions, resolver.Certified())
        return resolver.context(self, self._latest_markers(), kept[1])

    def latest_marker(self) -> Marker | None:
        """Return the marker :meth:`context` resolves from now, or None when none certifies."""
        got = self.context()
        return None if got.marker < 0 else Marker.from_record(self.read(got.marker))

    def _latest_markers(self) -> Iterator[int]:
        """Yield the positions of the session's markers, latest first, a few per query."""
        sid, backend = self._require_sid(), self.store.backend
        before, page = self.size, 8
        while True:
            got = backend.latest_markers(sid, before, page)
            yield from got
            if len(got) < page:
                return
            before, page = got[-1], min(page * 4, 512)

    def artifact(self, node: Node | int) -> Artifact:
        """Return the artifact a later instance expands from ``node``: loss class, payload, digest.

        The node is read again from the log and proven in the sealed head (of a ``Node``
        passed in, only its position is taken, once its session and leaf match). The
        digest binds the payload, loss class, node position, span root, the tree head
        (size and root), the session's name and the store's identity.

        Raises:
            KeyRequired: the store is keyed and was opened without its key.
            ForeignReference: ``node`` is not the node this session logged at its position.
        """
        return resolver.artifact(self, resolver.position_of(self, "node", node))

    def lookup(self, name: str) -> ev.JSON | None:
        """Return a literal's exact value from the log (a binding key, or ``pos:path``), or None.

        None too when a position redacted after the key's latest binding may have bound
        it anew: the latest value is then unknown.

        Raises:
            IntegrityError: a body read does not match its leaf, or was erased without a redaction.
        """
        if not isinstance(name, str):
            raise InvalidArgument("name", f"want a binding key or 'pos:path', got {type(name).__name__}")
        return resolver.lookup(self, name)

    def reconstruct(
        self,
        artifact: Artifact,
        operation: str,
        *,
        uses: Mapping[str, ev.JSON] | None = None,
        tool_results: Iterable[ev.JSON] = (),
        attempt: str | None = None,
    ) -> dict[str, ev.JSON]:
        """Run :func:`compactstore.reconstruct` against this log, guarding retries.

        With ``attempt`` (an idempotency key), the literals acted on are recorded in the
        log as an attempt, admitted only if every earlier attempt under the same key used
        the same value for each literal they share (read in the write transaction, so of
        two racing retries with different literals one is refused). ``retry_idempotent``
        needs ``attempt``.

        Raises:
            ReconstructionUnsoundError: naming the literal and why.
            InvalidArgument: an argument of the wrong type, or ``retry_idempotent`` without ``attempt``.
        """
        payload, record = resolver.restore(
            self, artifact, operation, uses=uses, tool_results=tool_results, attempt=attempt
        )
        if record is not None:
            self.append(record)
        return payload

    def restore_span(self, node: Node | int) -> RestoredSpan:
        """Return the raw events ``node`` replaced, exactly as logged, certified against the tree.

        What is trusted: the latest tree head, by its seal (a keyed MAC in a keyed
        store). The node is read from the log, its body re-hashed and its leaf proven in
        that head, in O(log n), so the node is the one the store appended, and the store
        refused it at append unless its content digest and span root were those of the
        span's stored bodies and leaves. The span's bodies are then read in one query
        and certified by one BLAKE3 over them against the node's content digest (a node
        over a redacted body cannot be restored). Bodies are not decoded until
        :meth:`RestoredSpan.events` is called. Any loss class: the raw log, not the
        summary, is the source.

        Raises:
            IntegrityError: a body, the node or the tree does not match: nothing is returned.
            ReconstructionUnsoundError: a body in the span was redacted.
            InvalidArgument: there is no summary node at that position.
        """
        store, backend, name = self.store, self.store.backend, self.name
        ref = node if isinstance(node, Node) else None
        if ref is not None:
            resolver.same_session(name, "node", ref)
        pos = _position("node", node if ref is None else ref.pos)
        # The node is read again from the log, once: a Node passed in is only a position
        # and a leaf here, and the leaf is proven in the sealed head below.
        sid = self._sid()
        row = backend.row(sid, pos) if sid is not None else None
        if ref is not None and (row is None or row.leaf != ref.leaf):
            # The verified read names the fault: a row missing or rewritten under the sealed
            # head (IntegrityError), or a Node that is not this session's (ForeignReference).
            resolver.position_of(self, "node", ref)
            raise ForeignReference("node", f"is not the event logged at pos {pos}", session=name, pos=pos)
        if sid is None or row is None:
            raise InvalidArgument("node", f"no event at {pos} in session {name!r}")
        try:
            n = _node_span.decode(row.body)  # type: ignore[arg-type]
        except (msgspec.DecodeError, TypeError):
            # Not a node (or erased): the full decoding says which, in its own words.
            record = self._record(row)
            if isinstance(record.event, ev.Redacted):
                raise ReconstructionUnsoundError(
                    f"node at pos {pos} was redacted by the event at pos {record.event.by}: it cannot vouch for a span"
                ) from None
            Node.from_record(record)
            raise InvalidArgument("node", f"pos {pos} is not a summary node") from None
        if merkle.leaf_hash(row.body) != row.leaf:  # type: ignore[arg-type]
            raise IntegrityError(f"node at pos {pos} does not match its leaf", session=name, pos=pos)
        if store.keyed and not store.has_key:
            raise KeyRequired("certify a restoration", session=name)
        head = self.sealed_head()  # its seal, and the witness where one is configured
        if not 0 <= n.start < n.stop <= pos < head.size:
            raise IntegrityError(f"node at pos {pos} covers [{n.start}, {n.stop}), not a span before it", session=name, pos=pos)
        proof = merkle.serve(merkle.inclusion_spans(pos, head.size), lambda c: backend.hashes(sid, c))
        if merkle.root_from_inclusion(row.leaf, pos, head.size, proof) != head.root:
            raise IntegrityError(f"node at pos {pos} is not in the tree of the latest head", session=name, pos=pos)
        start, stop = n.start, n.stop
        digest = None if n.content_digest is None else unhex(n.content_digest)
        got: list[bytes | None] = []

        def counted() -> None:
            if len(got) != stop - start:
                raise IntegrityError(f"[{start}, {stop}) holds {len(got)} events, want {stop - start}", session=name, pos=start)

        try:
            # Hashing refuses a None (redacted) body by itself: no separate pass over the span.
            if digest is not None:
                by: Literal["content_digest", "span_root"] = "content_digest"
                # Each batch of bodies is hashed as it is read, while it is in cache: no
                # pass over the whole span after the read, and no copy of it in one buffer.
                content = digester()
                got = backend.bodies(sid, start, stop, content.update)  # type: ignore[arg-type]  # None: TypeError
                ok = content.digest() == digest
            else:
                by = "span_root"
                want = unhex(n.span_root)
                got = backend.bodies(sid, start, stop)
                counted()
                ok = merkle.span_root_of_leaves(merkle.leaf_hashes(got), start, stop, first=start) == want  # type: ignore[arg-type]
        except TypeError:
            got = got or backend.bodies(sid, start, stop)  # the read the digest ended at a redacted body
            if None not in got:
                raise
            counted()
            erasures = _Erasures(self, sid)
            erased = [start + i for i, b in enumerate(got) if b is None]
            for p in erased:
                erasures.by(p)  # erased behind the store's back: tampering, not a redaction
            raise ReconstructionUnsoundError(
                f"[{start}, {stop}) cannot be restored: positions {erased} were redacted, only their leaves remain"
            ) from None
        counted()
        if not ok:
            # Name the body that changed when one no longer matches its leaf (else the node is at fault).
            leaves = dict(backend.subtree_range(sid, 0, start, stop))
            bad = next((start + i for i, b in enumerate(got) if merkle.leaf_hash(b) != leaves.get(start + i)), pos)  # type: ignore[arg-type]
            raise IntegrityError(
                f"the bodies of [{start}, {stop}) do not give the {by.replace('_', ' ')} of node at pos {pos}"
                + (f": the body at pos {bad} does not match its leaf" if bad != pos else ""),
                session=name, pos=bad,
            )
        return RestoredSpan(name, pos, start, stop, got, by)  # type: ignore[arg-type]

    # --- reading ---------------------------------------------------------------

    def _record(self, row: Row, erasures: _Erasures | None = None) -> Record:
        """Return the record of a stored row: the one checked read of a body.

        A body must hash to its leaf; a missing one must have been erased by a logged
        redaction (``erasures`` answers that, read once per call that passes it).

        Raises:
            IntegrityError: naming the position: the body does not match its leaf, or it
                is missing and no redaction event accounts for it.
        """
        if row.body is None:
            by = (erasures or _Erasures(self, row.session_id)).by(row.pos)
            return Record(self.name, row.seq, row.pos, "redacted", ev.Redacted(by=by), b"", row.leaf)
        if merkle.leaf_hash(row.body) != row.leaf:
            raise IntegrityError(f"event at pos {row.pos} does not match its leaf", session=self.name, pos=row.pos)
        return Record(self.name, row.seq, row.pos, row.kind, ev.decode_canonical(row.body), row.body, row.leaf)

    def _require_sid(self) -> int:
        sid = self._sid()
        if sid is None:
            raise InvalidArgument("session", f"{self.name!r} has no events")
        return sid

    def _index(self) -> Index:
        return Index(self.store.backend, self._require_sid())

    def _nodes_before(self, size: int) -> list[tuple[int, ev.Summary]]:
        """Return ``(position, node)`` of the session's summary nodes before ``size``, reading only those not read yet.

        The log before a position never changes (a redaction appends), so each read
        starts where the last stopped.
        """
        store, sid = self.store, self._require_sid()
        with store._cache_lock:
            upto, known = store._nodes.get(sid, (0, []))
        if upto < size:
            known = known + self._index().nodes(upto, size)
            with store._cache_lock:
                if store._nodes.get(sid, (0, []))[0] < size:
                    store._nodes[sid] = (size, known)
        return [(p, n) for p, n in known if p < size]

    def reader(self, size: int) -> EventReader:
        """Return a reader of the events before ``size`` that checks each body against its leaf.

        It keeps the leaves it checked (``leaves``), so that they can be held against a
        tree head with :meth:`root_with`.
        """
        return _EventReader(self, _position("size", size))

    def facts(self, size: int | None = None, *, reader: EventReader | None = None) -> Facts:
        """Return the structural facts of the session at checkpoint ``size`` (default: now).

        From the structural index in O(log n) queries when it answers; from one pass over
        the events when the session has redactions (an erased body no longer gives the
        facts it gave). ``reader`` reads the events the facts name (default: a new one).
        """
        size, sid = self._bounded("size", size, 0)
        if reader is not None:
            ev.as_callable("reader", reader)
        backend = self.store.backend
        if sid is None or backend.redactions(sid):
            events = [r.event for r in self.scan(0, size)]
            return FullFacts(events, self.span_root)
        return IndexedFacts(self._index(), size, reader or self.reader(size), self.span_root, self._nodes_before)

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
        stop, sid = self._bounded("stop", stop, 1)
        ev.as_flag("records", records)
        if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start < stop or sid is None:
            raise InvalidArgument("start", f"must be in [0, {stop}), got {shown(start)}")
        backend = self.store.backend
        out: list[Record] = []
        leaves: list[bytes] = []
        redacted = False
        erasures = _Erasures(self, sid)
        check = self._check()

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
                out.extend(self._record(r, erasures) for r in chunk)
            return got

        def stream() -> Iterator[list[bytes]]:
            pos, chunk = start, []
            for row in backend.rows(sid, start, stop, _CHUNK):
                if row.pos != pos:
                    break
                pos += 1
                chunk.append(row)
                if len(chunk) == _CHUNK:
                    yield bodies(chunk)
                    chunk = []
            if chunk:
                yield bodies(chunk)
            if pos != stop:
                raise IntegrityError(f"position {pos} is missing", session=self.name, pos=pos)

        digest = content_digest_of(stream())
        # The span's root from the leaves just proven, not from stored subtree roots.
        got = SpanRead(out, None if redacted else digest, merkle.span_root_of_leaves(leaves, start, stop, first=start))
        with self.store._cache_lock:
            spans = self.store._spans
            if len(spans) >= _SPANS_KEPT:
                spans.pop(next(iter(spans)))
            spans[(sid, start, stop)] = (len(backend.redactions(sid)), got._replace(records=[]))
        return got

    def _span(self, start: int, stop: int) -> SpanRead:
        """Return :meth:`read_span` of ``[start, stop)`` without records, from the last read when nothing was redacted since."""
        sid = self._require_sid()
        with self.store._cache_lock:
            kept = self.store._spans.get((sid, start, stop))
        if kept is not None and kept[0] == len(self.store.backend.redactions(sid)):
            return kept[1]
        return self.read_span(start, stop)

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
        size = _position("size", size)
        for p, leaf in leaves.items():
            if not 0 <= _position("leaves", p) < size or not isinstance(leaf, bytes) or len(leaf) != 32:
                raise InvalidArgument("leaves", f"want positions in [0, {size}) to 32-byte leaf hashes, got {shown(p)}: {shown(leaf)}")
        sid, backend = self._require_sid(), self.store.backend
        proven = self._proven(sid, size) if len(leaves) << (merkle.TILE_HEIGHT + 1) >= size else None
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

    def _proven(self, sid: int, size: int) -> bytearray | None:
        """Return a copy of the leaves ``[0, size)`` this handle's reads proved in the sealed head, if they reach ``size``."""
        with self.store._cache_lock:
            prefix = self.store._verified.get(sid)
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
        return _Reading((id(self.store), self.name))

    def _check(self) -> _ReadCheck:
        """Return the check of an open :meth:`reading` context, else a new one (which reads the id and the head).

        The context's check carries the session id it read with its head, so later reads
        inside look neither up again: the id, like the head, is the context's.
        """
        group = _READING.get()
        key = (id(self.store), self.name)
        if group is None or key not in group:
            return _ReadCheck(self, self._sid())
        check = group[key]
        if check is None or check.sid is None:  # an empty session may gain its first events meanwhile
            sid = self._sid()
            if check is None or check.sid != sid:
                check = group[key] = _ReadCheck(self, sid)
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
        _position("pos", pos)
        ev.as_flag("verify", verify)
        # A row committed after the head was read is past it, and run() reads the head again.
        check = self._check() if verify else None
        sid = check.sid if check is not None else self._sid()
        row = self.store.backend.row(sid, pos) if sid is not None else None
        if row is None:
            if check is not None and pos < check.size:
                raise IntegrityError(f"position {pos} is missing under the sealed head of size {check.size}",
                                     session=self.name, pos=pos)
            raise InvalidArgument("pos", f"no event at {pos} in session {self.name!r} (size {self.size})")
        if check is not None:
            check.run([row])  # before the body is decoded: a forged body is an IntegrityError first
        return self._record(row)

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
        _position("start", start)
        if stop is not None:
            _position("stop", stop)
        ev.as_flag("verify", verify)
        check = self._check() if verify else None
        sid = check.sid if check is not None else self._sid()
        if sid is None:
            return
        erasures = _Erasures(self, sid)  # read once, and only if a redacted row comes up
        if check is None:
            for row in self.store.backend.rows(sid, start, stop, _CHUNK):
                yield self._record(row, erasures)
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
            rows = self.store.backend.rows(sid, pos, stop, _CHUNK)
            while chunk := list(islice(rows, _CHUNK)):
                # Positions come in increasing order, each once: the chunk is gapless when its ends are.
                gap = chunk[0].pos != pos or chunk[-1].pos != pos + len(chunk) - 1
                if gap:
                    chunk = chunk[: next(i for i, r in enumerate(chunk) if r.pos != pos + i)]
                    if not chunk:
                        break
                check.run(chunk)
                for row in chunk:
                    yield self._record(row, erasures)
                pos += len(chunk)
                if gap:
                    break
            want = check.size if stop is None else min(stop, check.size)
            if pos >= want:
                return
            if check.reads == asked:
                raise IntegrityError(f"position {pos} is missing under the sealed head of size {check.size}",
                                     session=self.name, pos=pos)

    def _witnessed(self) -> None:
        """Refuse the session unless its stored head extends the one the witness holds (when one is configured)."""
        if self.store.watch is not None:
            self.store.watch.check(self.name)

    def _bounded(self, name: str, value: int | None, lo: int) -> tuple[int, int | None]:
        """Return ``(value or size, session id)`` after checking ``lo <= value <= size``.

        The id comes back so that the roots can be read without looking it up again.
        """
        sid = self._sid()
        head = self.store.backend.head(sid) if sid is not None else None
        size = head.size if head else 0
        value = size if value is None else _position(name, value)
        if not lo <= value <= size:
            raise InvalidArgument(name, f"must be in [{lo}, {size}] for session {self.name!r}, got {value!r}")
        return value, sid

    def _roots(self, spans: Sequence[merkle.Span], sid: int | None) -> list[bytes]:
        """Return the root of each span from stored roots, all read in one ``hashes`` call."""
        if sid is None:
            return merkle.spans_root(spans, {}, HASH)
        backend = self.store.backend
        return merkle.serve(spans, lambda c: backend.hashes(sid, c), HASH)

    def head(self, size: int | None = None, *, verify: bool = True) -> TreeHead:
        """Return the tree head at ``size`` (default: now), with a MAC when the store is keyed.

        The root is the one the latest sealed head vouches for, as :meth:`sealed_head`
        gives it: a root recomputed from an edited subtree table is refused, never MACed.
        ``verify=False`` gives the root the stored roots fold to, unchecked and so with no
        MAC (for drawing a store that does not verify); so does a keyed store opened
        without its key, which cannot check the seal.

        Raises:
            InvalidArgument: ``size`` is not in [0, latest size].
            IntegrityError: as :meth:`sealed_head`.
        """
        store = self.store
        if not ev.as_flag("verify", verify) or (store.keyed and not store.has_key):
            size, sid = self._bounded("size", size, 0)
            (root,) = self._roots([(0, size)], sid)
            return TreeHead(self.name, size, root, None)
        if size is None or _position("size", size):
            sid = self._sid()
            row = store.backend.head(sid) if sid is not None else None
            if sid is not None and row is not None:
                self._witnessed()
                return self._sealed_at(sid, row, size)
        size, _ = self._bounded("size", size, 0)  # an empty tree (size 0, or a session without events)
        return TreeHead(self.name, size, _EMPTY_ROOT, store.head_mac(self.name, size, _EMPTY_ROOT))

    @property
    def store_id(self) -> str:
        """Return the identity of the store this session lives in (bound into every artifact it makes)."""
        return self.store.store_id

    def sealed_head(self, size: int | None = None) -> TreeHead:
        """Return the tree head at ``size`` (default: the latest) as the latest sealed head vouches for it.

        The latest stored head's seal is checked (a keyed MAC in a keyed store), and a
        head at an earlier size is proven a prefix of it by a consistency proof: a root
        recomputed from a forged subtree table does not pass. Every certification and
        restoration rests on this head, in O(log n).

        Raises:
            KeyRequired: the store is keyed and was opened without its key.
            IntegrityError: the seal or the consistency proof does not verify.
            InvalidArgument: the session is empty, or ``size`` is not in [0, latest size].
        """
        store = self.store
        if store.keyed and not store.has_key:
            raise KeyRequired("certify", session=self.name)
        self._witnessed()
        sid = self._require_sid()
        return self._sealed_at(sid, store.backend.head(sid), size)

    def _sealed_at(self, sid: int, row: HeadRow | None, size: int | None) -> TreeHead:
        """Return :meth:`sealed_head` of ``size`` from ``row``, the latest stored head of session ``sid``."""
        store, name = self.store, self.name
        if row is None or row.seal != store.seal_head(name, row.size, row.root, row.prev, row.seqs):
            raise IntegrityError("the latest tree head's seal does not verify", session=name)
        size = row.size if size is None else size
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= row.size:
            raise InvalidArgument("size", f"must be in [0, {row.size}] for session {name!r}, got {shown(size)}")
        root = row.root
        if size < row.size:
            root, *proof = self._roots([(0, size), *merkle.consistency_spans(size, row.size)], sid)
            if not merkle.verify_consistency(size, row.size, root, row.root, proof, HASH):
                raise IntegrityError(f"the stored tree at size {size} is not a prefix of the sealed head", session=name, pos=size)
        return TreeHead(name, size, root, store.head_mac(name, size, root))

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
        _position("pos", pos)
        sid, backend = self._require_sid(), self.store.backend
        row = backend.row(sid, pos) if pos < head.size else None
        if row is None:
            raise InvalidArgument("pos", f"no event at {pos} in session {self.name!r} (size {head.size})")
        if row.body is not None and merkle.leaf_hash(row.body) != row.leaf:
            raise IntegrityError(f"event at pos {pos} does not match its leaf", session=self.name, pos=pos)
        proof = self._roots(merkle.inclusion_spans(pos, head.size), sid)
        if merkle.root_from_inclusion(row.leaf, pos, head.size, proof, HASH) != head.root:
            raise IntegrityError(f"event at pos {pos} is not in the tree of the sealed head", session=self.name, pos=pos)
        return self._record(row)

    def span_root(self, start: int, stop: int) -> bytes:
        """Return the root of positions ``[start, stop)`` (see :func:`merkle.span_root`), in O(log n)."""
        stop, sid = self._bounded("stop", stop, 0)
        if not 0 <= _position("start", start) <= stop:
            raise InvalidArgument("start", f"must be in [0, {stop}], got {shown(start)}")
        return self._roots([(start, stop)], sid)[0]

    def inclusion_proof(self, pos: int, size: int | None = None) -> list[bytes]:
        """Return the RFC 9162 inclusion proof of ``pos`` in the tree of ``size`` (default: now).

        Check it with :func:`compactstore.merkle.verify_inclusion`.
        """
        self._witnessed()
        size, sid = self._bounded("size", size, 1)
        if not 0 <= _position("pos", pos) < size:
            raise InvalidArgument("pos", f"must be in [0, {size - 1}], got {shown(pos)}")
        return self._roots(merkle.inclusion_spans(pos, size), sid)

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> list[bytes]:
        """Return the RFC 9162 consistency proof between tree sizes ``old_size`` and ``new_size``.

        Check it with :func:`compactstore.merkle.verify_consistency`.
        """
        self._witnessed()
        return self._consistency(old_size, new_size)

    def _consistency(self, old_size: int, new_size: int | None) -> list[bytes]:
        """Return :meth:`consistency_proof` from the stored roots, unwitnessed (what the witness's own check reads)."""
        new_size, sid = self._bounded("new_size", new_size, 0)
        if not 0 <= _position("old_size", old_size) <= new_size:
            raise InvalidArgument("old_size", f"must be in [0, {new_size}], got {shown(old_size)}")
        return self._roots(merkle.consistency_spans(old_size, new_size), sid)

    # --- maintenance under a compaction policy ---------------------------------------

    def maintain(self, policy: CompactionPolicy, *, progress: Callable[[Step], None] | None = None) -> Maintenance:
        """Do what ``policy`` says is due: compact the raw tail, grow the session digest, emit a marker.

        Every step is one commit through the gate, decided from the log as it stands
        (:func:`compactstore.policy.due`), so running it again after a crash partway
        finishes the work and writes nothing twice. A refused compaction or marker is
        reported in ``refused`` and tried again by the next call. ``progress(step)`` is
        called before each step. One maintainer per session: two racing ones may see
        ``InvalidArgument`` (overlapping nodes) and can simply run again.

        Raises:
            InvalidArgument: ``policy`` is not a CompactionPolicy, or its summarizer is
                async or returns anything but text (``field`` is ``summarizer``).
        """
        return policies.drive(self._maintenance(policy, progress), policy)

    async def amaintain(self, policy: CompactionPolicy, *, progress: Callable[[Step], None] | None = None) -> Maintenance:
        """Run :meth:`maintain` with a summarizer that may be ``async def`` (a language-model call).

        The store's work runs in a worker thread; the summarizer is awaited on the loop.
        """
        run = self._maintenance(policy, progress)
        text: str | None = None
        while True:
            records, done = await asyncio.to_thread(policies.advance, run, text)
            if done is not None or records is None:
                assert done is not None
                return done
            text = await policies.summary(policy, records)

    def _maintenance(self, policy: CompactionPolicy, progress: Callable[[Step], None] | None) -> policies.Run:
        """Do the due steps, yielding what each needs summarized; return what was done.

        Each step is decided at a size and appended only at that size: a step that lost a
        race with another writer (:class:`~compactstore.errors.SessionMoved`) is decided
        again from the log as it then stands, so two maintainers each do the work or find
        it done. The text of a step summarized and then lost is kept for the same step.
        """
        if not isinstance(policy, CompactionPolicy):
            raise InvalidArgument("policy", f"want a CompactionPolicy, got {type(policy).__name__}")
        compacted: list[int] = []
        rolled_up: list[int] = []
        refused: list[str] = []
        marker: int | None = None
        flags = {"compact": True, "roll_up": True, "mark": True}
        texts: dict[bytes, str] = {}
        lost = 0
        while True:
            size = self.size
            step = policies.due(self, policy, size=size, plan=self._plan(), **flags)
            if step is None:
                break
            if progress is not None:
                progress(step)
            try:
                if isinstance(step, policies.Mark):
                    try:
                        marker = self._step(size, [markers.cover_marker(self, size)])
                    except MarkerInvalid as exc:
                        refused.append(f"marker at node {step.node}: {exc}")
                    flags["mark"] = False  # one marker a run, refused or not
                    continue
                # Kept per redaction count: a summary of a span redacted since may quote what it erased.
                said = msgspec.json.encode(step) + str(len(self.store.backend.redactions(self._require_sid()))).encode()
                if said not in texts:
                    texts[said] = yield policies.inputs(self, step)
                text = texts[said]
                if isinstance(step, policies.RollUp):
                    rolled_up.append(self._step(size, compaction.roll_up(self, size, step.nodes, summary=text)))
                    continue
                try:
                    compacted.append(self._step(size, compaction.compaction(
                        self, size, step.start, step.stop, summary=text, on_risk=policy.on_risk)))
                except CompactionInvariantError as exc:
                    flags["compact"] = False  # the tail stays raw until the gate lets it go
                    refused.append(f"compaction [{step.start}, {step.stop}): {exc}")
            except SessionMoved:
                lost += 1
                if lost > _RETRIES:
                    raise ConflictError(
                        f"session {self.name!r} kept moving while its maintenance was decided", session=self.name
                    ) from None
        return Maintenance(compacted, rolled_up, marker, refused)

    def _plan(self) -> policies.Plan | None:
        """Return the session's maintenance plan kept by this handle (a new one after a redaction)."""
        sid = self._sid()
        if sid is None:
            return None
        redactions = len(self.store.backend.redactions(sid))
        with self.store._cache_lock:
            kept = self.store._plans.get(sid)
            if kept is None or kept[0] != redactions:
                kept = self.store._plans[sid] = (redactions, policies.Plan())
        return kept[1]

    def _step(self, size: int, events: list[ev.Event]) -> int:
        """Append what a maintenance step built at ``size``, only at that size; return the last position."""
        return self.extend(events, expect_size=size)[-1].pos


class _EventReader:
    """Reads events of a session before a checkpoint, each once, checking each body against its leaf.

    The leaves checked are kept in ``leaves``, so that the caller can hold them against
    a tree head (:meth:`Session.root_with`).
    """

    def __init__(self, session: Session, size: int) -> None:
        self.session, self.size = session, size
        self.events: dict[int, ev.Event] = {}
        self.leaves: dict[int, bytes] = {}

    def __call__(self, pos: int) -> ev.Event | None:
        """Return the event at ``pos``, or None when ``pos`` is not before the checkpoint."""
        if not 0 <= pos < self.size:
            return None
        if pos not in self.events:
            self.add(self.session.read(pos))
        return self.events[pos]

    def prefetch(self, positions: Iterable[int]) -> None:
        """Read the events at ``positions`` (those before the checkpoint and not read yet) in one query.

        Their leaves are held to the latest sealed head as :meth:`Session.read` holds one.

        Raises:
            IntegrityError: a body does not match its leaf, or a leaf is not the one the head holds.
        """
        session = self.session
        wanted = sorted({p for p in positions if 0 <= p < self.size and p not in self.events})
        if not wanted:
            return
        check = session._check()
        sid = check.sid
        if sid is None:
            return
        erasures = _Erasures(session, sid)
        rows = sorted(session.store.backend.rows_at(sid, wanted), key=lambda r: r.pos)
        if rows:  # scattered positions: held to the head by one multi-proof, not one per run
            check.scattered(rows)
        for row in rows:
            self.add(session._record(row, erasures))

    def add(self, record: Record) -> None:
        """Take in a record read elsewhere, checking it like the ones read here.

        Raises:
            IntegrityError: its body does not match its leaf.
        """
        leaf = record.leaf if isinstance(record.event, ev.Redacted) else merkle.leaf_hash(record.body)
        if leaf != record.leaf:
            raise IntegrityError(
                f"event at pos {record.pos} does not match its leaf", session=self.session.name, pos=record.pos
            )
        self.leaves[record.pos] = leaf
        self.events[record.pos] = record.event


_EMPTY_ROOT = merkle.empty_root(HASH)
#: the checks of the :meth:`Session.reading` contexts open here, by (store handle, session name)
_READING: ContextVar[dict[tuple[int, str], _ReadCheck | None] | None] = ContextVar("_READING", default=None)


class _Reading:
    """The context :meth:`Session.reading` returns: it opens the slot of one session's check in this context's group."""

    __slots__ = ("key", "token", "opened")
    token: Token[dict[tuple[int, str], _ReadCheck | None] | None] | None

    def __init__(self, key: tuple[int, str]) -> None:
        self.key, self.token, self.opened = key, None, False

    def __enter__(self) -> None:
        group = _READING.get()
        if group is None:
            group = {}
            self.token = _READING.set(group)
        if self.key not in group:  # else an outer context of this session serves
            group[self.key] = None
            self.opened = True

    def __exit__(self, *exc: object) -> None:
        group = _READING.get()
        if self.opened and group is not None:
            group.pop(self.key, None)
        if self.token is not None:
            _READING.reset(self.token)


class _Prefix:
    """Leaves ``[0, len(leaves) // 32)`` of a session, proven in its sealed head ``(size, root)`` by earlier reads."""

    __slots__ = ("name", "size", "root", "leaves", "sealed")

    def __init__(self, name: str, size: int, root: bytes) -> None:
        self.name, self.size, self.root = name, size, root
        self.leaves = bytearray()
        #: the latest head row whose seal was checked: the same row read again needs no new MAC
        self.sealed: HeadRow | None = None


#: the proven prefix of a check under an empty head (no read reaches under it, so none adds leaves)
_NO_PREFIX = _Prefix("", 0, _EMPTY_ROOT)


#: A run that does not give the head's root names the first of its positions whose inclusion
#: proof fails. That proof's siblings come from the stored rows, so a forged row fails it
#: for every position whose path passes through it: the forged one is the named or another
#: the named one's proof rests on.
_NOT_IN_TREE = ("the event at pos {pos} is not in the tree of the latest sealed head (size {size}), "
                "or a stored row its proof rests on was altered")


class _ReadCheck:
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

    def __init__(self, session: Session, sid: int | None) -> None:
        self.session, self.sid = session, sid
        self.size, self.root = 0, _EMPTY_ROOT
        #: the latest head's ``prev`` and ``seqs``: the first position of its commit and the seqs it seals
        self.tail, self.seqs = 0, b""
        #: whether the head was read for the read at hand (a reading() context's check is not, once reused)
        self.fresh = True
        self.prefix = _NO_PREFIX  # nothing is proven under an empty head: no read adds to it
        #: how many times the head was read: rows asked for before the latest reading may miss some of its commits
        self.reads = 0
        if sid is not None:
            self._head(sid)
        elif session.store.watch is not None:  # a session deleted under the witness has no id left
            session.store.watch.check(session.name)

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
        store = session.store
        if store.watch is not None:
            store.watch.check(session.name)
        self.reads += 1
        row = store.backend.head(sid)
        if row is None:
            return
        with store._cache_lock:
            prefix = store._verified.get(sid)
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
        proof = session._roots(merkle.consistency_spans(known, row.size), sid)
        if known and not merkle.verify_consistency(known, row.size, known_root, row.root, proof, HASH):
            raise self._fail(f"the tree of size {known} this handle proved is not a prefix of the latest sealed head "
                             f"(size {row.size})", known)
        with store._cache_lock:
            if prefix.size < row.size:
                prefix.size, prefix.root = row.size, row.root
        self.size, self.root, self.prefix, self.tail, self.seqs = row.size, row.root, prefix, row.prev, row.seqs

    def _sealed(self, sid: int, row: HeadRow) -> HeadRow:
        """Return ``row``, the latest stored head, its seal checked."""
        store, name = self.session.store, self.session.name
        if store.keyed and not store.has_key:
            return row
        with store._cache_lock:
            prefix = store._verified.get(sid)
            if prefix is not None and prefix.name == name and prefix.sealed == row:
                return row
        if row.seal != store.seal_head(name, row.size, row.root, row.prev, row.seqs):
            raise self._fail(f"the latest tree head (size {row.size}) has a seal that does not verify", row.size)
        if prefix is not None and prefix.name == name:
            prefix.sealed = row
        return row

    def _known(self, sid: int, row: HeadRow) -> tuple[_Prefix, int, bytes]:
        """Return the handle's proven prefix of the session (a new one at ``row``), its head size and root."""
        store = self.session.store
        with store._cache_lock:
            prefix = store._verified.get(sid)
            if prefix is None or prefix.name != self.session.name:
                prefix = store._verified[sid] = _Prefix(self.session.name, row.size, row.root)
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
        prefix, lock = self.prefix, self.session.store._cache_lock
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
            raise self._fail(_NOT_IN_TREE.format(pos=bad, size=self.size), bad)
        if stop > self.tail:
            self._seqs(rows[max(0, self.tail - first):])

    def _extend(self, start: int, leaves: Sequence[bytes]) -> bool:
        """Prove ``leaves`` at ``start..`` (the prefix ends at ``start`` or later) and add them to the proven prefix.

        They are hashed up and joined with stored roots for the rest of the head's tree
        (:func:`merkle.run_root_with`), which must give the head's root; returns whether
        they did.
        """
        sid, backend = self.sid, self.session.store.backend
        assert sid is not None
        if merkle.run_root_with(start, leaves, self.size, lambda c: backend.hashes(sid, c), HASH) != self.root:
            return False
        with self.session.store._cache_lock:
            if len(self.prefix.leaves) == 32 * start:
                self.prefix.leaves += b"".join(leaves)
        return True

    def scattered(self, rows: Sequence[Row]) -> None:
        """Check rows at any positions, in position order, with one multi-proof from stored roots.

        Leaves in the proven prefix cost a comparison each; the others, with stored
        subtree roots for every subtree that holds none of them (``Session.root_with``,
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
        with self.session.store._cache_lock:
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
            leaves = self.session.store.backend.leaves(sid, known, self.size)
            if len(leaves) == self.size - known and self._extend(known, leaves):
                with self.session.store._cache_lock:
                    known = len(self.prefix.leaves) // 32  # another thread's proof may have come first
                rest = [r for r in rows if r.pos >= known]
        with self.session.store._cache_lock:
            proven = {r.pos: bytes(self.prefix.leaves[32 * r.pos : 32 * r.pos + 32]) for r in rows if r.pos < known}
        for r in rows:
            if r.pos in proven and proven[r.pos] != r.leaf:
                raise self._fail(f"the event at pos {r.pos} is not the one the sealed head holds", r.pos)
        if rest and self.session.root_with({r.pos: r.leaf for r in rest}, self.size) != self.root:
            bad = next((r.pos for r in rest if self._fails(r)), rest[0].pos)
            raise self._fail(_NOT_IN_TREE.format(pos=bad, size=self.size), bad)
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
        proof = self.session._roots(path, sid)
        return merkle.root_from_inclusion(row.leaf, row.pos, self.size, proof, HASH) != self.root

    def _first_bad(self, start: int, leaves: Sequence[bytes]) -> int:
        """Return the first of ``leaves`` (from ``start``) whose inclusion proof from stored roots fails."""
        sid = self.sid
        assert sid is not None
        spans = [merkle.inclusion_spans(start + i, self.size) for i in range(len(leaves))]
        roots = self.session._roots([s for path in spans for s in path], sid)
        k = 0
        for i, path in enumerate(spans):
            proof, k = roots[k : k + len(path)], k + len(path)
            if merkle.root_from_inclusion(leaves[i], start + i, self.size, proof, HASH) != self.root:
                return start + i
        return start


class _Erasures:
    """Which erased bodies of a session a logged redaction accounts for, read as they come up.

    A body may be missing only where the redactions table names the redaction event
    that erased it, and that event, itself matching its leaf, lists the position.
    """

    def __init__(self, session: Session, sid: int) -> None:
        self.session, self.sid = session, sid
        self.table: dict[int, int] | None = None
        self.listed: dict[int, frozenset[int]] = {}

    def by(self, pos: int) -> int:
        """Return the position of the redaction event that erased ``pos``.

        Raises:
            IntegrityError: no logged redaction erased it: the body was erased behind the store's back.
        """
        backend = self.session.store.backend
        if self.table is None:
            self.table = backend.redactions(self.sid)
        by = self.table.get(pos)
        if by is not None and by not in self.listed:
            row = backend.row(self.sid, by)
            listed: frozenset[int] = frozenset()
            if row is not None and row.body is not None and merkle.leaf_hash(row.body) == row.leaf:
                try:
                    event: ev.Event | None = ev.decode(row.body)
                except InvalidEvent:
                    event = None
                if isinstance(event, ev.Redaction):
                    listed = frozenset(event.positions)
            self.listed[by] = listed
        if by is None or not pos < by or pos not in self.listed[by]:
            raise IntegrityError(
                f"the body at pos {pos} is missing and no redaction event erased it", session=self.session.name, pos=pos
            )
        return by


class _NodeSpan(msgspec.Struct, frozen=True, tag="node", tag_field="kind"):
    """The fields of a summary node's body that a restoration reads; the others are skipped, not built."""

    start: int
    stop: int
    span_root: str
    content_digest: str | None = None


_node_span = msgspec.json.Decoder(_NodeSpan)



