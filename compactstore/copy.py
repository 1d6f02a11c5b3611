"""Copy sessions between stores, and between backends, checking every root on arrival.

Re-appending the decoded events reproduces the source's bytes exactly: the canonical
encoding is deterministic, and an event's timestamp and idempotency key live in its
body. Each session is copied in order, in batches (one transaction each), and each
batch is checked on arrival: same positions, same leaves. At the end the session's
root at the copied size must equal the source's, or :class:`IntegrityError` is raised.

A session with redacted or dropped positions cannot be re-appended (only the leaves of
its erased bodies remain), so it is replicated instead: its rows as they are (erased
ones as leaves without bodies, each with its eraser in the same transaction), its
erasure records and its structural index rows; present bodies are still held to their
leaves, and the root at the end to the source's.

The destination's tree heads are the ones its own transactions made (one per batch),
so its head chain differs from the source's; the roots at every size are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

import msgspec

from . import events as ev
from .errors import CompactStoreError, IntegrityError, InvalidArgument, InvalidEvent, KeyRequired, shown
from .index import Index
from .store import Record, Session, Store

#: Events per destination transaction.
BATCH = 1000


class CopiedSession(msgspec.Struct, frozen=True):
    """One session copied: its name, its number of events and its root at that size."""

    name: str
    events: int
    root: bytes


class CopyReport(msgspec.Struct, frozen=True):
    """The outcome of :func:`copy`: the sessions copied, in order, and the total events."""

    sessions: list[CopiedSession]
    events: int


def _source_records(session: Session, size: int) -> Iterator[Record]:
    """Yield the source's records ``[0, size)``, turning an undecodable body into IntegrityError."""
    pos = 0
    it = session.scan(0, size)
    while True:
        try:
            record = next(it)
        except StopIteration:
            return
        except InvalidEvent as exc:
            raise IntegrityError(
                f"source session {session.name!r}: the event after pos {pos - 1} does not decode: {exc.reason}",
                session=session.name,
            ) from exc
        pos = record.pos + 1
        yield record


def batches(records: Iterable[Record], erased: Mapping[int, int], batch: int) -> Iterator[list[Record]]:
    """Group ``records`` (consecutive positions) into transactions of at least ``batch`` for a replica.

    An erased row must be written with the event that erased it (``erased``: position ->
    the eraser's position), so a batch runs on to the last eraser of the erased rows it
    holds. Only the last batch may be shorter than ``batch``.
    """
    chunk: list[Record] = []
    reach = -1
    for record in records:
        if not record.body:
            reach = max(reach, erased.get(record.pos, -1))
        chunk.append(record)
        if len(chunk) >= batch and record.pos >= reach:
            yield chunk
            chunk, reach = [], -1
    if chunk:
        yield chunk


def _copy_session(
    src: Session, dst: Session, batch: int, progress: Callable[[str, int, int], None] | None
) -> CopiedSession:
    size = src.size
    want = src.head(size).root
    sid = src.store.backend.session_id(src.name)
    erased = src.store.backend.erasures(sid) if sid is not None else {}
    index = Index(src.store.backend, sid) if erased and sid is not None else None
    done = 0

    def checked(records: Iterator[Record]) -> Iterator[Record]:
        for pos, record in enumerate(records):
            if record.pos != pos:
                raise IntegrityError(f"source session {src.name!r}: pos {record.pos} follows pos {pos - 1}",
                                     session=src.name, pos=record.pos)
            if not record.body and not erased.get(record.pos, size) < size:  # never empty unless erased
                raise IntegrityError(
                    f"source session {src.name!r} pos {record.pos}: the body was erased by an event past the "
                    f"copied size {size} (a redaction or retention during the copy)", session=src.name, pos=record.pos)
            yield record

    for chunk in batches(checked(_source_records(src, size)), erased, batch):
        if index is None:
            got = dst.extend([r.event for r in chunk], idempotency_keys=[r.event.idempotency_key for r in chunk])
        else:
            lo, hi = chunk[0].pos, chunk[-1].pos + 1
            dst.replicate(chunk, {p: erased[p] for p in range(lo, hi) if p in erased}, index.rows_in(lo, hi))
            got = list(dst.scan(lo, hi))
        for mine, theirs in zip(got, chunk, strict=True):
            if mine.pos != theirs.pos:
                raise IntegrityError(
                    f"session {dst.name!r}: event landed at pos {mine.pos}, want {theirs.pos} "
                    "(another writer appended to the destination during the copy)",
                    session=dst.name,
                    pos=theirs.pos,
                )
            if mine.leaf != theirs.leaf:
                raise IntegrityError(
                    f"session {dst.name!r} pos {theirs.pos}: copied leaf {mine.leaf.hex()[:16]} differs from "
                    f"the source's stored leaf {theirs.leaf.hex()[:16]} (the source body or leaf was altered)",
                    session=dst.name,
                    pos=theirs.pos,
                )
        done += len(chunk)
        if progress is not None:
            progress(src.name, done, size)
    if done != size:
        raise IntegrityError(
            f"source session {src.name!r}: {done} events read, its head says {size}", session=src.name
        )
    got_root = dst.head(size).root
    if got_root != want:
        raise IntegrityError(
            f"session {src.name!r}: root at size {size} is {got_root.hex()[:16]} in the destination, "
            f"{want.hex()[:16]} in the source",
            session=src.name,
        )
    return CopiedSession(src.name, size, got_root)


