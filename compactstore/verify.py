"""Whole-store verification: every cell is checked against a leaf, a head or a rule.

Bodies are re-hashed and the trees rebuilt from them alone; stored leaves, subtree
roots, heads and seals are then compared with what the bodies imply. Rows are checked by
chunks of 4096 positions, read in pages of at most about ``PAGE_BYTES`` of bodies (each
page's bodies dropped once hashed and checked), and only a frontier of O(log n) hashes
is kept per session, so memory grows neither with the log nor with its bodies' size.

A chunk whose rows are exactly its positions, with nothing wrong in any of them, is
summarised where it is read: the root of its complete subtree, the root of each head's
part of it, its stored subtrees checked. From ``PARALLEL_FROM`` events on, worker
processes read and summarise chunks and the calling process only folds the summaries in
order, O(log n) hashes per chunk and per head; so from a database file of
``PARALLEL_BYTES`` on, where reading and decoding the bodies is most of the work. Every other chunk is checked row by row,
in order, which is what a summary stands for: the report is the same either way.
Each head is also held to the global seqs of the events its commit added (``heads.seqs``,
under its seal): a chunk carries its seqs as runs of consecutive numbers, a few bytes.

The calling process reads everything in one snapshot of the store (see
:meth:`Backend.snapshot`), so a commit made meanwhile is never taken for damage. Worker
processes cannot share it: they check only chunks below the snapshot's latest head,
which no later append changes, against the snapshot's redaction records; a chunk in
which one finds anything (a body a later redaction erased, say) is checked again in the
snapshot.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from itertools import islice
from multiprocessing import get_all_start_methods, get_context
from typing import NamedTuple, Protocol

import msgspec

from . import events as ev
from . import index as structure_index
from . import merkle, retention
from . import structure
from .backends.queries import TABLE
from .backends import Backend, HeadRow, Row, all_heads, is_postgres, open_backend
from .content import content_digest_of
from .errors import IntegrityError, InvalidEvent
from .seal import pack_runs, runs_of



class Sealed(Protocol):
    """What verification needs of a store: its backend and target, and how it seals heads.

    Verification reads the backend directly, never the store's caches, so a store
    passes only what its rows alone show.
    """

    backend: Backend
    #: where the store lives, so worker processes can open it too ("" or ":memory:": no workers)
    target: str
    keyed: bool

    @property
    def has_key(self) -> bool: ...

    def seal_head(self, session: str, size: int, root: bytes, prev: int, seqs: bytes) -> bytes: ...

MAX_PROBLEMS = 10_000
#: Every name the meta table may hold.
META_NAMES = frozenset({"schema_version", "hash", "keyed", "key_check", "store_id"})
#: Below every real position or size: where verify starts reading, so nothing hides there.
_FLOOR = -(2**62)
#: From this many events on, verify() re-hashes bodies in one worker process per core.
PARALLEL_FROM = 200_000
#: From a database file of this many bytes on too (fewer, larger bodies: the same work).
PARALLEL_BYTES = 256 << 20
#: Rows are read in pages of about this many bytes of bodies (and at most ``_CHUNK`` rows).
PAGE_BYTES = 8 << 20
#: The first page of a range: its rows' size sets the next page's length.
_FIRST_PAGE = 64
#: Rows are read and checked by chunks of positions: each a complete subtree of this level.
_CHUNK_LEVEL = 12
_CHUNK = 1 << _CHUNK_LEVEL
#: Chunks per task of a worker process: each hand-over costs a few wake-ups, and on a
#: busy machine each wake-up waits for a time slice.
_TASK_CHUNKS = 4


class Problem(msgspec.Struct, frozen=True):
    """One thing verification found wrong.

    Attributes:
        session: the session's name (None for store-wide problems).
        table: where: ``events``, ``subtrees``, ``heads``, ``sessions``, ``meta``, or
            ``witness`` (the store does not extend a head its witness holds).
        pos: the event position, or the first position a subtree or head covers.
        what: what is wrong, with got/want where it helps.
    """

    session: str | None
    table: str
    pos: int | None
    what: str

    def __str__(self) -> str:
        where = f"{self.session!r}" if self.session is not None else "store"
        at = "" if self.pos is None else f" {'size' if self.table == 'heads' else 'pos'} {self.pos}"
        return f"{where} {self.table}{at}: {self.what}"


class VerifyReport(msgspec.Struct, frozen=True):
    """The outcome of :meth:`Store.verify`: ``ok`` when ``problems`` is empty."""

    ok: bool
    problems: list[Problem]
    sessions: int
    events: int
    #: problems found beyond the first MAX_PROBLEMS, counted but not listed.
    more: int = 0
    #: positions whose bodies were erased by a redaction event (not problems).
    redacted: int = 0


class _Problems:
    def __init__(self) -> None:
        self.items: list[Problem] = []
        self.more = 0
        self.redacted = 0

    def add(self, session: str | None, table: str, pos: int | None, what: str) -> None:
        if len(self.items) < MAX_PROBLEMS:
            self.items.append(Problem(session, table, pos, what))
        else:
            self.more += 1


def _short(h: bytes) -> str:
    return h.hex()[:16] + "…"


class _Checked(NamedTuple):
    """What checking rows' bodies alone tells, row by row: the input of the per-row path."""

    positions: list[int]
    seqs: list[int]
    #: the leaves the tree is rebuilt from: re-hashed from the bodies, or as stored
    #: where a redaction erased the body
    leaves: list[bytes]
    #: erased positions, with their kind and idem_key columns
    erased: dict[int, tuple[str, str | None]]
    #: the positions each redaction event lists, by its position
    redacts: dict[int, list[int]]
    problems: list[tuple[int, str, str]]
    #: (pos, kind, body) of the rows that may give structural index rows (the others give
    #: none): decoded where the index is derived, as bytes cross processes cheaper than events
    indexed: list[tuple[int, str, bytes | None]]
    #: (pos, what) for the summary nodes whose content digest does not match their span
    digests: list[tuple[int, str]]


