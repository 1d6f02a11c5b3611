"""The storage protocol every backend implements: rows, heads, and the typed verbs over them.

See :mod:`compactstore.backends` for the tables.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from itertools import repeat
from typing import Any, NamedTuple, Protocol, overload

from ..errors import NotAStore, StaleHead
from ..structure import IndexRow

#: The schema this library writes and reads; an older one is migrated (:mod:`compactstore.migrate`), a newer one refused.
#: 4: a failed tool result's negative fact holds its exact output (3 cut it at 160
#: characters), redactions blank the fact texts they erase, and a store carries its
#: identity in meta; a store written by 3 no longer verifies. 5: each head stores and
#: seals the global sequence numbers of the events its commit added (``heads.seqs``).
#: 6: a head must follow the head it extends (a trigger), and the index snapshots the
#: open items every 64 positions (512 before).
SCHEMA_VERSION = "6"


def caller() -> tuple[int, object]:
    """Return who calls: the thread, and the asyncio task running in it (None outside one).

    A snapshot (:meth:`Backend.snapshot`) is its opener's: a task another one starts
    inside it copies its context, but is another caller.
    """
    try:
        task: object = asyncio.current_task()
    except RuntimeError:  # no event loop runs in this thread
        task = None
    return threading.get_ident(), task


def identified(meta: dict[str, str], where: str) -> dict[str, str]:
    """Return ``meta`` as read by an opener that may not create: an empty one is a store still being made."""
    if not meta:
        raise NotAStore(where, "its schema has no identity yet (a store being made)")
    return meta


class Row(NamedTuple):
    """One stored event, as the backend keeps it."""

    seq: int
    session_id: int
    pos: int
    kind: str
    idem_key: str | None
    leaf: bytes
    body: bytes | None


#: Bodies per batch handed to the ``each`` of :meth:`Backend.bodies`: small enough that a
#: batch of 1 KiB turns is still in cache when it is hashed, large enough that calls are few.
BODY_BATCH = 64


_new_tuple = tuple.__new__


class Rows(Sequence[Row]):
    """The rows of one append, kept by column: a :class:`Row` is made only when one is read.

    A batch's rows as a list of tuples were a thousand objects the cycle collector
    tracked, and most of its collections during an append; a backend that reads the
    columns (SQLite binds them through ``zip``) makes none.
    """

    __slots__ = ("seqs", "session_id", "positions", "kinds", "keys", "leaves", "bodies")

    def __init__(self, seqs: Sequence[int], session_id: int, positions: range, kinds: Sequence[str],
                 keys: Sequence[str | None], leaves: Sequence[bytes], bodies: Sequence[bytes]) -> None:
        """Hold the columns; each has one item per row, in position order."""
        self.seqs, self.session_id, self.positions = seqs, session_id, positions
        self.kinds, self.keys, self.leaves, self.bodies = kinds, keys, leaves, bodies

    def __len__(self) -> int:
        return len(self.positions)

    def __iter__(self) -> Iterator[Row]:
        # tuple.__new__ is Row(...) without the Python-level __new__ a NamedTuple adds.
        return map(_new_tuple, repeat(Row), zip(self.seqs, repeat(self.session_id), self.positions, self.kinds,
                                                 self.keys, self.leaves, self.bodies))

    @overload
    def __getitem__(self, i: int) -> Row: ...

    @overload
    def __getitem__(self, i: slice) -> list[Row]: ...

    def __getitem__(self, i: int | slice) -> Row | list[Row]:
        if isinstance(i, slice):
            return list(self)[i]
        j = range(len(self))[i]  # an IndexError out of range, negative indexes from the end
        return Row(self.seqs[j], self.session_id, self.positions[j], self.kinds[j], self.keys[j], self.leaves[j],
                   self.bodies[j])


class HeadRow(NamedTuple):
    """One stored tree head."""

    size: int
    root: bytes
    prev: int
    seal: bytes
    #: the ``seq`` of each event at positions ``[prev, size)``, packed by :func:`compactstore.seal.seq_runs`
    seqs: bytes


class Writer(Protocol):
    """One write transaction holding a session's append lock."""

    session_id: int

    def head(self) -> HeadRow | None:
        """Return the session's latest stored head (None for a new session)."""
        ...

    def hashes(self, coords: Sequence[tuple[int, int]]) -> list[bytes]:
        """Return the subtree roots at ``(level, idx)`` coordinates (level 0: leaves)."""
        ...

    def find_idempotent(self, key: str) -> Row | None:
        """Return the session's event appended with idempotency key ``key``, if any."""
        ...

    def confirm(self) -> None:
        """Make sure the head this writer builds on is the latest (a speculating writer locks and checks now).

        Raises:
            StaleHead: it is not; nothing was written.
        """
        ...

    def next_seqs(self, count: int) -> Sequence[int]:
        """Return the global sequence numbers of the next ``count`` events, increasing.

        Taken inside the transaction, so they are after those of every commit that ended
        before it began (the head's seal covers them). Consecutive on a backend with one
        writer at a time; where writers run at once they may interleave, and numbers taken
        by a transaction that rolls back are not used again.
        """
        ...

    def insert(
        self,
        rows: Sequence[Row],
        subtrees: Sequence[tuple[int, int, bytes]],
        head: HeadRow,
    ) -> list[int]:
        """Insert events (their seqs from :meth:`next_seqs`), completed subtree roots and the new head; return the seqs.

        The last write of the transaction, but for the ``erase`` of a redaction or a
        retention among ``rows``: without one, a writer may commit here, in the same round trip.
        """
        ...

    def note_erased(self, positions: Sequence[int], by: int) -> None:
        """Record ``positions``, inserted without bodies in this transaction, as erased by the event at ``by`` (a copy's)."""
        ...

    def erase(self, positions: Sequence[int], by: int, *, kind: str = "redacted") -> None:
        """Record ``positions`` as erased by the event at ``by``: body and idem_key NULL, kind ``kind``.

        ``redacted`` (by a redaction): the texts of the negative facts at those positions in
        the structural index (renderings of the erased events) are blanked too. ``dropped``
        (by retention): the index keeps them. Every other row and column stays.
        """
        ...

    def index_rows(self, rels: Sequence[str], lo: int, hi: int) -> list[IndexRow]:
        """Return the session's index rows of kinds ``rels`` at positions ``[lo, hi)``, by position."""
        ...

    def index_rows_at(self, rel: str, positions: Sequence[int]) -> list[IndexRow]:
        """Return the session's index rows of kind ``rel`` at ``positions`` (sorted), by position."""
        ...

    def latest_binding(self, key: str, before: int) -> IndexRow | None:
        """Return the session's ``binding`` row of the last binding of ``key`` before position ``before``."""
        ...

    def body(self, pos: int) -> bytes | None:
        """Return the session's stored body at ``pos`` (None: redacted or missing)."""
        ...

    def insert_index(self, rows: Sequence[IndexRow]) -> None:
        """Insert the session's index ``rows``, before :meth:`insert` (it may commit)."""
        ...