def copy(
    src: Store,
    dst: Store,
    *,
    sessions: Iterable[str] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    batch: int = BATCH,
) -> CopyReport:
    """Copy sessions from ``src`` to ``dst`` (any backends), byte for byte, verifying every root.

    Each session is copied up to the size it has when its copy starts, read as a plain
    read reads it (every leaf proven in the source's sealed head, under its key). Nothing
    is written unless every destination session is empty, no source session has a derived
    event that breaks a rule, and the destination can resume the
    source's markers (their checkpoint MACs are the source key's, so a keyed destination
    takes markers only from a source with the same key); a copy that fails part way
    (another writer, a source changed during the copy) leaves a verified prefix of the
    session that failed (the log is append-only).

    Args:
        src: the store to read.
        dst: the store to write; opened with its key if it is keyed.
        sessions: the names to copy (default: every session of ``src``).
        progress: called as ``progress(session, done, total)`` after every batch.
        batch: events per destination transaction.

    Raises:
        InvalidArgument: a named session is not in ``src``, a destination session already
            has events, or ``dst`` has another key than ``src`` and a session holds markers.
        KeyRequired: ``src`` is keyed and was opened without its key.
        IntegrityError: the source does not verify (a leaf, root or seal, or a derived
            event that breaks a rule), or another writer appended to a destination session.
        CompactStoreError: ``dst`` is keyed and was opened without its key.
    """
    for field, store in (("src", src), ("dst", dst)):
        if not isinstance(store, Store):
            raise InvalidArgument(field, f"want an open Store, got {type(store).__name__}")
    if ev.as_int("batch", batch) < 1:
        raise InvalidArgument("batch", f"must be a positive int, got {shown(batch)}")
    if progress is not None:
        ev.as_callable("progress", progress)
    present = src.sessions()
    names = present if sessions is None else list(dict.fromkeys(ev.as_texts("sessions", sessions)))
    missing = sorted(set(names) - set(present))
    if missing:
        raise InvalidArgument("sessions", f"not in the source store: {', '.join(map(repr, missing))}")
    if src.keyed and not src.has_key:
        raise KeyRequired("copy", session=None)
    if dst.keyed and not dst.has_key:
        raise CompactStoreError("the destination store is keyed", hint="open it with its key")
    if dst.has_key and not dst.same_key(src):
        marked = [name for name in names if (sid := src.backend.session_id(name)) is not None
                  and src.backend.latest_markers(sid, src.session(name).size, 1)]
        if marked:
            raise InvalidArgument(
                "dst", f"the destination has another key than the source, and sessions {', '.join(map(repr, marked))} "
                "hold markers whose checkpoint MACs are the source key's: they would not resume there",
                hint="copy into a store with the source's key, or into an unkeyed store")
    orphans = src.backend.orphans()
    if orphans:
        table, owner = orphans[0]
        raise IntegrityError(f"the source's {table} table holds rows of session id {owner!r}, which no session has: "
                             "a session's name or rows were changed behind the store's back")
    for name in names:
        broken = src.session(name).rule_problems()
        if broken:
            pos, why = broken[0]
            raise IntegrityError(f"source session {name!r}: the event at pos {pos} breaks a rule: {why}",
                                 session=name, pos=pos)
    occupied = [(name, dst.session(name).size) for name in names]
    occupied = [(name, n) for name, n in occupied if n]
    if occupied:
        listed = ", ".join(f"{name!r} ({n} events)" for name, n in occupied)
        raise InvalidArgument("dst", f"destination sessions already hold events: {listed}",
                              hint="copy into an empty store, or name other sessions")
    copied = [_copy_session(src.session(name), dst.session(name), batch, progress) for name in names]
    return CopyReport(copied, sum(c.events for c in copied))