def _stored_leaf(row: Row) -> bytes:
    """Return the leaf stored for a body that cannot be hashed: as stored, or zeros if it is not a leaf at all."""
    leaf = row.leaf
    return leaf if isinstance(leaf, bytes) and len(leaf) == merkle.HASH_SIZE else bytes(merkle.HASH_SIZE)


def _check_rows(rows: list[Row], spans: tuple[Backend, int] | None) -> _Checked:
    """Check rows' bodies; ``spans``: the backend and session id to check summary nodes' content digests in."""
    hashed = iter(merkle.leaf_hashes([r.body for r in rows if isinstance(r.body, bytes)]))
    leaves: list[bytes] = []
    erased: dict[int, tuple[str, str | None]] = {}
    redacts: dict[int, list[int]] = {}
    problems: list[tuple[int, str, str]] = []
    indexed: list[tuple[int, str, bytes | None]] = []
    digests: list[tuple[int, str]] = []
    may_give_rows, inert, structural = structure_index.may_give_rows, structure.inert, structure.STRUCTURAL_KINDS
    for row in rows:
        if row.body is not None and not isinstance(row.body, bytes):
            # A damaged file can hold any type in any cell: not a body, so no leaf to check.
            problems.append((row.pos, "events", f"body is not a blob but {type(row.body).__name__}"))
            leaves.append(_stored_leaf(row))
            continue
        if row.body is None:
            # Erased by a redaction: only the tree can vouch for the stored leaf.
            indexed.append((row.pos, row.kind, row.body))
            erased[row.pos] = (row.kind, row.idem_key)
            leaves.append(_stored_leaf(row))
            continue
        leaf = next(hashed)
        leaves.append(leaf)
        if row.leaf != leaf:
            problems.append((row.pos, "events", f"leaf does not match body: got {_short(row.leaf)}, want {_short(leaf)}"))
        event = _check_body(row.body, row.kind, row.idem_key, row.pos, problems)
        # Read here for the index's derivation too: the parent then derives it without
        # reading the log again, from the few rows that may give index rows (and decodes
        # only those: an unreadable one fails the derivation there as it would here). An
        # inert event of a plain kind gives none whether the derivation skips it by its
        # bytes or decodes it, so its bytes need no search.
        if row.kind in structural or not (event is not None and inert(event)) and may_give_rows(row.body, row.kind):
            indexed.append((row.pos, row.kind, row.body))
        if isinstance(event, ev.Redaction):
            redacts[row.pos] = list(event.positions)
        elif isinstance(event, ev.Retention):
            redacts[row.pos] = list(ev.SpanSet(event.spans))
        elif spans is not None and row.kind == "node" and isinstance(event, ev.Summary) and event.content_digest is not None:
            if (what := _content_digest_problem(*spans, row.pos, event)) is not None:
                digests.append((row.pos, what))
    return _Checked([r.pos for r in rows], [r.seq for r in rows], leaves, erased, redacts, problems, indexed, digests)


