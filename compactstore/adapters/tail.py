"""What an adapter has read of one session's log, kept current by reading only what is new.

The log is the source of truth; an adapter keeps a small index of it in memory (which
position holds which checkpoint, item or write) so that reading the latest state costs
a few rows, not the whole history. Each refresh reads the positions appended since the
last one, by this process or any other, redactions included, so the index follows the
log however many writers share it.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from operator import attrgetter
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

from blake3 import blake3

from .. import events as ev
from ..errors import ConflictError, InvalidArgument, InvalidEvent, SessionMoved
from ..store import MAX_SESSION_NAME, Record, Session, Store
from ..store import open as open_store
from ..witness import Witness

#: Positions listed by one redaction event: keeps its body far below the event size limit.
REDACTION_CHUNK = 10_000
#: Attempts at a write that lost a race with another writer (one that appended between
#: the index's refresh and the commit) before giving up.
RETRIES = 16
#: Idempotency keys longer than this are replaced by their digest (the store takes up to 1,024).
MAX_KEY = 1000
#: Gap between wanted positions up to which one range read beats separate reads.
READ_GAP = 64

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_POS, _EVENT, _KIND = attrgetter("pos"), attrgetter("event"), attrgetter("kind")
#: Event types whose record changes what earlier positions hold.
_ERASING = frozenset({ev.Redaction, ev.Retention})
#: What a part of an idempotency key must not hold unquoted: separators, "%", controls, non-ASCII.
_UNSAFE = re.compile(r"[^A-Za-z0-9_.~:|\-]")


class StoreUser:
    """Holds a store given open, or opens one from a target and then closes it with itself."""

    store: Store
    _owned: bool

    def _use(self, store: Store | str, witness: str | os.PathLike[str] | Witness | None = None) -> None:
        if witness is not None and isinstance(store, Store):
            raise InvalidArgument("witness", "a store given open keeps the witness it was opened with")
        self._owned = not isinstance(store, Store)
        self.store = open_store(store, witness=witness) if isinstance(store, str) else store

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def close(self) -> None:
        """Close the store if this object opened it."""
        if self._owned:
            self.store.close()

    async def aclose(self) -> None:
        """Close the store if this object opened it, in a worker thread, without blocking the event loop.

        Calls still running in worker threads (those of a cancelled ``await``) finish
        first; any they start after raise :class:`~compactstore.errors.StoreClosed`.
        """
        await asyncio.to_thread(self.close)


def session_name(prefix: str, ident: str) -> str:
    """Return the session name for a framework's thread or session id ``ident``.

    ``prefix + ident`` when that is a valid session name and ``ident`` does not start
    with ``#``; otherwise ``prefix + "#" +`` the hex BLAKE3 of ``ident``. The mapping
    is one to one, and the original id is kept inside the events.
    """
    if ident and not ident.startswith("#") and len(prefix) + len(ident) <= MAX_SESSION_NAME and not _CONTROL.search(ident):
        return prefix + ident
    return prefix + "#" + blake3(ident.encode("utf-8", "surrogatepass")).hexdigest()


def idempotency_key(parts: Sequence[object], replaced: int | None = None) -> str:
    """Return a readable idempotency key naming ``parts`` (and the position it replaces), hashed when long.

    Parts are percent-quoted and joined by ``/``, so distinct parts give distinct keys:
    ``w//<checkpoint id>/<task id>/0``, or ``.../-3@41`` for a write replacing pos 41.
    """
    key = "/".join(_quoted(str(p)) for p in parts) + ("" if replaced is None else f"@{replaced}")
    return key if len(key) <= MAX_KEY else "b3:" + blake3(key.encode("utf-8", "surrogatepass")).hexdigest()


def _quoted(part: str) -> str:
    # Quote only what needs it (separators, "%", control characters): most ids are plain.
    return quote(part, safe=":|") if _UNSAFE.search(part) else part


def reading(session: Session, verify: bool) -> AbstractContextManager[None]:
    """Return :meth:`Session.reading` of ``session`` when reads are verified, else a context that does nothing."""
    return session.reading() if verify else nullcontext()


def read_many(session: Session, positions: Iterable[int], *, verify: bool = True) -> dict[int, Record]:
    """Return the records at ``positions``, reading runs of nearby positions as one range.

    ``verify``: hold each run to the latest sealed head, as :meth:`Session.scan` does.
    """
    wanted = sorted(set(positions))
    out: dict[int, Record] = {}
    i = 0
    while i < len(wanted):
        j = i
        while j + 1 < len(wanted) and wanted[j + 1] - wanted[j] <= READ_GAP:
            j += 1
        keep = set(wanted[i : j + 1])
        for record in session.scan(wanted[i], wanted[j] + 1, verify=verify):
            if record.pos in keep:
                out[record.pos] = record
        i = j + 1
    return out


class Tail:
    """One session's log as read so far: positions ``[0, size)`` are reflected in the index.

    Subclasses keep the index in :meth:`apply` (one record) and :meth:`forget` (positions
    a redaction erased). ``lock`` serializes the index and the writes that depend on it.
    """

    def __init__(self, session: Session, *, verify: bool = True) -> None:
        """Follow ``session`` from its first position; ``verify``: read it as :meth:`Session.scan` reads by default."""
        self.session = session
        #: whether reads hold the rows to the latest sealed head (see :meth:`Session.scan`)
        self.verify = verify
        self.size = 0
        self.lock = threading.RLock()
        #: live positions holding something other than a redaction
        self.live: set[int] = set()

    def refresh(self) -> None:
        """Read what was appended since the last refresh and apply it."""
        with self.lock:
            for record in self.session.scan(self.size, verify=self.verify):
                self._take(record)

    def own(self, records: Sequence[Record]) -> None:
        """Apply records this process just appended; the index then holds what the log holds up to them.

        One commit's fresh records (the usual case) follow the index's end in order with
        nothing among them that erases: they are applied as a batch (:meth:`apply_all`).
        Anything else (a gap another writer left, replays of idempotent appends, a
        redaction) is read back from the log instead, by :meth:`refresh`.
        """
        with self.lock:
            if not records:
                return
            first = records[0].pos
            if (first == self.size and list(map(_POS, records)) == list(range(first, first + len(records)))
                    and _ERASING.isdisjoint(map(type, map(_EVENT, records)))
                    and "redacted" not in map(_KIND, records)):
                self.apply_all(records)
            else:
                self.refresh()

    def commit(self, events: Sequence[ev.Event]) -> list[Record] | None:
        """Append ``events`` in one transaction, if the log still ends where the index does.

        The caller decided them from the index (what is new, what it replaces) without
        reading the log first: the check runs under the session's write lock, so when it
        passes no other writer can have made that decision stale before the commit, the
        events need no idempotency keys and the store looks none up. They are validated
        and encoded before the transaction, which then only writes. Returns the records
        (applied to the index), or None, writing nothing, when another writer appended
        since the index was last brought up to date: :meth:`refresh` and decide again.

        Raises:
            InvalidEvent: an event is not valid; nothing is written.
        """
        with self.lock:
            try:
                records = self.session.extend(list(events), expect_size=self.size)
            except SessionMoved:
                return None
            self.own(records)
            return records

    def _take(self, record: Record) -> None:
        self.size = record.pos + 1
        event = record.event
        if isinstance(event, ev.Redaction):
            erased = [p for p in event.positions if p in self.live]
            self.live.difference_update(erased)
            self.forget(erased)
        elif isinstance(event, ev.Retention):
            pass  # it holds nothing to erase; what it dropped stays live (its facts, its position), bodiless
        elif record.kind != "redacted":
            self.live.add(record.pos)
            self.apply(record)

    def apply(self, record: Record) -> None:
        """Index one live record (not a redaction)."""

    def apply_all(self, records: Sequence[Record]) -> None:
        """Take live records that follow the index's end, none a redaction: each read, then applied, in order.

        As :meth:`refresh` takes them: when :meth:`apply` raises, the records before are
        applied and the rest are left unread.
        """
        live = self.live
        for record in records:
            self.size = record.pos + 1
            live.add(record.pos)
            self.apply(record)

    def forget(self, positions: Sequence[int]) -> None:
        """Drop redacted ``positions`` from the index."""

    def erase(self, positions: Iterable[int], reason: str) -> None:
        """Redact ``positions`` (those still live), in chunks, and apply the redactions."""
        with self.lock:
            self.refresh()
            todo = sorted(p for p in set(positions) if p in self.live)
            for i in range(0, len(todo), REDACTION_CHUNK):
                for _ in range(RETRIES):
                    chunk = [p for p in todo[i : i + REDACTION_CHUNK] if p in self.live]
                    if not chunk:
                        break
                    try:
                        self.own([self.session.redact(chunk, reason)])
                        break
                    except InvalidEvent:
                        # Another writer redacted some of them first: read its redaction and retry.
                        self.refresh()
                else:
                    raise ConflictError(f"could not redact {len(chunk)} positions of {self.session.name!r}: "
                                        f"other writers kept redacting them", session=self.session.name)
