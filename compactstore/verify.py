"""Whole-store verification: every cell is checked against a leaf, a head or a rule.

Bodies are re-hashed and the trees rebuilt from them alone; stored leaves, subtree
roots, heads and seals are then compared with what the bodies imply. Rows are read in
chunks and only a frontier of O(log n) hashes is kept per session, so memory does not
grow with the log.
"""

from __future__ import annotations

import os
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import get_all_start_methods, get_context
from typing import TYPE_CHECKING, NamedTuple

import msgspec

from . import events as ev
from . import index as structure_index
from . import merkle
from .backends.index import TABLE
from .backends import Backend, HeadRow, Row, open_backend
from .errors import InvalidEvent

if TYPE_CHECKING:
    from .store import Store

MAX_PROBLEMS = 10_000
#: Every name the meta table may hold.
META_NAMES = frozenset({"schema_version", "hash", "keyed", "key_check"})
#: Below every real position or size: where verify starts reading, so nothing hides there.
_FLOOR = -(2**62)
#: From this many events on, verify() re-hashes bodies in one worker process per core.
PARALLEL_FROM = 200_000
_CHUNK = 4096


class Problem(msgspec.Struct, frozen=True):
    """One thing verification found wrong.

    Attributes:
        session: the session's name (None for store-wide problems).
        table: where: ``events``, ``nodes``, ``heads``, ``sessions`` or ``meta``.
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
    """What checking a chunk of rows' bodies alone tells; made in worker processes when parallel.

    Columns rather than one object per row, so that a chunk crosses a process boundary
    cheaply.
    """

    positions: list[int]
    seqs: list[int]
    #: the leaves the tree is rebuilt from (32 bytes each): re-hashed from the bodies,
    #: or as stored where a redaction erased the body
    leaves: bytes
    #: erased positions, with their kind and idem_key columns
    erased: dict[int, tuple[str, str | None]]
    #: the positions each redaction event lists, by its position
    redacts: dict[int, list[int]]
    problems: list[tuple[int, str, str]]


def _check_rows(rows: list[Row]) -> _Checked:
    leaf_hash = merkle.leaf_hash
    leaves: list[bytes] = []
    erased: dict[int, tuple[str, str | None]] = {}
    redacts: dict[int, list[int]] = {}
    problems: list[tuple[int, str, str]] = []
    for row in rows:
        if row.body is None:
            # Erased by a redaction: only the tree can vouch for the stored leaf.
            erased[row.pos] = (row.kind, row.idem_key)
            leaves.append(row.leaf if len(row.leaf) == merkle.HASH_SIZE else bytes(merkle.HASH_SIZE))
            continue
        leaf = leaf_hash(row.body)
        leaves.append(leaf)
        if row.leaf != leaf:
            problems.append((row.pos, "events", f"leaf does not match body: got {_short(row.leaf)}, want {_short(leaf)}"))
        event = _check_body(row.body, row.kind, row.idem_key, row.pos, problems)
        if isinstance(event, ev.Redaction):
            redacts[row.pos] = list(event.positions)
    return _Checked([r.pos for r in rows], [r.seq for r in rows], b"".join(leaves), erased, redacts, problems)


# One backend per worker process, opened by the pool's initializer.
_worker_backend: Backend | None = None


def _worker_init(target: str) -> None:
    global _worker_backend
    _worker_backend = open_backend(target, durable=False)


def _worker_chunk(sid: int, start: int, stop: int) -> _Checked:
    assert _worker_backend is not None
    return _check_rows(list(_worker_backend.rows(sid, start, stop, _CHUNK)))


def verify_store(
    store: Store, *, progress: Callable[[int, int], None] | None = None, workers: int | None = None
) -> VerifyReport:
    """Check every table of ``store``; see :meth:`Store.verify`."""
    backend = store.backend
    found = _Problems()
    if store.keyed and store.mac_key is None:
        found.add(None, "meta", None, "the store is keyed: open it with its key to check head MACs")
    for name in sorted(set(backend.meta()) - META_NAMES):
        found.add(None, "meta", None, f"unknown entry {name!r}")
    for what in backend.integrity():
        found.add(None, "file", None, what)
    for table, sid in backend.orphans():
        found.add(None, table, None, f"rows name session id {sid}, which does not exist")
    count, lo, hi = backend.seq_bounds()
    if backend.gapless_seq and count and (lo != 1 or hi != count):
        found.add(None, "events", None, f"sequence numbers are not 1..{count}: got {lo}..{hi}")
    if workers is None:
        workers = (os.cpu_count() or 1) if count >= PARALLEL_FROM else 1
    if store.target in ("", ":memory:"):
        workers = 1
    pool = None
    if workers > 1:
        # fork: workers need nothing of the parent but the target, and spawning would
        # re-run a caller's unguarded main script. Each worker opens its own connection.
        method = "fork" if "fork" in get_all_start_methods() else "spawn"
        pool = ProcessPoolExecutor(workers, mp_context=get_context(method), initializer=_worker_init,
                                   initargs=(store.target,))
    done = 0
    sessions = backend.sessions()
    try:
        for sid, name in sessions:
            checked = _parallel(pool, workers, sid, backend) if pool else (
                _check_rows(chunk) for chunk in _chunks(backend.rows(sid, _FLOOR, None, _CHUNK))
            )
            for n in _verify_session(store, sid, name, checked, found):
                done += n
                if progress is not None:
                    progress(done, count)
            _check_content_digests(backend, sid, name, found)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    structure_index.verify_store(backend, sessions, lambda name, pos, what: found.add(name, TABLE, pos, what))
    return VerifyReport(not found.items, found.items, len(sessions), done, found.more, found.redacted)


def _parallel(pool: ProcessPoolExecutor, workers: int, sid: int, backend: Backend) -> Iterator[_Checked]:
    """Yield checked chunks in order, at most two per worker in flight (memory stays bounded)."""
    below = list(backend.rows(sid, _FLOOR, 0, _CHUNK))  # rows no real append could write
    if below:
        yield _check_rows(below)
    pending: deque[Future[_Checked]] = deque()
    start = 0
    while True:
        while len(pending) < 2 * workers:
            pending.append(pool.submit(_worker_chunk, sid, start, start + _CHUNK))
            start += _CHUNK
        chunk = pending.popleft().result()
        if not chunk.positions:
            for f in pending:
                f.cancel()
            beyond = list(backend.rows(sid, start - (len(pending) + 1) * _CHUNK, None, _CHUNK))
            if beyond:  # rows past a gap of a whole chunk: check them in this process
                yield _check_rows(beyond)
            return
        yield chunk


def _verify_session(
    store: Store, sid: int, name: str, chunks: Iterable[_Checked], found: _Problems
) -> Iterator[int]:
    backend = store.backend
    frontier = merkle.Frontier(algo="blake3")
    heads = _stream_heads(store, sid)
    head = next(heads, None)
    prev = 0
    last_seq = 0
    redacted = backend.redactions(sid)
    erased_by: dict[int, set[int]] = defaultdict(set)
    for p, by in redacted.items():
        erased_by[by].add(p)
    for chunk in chunks:
        made: dict[int, dict[int, bytes]] = defaultdict(dict)
        issues = {p: [] for p, _, _ in chunk.problems}  # type: dict[int, list[tuple[str, str]]]
        for p, table, what in chunk.problems:
            issues[p].append((table, what))
        leaves = chunk.leaves
        for i, (row_pos, seq) in enumerate(zip(chunk.positions, chunk.seqs)):
            pos = frontier.size
            if row_pos != pos:
                found.add(name, "events", row_pos, f"position out of order: want {pos}")
            if seq <= last_seq:
                found.add(name, "events", row_pos, f"sequence number {seq} not after {last_seq}")
            last_seq = seq
            for table, what in issues.get(row_pos, ()):
                found.add(name, table, row_pos, what)
            if row_pos in chunk.erased:
                kind, idem_key = chunk.erased[row_pos]
                if row_pos in redacted and kind == "redacted" and idem_key is None:
                    found.redacted += 1
                elif row_pos in redacted:
                    found.add(name, "events", row_pos, "a redacted row must have kind 'redacted' and no idem_key")
                else:
                    found.add(name, "events", row_pos, "body is missing and no redaction erased it")
            else:
                if row_pos in redacted:
                    found.add(name, "redactions", row_pos, f"recorded as erased by pos {redacted[row_pos]}, but the body is there")
                if row_pos in chunk.redacts or row_pos in erased_by:
                    listed = set(chunk.redacts.get(row_pos, ()))
                    erased = erased_by.pop(row_pos, set())
                    if listed != erased:
                        found.add(name, "redactions", row_pos, f"redaction lists {sorted(listed)}, the store erased {sorted(erased)}")
            for level, idx, h in frontier.append(leaves[32 * i : 32 * i + 32]):
                if merkle.is_stored(level):
                    made[level][idx] = h
            while head is not None and head.size <= frontier.size:
                _check_head(store, name, head, prev, frontier, found)
                prev = head.size
                head = next(heads, None)
        for level, want in made.items():
            stored = dict(backend.node_range(sid, level, min(want), max(want) + 1))
            for idx, h in want.items():
                got = stored.get(idx)
                if got != h:
                    what = "missing" if got is None else f"got {_short(got)}, want {_short(h)}"
                    found.add(name, "nodes", idx << level, f"subtree ({level}, {idx}): {what}")
        yield len(chunk.positions)
    size = frontier.size
    if size == 0:
        found.add(name, "sessions", None, "session has no events")
    for by, erased in sorted(erased_by.items()):
        found.add(name, "redactions", by, f"positions {sorted(erased)} are recorded as erased by pos {by}, which is no redaction")
    while head is not None:
        found.add(name, "heads", head.size, f"head of size {head.size} beyond the log's {size} events")
        head = next(heads, None)
    if size and prev != size:
        found.add(name, "heads", prev, f"latest head is at size {prev}, but the log has {size} events")
    for level, n in backend.node_counts(sid).items():
        expected = size >> level if level >= 1 and merkle.is_stored(level) else 0
        if n != expected:
            found.add(name, "nodes", None, f"{n} subtrees stored at level {level}, want {expected}")


def _check_body(
    body: bytes, kind: str, idem_key: str | None, pos: int, problems: list[tuple[int, str, str]]
) -> ev.Event | None:
    try:
        event = ev.decode(body)
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


def _check_head(store: Store, name: str, head: HeadRow, prev: int, frontier: merkle.Frontier, found: _Problems) -> None:
    if head.size != frontier.size:  # a size the log never passed through in order
        found.add(name, "heads", head.size, "head of a size that was skipped")
        return
    root = frontier.root()
    if head.root != root:
        found.add(name, "heads", head.size, f"root mismatch: got {_short(head.root)}, want {_short(root)}")
    if head.prev != prev:
        found.add(name, "heads", head.size, f"chain broken: previous head is at size {head.prev}, want {prev}")
    if head.seal != store._seal(name, head.size, head.root, head.prev):
        found.add(name, "heads", head.size, "seal does not match (session name, size, root, prev)" + (" under the key" if store.mac_key else ""))


def _stream_heads(store: Store, sid: int) -> Iterator[HeadRow]:
    after = _FLOOR
    while True:
        got = store.backend.heads(sid, after, _CHUNK)
        yield from got
        if len(got) < _CHUNK:
            return
        after = got[-1].size


def _chunks(rows: Iterator[Row]) -> Iterator[list[Row]]:
    chunk: list[Row] = []
    for r in rows:
        chunk.append(r)
        if len(chunk) == _CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _check_content_digests(backend: Backend, sid: int, name: str, found: _Problems) -> None:
    """Check each summary node's content digest against the bodies of the span it covers.

    The rest of verify() ties bodies to leaves and leaves to heads; this ties a node's
    content digest, which restoration trusts in place of a Merkle rehash, to the bodies.
    A span with a redacted body is skipped: nothing can certify it any more.
    """
    from .compaction import content_digest_of

    for row in backend.kind_rows(sid, "node"):
        try:
            node = ev.decode(row.body) if row.body is not None else None
        except InvalidEvent:
            continue  # reported with the body itself
        if not isinstance(node, ev.Summary) or node.content_digest is None:
            continue
        if not 0 <= node.start < node.stop <= row.pos:
            found.add(name, "events", row.pos, f"node covers [{node.start}, {node.stop}), not a span before it")
            continue
        nxt, gapless, redacted = node.start, True, False

        def chunks() -> Iterator[list[bytes]]:
            nonlocal nxt, gapless, redacted
            for chunk in _chunks(backend.rows(sid, node.start, node.stop, _CHUNK)):
                for r in chunk:
                    gapless = gapless and r.pos == nxt
                    nxt += 1
                    redacted = redacted or r.body is None
                yield [r.body or b"" for r in chunk]

        got = content_digest_of(chunks()).hex()
        if redacted:
            continue
        if not gapless or nxt != node.stop:
            found.add(name, "events", row.pos, f"positions of [{node.start}, {node.stop}) are missing or out of order")
        elif got != node.content_digest:
            found.add(name, "events", row.pos, f"content digest of [{node.start}, {node.stop}) does not match its bodies: "
                      f"the node records {node.content_digest[:16]}…, the bodies give {got[:16]}…")