def _pages(backend: Backend, sid: int, start: int, stop: int | None, most: int | None = None) -> Iterator[list[Row]]:
    """Yield a session's rows of ``[start, stop)`` (the first ``most`` of them) in position order, in pages of about ``PAGE_BYTES`` of bodies.

    Each page's length follows the bodies' size in the one before: a page of small rows
    is one query for up to ``_CHUNK`` of them, a page of large ones few enough to keep
    memory flat.
    """
    n = _FIRST_PAGE
    while (stop is None or start < stop) and (most is None or most > 0):
        if most is not None:
            n = min(n, most)
            most -= n
        page = list(islice(backend.rows(sid, start, stop, n), n))
        if page:
            yield page
        if len(page) < n:
            return
        start = int(page[-1].pos) + 1
        size = sum(len(r.body) for r in page if isinstance(r.body, bytes)) or 1
        n = max(1, min(_CHUNK, PAGE_BYTES * len(page) // size))


def _check_pages(
    backend: Backend, sid: int, start: int, stop: int | None, spans: tuple[Backend, int] | None, most: int | None = None
) -> _Checked:
    """Check the rows of ``[start, stop)`` (the first ``most``) page by page; return their findings as one ``_Checked``."""
    parts = [_check_rows(page, spans) for page in _pages(backend, sid, start, stop, most)]
    if len(parts) == 1:
        return parts[0]
    out = _Checked([], [], [], {}, {}, [], [], [])
    for part in parts:
        out.positions.extend(part.positions)
        out.seqs.extend(part.seqs)
        out.leaves.extend(part.leaves)
        out.erased.update(part.erased)
        out.redacts.update(part.redacts)
        out.problems.extend(part.problems)
        out.indexed.extend(part.indexed)
        out.digests.extend(part.digests)
    return out


class _Redactions(NamedTuple):
    """A session's erasure records: what redactions erased and retentions dropped."""

    #: erased position -> the position of the redaction or retention event that erased it
    erased: dict[int, int]
    #: eraser position -> the positions recorded as erased by it
    by: dict[int, set[int]]
    #: eraser position -> the kind its erased rows must have (``redacted`` or ``dropped``), by the eraser's kind column
    kinds: dict[int, str]

    @classmethod
    def of(cls, backend: Backend, sid: int) -> _Redactions:
        erased = backend.erasures(sid)
        by: dict[int, set[int]] = defaultdict(set)
        for p, b in erased.items():
            by[b].add(p)
        kinds = {}
        for b in by:
            row = backend.row(sid, b)
            kinds[b] = "dropped" if row is not None and row.kind == "retention" else "redacted"
        return cls(erased, dict(by), kinds)

    def kind(self, pos: int) -> str:
        """Return the kind the erased row at ``pos`` must have."""
        return self.kinds.get(self.erased.get(pos, -1), "redacted")

    def own(self, by: int, listed: Iterable[int]) -> set[int]:
        """Return those of ``listed`` (what the event at ``by`` names) that it erased itself.

        A redaction may name a position retention dropped earlier: it stays recorded as dropped.
        """
        return {p for p in listed if self.erased.get(p) in (None, by) or self.kinds.get(self.erased[p]) != "dropped"}

    def dropped_only(self) -> bool:
        """Return whether every erasure is a retention's (the index still gives every fact)."""
        return all(k == "dropped" for k in self.kinds.values())


def _retained_rows(backend: Backend, sid: int, reds: _Redactions) -> list[tuple[int, str]]:
    """Return ``(pos, what)`` for each retention whose dropped positions' index rows are not those it recorded.

    A dropped body no longer gives its facts again; the index still gives them, held to
    the digest the retention took of them (whose own body the tree vouches for).
    """
    out = []
    for by, kind in sorted(reds.kinds.items()):
        row = backend.row(sid, by) if kind == "dropped" else None
        if row is None or row.body is None:
            continue
        try:
            event = ev.decode(row.body)
        except InvalidEvent:
            continue  # the row's own check names it
        if isinstance(event, ev.Retention):
            positions = list(ev.SpanSet(event.spans))
            got = retention.index_digest(structure_index.Index(backend, sid).rows_at(positions)) if positions else ""
            if got != event.index_digest:
                out.append((by, "the structural index's rows at the positions this retention dropped are not those it recorded"))
    return out


class _Chunk(NamedTuple):
    """What checking positions ``[start, start + _CHUNK)`` alone tells: made where the rows are.

    When the rows are exactly those positions, in order, and nothing is wrong with any
    of them (``clean``), their part of the tree is summarised: the complete subtree
    roots covering them, and for each head ending among them the root of its part.
    Then the session's tree costs O(log n) hashes per chunk and per head, not one
    append per row, and a chunk crosses a process boundary in a few hundred bytes.
    Otherwise ``rows`` carries every row's findings for the per-row path.
    """

    start: int
    #: rows found in the chunk's positions
    length: int
    clean: bool
    first_seq: int
    last_seq: int
    #: the rows' seqs as ``(first, length)`` runs of consecutive numbers
    seq_runs: list[tuple[int, int]]
    #: ``cover(start, start + count)`` as (level, root), left to right: one level-12 root
    #: for a whole chunk
    pieces: list[tuple[int, bytes]]
    #: head size -> the root of ``[start, size)``, for the heads ending in the chunk
    tails: dict[int, bytes]
    #: (pos, what) for the stored subtrees inside the chunk that do not match
    subtrees: list[tuple[int, str]]
    #: erased rows a redaction accounts for (not problems)
    redacted: int
    #: the positions of redaction events whose erased positions were checked here
    redactions_checked: list[int]
    #: what the rows give the structural index's derivation (see ``_Checked``)
    indexed: list[tuple[int, str, bytes | None]]
    #: the summary nodes among the rows whose content digest does not match (see ``_Checked``)
    digests: list[tuple[int, str]]
    rows: _Checked | None


def _check_chunk(backend: Backend, sid: int, start: int, reds: _Redactions, keep_rows: bool) -> _Chunk:
    """Check positions ``[start, start + _CHUNK)``; ``keep_rows``: return the rows' findings even when clean."""
    checked = _check_pages(backend, sid, start, start + _CHUNK, (backend, sid))
    n = len(checked.positions)
    seqs = checked.seqs
    clean = (
        n > 0
        and not checked.problems
        and checked.positions == list(range(start, start + n))
        and all(a < b for a, b in zip(seqs, seqs[1:]))
    )
    redacted = 0
    done: list[int] = []
    if clean and (checked.erased or reds.erased):
        # The redaction checks of the per-row path, for a chunk whose positions are exact.
        for p, (kind, idem_key) in checked.erased.items():
            clean = clean and p in reds.erased and kind == reds.kind(p) and idem_key is None
            redacted += 1
        stop = start + n
        clean = clean and not any(start <= p < stop and p not in checked.erased for p in reds.erased)
        for p in set(checked.redacts).union(b for b in reds.by if start <= b < stop):
            if p in checked.erased:
                continue  # an erased redaction event: its records are left over, reported at the end
            clean = clean and reds.own(p, checked.redacts.get(p, ())) == reds.by.get(p, set())
            if p in reds.by:
                done.append(p)
    if not clean:
        return _Chunk(start, n, False, 0, 0, [], [], {}, [], 0, [], checked.indexed, checked.digests, checked)
    levels = merkle.subtree_levels(checked.leaves)
    subtrees: list[tuple[int, str]] = []
    for level in range(1, len(levels)):
        if not merkle.is_stored(level):
            continue
        want, base = levels[level], start >> level
        stored = dict(backend.subtree_range(sid, level, base, base + len(want)))
        for i, h in enumerate(want):
            got = stored.get(base + i)
            if got != h:
                what = "missing" if got is None else f"got {_short(got)}, want {_short(h)}"
                subtrees.append(((base + i) << level, f"subtree ({level}, {base + i}): {what}"))
    tails = {
        h.size: merkle.fold([levels[lv][i] for lv, i in merkle.cover(0, h.size - start)])
        for h in backend.heads(sid, start, _CHUNK)
        if h.size <= start + n
    }
    pieces = [(lv, levels[lv][i]) for lv, i in merkle.cover(0, n)]
    runs = _SeqRuns()
    for q in seqs:
        runs.add(q)
    return _Chunk(start, n, True, seqs[0], seqs[-1], runs.pairs(), pieces, tails, subtrees, redacted, done,
                  checked.indexed, checked.digests, checked if keep_rows else None)


# One backend per worker process, opened by the pool's initializer.
_worker_backend: Backend | None = None


def _worker_init(target: str) -> None:
    global _worker_backend
    _worker_backend = open_backend(target, durable=False, create=False)  # it only reads: no write lock to open


def _worker_integrity() -> list[str]:
    assert _worker_backend is not None
    return _worker_backend.integrity()


def _worker_chunks(sid: int, start: int, count: int, reds: _Redactions) -> list[_Chunk]:
    """Check ``count`` chunks from ``start`` on, up to the first empty one, against the snapshot's redaction records."""
    assert _worker_backend is not None
    out: list[_Chunk] = []
    for k in range(count):
        out.append(_check_chunk(_worker_backend, sid, start + k * _CHUNK, reds, keep_rows=False))
        if not out[-1].length:
            break
    return out


def _index_events(rows: list[tuple[int, str, bytes | None]]) -> Iterator[tuple[int, ev.Event | None]]:
    """Yield (pos, event) of rows that give index rows as the derivation reads them; None: unreadable."""
    for pos, kind, body in rows:
        try:
            yield pos, structure_index.event_of(body, kind)
        except InvalidEvent:
            yield pos, None


def _threads_may_hold_sqlite(target: str) -> bool:
    """Whether forking workers to read the SQLite store at ``target`` could leave them stuck.

    SQLite's mutexes are the process's: another thread in a call into SQLite at the fork
    leaves its mutex held in the worker for ever (seen: a worker blocked in
    ``sqlite3WalBeginReadTransaction``). So workers are forked only from a process with no
    other thread; the report is the same either way, only slower. A PostgreSQL worker
    never calls SQLite.
    """
    return not is_postgres(target) and threading.active_count() > 1


def _file_bytes(target: str) -> int:
    """Return the size of the database file at ``target``, 0 when it is no file (a server, memory)."""
    try:
        return os.path.getsize(target) if os.path.isfile(target) else 0
    except OSError:
        return 0


def _usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))  # a process pinned to some cores gets no more workers
    return os.cpu_count() or 1