class Backend(Protocol):
    """Storage for one store: the tables above, append-only, transactional."""

    #: Whether global sequence numbers are gapless (so verify can check that).
    gapless_seq: bool

    def close(self) -> None:
        """Release connections; the backend is unusable afterwards."""
        ...

    def snapshot(self) -> AbstractContextManager[None]:
        """Open a read-only view of one state of the store for the calling thread, until the context ends.

        Inside it every read this backend serves to the calling thread sees the store as
        of the first of them: commits made meanwhile (by this handle or another) are not
        seen, so reads made in several queries agree with each other. Commits are not
        refused; whether other threads of this handle wait for the context to end is the
        backend's to say. Nested contexts share the outer one's state. Writing from
        inside one is not supported.

        Raises:
            StoreClosed: the backend is closed.
        """
        ...

    def meta(self) -> dict[str, str]:
        """Return the meta table."""
        ...

    def init_meta(self, values: dict[str, str], *, create: bool = True) -> dict[str, str]:
        """Write ``values`` into an empty meta table; return what is stored either way.

        ``create=False``: read only, without the write lock; an empty meta table (a store
        whose maker has made the schema and not yet its identity) raises
        :class:`~compactstore.errors.NotAStore`, and nothing is written.
        """
        ...

    def upgrade(self, to: str, derive: Callable[[], Sequence[tuple[int, Sequence[IndexRow]]]], *, commit: bool) -> None:
        """Move the store to schema ``to`` from the one before it, in one transaction that holds off writers.

        Runs the backend's statements for ``to``, inserts the index rows ``derive()``
        returns (``(session id, rows)``; it reads the store through this backend, inside
        the transaction), and records ``to`` as the schema version. ``commit=False``
        runs every step and rolls them all back (a dry run). Killed at any point, the
        store is wholly at the one version or wholly at the other.

        Raises:
            ConflictError: the store is not at the version before ``to`` (another migration ran first).
            IntegrityError: the store's tables are not those of that version.
        """
        ...

    def reclaim(self) -> int:
        """Give the space of erased bodies back: SQLite rewrites its file (VACUUM), PostgreSQL vacuums the log's tables.

        Returns the bytes the store's files or tables shrank by (0 when nothing was freed).
        """
        ...

    def sessions(self) -> list[tuple[int, str]]:
        """Return ``(id, name)`` of every session, ordered by name."""
        ...

    def session_id(self, name: str) -> int | None:
        """Return the id of session ``name``, or None when it has no events."""
        ...

    def writer(self, name: str, *, speculate: bool = False) -> AbstractContextManager[Writer]:
        """Open a write transaction on session ``name``, creating it; commit on success.

        ``speculate``: the writer may start from the head this backend committed last,
        without taking the lock first; it takes the lock before any read or write, or in
        the insert itself, and raises :class:`StaleHead` if the head moved meanwhile.
        """
        ...

    def row(self, session_id: int, pos: int) -> Row | None:
        """Return the event at ``pos``."""
        ...

    def rows(self, session_id: int, start: int, stop: int | None, chunk: int) -> Iterator[Row]:
        """Yield events with ``start <= pos < stop`` in position order, ``chunk`` per query."""
        ...

    def head(self, session_id: int) -> HeadRow | None:
        """Return the latest stored head of a session."""
        ...

    def hashes(self, session_id: int, coords: Sequence[tuple[int, int]]) -> list[bytes]:
        """Return the subtree roots at ``coords`` (level 0: leaves).

        Raises:
            IntegrityError: one is not stored; it names the first missing.
        """
        ...

    def bodies(
        self, session_id: int, start: int, stop: int, each: Callable[[list[bytes | None]], object] | None = None
    ) -> list[bytes | None]:
        """Return the bodies at positions ``[start, stop)`` in order (None where redacted), in one query.

        ``each``, when given, is called with every batch of bodies in order as the batch
        is read, before the next is: a caller hashes each while it is in cache, with no
        pass over the whole span afterwards. What it raises ends the read and is raised as it is.
        """
        ...

    def rows_at(self, session_id: int, positions: Sequence[int]) -> list[Row]:
        """Return the events at ``positions`` (sorted), by position."""
        ...

    def leaves(self, session_id: int, start: int, stop: int) -> list[bytes]:
        """Return the leaf hashes at positions ``[start, stop)`` in order, in one query (fewer where positions are missing)."""
        ...

    def node_bodies(self, session_id: int, lo: int, hi: int) -> list[tuple[int, bytes | None]]:
        """Return ``(pos, body)`` of the summary nodes (events of kind ``node``) at positions ``[lo, hi)``, by position."""
        ...

    def derived_positions(self, session_id: int, lo: int, hi: int) -> list[int]:
        """Return the positions in ``[lo, hi)`` of derived events (nodes, spills, markers, attempts), in order."""
        ...

    def body(self, session_id: int, pos: int) -> bytes | None:
        """Return the stored body at ``pos`` (None: redacted or missing)."""
        ...

    def latest_markers(self, session_id: int, before: int, limit: int) -> list[int]:
        """Return the positions of up to ``limit`` markers before position ``before``, latest first."""
        ...

    def subtree_range(self, session_id: int, level: int, lo: int, hi: int) -> list[tuple[int, bytes]]:
        """Return ``(idx, hash)`` of the stored subtree roots at ``level`` with ``lo <= idx < hi`` (level 0: leaves)."""
        ...

    def subtree_counts(self, session_id: int) -> dict[int, int]:
        """Return the number of stored subtree roots per level."""
        ...

    def index_rows(self, session_id: int, rels: Sequence[str], lo: int, hi: int) -> list[IndexRow]:
        """Return the index rows of kinds ``rels`` at positions ``[lo, hi)``, by position."""
        ...

    def index_rows_at(self, session_id: int, rel: str, positions: Sequence[int]) -> list[IndexRow]:
        """Return the index rows of kind ``rel`` at ``positions`` (sorted), by position."""
        ...

    def negatives_caused(self, session_id: int, lo: int, hi: int) -> list[IndexRow]:
        """Return the ``negative`` rows before ``lo`` made negative in ``[lo, hi)`` (their ``num``), by position."""
        ...

    def latest_binding(self, session_id: int, key: str, before: int) -> IndexRow | None:
        """Return the ``binding`` row of the last binding of ``key`` before position ``before``."""
        ...

    def index_after(self, session_id: int, after: tuple[int, str, int], limit: int) -> list[IndexRow]:
        """Return up to ``limit`` index rows after ``(pos, rel, num)`` in that order, for streaming the index."""
        ...

    def index_orphans(self) -> list[object]:
        """Return the session ids the index names that no session has, as stored (a damaged file may hold a NULL)."""
        ...

    def heads(self, session_id: int, after: int, limit: int) -> list[HeadRow]:
        """Return up to ``limit`` stored heads with ``size > after``, by size."""
        ...

    def integrity(self) -> list[str]:
        """Return what the database's own consistency check finds wrong (empty when none)."""
        ...

    def redactions(self, session_id: int) -> dict[int, int]:
        """Return the session's redacted positions, each with the position of its redaction event."""
        ...

    def erasures(self, session_id: int) -> dict[int, int]:
        """Return every position whose body is erased (redacted or dropped), each with the position of the event that erased it."""
        ...

    def orphans(self) -> list[tuple[str, object]]:
        """Return ``(table, session_id)`` for rows that name no existing session, the id as stored."""
        ...

    def seq_bounds(self) -> tuple[int, int, int]:
        """Return ``(count, min, max)`` of event sequence numbers."""
        ...


def keyset(
    fetch: Callable[[int, int, int], Sequence[tuple[Any, ...]]], start: int, stop: int | None, chunk: int
) -> Iterator[Row]:
    """Yield rows ``start <= pos < stop`` page by page: ``fetch(start, end, limit)`` returns one page.

    Each page starts after the last position of the one before, so a page costs one
    index range scan however far into the log it is.
    """
    end = stop if stop is not None else 1 << 62
    while start < end:
        got = fetch(start, end, chunk)
        for r in got:
            yield Row(*r)
        if len(got) < chunk:
            return
        start = int(got[-1][2]) + 1


def chunked(rows: Iterable[Row], size: int) -> Iterator[list[Row]]:
    """Yield ``rows`` in lists of ``size`` (the last may be shorter)."""
    chunk: list[Row] = []
    for r in rows:
        chunk.append(r)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def all_heads(backend: Backend, session_id: int, chunk: int = 2048) -> Iterator[HeadRow]:
    """Yield every stored head of a session in size order, page by page (sizes below 0 too)."""
    after = -(2**62)  # below any size a row could hold: verify must see even impossible ones
    while True:
        got = backend.heads(session_id, after, chunk)
        yield from got
        if len(got) < chunk:
            return
        after = got[-1].size
