"""The store and its sessions: append, read, tree heads, proofs.

A session is one append-only log with gapless positions from 0 and one Merkle tree
over its events. Every write transaction stores the subtree roots it completes and a
sealed tree head, so span roots, heads and proofs for any size are served in O(log n)
from stored roots, and the frontier (the compact range of the whole tree) is cached
between appends and re-read only when another writer has moved the session on.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from types import TracebackType

import msgspec

from . import compaction, markers, resolver, restore, retention, rules
from . import migrate as migrations
from . import events as ev
from . import policy as policies
from . import witness as witnesses
from .backends import SCHEMA_VERSION, Backend, open_backend
from .compaction import AUTO, Auto, Finding, Node, OnRisk
from .errors import (
    BodyDroppedError,
    CompactStoreError,
    IntegrityError,
    InvalidArgument,
    SchemaOutdatedError,
    shown,
)
from .events import LossClass, Record as Record, TreeHead as TreeHead
from .log.caches import Caches
from .log.commit import Writer
from .log.maintainer import run
from .log.heads import HASH
from .log.reader import Reader
from .markers import Marker
from .policy import CompactionPolicy, Maintenance, Step
from .resolver import Artifact, Resolution, RestoredSpan
from .seal import derive_key, head_mac, key_check, seal, store_id, store_id_ok
from .structure import IndexRow
from .summarize import Summarizer
from .verify import Problem, VerifyReport, verify_store

MAX_SESSION_NAME = 512


def open(  # noqa: A001 - the public name the API promises
    target: str = "compactstore.db",
    *,
    key: bytes | str | None = None,
    clock: ev.Clock | None = None,
    durable: bool = False,
    witness: str | os.PathLike[str] | witnesses.Witness | None = None,
    create: bool = True,
    migrate: bool = False,
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
        migrate: bring a store made by an earlier release to this release's schema first
            (:func:`compactstore.migrate.migrate`: every event, leaf and seal kept; on
            SQLite a copy of the file is written first). Otherwise such a store is refused.

    Raises:
        NotAStore: no store is there and ``create`` is false; or the target is
            something else (not a SQLite file, or one holding other tables), whatever ``create``.
        IntegrityError: the key does not match the store's.
        WitnessMismatch: a session does not extend the head the witness holds for it.
        SchemaOutdatedError: the store was made by an earlier release and ``migrate`` is false.
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
    ev.as_flag("migrate", migrate)
    backend = open_backend(target, durable=durable, create=create)
    try:
        found = migrations.version_of(backend)
        if migrations.needed(found):
            assert found is not None
            if not migrate:
                raise SchemaOutdatedError(migrations.where(target), found, SCHEMA_VERSION, migrations.command(target))
            migrations.migrate(backend, target)
    except BaseException:
        backend.close()
        raise
    store = Store(backend, key=key, clock=clock, witness=witness, create=create)
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


_position = ev.as_position


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
        #: what this handle keeps between calls (see :class:`compactstore.log.caches.Caches`)
        self.caches = Caches()
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
                f"the store is of schema {meta.get('schema_version')!r}, which this release neither reads "
                f"({SCHEMA_VERSION!r}) nor migrates (from {', '.join(migrations.MIGRATES_FROM)})",
                hint="open it with the compactstore release that wrote it, or a later one",
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

    def reclaim(self) -> int:
        """Give the space of dropped and redacted bodies back; return the bytes freed.

        On SQLite the file is rewritten from its live rows (``VACUUM``: it waits for, and
        holds off, other writers while it runs, and needs room for a second copy); on
        PostgreSQL the log's tables are vacuumed (autovacuum gets there on its own too).
        Every event, leaf, head and seal stays as it was.
        """
        return self.backend.reclaim()

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
        """Re-hash every body, rebuild every tree and check every stored node, head, seal and rule.

        Re-derives the structural index and each node's content digest from the bodies,
        and holds every stored derived event to the rules (:meth:`Session.rule_problems`),
        so a row written behind the library's back that admission would have refused is a
        problem too. Streams: memory stays flat however long the log. ``progress(done,
        total)`` is called as events are checked. ``workers`` processes (default: one per
        usable CPU on large stores) check chunks side by side; the report is the same
        either way. A process with other threads checks a SQLite store alone.
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
        return self.session(name).view.consistency(old_size, new_size)

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
    """One named, append-only log with its Merkle tree. Obtain with :meth:`Store.session`.

    A facade: reads go through :attr:`view`, the verifying reader (the builders' too), writes through the one commit.

    Attributes:
        store: the store it lives in.
        name: its name.
        view: its verifying reader (:class:`compactstore.log.reader.Reader`): for tools that
            read a session as the builders do (its structural facts, checked spans).
    """

    def __init__(self, store: Store, name: str) -> None:
        self.store = store
        self.name = name
        self.view = Reader(store, name)
        self._writer = Writer(self.view)

    def __repr__(self) -> str:
        return f"Session({self.name!r})"

    @property
    def size(self) -> int:
        """Return the number of events in the session."""
        return self.view.size

    # --- writing ---------------------------------------------------------------

    def append(self, event: ev.Event, *, idempotency_key: str | None = None) -> Record:
        """Append one event and return its record (see :meth:`extend`); a retry under ``idempotency_key`` writes nothing.

        Raises:
            InvalidEvent, ConflictError, IntegrityError: as :meth:`extend`.
        """
        return self._writer.append(event, idempotency_key=idempotency_key)

    def extend(
        self,
        events: Sequence[ev.Event],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
        expect_size: int | None = None,
    ) -> list[Record]:
        """Append events in one transaction; all are written or none.

        The one commit: every other write goes through it, and it holds every derived
        event to the rules, whichever way it arrives. ``idempotency_keys``: one key (or
        None) per event; a retried event with its key returns its first record.
        ``expect_size``: write only if the session holds exactly this many events.

        Raises:
            InvalidEvent: naming the event's index and field; nothing is written.
            SessionMoved: the session is not at ``expect_size``; nothing is written.
            ConflictError: an idempotency key was already used for a different event.
            IntegrityError: the store holds less of the session than this handle proved.
        """
        return self._writer.extend(events, idempotency_keys=idempotency_keys, expect_size=expect_size)

    def redact(self, positions: Sequence[int], reason: str) -> Record:
        """Erase the bodies at ``positions`` and every derived copy of them, logging a redaction that says why.

        Copies are found by :func:`compactstore.rules.copies`. The leaves stay, so the tree
        still verifies; a redacted position is unknown to the rules, not empty: no marker
        over it certifies, no node over it is LOSSLESS, no span holding it is restored.

        Raises:
            InvalidEvent: a position is out of range or already redacted; nothing is written.
        """
        return self._writer.redact(positions, reason)

    def replicate(self, records: Sequence[Record], erased: Mapping[int, int], index_rows: Sequence[IndexRow]) -> None:
        """Append another store's ``records`` as they are, redacted and dropped rows included (what :func:`compactstore.copy` writes).

        See :meth:`compactstore.log.commit.Writer.replicate`: each present body is held to
        its leaf, erased rows keep their leaves, and the rules are not decided again; the
        caller holds the copy's root to the source's.

        Raises:
            SessionMoved: the session does not end where ``records`` begin; nothing is written.
            IntegrityError: a body does not match its leaf, or an eraser is not among the records.
        """
        self._writer.replicate(records, erased, index_rows)

    def retain(self, *, keep_last: int = 0) -> Record | None:
        """Drop the raw bodies that the certified context's summaries stand for; return the retention logged (None: nothing to drop).

        The marker that gives :meth:`context` now names the cover; of its spans, the raw
        conversation that gives no fact of its own (turns, tool calls with their results;
        never bindings, obligations, handles, failures, rejections, cited events, derived
        events, or the newest ``keep_last`` positions: see :mod:`compactstore.retention`)
        loses its body and keeps its leaf, so every tree, proof, seal and certification
        holds and :meth:`context` is byte-identical after. A dropped body reads as dropped
        (:class:`~compactstore.errors.BodyDroppedError` from :meth:`read` and
        :meth:`restore_span`). The index keeps the facts. :meth:`Store.reclaim` gives the
        freed space back to the file system.

        Raises:
            InvalidArgument: ``keep_last`` is not a non-negative int.
        """
        ev.as_position("keep_last", keep_last)
        got = self.context()
        if got.mode != "certified" or got.marker < 0:
            return None
        view = self.view

        def build(size: int) -> list[ev.Event]:
            plan = retention.planned(view, view.facts(size), got.marker, keep_last)
            return [] if plan is None else [plan]

        made = self._writer.built(build)
        return made[-1] if made else None

    def rule_problems(self) -> list[tuple[int, str]]:
        """Return ``(position, why)`` for each stored derived event that breaks a rule of its log (what ``verify`` reports)."""
        return self._writer.admission.rule_problems()

    # --- reading ---------------------------------------------------------------

    def read(self, pos: int, *, verify: bool = True) -> Record:
        """Return the record at ``pos``, its body checked against its leaf and the leaf against the latest sealed head.

        ``verify=False`` checks the body against its own leaf only (a body rewritten with
        its leaf then passes).

        Raises:
            InvalidArgument: no event at ``pos``.
            IntegrityError: naming the position: the body, its leaf, the head's seal, or a
                position missing under the head.
            WitnessMismatch: the stored head does not extend the witness's.
        """
        record = self.view.read(pos, verify=verify)
        if isinstance(record.event, ev.Dropped):
            raise BodyDroppedError(pos, record.event.by, self.view.read(record.event.by).event.ts)
        return record

    def scan(self, start: int = 0, stop: int | None = None, *, verify: bool = True) -> Iterator[Record]:
        """Yield the records of ``[start, stop)`` in order, streaming, each checked as :meth:`read` checks it.

        Raises:
            IntegrityError: as :meth:`read`; also when a position under the head is missing.
        """
        return self.view.scan(start, stop, verify=verify)

    def reading(self) -> AbstractContextManager[None]:
        """Return a context in which this session's verified reads check the latest sealed head once (one adapter call)."""
        return self.view.reading()

    def head(self, size: int | None = None, *, verify: bool = True) -> TreeHead:
        """Return the tree head at ``size`` (default: now) as :meth:`sealed_head` vouches for it, with a MAC when keyed.

        ``verify=False`` (or a keyed store opened without its key) gives the root the
        stored roots fold to, unchecked and without a MAC.

        Raises:
            InvalidArgument: ``size`` is not in [0, latest size].
            IntegrityError: as :meth:`sealed_head`.
        """
        return self.view.head(size, verify=verify)

    @property
    def store_id(self) -> str:
        """Return the identity of the store this session lives in (bound into every artifact it makes)."""
        return self.store.store_id

    def sealed_head(self, size: int | None = None) -> TreeHead:
        """Return the tree head at ``size`` (default: the latest) as the latest sealed head vouches for it.

        Its seal is checked (a keyed MAC in a keyed store), an earlier size is proven a
        prefix of it, and a witness must hold a head it extends. Every certification and
        restoration rests on this head.

        Raises:
            KeyRequired: the store is keyed and was opened without its key.
            IntegrityError: the seal or the consistency proof does not verify.
            WitnessMismatch: the stored head does not extend the witness's.
            InvalidArgument: the session is empty, or ``size`` is not in [0, latest size].
        """
        return self.view.sealed_head(size)

    def span_root(self, start: int, stop: int) -> bytes:
        """Return the root of positions ``[start, stop)`` (see :func:`merkle.span_root`), in O(log n)."""
        return self.view.span_root(start, stop)

    def inclusion_proof(self, pos: int, size: int | None = None) -> list[bytes]:
        """Return the RFC 9162 inclusion proof of ``pos`` in the tree of ``size`` (default: now).

        Check it with :func:`compactstore.merkle.verify_inclusion`.
        """
        return self.view.inclusion_proof(pos, size)

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> list[bytes]:
        """Return the RFC 9162 consistency proof between tree sizes ``old_size`` and ``new_size``.

        Check it with :func:`compactstore.merkle.verify_consistency`.
        """
        return self.view.consistency_proof(old_size, new_size)

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
            missing = rules.unbound_needs(self.view.facts(size), event.needs)
            if missing:
                raise InvalidArgument(
                    "needs", f"no binding {missing[0]!r} in session {self.name!r}" if len(missing) == 1 else
                    f"no bindings {missing} in session {self.name!r}",
                    hint="bind it first, or pass allow_unbound=True if it will be bound later")
            return [event]

        return self._writer.built(build)[0]

    def fulfil(self, name: str) -> Record:
        """Close obligation ``name``.

        Raises:
            InvalidArgument: no such obligation is open.
        """
        ev.as_text("name", name)

        def build(size: int) -> list[ev.Event]:
            if not any(n == name for _, n, _ in self.view.facts(size).open_obligations()):
                raise InvalidArgument("name", f"no open obligation {name!r} in session {self.name!r}")
            return [ev.Fulfilment(name=name)]

        return self._writer.built(build)[0]

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
        """Append a compaction: an L1 summary node over raw positions ``[start, stop)``; see :func:`compactstore.compaction.compaction`.

        The node records the span root, the content digest of the span's bodies, the
        summary (given, or ``summarizer``'s over the span's raw events; the extractive one
        by default), its loss class, and what it retains: negative facts, unresolved and
        resolved items (from the log's structure unless given), and ``keep`` verbatim
        (binding keys or ``(pos, path)``; ``AUTO``: every literal). ``loss=AUTO`` picks
        LOSSLESS when everything is kept, else LOSSY_LITERAL. Before a lossy compaction
        the gate runs: an open obligation's non-regenerable binding in the span makes it
        refuse (``on_risk="refuse"``), keep it (``"preserve"``) or spill it (``"spill"``).

        Raises:
            CompactionInvariantError: the gate refused, or a LOSSLESS claim does not hold.
            InvalidEvent: a given negative fact or item is not the log's (naming the field).
            InvalidArgument: the span is empty, out of range, or overlaps an L1 node.
        """
        return self._node_of(self._writer.built(lambda size: compaction.compaction(
            self.view, size, start, stop, summary=summary, summarizer=summarizer, loss=loss,
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
        """Append an L2 node over contiguous L1 ``nodes``; see :func:`compactstore.compaction.roll_up`.

        To grow the session digest, pass the current digest followed by the L1 nodes after
        it: the new L2 covers their union and supersedes it. It retains its children's
        negative facts (listing what an L1 child dropped and the newest of theirs, and any
        ``negative_facts`` given besides), lists
        the items open at its stop and those resolved in its span, and carries the kept and
        spilled values still live. Its loss class is at best its weakest child's.

        Raises:
            InvalidArgument: the nodes are not contiguous L1 nodes (after at most one
                digest), overlap an L2 node, or the digest was already rolled up.
            CompactionInvariantError: ``loss`` claims more than the children give.
        """
        return self._node_of(self._writer.built(lambda size: compaction.roll_up(
            self.view, size, nodes, summary=summary, summarizer=summarizer, loss=loss,
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
        found = rules.risks(self.view.facts(size), start, stop, kept)
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
        return restore.spilled(self.view, handle)

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
        reader = self.view.reader(pos)
        reader.prefetch(range(node.start, min(node.stop, pos)))
        return msgspec.structs.replace(node, lost=rules.lost(self.view.facts(pos, reader=reader), summary, pos))

    def cover(self, size: int | None = None) -> list[Node]:
        """Return the nodes a marker at ``size`` (default: now) resolves to, in span order: the newest digest, the L1 nodes after it."""
        size, _ = self.view.bounded("size", size, 0)
        return [Node.from_record(self.read(p)) for p in rules.cover(self.view.facts(size))]

    def audit(self) -> list[Finding]:
        """Return each non-regenerable binding a lossy compaction swallowed and a later step needed."""
        return compaction.audit(self.view)

    # --- markers, resume and reconstruction -----------------------------------------

    def mark(self, node: Node | int | None = None) -> Marker:
        """Emit a recovery marker pointing at ``node``, or at the session's cover (:meth:`cover`), at the current checkpoint.

        Closure, negative-fact retention and anchoring are checked first over every node of
        the cover (:func:`compactstore.rules.check_cover`), and recorded as certified.

        Raises:
            MarkerInvalid: a condition fails; ``violations`` names each. Nothing is written;
                :meth:`mark_raw` is the safe fallback.
            InvalidArgument: no ``node`` given and the session has no summary node.
        """
        if node is None:
            return Marker.from_record(self._writer.built(lambda size: [markers.cover_marker(self.view, size)])[-1])
        pos = resolver.position_of(self.view, "node", node)
        return Marker.from_record(self._writer.built(lambda size: [markers.marker(self.view, size, pos)])[-1])

    def mark_raw(self, size: int | None = None) -> Marker:
        """Emit a raw-checkpoint marker at ``size`` (default: now); it resumes in ``fallback`` mode."""

        def build(now: int) -> list[ev.Event]:
            at = now if size is None else size
            if not isinstance(at, int) or isinstance(at, bool) or not 0 <= at <= now:
                raise InvalidArgument("size", f"must be in [0, {now}], got {shown(at)}")
            return [markers.raw_marker(self.view, at)]

        return Marker.from_record(self._writer.built(build)[-1])

    def resume(self, marker: Marker | int, *, rehash: bool = False) -> Resolution:
        """Resume from ``marker``: certified summary tier, or exactly the raw events up to its checkpoint.

        The marker is trusted wholesale or not at all: every emission check is re-run and
        any failure gives ``fallback`` with the reasons; the same marker always gives a
        byte-identical ``digest``. A certified resume costs O(log n): it re-hashes every
        body it reads or returns and holds them to the checkpoint root; the structural
        facts come from the index and an earlier digest is trusted as admitted (both
        re-checked by :meth:`Store.verify`). ``rehash=True`` re-hashes every body up to the
        marker and runs the checks over the events themselves, a digest's whole chain too.

        Raises:
            IntegrityError: a body read does not match its leaf, or the bodies read do
                not give the checkpoint root (with ``rehash``: any body up to the marker).
        """
        pos = resolver.position_of(self.view, "marker", marker if isinstance(marker, Marker) else _position("marker", marker))
        return resolver.resume(self.view, pos, rehash=ev.as_flag("rehash", rehash))

    def context(self) -> Resolution:
        """Return what a resumed agent loads now: the latest certifying marker's cover and the raw events since.

        The first marker, latest first, that certifies at its checkpoint (as :meth:`resume`)
        and whose cover still keeps what every obligation open now needs gives the context:
        its cover, then the raw events after its checkpoint (derived ones left out), each
        held against the sealed head, and the literals open obligations need that the cover
        spilled (``needed``). When none does, the mode is ``fallback``, the context the raw
        log, ``marker`` -1, and ``reasons`` say why each marker failed. Byte-identical on
        every backend.

        Raises:
            KeyRequired: the store is keyed and was opened without its key.
            IntegrityError: a body read does not match its leaf or the sealed head.
        """
        self.view.witnessed()
        sid = self.view.sid()
        if sid is None:
            return resolver.empty_context(self.name)
        erasures = len(self.store.backend.erasures(sid))
        kept = self.store.caches.kept("certified", sid, erasures, resolver.Certified)
        return resolver.context(self.view, self._latest_markers(), kept)

    def latest_marker(self) -> Marker | None:
        """Return the marker :meth:`context` resolves from now, or None when none certifies."""
        got = self.context()
        return None if got.marker < 0 else Marker.from_record(self.read(got.marker))

    def _latest_markers(self) -> Iterator[int]:
        """Yield the positions of the session's markers, latest first, a few per query."""
        sid, backend = self.view.require_sid(), self.store.backend
        before, page = self.size, 8
        while True:
            got = backend.latest_markers(sid, before, page)
            yield from got
            if len(got) < page:
                return
            before, page = got[-1], min(page * 4, 512)

    def artifact(self, node: Node | int) -> Artifact:
        """Return the artifact a later instance expands from ``node``: loss class, payload, digest.

        The node is read again from the log and proven in the sealed head; the digest binds
        the payload, loss class, node, span root, tree head, session and store.

        Raises:
            KeyRequired: the store is keyed and was opened without its key.
            ForeignReference: ``node`` is not the node this session logged at its position.
        """
        return resolver.artifact(self.view, resolver.position_of(self.view, "node", node))

    def lookup(self, name: str) -> ev.JSON | None:
        """Return a literal's exact value from the log (a binding key, or ``pos:path``), or None.

        None too when a position redacted after the key's latest binding may have bound
        it anew: the latest value is then unknown.

        Raises:
            IntegrityError: a body read does not match its leaf, or was erased without a redaction.
        """
        if not isinstance(name, str):
            raise InvalidArgument("name", f"want a binding key or 'pos:path', got {type(name).__name__}")
        return resolver.lookup(self.view, name)

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

        With ``attempt`` (an idempotency key) the literals acted on are logged as an attempt,
        admitted only if every earlier attempt under that key used the same values (decided
        in the write transaction). ``retry_idempotent`` needs ``attempt``.

        Raises:
            ReconstructionUnsoundError: naming the literal and why.
            InvalidArgument: an argument of the wrong type, or ``retry_idempotent`` without ``attempt``.
        """
        payload, record = resolver.restore(
            self.view, artifact, operation, uses=uses, tool_results=tool_results, attempt=attempt
        )
        if record is not None:
            self.append(record)
        return payload

    def restore_span(self, node: Node | int) -> RestoredSpan:
        """Return the raw events ``node`` replaced, exactly as logged, certified against the tree (see :mod:`compactstore.restore`).

        Raises:
            IntegrityError: a body, the node or the tree does not match: nothing is returned.
            ReconstructionUnsoundError: a body in the span was redacted.
            InvalidArgument: there is no summary node at that position.
        """
        return restore.restore_span(self.view, node)

    # --- maintenance under a compaction policy ---------------------------------------

    def maintain(self, policy: CompactionPolicy, *, progress: Callable[[Step], None] | None = None) -> Maintenance:
        """Do what ``policy`` says is due: compact the raw tail, grow the session digest, emit a marker.

        Each step is one commit through the gate, decided from the log as it stands, so a
        maintenance stopped partway is finished by running it again and nothing is written
        twice; racing maintainers each do the work or find it done
        (:mod:`compactstore.log.maintainer`). A refused step is reported in ``refused`` and
        tried again next time. ``progress(step)`` is called before each step.

        Raises:
            InvalidArgument: ``policy`` is not a CompactionPolicy, or its summarizer is
                async or returns anything but text (``field`` is ``summarizer``).
            SummaryTooLongError: a summary is longer than ``policy.summary_limit``.
        """
        return policies.drive(run(self.view, self._writer, policy, progress), policy)

    async def amaintain(self, policy: CompactionPolicy, *, progress: Callable[[Step], None] | None = None) -> Maintenance:
        """Run :meth:`maintain` with a summarizer that may be ``async def`` (a language-model call).

        The store's work runs in a worker thread; the summarizer is awaited on the loop.
        """
        steps = run(self.view, self._writer, policy, progress)
        text: str | None = None
        while True:
            records, done = await asyncio.to_thread(policies.advance, steps, text)
            if done is not None or records is None:
                assert done is not None
                return done
            text = await policies.summary(policy, records)