def verify_store(
    store: Sealed, *, progress: Callable[[int, int], None] | None = None, workers: int | None = None
) -> VerifyReport:
    """Check every table of ``store``; see :meth:`Store.verify`.

    Every read of this process is made in one snapshot of the store, so commits made
    meanwhile are not mistaken for damage (a row beyond a head, a head beyond the rows).
    """
    with store.backend.snapshot():
        return _verify_in_snapshot(store, progress, workers)


def _verify_in_snapshot(store: Sealed, progress: Callable[[int, int], None] | None, workers: int | None) -> VerifyReport:
    """Check every table of ``store``, reading inside a snapshot of its backend (see :func:`verify_store`)."""
    backend = store.backend
    count, lo, hi = backend.seq_bounds()
    if workers is None:
        workers = _usable_cpus() if count >= PARALLEL_FROM or _file_bytes(store.target) >= PARALLEL_BYTES else 1
    if store.target in ("", ":memory:") or _threads_may_hold_sqlite(store.target):
        workers = 1
    pool = None
    integrity: Future[list[str]] | None = None
    if workers > 1:
        # fork: workers need nothing of the parent but the target, and spawning would
        # re-run a caller's unguarded main script (a process with other threads does not
        # fork them: see _threads_may_hold_sqlite). Each worker opens its own connection,
        # to read only: opening takes no write lock, which another process may hold.
        method = "fork" if "fork" in get_all_start_methods() else "spawn"
        pool = ProcessPoolExecutor(workers, mp_context=get_context(method), initializer=_worker_init,
                                   initargs=(store.target,))
        # The database's own check reads the whole file: one worker runs it while the
        # others start on the sessions, instead of everyone waiting for it.
        integrity = pool.submit(_worker_integrity)
    found = _Problems()
    done = 0
    sessions = backend.sessions()
    # The structural index's problems are listed after every session's own.
    index_found: list[tuple[str | None, int | None, str]] = []
    structure_index.verify_orphans(backend, lambda pos, what: index_found.append((None, pos, what)))
    try:
        for sid, name in sessions:
            session = _SessionCheck(store, sid, name, found)
            # The index is derived again from what the pass over the rows gives (a session
            # with redactions has only the kinds of its rows checked: nothing to derive).
            head = backend.head(sid)
            derived = (None if session.reds.erased
                       else structure_index.Rederivation(backend, sid, 0 if head is None else head.size))
            digests: list[tuple[int, str]] = _retained_rows(backend, sid, session.reds)
            for part in _session_parts(backend, sid, session.reds, pool, workers):
                if isinstance(part, _Checked):
                    n = session.rows(part)
                    positions: Sequence[int] = part.positions
                else:
                    n = session.chunk(part)
                    if part.clean:  # its rows are exactly its positions
                        positions = range(part.start, part.start + part.length)
                    else:
                        assert part.rows is not None  # a chunk that is not clean carries its rows
                        positions = part.rows.positions
                if derived is not None:
                    derived.take(positions, _index_events(part.indexed))
                digests += part.digests
                done += n
                if progress is not None:
                    progress(done, count)
            session.finish()
            for at, what in digests:
                found.add(name, "events", at, what)

            def index_problem(pos: int | None, what: str, name: str = name) -> None:
                index_found.append((name, pos, what))

            structure_index.verify_stored_session(backend, sid, index_problem, derived)
        file = integrity.result() if integrity is not None else backend.integrity()
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    for session_name, pos, what in index_found:
        found.add(session_name, TABLE, pos, what)
    # Store-wide problems are listed first.
    problems = _store_problems(store, file, count, lo, hi) + found.items
    listed = problems[:MAX_PROBLEMS]
    more = found.more + len(problems) - len(listed)
    return VerifyReport(not listed, listed, len(sessions), done, more, found.redacted)


