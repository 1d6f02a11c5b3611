"""What a builder reads of a session: the read protocol below the store.

Compaction, markers and the resolver build events and resolutions from a session's
log and never write: they read through :class:`SessionView`, which
:class:`compactstore.store.Session` implements with its public read methods, and the
store commits what they return. So they sit below the store, and the store is the
only writer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple, Protocol

from . import events as ev
from .errors import ForeignReference, InvalidArgument, shown
from .events import Record, TreeHead
from .facts import Facts
from .structure import IndexRow


class SpanRead(NamedTuple):
    """What one read of a stored span ``[start, stop)`` gives (see :meth:`SessionView.read_span`)."""

    #: the records, in position order (empty unless asked for)
    records: list[Record]
    #: the content digest of the bodies, or None when a body in the span was redacted
    digest: bytes | None
    #: the stored tree's root of the span
    span_root: bytes


class EventReader(Protocol):
    """Reads events before a checkpoint, each once, checking each body against its leaf."""

    #: the leaves of the bodies read and checked, by position
    leaves: dict[int, bytes]

    def __call__(self, pos: int) -> ev.Event | None:
        """Return the event at ``pos``, or None when ``pos`` is not before the checkpoint."""
        ...

    def prefetch(self, positions: Iterable[int]) -> None:
        """Read the events at ``positions`` not read yet, in one query."""
        ...

    def add(self, record: Record) -> None:
        """Take in a record read elsewhere, checking it like the ones read here."""
        ...


class SessionView(Protocol):
    """The reads of one session that builders use."""

    name: str

    @property
    def size(self) -> int:
        """Return the number of events in the session."""
        ...

    def read(self, pos: int) -> Record:
        """Return the record at ``pos``."""
        ...

    def scan(self, start: int = 0, stop: int | None = None, *, verify: bool = True) -> Iterator[Record]:
        """Yield the records of ``[start, stop)`` in order (``verify=False``: each body against its leaf only)."""
        ...

    def head(self, size: int | None = None) -> TreeHead:
        """Return the tree head at ``size``, with a MAC when the store is keyed."""
        ...

    @property
    def store_id(self) -> str:
        """Return the identity of the store the session lives in."""
        ...

    def sealed_head(self, size: int | None = None) -> TreeHead:
        """Return the tree head at ``size`` (default: the latest), proven against the latest sealed head.

        Raises ``KeyRequired`` on a keyed store opened without its key.
        """
        ...

    def proven(self, pos: int) -> Record:
        """Return the record at ``pos``, checked against its leaf and proven in the latest sealed head."""
        ...

    def span_root(self, start: int, stop: int) -> bytes:
        """Return the root of ``[start, stop)`` from the stored tree."""
        ...

    def root_with(self, leaves: Mapping[int, bytes], size: int) -> bytes:
        """Return the root of ``[0, size)`` from ``leaves`` and the stored subtree roots for the rest."""
        ...

    def facts(self, size: int | None = None, *, reader: EventReader | None = None) -> Facts:
        """Return the structural facts of the session at checkpoint ``size``."""
        ...

    def reader(self, size: int, *, deferred: bool = False) -> EventReader:
        """Return a reader of the events before ``size`` that checks each body against its leaf.

        ``deferred``: its leaves are not held to the sealed head as they are read; the
        caller proves them all in one multi-proof before acting on what it read.
        """
        ...

    def read_span(self, start: int, stop: int, *, records: bool = False) -> SpanRead:
        """Read ``[start, stop)`` once, as a plain read reads it: its content digest and span root from its leaves."""
        ...

    def bodies(self, start: int, stop: int, sink: Callable[[list[bytes]], object] | None = None) -> list[bytes | None]:
        """Return the stored bodies of ``[start, stop)`` unchecked, for a caller that holds them to a digest it trusts."""
        ...

    def erasures(self) -> dict[int, int]:
        """Return every erased position (redacted or dropped) with the position of the event that erased it."""
        ...

    def index_rows(self, positions: Sequence[int]) -> list[IndexRow]:
        """Return the structural index's rows at ``positions``."""
        ...

    def erased_by(self, pos: int) -> int:
        """Return the position of the logged redaction that erased the body at ``pos`` (IntegrityError if none did)."""
        ...


class Logged(Protocol):
    """A caller's copy of an event a session logged (a ``Node``, a ``Marker``): its session, position and leaf."""

    @property
    def session(self) -> str:
        """Return the name of the session that logged it."""
        ...

    @property
    def pos(self) -> int:
        """Return its position there."""
        ...

    @property
    def leaf(self) -> bytes:
        """Return its leaf hash."""
        ...


def same_session(name: str, field: str, obj: Logged) -> None:
    """Refuse a caller's copy of a logged event taken from a session other than ``name``, or not of exact types.

    Its session must be a str equal to ``name``, its position an int, its leaf bytes,
    each exactly: a subclass could call itself equal to anything, and every later
    comparison of them would say what it likes.

    Raises:
        ForeignReference: it names another session, or its leaf is not bytes.
        InvalidArgument: its position is not one (naming ``field``).
    """
    given, pos, leaf = obj.session, obj.pos, obj.leaf
    if type(given) is not str or given != name:
        raise ForeignReference(field, f"is from session {shown(given)}, not {name!r}", session=name,
                               pos=pos if type(pos) is int else None)
    if type(pos) is not int or not 0 <= pos <= ev.MAX_POSITION:
        raise InvalidArgument(field, f"names no position: {shown(pos)}")
    if type(leaf) is not bytes:
        raise ForeignReference(field, f"its leaf is not bytes but {type(leaf).__name__}", session=name, pos=pos)


def logged_position(view: SessionView, field: str, obj: Logged) -> int:
    """Return the position of ``obj``, a caller's copy of an event, once its session and leaf are those ``view`` logged there.

    Only the position is taken from such an object, and only then: everything else is
    read again from the log, so an object edited in memory or taken from another
    session is never trusted. Every path that takes a ``Node`` or a ``Marker`` goes
    through here (or through :func:`same_session` first, then compares the leaf).

    Raises:
        ForeignReference: it names another session, or another event (its leaf differs).
        InvalidArgument: its position is not one (naming ``field``), or there is no event there.
    """
    same_session(view.name, field, obj)
    pos = obj.pos
    record = view.read(pos)
    if obj.leaf != record.leaf:
        raise ForeignReference(
            field, f"is not the {record.kind} logged at pos {pos}: its leaf differs (edited, or from another store)",
            session=view.name, pos=pos,
        )
    return pos