def _store_problems(store: Sealed, integrity: list[str], count: int, lo: int, hi: int) -> list[Problem]:
    """Return what is wrong store-wide: meta entries, the file, orphan rows, the sequence.

    ``integrity`` is what the backend's own check found; ``count, lo, hi`` its sequence bounds.
    """
    backend = store.backend
    out: list[Problem] = []
    if store.keyed and not store.has_key:
        out.append(Problem(None, "meta", None, "the store is keyed: open it with its key"))
    for name in sorted(set(backend.meta()) - META_NAMES):
        out.append(Problem(None, "meta", None, f"unknown entry {name!r}"))
    out.extend(Problem(None, "file", None, what) for what in integrity)
    for table, sid in backend.orphans():
        out.append(Problem(None, table, None, f"rows name session id {sid}, which does not exist"))
    if backend.gapless_seq and count and (lo != 1 or hi != count):
        out.append(Problem(None, "events", None, f"sequence numbers are not 1..{count}: got {lo}..{hi}"))
    return out


def _session_parts(
    backend: Backend, sid: int, reds: _Redactions, pool: ProcessPoolExecutor | None, workers: int
) -> Iterator[_Checked | _Chunk]:
    """Yield a session's rows in position order: checked chunk by chunk, in worker processes if ``pool``.

    Chunks of ``_CHUNK`` positions from 0 on, until one is empty; then any rows past it
    (past a gap) and, first, any below 0: no row hides outside the chunks.

    Called inside a snapshot of ``backend``, which worker processes, on connections of
    their own, do not share. The log is append-only: its rows, its heads and its complete
    subtrees below the size of the snapshot's latest head are the same in every later
    state (but for the bodies a later redaction erases). So workers get only the chunks
    that end at or below that size, and the chunks from there on are read here, in the
    snapshot.
    """
    yield from _runs(backend, sid, _FLOOR, 0)  # rows no real append could write
    start = 0
    latest = backend.head(sid) if pool is not None else None
    # The chunks the workers may check: a session within one chunk has none, sparing
    # many small sessions the hand-overs.
    shared = (latest.size if latest is not None else 0) // _CHUNK
    if pool is not None and shared > 0:
        pending: deque[Future[list[_Chunk]]] = deque()
        submitted = 0  # chunks handed over
        while True:
            # At most two tasks per worker in flight: memory stays bounded.
            while len(pending) < 2 * workers and submitted < shared:
                n = min(_TASK_CHUNKS, shared - submitted)
                pending.append(pool.submit(_worker_chunks, sid, submitted * _CHUNK, n, reds))
                submitted += n
            if not pending:
                break
            chunks = pending.popleft().result()
            for chunk in chunks:
                if not chunk.length:
                    break
                if not chunk.clean:
                    # What a worker found it read in a later state, where a redaction made
                    # since may have erased a body: the chunk is checked again here, in the snapshot.
                    chunk = _check_chunk(backend, sid, chunk.start, reds, keep_rows=True)
                yield chunk
                start += _CHUNK
            if not chunks[-1].length:  # an empty chunk ends the chunks, as below
                for f in pending:
                    f.cancel()
                yield from _runs(backend, sid, start, None)
                return
    while (chunk := _check_chunk(backend, sid, start, reds, keep_rows=True)).length:
        yield chunk
        start += _CHUNK
    yield from _runs(backend, sid, start, None)  # rows past a gap of a whole chunk


def _runs(backend: Backend, sid: int, start: int, stop: int | None) -> Iterator[_Checked]:
    """Yield the rows of ``[start, stop)`` checked in runs of ``_CHUNK`` rows, each read page by page."""
    while (stop is None or start < stop) and (checked := _check_pages(backend, sid, start, stop, (backend, sid), _CHUNK)).positions:
        yield checked
        if len(checked.positions) < _CHUNK:
            return
        start = int(checked.positions[-1]) + 1


class _Heads:
    """A session's stored heads in size order, read page by page, with look-ahead."""

    def __init__(self, backend: Backend, sid: int) -> None:
        self._pages = all_heads(backend, sid, _CHUNK)
        self._ahead: deque[HeadRow] = deque()

    def peek(self) -> HeadRow | None:
        if not self._ahead:
            got = next(self._pages, None)
            if got is None:
                return None
            self._ahead.append(got)
        return self._ahead[0]

    def pop(self) -> HeadRow | None:
        head = self.peek()
        if head is not None:
            self._ahead.popleft()
        return head

    def upto(self, size: int) -> list[HeadRow]:
        """Remove and return the heads of at most ``size``."""
        out = []
        while (head := self.peek()) is not None and head.size <= size:
            out.append(self._ahead.popleft())
        return out

    def unread(self, heads: list[HeadRow]) -> None:
        self._ahead.extendleft(reversed(heads))


class _SeqRuns:
    """Global seqs of consecutive positions as runs of consecutive numbers: those read and not yet held to a head."""

    __slots__ = ("runs",)

    def __init__(self) -> None:
        self.runs: deque[list[int]] = deque()

    def add(self, seq: int) -> None:
        runs = self.runs
        if runs and runs[-1][0] + runs[-1][1] == seq:
            runs[-1][1] += 1
        else:
            runs.append([seq, 1])

    def extend(self, runs: Sequence[tuple[int, int]]) -> None:
        mine = self.runs
        for first, n in runs:
            if mine and mine[-1][0] + mine[-1][1] == first:
                mine[-1][1] += n
            else:
                mine.append([first, n])

    def pairs(self) -> list[tuple[int, int]]:
        return [(a, n) for a, n in self.runs]

    def take(self, count: int) -> bytes:
        """Remove the seqs of the next ``count`` positions; return them packed as a head stores them."""
        runs, out = self.runs, []
        while count > 0 and runs:
            first, n = runs[0]
            if n <= count:
                runs.popleft()
                out.append((first, n))
                count -= n
            else:
                out.append((first, count))
                runs[0] = [first + count, n - count]
                count = 0
        return pack_runs(out)


def _seq_problem(stored: bytes, got: bytes, prev: int, size: int) -> tuple[int, str]:
    """Return the first position of ``[prev, size)`` whose seq differs from the one its head seals, and what is wrong."""
    def each(packed: bytes) -> Iterator[int]:
        for first, n in runs_of(packed):
            yield from range(first, first + n)

    for pos, (want, have) in enumerate(zip(each(stored), each(got)), prev):
        if want != have:
            return pos, f"sequence number {have}, where the head of size {size} seals {want}"
    return prev, f"the head of size {size} seals other sequence numbers for positions [{prev}, {size})"


class _SessionCheck:
    """The checks of one session that need its rows in order: tree, heads, sequence, redactions."""

    def __init__(self, store: Sealed, sid: int, name: str, found: _Problems) -> None:
        self.store, self.sid, self.name, self.found = store, sid, name, found
        self.tree = merkle.Frontier(algo="blake3")
        self.heads = _Heads(store.backend, sid)
        self.prev = 0
        self.last_seq = 0
        #: the seqs of positions from ``prev`` on
        self.seqs = _SeqRuns()
        self.reds = _Redactions.of(store.backend, sid)
        #: redaction records not yet met by their redaction event
        self.erased_by = {b: set(ps) for b, ps in self.reds.by.items()}

    def chunk(self, chunk: _Chunk) -> int:
        """Take a chunk's summary when it is clean and the tree is at its start; else its rows."""
        if chunk.clean and self.tree.size == chunk.start and chunk.first_seq > self.last_seq and self._whole(chunk):
            return chunk.length
        checked = chunk.rows
        if checked is None:  # clean, but out of step (rows before it were missing): re-read it here
            # Its content digests came with the chunk.
            checked = _check_pages(self.store.backend, self.sid, chunk.start, chunk.start + _CHUNK, None)
        return self.rows(checked)

    def _whole(self, chunk: _Chunk) -> bool:
        due = self.heads.upto(chunk.start + chunk.length)
        if any(h.size <= chunk.start or h.size not in chunk.tails for h in due):
            self.heads.unread(due)  # a skipped size, or a head the worker did not see: row by row
            return False
        found, name = self.found, self.name
        prefix = self.tree.hashes  # the roots of cover(0, start): fold them onto each head's part
        self.seqs.extend(chunk.seq_runs)
        for head in due:
            _check_head(self.store, name, head, self.prev, merkle.fold([*prefix, chunk.tails[head.size]]),
                        self.seqs.take(head.size - self.prev), found)
            self.prev = head.size
        self.last_seq = chunk.last_seq
        found.redacted += chunk.redacted
        for p in chunk.redactions_checked:
            self.erased_by.pop(p, None)
        for pos, what in chunk.subtrees:
            found.add(name, "subtrees", pos, what)
        made: dict[int, dict[int, bytes]] = defaultdict(dict)
        for level, root in chunk.pieces:
            for lv, idx, h in self.tree.append_subtree(level, root):
                if merkle.is_stored(lv):
                    made[lv][idx] = h
        self._check_made(made)
        return True

    def rows(self, chunk: _Checked) -> int:
        """Check rows one by one, appending each leaf to the tree."""
        store, name, found, frontier = self.store, self.name, self.found, self.tree
        redacted = self.reds.erased
        erased_by = self.erased_by
        made: dict[int, dict[int, bytes]] = defaultdict(dict)
        issues = {p: [] for p, _, _ in chunk.problems}  # type: dict[int, list[tuple[str, str]]]
        for p, table, what in chunk.problems:
            issues[p].append((table, what))
        for row_pos, seq, leaf in zip(chunk.positions, chunk.seqs, chunk.leaves):
            pos = frontier.size
            if row_pos != pos:
                found.add(name, "events", row_pos, f"position out of order: want {pos}")
            if seq <= self.last_seq:
                found.add(name, "events", row_pos, f"sequence number {seq} not after {self.last_seq}")
            self.last_seq = seq
            self.seqs.add(seq)
            for table, what in issues.get(row_pos, ()):
                found.add(name, table, row_pos, what)
            if row_pos in chunk.erased:
                kind, idem_key = chunk.erased[row_pos]
                want = self.reds.kind(row_pos)
                if row_pos in redacted and kind == want and idem_key is None:
                    found.redacted += 1
                elif row_pos in redacted:
                    found.add(name, "events", row_pos, f"an erased row must have kind {want!r} and no idem_key")
                else:
                    found.add(name, "events", row_pos, "body is missing and no redaction or retention erased it")
            else:
                if row_pos in redacted:
                    found.add(name, "redactions", row_pos, f"recorded as erased by pos {redacted[row_pos]}, but the body is there")
                if row_pos in chunk.redacts or row_pos in erased_by:
                    listed = self.reds.own(row_pos, chunk.redacts.get(row_pos, ()))
                    erased = erased_by.pop(row_pos, set())
                    if listed != erased:
                        found.add(name, "redactions", row_pos, f"redaction lists {sorted(listed)}, the store erased {sorted(erased)}")
            for level, idx, h in frontier.append(leaf):
                if merkle.is_stored(level):
                    made[level][idx] = h
            while (head := self.heads.peek()) is not None and head.size <= frontier.size:
                root = frontier.root() if head.size == frontier.size else None
                _check_head(store, name, head, self.prev, root, self.seqs.take(head.size - self.prev), found)
                self.prev = head.size
                self.heads.pop()
        self._check_made(made)
        return len(chunk.positions)

    def _check_made(self, made: dict[int, dict[int, bytes]]) -> None:
        for level, want in made.items():
            stored = dict(self.store.backend.subtree_range(self.sid, level, min(want), max(want) + 1))
            for idx, h in want.items():
                got = stored.get(idx)
                if got != h:
                    what = "missing" if got is None else f"got {_short(got)}, want {_short(h)}"
                    self.found.add(self.name, "subtrees", idx << level, f"subtree ({level}, {idx}): {what}")

    def finish(self) -> None:
        """Report what only the whole session shows: its end, leftover records, subtree counts."""
        found, name = self.found, self.name
        size = self.tree.size
        if size == 0:
            found.add(name, "sessions", None, "session has no events")
        for by, erased in sorted(self.erased_by.items()):
            found.add(name, "redactions", by, f"positions {sorted(erased)} are recorded as erased by pos {by}, "
                      "which is no redaction or retention")
        latest = None
        while (head := self.heads.pop()) is not None:
            found.add(name, "heads", head.size, f"head of size {head.size} beyond the log's {size} events")
            latest = head.size
        if size and self.prev != size:
            # With heads beyond the log, events are missing from its end: the latest head
            # is the last of those, not the last one the log still reaches.
            if latest is None:
                found.add(name, "heads", self.prev, f"latest head is at size {self.prev}, but the log has {size} events")
            else:
                within = f"the last head within it is at size {self.prev}" if self.prev else "no head is within it"
                found.add(name, "heads", latest, f"latest head is at size {latest}, but the log has {size} events "
                          f"({within}): events are missing from its end")
        for level, n in self.store.backend.subtree_counts(self.sid).items():
            expected = size >> level if level >= 1 and merkle.is_stored(level) else 0
            if n != expected:
                found.add(name, "subtrees", None, f"{n} subtrees stored at level {level}, want {expected}")


def _check_body(
    body: bytes, kind: str, idem_key: str | None, pos: int, problems: list[tuple[int, str, str]]
) -> ev.Event | None:
    event = ev.canonical_of_kind(body, kind)
    if event is not None:  # canonical, of the kind its column says: only the key is left to compare
        if event.idempotency_key != idem_key:
            problems.append((pos, "events", f"idem_key column says {idem_key!r}, body says {event.idempotency_key!r}"))
        return event
    try:
        event = ev.decode_canonical(body)
    except InvalidEvent as exc:
        problems.append((pos, "events", f"body is not a valid event: {exc.reason}"))
        return None
    if ev.encode(event) != body:
        problems.append((pos, "events", "body is not in canonical form"))
    if event.kind != kind:
        problems.append((pos, "events", f"kind column says {kind!r}, body says {event.kind!r}"))
    if event.idempotency_key != idem_key:
        problems.append((pos, "events", f"idem_key column says {idem_key!r}, body says {event.idempotency_key!r}"))
    return event


def _check_head(store: Sealed, name: str, head: HeadRow, prev: int, root: bytes | None, seqs: bytes,
                found: _Problems) -> None:
    """Check a head against ``root``, the tree's root at its size (None: the log never had that size in order).

    ``seqs``: the seqs of the events at positions ``[prev, size)``, packed as a head stores them.
    """
    if root is None:
        found.add(name, "heads", head.size, "head of a size that was skipped")
        return
    if head.seqs != seqs:
        found.add(name, "events", *_seq_problem(head.seqs, seqs, prev, head.size))
    if head.root != root:
        found.add(name, "heads", head.size, f"root mismatch: got {_short(head.root)}, want {_short(root)}")
    if head.prev != prev:
        found.add(name, "heads", head.size, f"chain broken: previous head is at size {head.prev}, want {prev}")
    # A keyed store opened without its key: every seal would differ, and the one problem
    # the store-wide check reports ("the store is keyed") says why; no tamper alarm per head.
    if store.keyed and not store.has_key:
        return
    if head.seal != store.seal_head(name, head.size, head.root, head.prev, head.seqs):
        found.add(name, "heads", head.size, "seal does not match (session name, size, root, prev, seqs)"
                  + (" under the key" if store.has_key else ""))


def _content_digest_problem(backend: Backend, sid: int, pos: int, node: ev.Summary) -> str | None:
    """Check the content digest of the summary node at ``pos`` against the bodies of the span it covers.

    The rest of verify() ties bodies to leaves and leaves to heads; this ties a node's
    content digest, which restoration trusts in place of a Merkle rehash, to the bodies.
    A span with a redacted body is skipped: nothing can certify it any more.
    """
    if not 0 <= node.start < node.stop <= pos:
        return f"node covers [{node.start}, {node.stop}), not a span before it"
    span = _stored_span(backend, sid, node.start, node.stop)
    if span.redacted:
        return None
    if span.missing is not None:
        return f"positions of [{node.start}, {node.stop}) are missing or out of order"
    got = span.digest.hex()
    if got != node.content_digest:
        return (f"content digest of [{node.start}, {node.stop}) does not match its bodies: "
                f"the node records {(node.content_digest or '')[:16]}…, the bodies give {got[:16]}…")
    return None


class _StoredSpan(NamedTuple):
    """What one streamed read of a stored span gives (see :func:`stored_span`)."""

    #: :func:`content_digest` of the bodies read, an erased one counted as empty
    digest: bytes
    #: the first position missing or out of order, None when ``[start, stop)`` is whole
    missing: int | None
    #: whether a body in the span was erased by a redaction
    redacted: bool
    #: whether every body matched its stored leaf (False unless asked, or with one erased)
    matched: bool


def _stored_span(backend: Backend, session_id: int, start: int, stop: int, *, match_leaves: bool = False,
                each: Callable[[list[Row]], object] | None = None) -> _StoredSpan:
    """Read ``[start, stop)`` of a session once, in chunks, and digest its bodies.

    What a node's content digest is made from when it is written, and checked against by
    ``verify()``; memory stays flat however long the span. ``match_leaves``: also hash
    each body and compare it with its stored leaf. ``each``: called with every chunk of
    rows as it is read.
    """
    nxt, missing, redacted, matched = start, None, False, match_leaves

    def bodies() -> Iterator[list[bytes]]:
        nonlocal nxt, missing, redacted, matched
        for chunk in _pages(backend, session_id, start, stop):
            for r in chunk:
                if missing is None and r.pos != nxt:
                    missing = nxt
                nxt += 1
                if r.body is None:
                    redacted = True
                elif not isinstance(r.body, bytes):  # a damaged file's cell
                    raise IntegrityError(f"position {r.pos} holds a body that is not a blob")
            got = [r.body or b"" for r in chunk]
            if matched and not redacted:
                matched = all(leaf == r.leaf for leaf, r in zip(merkle.leaf_hashes(got), chunk))
            if each is not None:
                each(chunk)
            yield got

    digest = content_digest_of(bodies())
    if missing is None and nxt != stop:
        missing = nxt
    return _StoredSpan(digest, missing, redacted, matched and not redacted)
