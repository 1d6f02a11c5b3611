"""Summary nodes, loss classes and the pre-compaction gate.

A compaction replaces raw positions ``[start, stop)`` of a session by an L1 summary
node; a digest replaces contiguous L1 nodes by an L2 node. Nodes are events, so the
tree covers them, and each carries the span root of the raw events it replaced.

Before a lossy compaction runs, the gate classifies every open obligation by whether
the binding it needs is regenerable. A non-regenerable binding whose latest value is
bound inside the span must be kept verbatim, spilled to the store, or the compaction
is refused: the failure it prevents shows up many steps later, at the first step that
needs the lost literal, where nothing points back at the compaction.

What a compaction needs of the session's structure (overlapping nodes, the span's
negative facts, open and resolved items, bindings, open obligations) comes from the
structural index when it answers (:class:`IndexedFacts`), else from a pass over every
event (:class:`FullFacts`, the reference); both give the same nodes and refusals. The
span itself is read once, under the session's lock: its records for the summarizer,
its content digest and each body against its leaf, so the node needs no second read
at commit.
"""

from __future__ import annotations

import enum
import struct
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

import msgspec
from blake3 import blake3

from . import events as ev
from . import merkle
from .backends import chunked
from .errors import CompactionInvariantError, IntegrityError, InvalidArgument, InvalidEvent
from .events import Excerpt, Fact, Item, LossClass, SpillRef
from .index import Index
from .structure import Structure, build, split_item, text_of

if TYPE_CHECKING:
    from .backends import Backend, Row
    from .store import Record, Session

__all__ = [
    "AUTO",
    "Finding",
    "LossClass",
    "Node",
    "Risk",
    "Summarizer",
    "content_digest",
    "content_digest_of",
    "extractive",
]

OnRisk = Literal["refuse", "preserve", "spill"]
Summarizer = Callable[[Sequence["Record"]], str]
"""A plain callable from the span's records to summary text. The store never calls a model."""


class _Auto(enum.Enum):
    AUTO = "AUTO"

    def __repr__(self) -> str:
        return "AUTO"


AUTO = _Auto.AUTO
"""Let the store fill negative facts and unresolved items from the log's structure."""

_LOSS_ORDER = {LossClass.LOSSLESS: 0, LossClass.LOSSY_GIST: 1, LossClass.LOSSY_LITERAL: 2}


class Node(msgspec.Struct, frozen=True):
    """A summary node as stored at position ``pos`` of its session.

    Attributes:
        tier: 1 over raw events, 2 over contiguous tier-1 nodes.
        start, stop: the raw positions ``[start, stop)`` it covers.
        span_root: the tree's root of that span when the node was written.
        loss: its loss class.
        children: positions of the tier-1 nodes an L2 node digests.
        negative_facts, unresolved, kept, spills: what it retains.
        resolved: the items opened before its span and closed inside it.
        content_digest: :func:`content_digest` of the span's bodies when the node was
            written, or None (a node written before it existed, or over a redacted body).
    """

    session: str
    pos: int
    tier: int
    start: int
    stop: int
    span_root: bytes
    summary: str
    loss: LossClass
    children: list[int]
    negative_facts: list[Fact]
    unresolved: list[Item]
    kept: list[Excerpt]
    spills: list[SpillRef]
    contract: str | None
    leaf: bytes
    content_digest: bytes | None = None
    resolved: list[Item] = []

    @classmethod
    def from_record(cls, record: Record) -> Node:
        """Return the node stored in ``record``.

        Raises:
            InvalidArgument: the record is not a summary node.
        """
        s = record.event
        if not isinstance(s, ev.Summary):
            raise InvalidArgument("node", f"pos {record.pos} is a {record.kind!r} event, not a summary node")
        return cls(
            record.session, record.pos, s.tier, s.start, s.stop, bytes.fromhex(s.span_root), s.summary, s.loss,
            list(s.children), list(s.negative_facts), list(s.unresolved), list(s.kept), list(s.spills),
            s.contract, record.leaf, None if s.content_digest is None else _unhex(s.content_digest),
            list(s.resolved),
        )


class Risk(msgspec.Struct, frozen=True):
    """An open obligation that needs a non-regenerable binding bound inside the span."""

    obligation: str
    obligation_pos: int
    key: str
    binding_pos: int

    def __str__(self) -> str:
        return (
            f"obligation {self.obligation!r} (pos {self.obligation_pos}) needs non-regenerable "
            f"binding {self.key!r} bound at pos {self.binding_pos}"
        )


class Finding(msgspec.Struct, frozen=True):
    """A binding destroyed by compaction and needed afterwards (seed 001's structural signal).

    Attributes:
        node: position of the lossy node whose span swallowed the binding.
        key, binding_pos: the binding and where it was bound.
        needed_at: the first step after the node that needed it.
        steps_later: how many positions after the node that step came.
        via: what needed it (an obligation, or an event's ``uses``).
    """

    node: int
    key: str
    binding_pos: int
    needed_at: int
    steps_later: int
    via: str


def extractive(records: Sequence[Record]) -> str:
    """Summarize deterministically: one short line per event, literal values left out.

    A binding shows as ``bound KEY`` without its value, so this summary keeps the gist
    and drops literals, as a language-model summary would.
    """
    lines = []
    for r in records:
        event = r.event
        if isinstance(event, ev.Summary):
            lines.append(f"[{event.start}-{event.stop}) {event.summary}")
            continue
        status = f" [{event.status}]" if event.status not in (None, "ok") else ""
        lines.append(f"{r.pos}: {text_of(event)[:80]}{status}")
    return "\n".join(lines)


# --- argument handling -----------------------------------------------------------


def _facts(given: Iterable[Fact | int] | _Auto, structural: list[Fact], s: Facts) -> list[Fact]:
    if given is AUTO:
        return structural
    given = list(given)
    negative = s.negatives_at(given)
    out = []
    for f in given:
        found = negative(f) if isinstance(f, int) else None
        if isinstance(f, Fact):
            out.append(f)
        elif found is not None:
            out.append(found)
        else:
            raise InvalidArgument("negative_facts", f"{f!r} is neither a Fact nor the position of a negative fact")
    return sorted(set(out), key=lambda x: x.pos)


def _items(given: Iterable[Item | str] | _Auto, structural: list[Item], field: str = "unresolved") -> list[Item]:
    if given is AUTO:
        return structural
    by_id = {i.id: i for i in structural}
    out = []
    what = "an open item" if field == "unresolved" else "an item closed in the span"
    for i in given:
        if isinstance(i, Item):
            out.append(i)
        elif isinstance(i, str) and i in by_id:
            out.append(by_id[i])
        else:
            raise InvalidArgument(field, f"{i!r} is neither an Item nor the id of {what}")
    return sorted(set(out), key=lambda x: (x.pos, x.kind, x.id))


def _extract(event: ev.Event, path: str) -> ev.JSON:
    """Return field ``path`` (``value``, ``args.sql``, ``output.rows[0]``) of ``event``."""
    value: object = event
    for part in path.replace("[", ".[").split("."):
        if part.startswith("[") and part.endswith("]") and isinstance(value, list):
            value = value[int(part[1:-1])]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, msgspec.Struct) and part in value.__struct_fields__:
            value = getattr(value, part)
        else:
            raise KeyError(path)
    return msgspec.to_builtins(value)


def excerpt(session: Session, pos: int, path: str) -> Excerpt:
    """Return field ``path`` of the event at ``pos`` as an excerpt.

    Raises:
        InvalidArgument: no such field.
    """
    try:
        value = _extract(session.read(pos).event, path)
    except (KeyError, IndexError, ValueError) as exc:
        raise InvalidArgument("keep", f"event at pos {pos} has no field {path!r}") from exc
    return Excerpt(pos, path, value)


def _kept(session: Session, keep: Iterable[str | tuple[int, str]], s: Facts, stop: int) -> list[Excerpt]:
    out = []
    for k in keep:
        if isinstance(k, str):
            found = s.latest_binding(k, stop)
            if found is None:
                raise InvalidArgument("keep", f"no binding {k!r} before pos {stop}")
            out.append(Excerpt(found[0], "value", s.binding(found[0]).value))
        elif isinstance(k, tuple) and len(k) == 2:
            out.append(excerpt(session, k[0], k[1]))
        else:
            raise InvalidArgument("keep", f"want a binding key or (pos, path), got {k!r}")
    return out


def _keys_of(kept: Iterable[Excerpt], s: Facts) -> set[str]:
    """Return the binding keys whose value an excerpt keeps."""
    return s.keys_at({e.pos for e in kept if e.path == "value"})


def _dedupe(kept: Iterable[Excerpt]) -> list[Excerpt]:
    # Excerpt values may be lists or dicts (unhashable): dedupe by where they come from.
    return sorted({(e.pos, e.path): e for e in kept}.values(), key=lambda e: (e.pos, e.path))


def kept_keys(node: ev.Summary | Node, s: Structure) -> set[str]:
    """Return the binding keys a node keeps verbatim or spilled."""
    return FullFacts(s).keys_at({e.pos for e in node.kept if e.path == "value"}) | {sp.key for sp in node.spills}


def _unhex(text: str) -> bytes | None:
    # A malformed digest certifies nothing: restoration then falls back to the span root.
    try:
        return bytes.fromhex(text)
    except ValueError:
        return None


#: Separates a span's content digest from every other BLAKE3 input in the store.
CONTENT_TAG = b"compactstore/span-content/v1\x00"


def content_digest(bodies: Sequence[bytes]) -> bytes:
    """Return the content digest of a span: one BLAKE3 over its bodies, in order.

    The input is ``CONTENT_TAG``, the bodies back to back, then each body's length and
    their number (8-byte big-endian integers). The lengths make the encoding injective,
    so a missing, extra, reordered or altered body changes the digest; the bodies go
    in as one buffer, which BLAKE3 hashes several chunks at a time (a body at a time
    it could not), and the lengths after them, so a long span can be streamed.
    """
    return content_digest_of([bodies])


def content_digest_of(chunks: Iterable[Sequence[bytes]]) -> bytes:
    """Return :func:`content_digest` of the bodies of ``chunks`` taken in order, streaming."""
    h = blake3(CONTENT_TAG)
    lengths: list[int] = []
    for chunk in chunks:
        h.update(b"".join(chunk))
        lengths.extend(map(len, chunk))
    n = len(lengths)
    h.update(struct.pack(f">{n}QQ", *lengths, n))
    return h.digest()


#: Rows per query when a span is streamed (memory stays flat however long the span).
_CHUNK = 2048


def _span_rows(session: Session, start: int, stop: int) -> Iterator[list[Row]]:
    """Yield the stored rows of ``[start, stop)`` in chunks; raise if a position is missing or out of order."""
    nxt = start
    for chunk in chunked(session.store.backend.rows(session._require_sid(), start, stop, _CHUNK), _CHUNK):
        for row in chunk:
            if row.pos != nxt:
                raise IntegrityError(f"position {nxt} is missing", session=session.name, pos=nxt)
            nxt += 1
        yield chunk
    if nxt != stop:
        raise IntegrityError(f"position {nxt} is missing", session=session.name, pos=nxt)


class StoredSpan(NamedTuple):
    """What one streamed read of a stored span gives (see :func:`stored_span`)."""

    #: :func:`content_digest` of the bodies read, an erased one counted as empty
    digest: bytes
    #: the first position missing or out of order, None when ``[start, stop)`` is whole
    missing: int | None
    #: whether a body in the span was erased by a redaction
    redacted: bool
    #: whether every body matched its stored leaf (False unless asked, or with one erased)
    matched: bool


def stored_span(backend: Backend, session_id: int, start: int, stop: int, *, match_leaves: bool = False,
                each: Callable[[list[Row]], object] | None = None) -> StoredSpan:
    """Read ``[start, stop)`` of a session once, in chunks, and digest its bodies.

    What a node's content digest is made from when it is written, and checked against by
    ``verify()``; memory stays flat however long the span. ``match_leaves``: also hash
    each body and compare it with its stored leaf. ``each``: called with every chunk of
    rows as it is read.
    """
    nxt, missing, redacted, matched = start, None, False, match_leaves

    def bodies() -> Iterator[list[bytes]]:
        nonlocal nxt, missing, redacted, matched
        for chunk in chunked(backend.rows(session_id, start, stop, _CHUNK), _CHUNK):
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
    return StoredSpan(digest, missing, redacted, matched and not redacted)


def _read_span(session: Session, start: int, stop: int, records: bool) -> tuple[StoredSpan, list[Record]]:
    """Read ``[start, stop)`` once: its content digest, each body checked against its leaf, and its records if asked."""
    backend, sid = session.store.backend, session._require_sid()
    out: list[Record] = []
    erased: dict[int, int] | None = None

    def keep(chunk: list[Row]) -> None:
        nonlocal erased
        if erased is None and any(r.body is None for r in chunk):
            erased = backend.redactions(sid)  # once for the span, not per erased row
        out.extend(session._record(r, erased) for r in chunk)

    return stored_span(backend, sid, start, stop, match_leaves=True, each=keep if records else None), out


class Vouch(NamedTuple):
    """What a compaction's one read of its span found, handed with its node to the commit.

    Each body of ``[start, stop)`` matched its stored leaf, read under the session's lock
    at head ``first``; ``digest`` is their content digest and ``span_root`` the stored
    tree's root of the span. That is what :func:`check_content_digest` would find reading
    them again for a node written at ``first`` (the log before a head never changes: a
    redaction appends), so it takes that node without the second read.
    """

    first: int
    start: int
    stop: int
    digest: str
    span_root: str


def _content(session: Session, size: int, start: int, stop: int, span_root: bytes,
             got: StoredSpan) -> tuple[str | None, Vouch | None]:
    """Return the content digest (hex) a node over ``[start, stop)`` records, from the span read under the lock.

    With it, the :class:`Vouch` its commit takes instead of a second read, when every
    body matched its leaf.
    """
    if got.missing is not None:
        raise IntegrityError(f"position {got.missing} is missing", session=session.name, pos=got.missing)
    if got.redacted:
        return None, None  # an erased body can never be certified again
    digest = got.digest.hex()
    return digest, Vouch(size, start, stop, digest, span_root.hex()) if got.matched else None


def check_content_digest(session: Session, node: ev.Summary, pos: int, pending: Sequence[Row],
                         vouch: Vouch | None = None) -> None:
    """Refuse a node at ``pos`` whose content digest is not that of its span's bodies.

    A node is trusted with its content digest only because nothing else can enter the
    log: each body it digests must match its leaf, the leaves must give the span root
    it records, and the bodies must be the stored ones, or those of ``pending`` (the
    rows of the same batch before it). Then a restoration that proves the node's leaf
    in a sealed head and matches the digest has the very bodies the tree holds,
    without rehashing the tree. A ``vouch`` from the compaction that built the node
    under this lock stands for reading the span again when it names this node and head.

    Raises:
        InvalidEvent: naming ``content_digest`` or ``span_root``; nothing is written.
    """
    start, stop = node.start, node.stop
    if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start < stop <= pos):
        raise InvalidEvent("content_digest", f"span [{start}, {stop}) is not a non-empty span before pos {pos}")
    first = pending[0].pos if pending else pos
    if stop <= first and vouch == Vouch(first, start, stop, node.content_digest or "", node.span_root):
        return  # its span was read and digested under this lock, at this head
    leaves: list[bytes] = []  # kept only when part of the span is in this batch, with no stored roots yet

    def bodies() -> Iterator[list[bytes]]:
        try:
            stored = _span_rows(session, start, min(stop, first)) if start < first else iter(())
            for chunk in [*stored, list(pending[max(0, start - first) : max(0, stop - first)])]:
                bodies = [r.body for r in chunk]
                for r in chunk:
                    if r.body is None:
                        raise InvalidEvent("content_digest", f"pos {r.pos} in [{start}, {stop}) is redacted: nothing to digest")
                got = merkle.leaf_hashes(bodies)  # type: ignore[arg-type]  # none is None: checked above
                for r, leaf in zip(chunk, got):
                    if leaf != r.leaf:
                        raise InvalidEvent("content_digest", f"the body at pos {r.pos} does not match its leaf")
                if stop > first:
                    leaves.extend(got)
                yield bodies  # type: ignore[misc]
        except IntegrityError as exc:
            raise InvalidEvent("content_digest", exc.args[0]) from exc

    want = content_digest_of(bodies()).hex()
    if len(leaves) not in (0, stop - start):
        raise InvalidEvent("content_digest", f"[{start}, {stop}) is not complete before pos {pos}")
    root = merkle.span_root_of_leaves(leaves, start, stop, first=start) if stop > first else session.span_root(start, stop)
    if root.hex() != node.span_root:
        raise InvalidEvent("span_root", f"[{start}, {stop}) gives {root.hex()[:16]}…, the node says {node.span_root[:16]}…")
    if node.content_digest != want:
        got = node.content_digest or ""
        raise InvalidEvent("content_digest", f"got {got[:16]}…, the bodies of [{start}, {stop}) give {want[:16]}…")


def value_digest(value: ev.JSON) -> str:
    """Return the hex BLAKE3 digest of a value's canonical JSON."""
    return blake3(ev.encode_json(value).encode()).hexdigest()


# --- the gate ----------------------------------------------------------------------


def risks(s: Facts, start: int, stop: int, kept: set[str] = frozenset()) -> list[Risk]:  # type: ignore[assignment]
    """Return each open obligation that needs a non-regenerable binding last bound in ``[start, stop)``."""
    out = []
    latest: dict[str, tuple[int, bool] | None] = {}
    for opos, name, needs in s.open_obligations():
        for key in needs:
            if key not in latest:
                latest[key] = s.latest_binding(key, s.size)
            found = latest[key]
            if found is None or key in kept:
                continue
            bpos, regenerable = found
            if start <= bpos < stop and not regenerable:
                out.append(Risk(name, opos, key, bpos))
    return out


def _risk_error(found: list[Risk], start: int, stop: int) -> CompactionInvariantError:
    lines = "; ".join(str(r) for r in found)
    return CompactionInvariantError(
        f"compacting [{start}, {stop}) would lose what open obligations need: {lines}",
        risks=found,
        hint='pass on_risk="preserve" to keep these bindings verbatim, or on_risk="spill" to spill them',
    )


# --- compaction -------------------------------------------------------------------


def _structure(session: Session, stop: int) -> Structure:
    return build((r.pos, r.event) for r in session.scan(0, stop))


class Facts(Protocol):
    """What compaction reads of a session's structure at checkpoint ``size``.

    Two implementations give the same answers for every session (a property test holds
    them side by side): :class:`FullFacts`, a pass over every event, and
    :class:`IndexedFacts`, which reads the structural index, the summary nodes and the
    few events it names, in a cost bounded by the span and what the index returns.
    """

    size: int

    def first_overlap(self, tier: int, start: int, stop: int) -> tuple[int, ev.Summary] | None:
        """Return the first node of ``tier`` (by position) whose span overlaps ``[start, stop)``."""
        ...

    def negatives_in(self, start: int, stop: int) -> list[Fact]:
        """Return :meth:`Structure.negatives_in`."""
        ...

    def negatives_at(self, positions: Sequence[object]) -> Callable[[object], Fact | None]:
        """Return a lookup of the negative fact at each of ``positions`` (None: not one)."""
        ...

    def unresolved_at(self, start: int, stop: int) -> list[Item]:
        """Return :meth:`Structure.unresolved_at`."""
        ...

    def resolved_in(self, start: int, stop: int) -> list[Item]:
        """Return :meth:`Structure.resolved_in`."""
        ...

    def resolved_before(self, items: Sequence[Item], stop: int) -> set[Item]:
        """Return those of ``items`` that :meth:`Structure.resolved_before` says are closed before ``stop``."""
        ...

    def latest_binding(self, key: str, before: int) -> tuple[int, bool] | None:
        """Return ``(position, regenerable)`` of the last binding of ``key`` before ``before``."""
        ...

    def binding(self, pos: int) -> ev.Binding:
        """Return the binding at ``pos`` (one a query above named)."""
        ...

    def keys_at(self, positions: Iterable[object]) -> set[str]:
        """Return the keys of the bindings at ``positions``."""
        ...

    def keys_in(self, start: int, stop: int) -> set[str]:
        """Return the keys bound at a position in ``[start, stop)``."""
        ...

    def open_obligations(self) -> list[tuple[int, str, list[str]]]:
        """Return ``(position, name, needs)`` of each obligation open at ``size``, by position."""
        ...


class FullFacts:
    """:class:`Facts` from one pass over the events (the reference, and the path of a session with redactions)."""

    def __init__(self, s: Structure) -> None:
        self.s = s
        self.size = s.size
        self._bound: dict[int, ev.Binding] | None = None

    def first_overlap(self, tier: int, start: int, stop: int) -> tuple[int, ev.Summary] | None:
        for pos, node in sorted(self.s.nodes.items()):
            if node.tier == tier and max(start, node.start) < min(stop, node.stop):
                return pos, node
        return None

    def negatives_in(self, start: int, stop: int) -> list[Fact]:
        return self.s.negatives_in(start, stop)

    def negatives_at(self, positions: Sequence[object]) -> Callable[[object], Fact | None]:
        return self.s.negatives.get  # type: ignore[return-value]

    def unresolved_at(self, start: int, stop: int) -> list[Item]:
        return self.s.unresolved_at(start, stop)

    def resolved_in(self, start: int, stop: int) -> list[Item]:
        return self.s.resolved_in(start, stop)

    def resolved_before(self, items: Sequence[Item], stop: int) -> set[Item]:
        return {i for i in items if self.s.resolved_before(i, stop)}

    def latest_binding(self, key: str, before: int) -> tuple[int, bool] | None:
        found = self.s.latest_binding(key, before)
        return None if found is None else (found[0], found[1].regenerable)

    def binding(self, pos: int) -> ev.Binding:
        if self._bound is None:
            self._bound = {p: b for bound in self.s.bindings.values() for p, b in bound}
        return self._bound[pos]

    def keys_at(self, positions: Iterable[object]) -> set[str]:
        at = set(positions)
        return {key for key, bound in self.s.bindings.items() if any(p in at for p, _ in bound)}

    def keys_in(self, start: int, stop: int) -> set[str]:
        return {k for k, bound in self.s.bindings.items() if any(start <= p < stop for p, _ in bound)}

    def open_obligations(self) -> list[tuple[int, str, list[str]]]:
        return [(pos, o.name, list(o.needs)) for pos, o in self.s.open_obligations()]


def _positions(values: Iterable[object], size: int) -> list[int]:
    """Return the positions among ``values`` (ints, bools counted as ints, as a dict lookup does) before ``size``."""
    return sorted({int(v) for v in values if isinstance(v, int) and 0 <= v < size})


class IndexedFacts:
    """:class:`Facts` from the structural index (see :class:`compactstore.index.Index`) and a few reads.

    The summary nodes come from one query on the events' kind (nodes give no index
    rows); the value of a binding from its event. Everything else is index rows: the
    open items at two boundaries, the negative and binding rows of the span, the
    negative rows it caused before it, one probe per binding key.
    """

    def __init__(self, session: Session, index: Index, size: int) -> None:
        self.session, self.index, self.size = session, index, size
        self._nodes: list[tuple[int, ev.Summary]] | None = None
        self._open: dict[int, dict[int, str]] = {}

    def _open_at(self, at: int) -> dict[int, str]:
        if at not in self._open:
            self._open[at] = self.index.open_at(at)
        return self._open[at]

    def first_overlap(self, tier: int, start: int, stop: int) -> tuple[int, ev.Summary] | None:
        if self._nodes is None:
            self._nodes = _nodes(self.session.store, self.index, self.size)
        for pos, node in self._nodes:
            if node.tier == tier and max(start, node.start) < min(stop, node.stop):
                return pos, node
        return None

    def negatives_in(self, start: int, stop: int) -> list[Fact]:
        # A position made negative only at or after the boundary was not negative there.
        return [Fact(r.pos, r.key, r.text) for r in self.index.negatives(start, stop) if r.num < stop]  # type: ignore[arg-type]

    def negatives_at(self, positions: Sequence[object]) -> Callable[[object], Fact | None]:
        rows = self.index.negatives_at(_positions(positions, self.size), self.size)
        found = {p: Fact(r.pos, r.key, r.text) for p, r in rows.items()}  # type: ignore[arg-type]
        return lambda p: found.get(int(p)) if isinstance(p, int) and 0 <= p < self.size else None

    def unresolved_at(self, start: int, stop: int) -> list[Item]:
        return [_item(p, name) for p, name in sorted(self._open_at(stop).items()) if start <= p]

    def resolved_in(self, start: int, stop: int) -> list[Item]:
        # Open at the start and no longer at the stop: closed inside the span (a close
        # closes every earlier open of its item).
        at_stop = self._open_at(stop)
        got = [_item(p, name) for p, name in self._open_at(start).items() if p not in at_stop]
        return sorted(got, key=lambda i: (i.pos, i.kind, i.id))

    def resolved_before(self, items: Sequence[Item], stop: int) -> set[Item]:
        if not items:
            return set()
        closes: dict[tuple[str, str], list[int]] = {}
        for r in self.index.closes(max(0, min(i.pos for i in items) + 1), stop):
            closes.setdefault(split_item(r.key), []).append(r.pos)
        return {i for i in items if any(i.pos < c < stop for c in closes.get((i.kind, i.id), []))}

    def latest_binding(self, key: str, before: int) -> tuple[int, bool] | None:
        row = self.index.latest_binding(key, before)
        return None if row is None else (row.pos, bool(row.num))

    def binding(self, pos: int) -> ev.Binding:
        event = self.session.read(pos).event
        assert isinstance(event, ev.Binding), (pos, event.kind)  # the index named it
        return event

    def keys_at(self, positions: Iterable[object]) -> set[str]:
        return {r.key for r in self.index.bindings_at(_positions(positions, self.size))}

    def keys_in(self, start: int, stop: int) -> set[str]:
        return {r.key for r in self.index.bindings_in(start, stop)}

    def open_obligations(self) -> list[tuple[int, str, list[str]]]:
        obligations = {p: _item(p, name).id for p, name in self._open_at(self.size).items()
                       if split_item(name)[0] == "obligation"}
        needs = self.index.needs(sorted(obligations))
        return [(p, name, needs.get(p, [])) for p, name in sorted(obligations.items())]


#: The summary nodes read so far of each session of a store: ``sid -> (read up to, nodes)``.
#: The log before a position never changes, so each read starts where the last stopped
#: and a compaction reads only the nodes appended since (after one read of the session).
_NODES: weakref.WeakKeyDictionary[Any, dict[int, tuple[int, list[tuple[int, ev.Summary]]]]] = (
    weakref.WeakKeyDictionary()
)
_NODES_LOCK = threading.Lock()


def _nodes(store: object, index: Index, size: int) -> list[tuple[int, ev.Summary]]:
    """Return ``(position, node)`` of the session's summary nodes before ``size``, by position."""
    sid = index.sql.sid
    with _NODES_LOCK:
        upto, known = _NODES.setdefault(store, {}).get(sid, (0, []))
    if upto < size:
        known = known + index.nodes(upto, size)
        with _NODES_LOCK:
            per = _NODES.setdefault(store, {})
            if per.get(sid, (0, []))[0] < size:
                per[sid] = (size, known)
    return [(p, n) for p, n in known if p < size]


def _item(pos: int, name: str) -> Item:
    kind, ident = split_item(name)
    return Item(pos, kind, ident)  # type: ignore[arg-type]


def facts_at(session: Session, size: int) -> Facts:
    """Return the structure of the session at checkpoint ``size``: from the index when it answers, else a full pass."""
    index = Index.of(session, size)
    if index is None:
        return FullFacts(_structure(session, size))
    return IndexedFacts(session, index, size)


def _as_list(field: str, value: object) -> list[Any]:
    """Return ``value`` as a list; refuse a str (it would be split into characters) or a non-iterable."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidArgument(field, f"want a list, got {type(value).__name__}")
    return list(value)


def _check_span(start: int, stop: int, size: int) -> None:
    if not isinstance(start, int) or not isinstance(stop, int) or not 0 <= start < stop <= size:
        raise InvalidArgument("span", f"[{start}, {stop}) is not a non-empty span of the session's {size} positions")


def _overlap(s: Facts, tier: int, start: int, stop: int) -> None:
    found = s.first_overlap(tier, start, stop)
    if found is not None:
        pos, node = found
        raise InvalidArgument(
            "span", f"[{start}, {stop}) overlaps the L{tier} node at pos {pos} covering [{node.start}, {node.stop})"
        )


def _check_lossless(
    s: Facts, start: int, stop: int, facts: list[Fact], items: list[Item], keys: set[str], done: list[Item]
) -> None:
    missing = [k for k in s.keys_in(start, stop) if k not in keys]
    missing_facts = [f.pos for f in s.negatives_in(start, stop) if f.pos not in {x.pos for x in facts}]
    missing_items = [i.id for i in s.unresolved_at(start, stop) if i not in items]
    missing_items += [i.id for i in s.resolved_in(start, stop) if i not in done]
    problems = []
    if missing:
        problems.append(f"bindings not kept: {sorted(missing)}")
    if missing_facts:
        problems.append(f"negative facts not retained at pos {missing_facts}")
    if missing_items:
        problems.append(f"open or resolved items not listed: {missing_items}")
    if problems:
        raise CompactionInvariantError(f"[{start}, {stop}) cannot be LOSSLESS: " + "; ".join(problems))


def compact(
    session: Session,
    start: int,
    stop: int,
    *,
    summary: str | None = None,
    summarizer: Summarizer | None = None,
    loss: LossClass = LossClass.LOSSY_GIST,
    negative_facts: Iterable[Fact | int] | _Auto = AUTO,
    unresolved: Iterable[Item | str] | _Auto = AUTO,
    keep: Iterable[str | tuple[int, str]] = (),
    on_risk: OnRisk = "refuse",
    resolved: Iterable[Item | str] | _Auto = AUTO,
) -> Node:
    """Append an L1 node over raw positions ``[start, stop)``; see :meth:`Session.compact`."""
    if on_risk not in ("refuse", "preserve", "spill"):
        raise InvalidArgument("on_risk", f'want "refuse", "preserve" or "spill", got {on_risk!r}')
    loss = _loss(loss)
    keep = _as_list("keep", keep)
    if negative_facts is not AUTO:
        negative_facts = _as_list("negative_facts", negative_facts)
    if unresolved is not AUTO:
        unresolved = _as_list("unresolved", unresolved)
    if resolved is not AUTO:
        resolved = _as_list("resolved", resolved)
    if summary is not None and not isinstance(summary, str):
        raise InvalidArgument("summary", f"must be str, got {type(summary).__name__}")

    def build_events(size: int) -> list[tuple[ev.Event, str | None, Vouch | None]]:
        _check_span(start, stop, size)
        s = facts_at(session, size)
        _overlap(s, 1, start, stop)
        facts = _facts(negative_facts, s.negatives_in(start, stop), s)
        items = _items(unresolved, s.unresolved_at(start, stop))
        done = _items(resolved, s.resolved_in(start, stop), "resolved")
        kept = _kept(session, keep, s, stop)
        keys = _keys_of(kept, s)
        at_risk = risks(s, start, stop, keys)
        spill_events: list[ev.Spill] = []
        refs: list[SpillRef] = []
        contract = None
        if at_risk and loss is not LossClass.LOSSLESS:
            if on_risk == "refuse":
                raise _risk_error(at_risk, start, stop)
            needed = sorted({(r.key, r.binding_pos) for r in at_risk})
            names = sorted({r.obligation for r in at_risk})
            if on_risk == "preserve":
                kept += [Excerpt(p, "value", s.binding(p).value) for k, p in needed]
                contract = f"kept verbatim for obligations {names}: {[k for k, _ in needed]}"
            else:
                for i, (k, p) in enumerate(needed):
                    value = s.binding(p).value
                    d = value_digest(value)
                    spill_events.append(ev.Spill(key=k, value=value, source=p, digest=d))
                    refs.append(SpillRef(f"spill:{size + i}", k, p, d))
                contract = f"spilled for obligations {names}: {[k for k, _ in needed]}"
            keys |= {k for k, _ in needed}
        kept = _dedupe(kept)
        if loss is LossClass.LOSSLESS:
            _check_lossless(s, start, stop, facts, items, keys, done)
        # One read of the span: the summarizer's records, the content digest, each body against its leaf.
        text = summary
        got, records = _read_span(session, start, stop, records=text is None)
        if text is None:
            text = (summarizer or extractive)(records)
            if not isinstance(text, str):
                raise InvalidArgument("summarizer", f"must return str, got {type(text).__name__}")
        root = session.span_root(start, stop)
        content, vouch = _content(session, size, start, stop, root, got)
        node = ev.Summary(
            tier=1, start=start, stop=stop, span_root=root.hex(), summary=text,
            loss=loss, negative_facts=facts, unresolved=items, resolved=done, kept=kept, spills=refs, contract=contract,
            content_digest=content,
        )
        return [*((e, None, None) for e in spill_events), (node, None, vouch)]

    return Node.from_record(session._commit(build_events)[-1])


def _loss(loss: object) -> LossClass:
    try:
        return LossClass(loss)
    except ValueError:
        raise InvalidArgument("loss", f"want one of {[c.value for c in LossClass]}, got {loss!r}") from None


def digest(
    session: Session,
    nodes: Sequence[Node | int],
    *,
    summary: str | None = None,
    summarizer: Summarizer | None = None,
    loss: LossClass | None = None,
    negative_facts: Iterable[Fact | int] | _Auto = AUTO,
    unresolved: Iterable[Item | str] | _Auto = AUTO,
    resolved: Iterable[Item | str] | _Auto = AUTO,
) -> Node:
    """Append an L2 node over contiguous L1 nodes; see :meth:`Session.digest`."""
    if resolved is not AUTO:
        resolved = _as_list("resolved", resolved)
    positions = [n.pos if isinstance(n, Node) else n for n in _as_list("nodes", nodes)]
    if not positions or not all(isinstance(p, int) for p in positions):
        raise InvalidArgument("nodes", "want one or more L1 nodes (or their positions)")
    children = sorted(
        (Node.from_record(session.read(p)) for p in positions), key=lambda n: n.start
    )
    for c in children:
        if c.tier != 1:
            raise InvalidArgument("nodes", f"node at pos {c.pos} is L{c.tier}; an L2 digests L1 nodes")
    for a, b in zip(children, children[1:]):
        if a.stop != b.start:
            raise InvalidArgument("nodes", f"nodes at pos {a.pos} and {b.pos} are not contiguous: [{a.start}, {a.stop}) then [{b.start}, {b.stop})")
    start, stop = children[0].start, children[-1].stop
    floor = max((c.loss for c in children), key=_LOSS_ORDER.__getitem__)
    wanted = floor if loss is None else _loss(loss)
    if _LOSS_ORDER[wanted] < _LOSS_ORDER[floor]:
        raise CompactionInvariantError(f"an L2 node cannot be {wanted.value} over children that are {floor.value}")

    def build_events(size: int) -> list[tuple[ev.Event, str | None, Vouch | None]]:
        s = facts_at(session, size)
        _overlap(s, 2, start, stop)
        # The children's facts, and what became negative inside the span after they were
        # written (an event of the first child superseded by one of the last).
        carried = sorted(
            {f.pos: f for f in [*s.negatives_in(start, stop), *(f for c in children for f in c.negative_facts)]}.values(),
            key=lambda f: f.pos,
        )
        listed = sorted({i for c in children for i in c.unresolved}, key=lambda i: (i.pos, i.kind, i.id))
        closed = s.resolved_before(listed, stop)
        still_open = sorted(
            {i for i in listed if i not in closed},
            key=lambda i: (i.pos, i.kind, i.id),
        )
        facts = _facts(negative_facts, carried, s)
        items = _items(unresolved, still_open)
        # Over the whole span, not the children's lists: an item a later child resolved may
        # have been opened in an earlier one, and is then neither open nor hidden.
        done = _items(resolved, s.resolved_in(start, stop), "resolved")
        text = summary
        if text is None:
            text = (summarizer or extractive)([session.read(c.pos) for c in children])
        root = session.span_root(start, stop)
        content, vouch = _content(session, size, start, stop, root, _read_span(session, start, stop, records=False)[0])
        node = ev.Summary(
            tier=2, start=start, stop=stop, span_root=root.hex(), summary=text,
            loss=wanted, children=[c.pos for c in children], negative_facts=facts, unresolved=items, resolved=done,
            kept=_dedupe(e for c in children for e in c.kept),
            spills=sorted({r for c in children for r in c.spills}, key=lambda r: r.handle),
            contract="; ".join(c.contract for c in children if c.contract) or None,
            content_digest=content,
        )
        return [(node, None, vouch)]

    return Node.from_record(session._commit(build_events)[-1])


def assert_compaction_safe(session: Session, start: int, stop: int, keep: Iterable[str] = ()) -> None:
    """Raise CompactionInvariantError listing each obligation and binding a lossy compaction would lose."""
    size = session.size
    _check_span(start, stop, size)
    found = risks(facts_at(session, size), start, stop, set(keep))
    if found:
        raise _risk_error(found, start, stop)


def spilled(session: Session, handle: str) -> ev.JSON:
    """Return the exact value spilled under ``handle``, checked against its leaf, tree and digest."""
    prefix = "spill:"
    if not isinstance(handle, str) or not handle.startswith(prefix) or not handle[len(prefix):].isdigit():
        raise InvalidArgument("handle", f"want 'spill:<pos>', got {handle!r}")
    pos = int(handle[len(prefix):])
    if pos >= 2**63:
        raise InvalidArgument("handle", f"{handle!r} names no position")
    record = session.read(pos)
    spill = record.event
    if not isinstance(spill, ev.Spill):
        raise InvalidArgument("handle", f"{handle} names a {record.kind!r} event, not a spill")
    head = session.head()
    if merkle.leaf_hash(record.body) != record.leaf or not merkle.verify_inclusion(
        record.body, pos, head.size, session.inclusion_proof(pos, head.size), head.root
    ):
        raise IntegrityError(f"spill {handle} does not match the tree", session=session.name, pos=pos)
    if value_digest(spill.value) != spill.digest:
        raise IntegrityError(f"spill {handle}: value does not match its digest", session=session.name, pos=pos)
    return spill.value


def audit(session: Session) -> list[Finding]:
    """Return every binding destroyed by a lossy compaction and needed by a later step."""
    s = _structure(session, session.size)
    findings: list[Finding] = []
    seen: set[tuple[int, str]] = set()
    for pos, key, via in sorted(s.needs):
        bound = [(p, b) for p, b in s.bindings.get(key, []) if p < pos]
        if not bound or bound[-1][1].regenerable:
            continue
        # Every source of the binding must lie in a lossy span compacted before this step
        # by a node that kept nothing of it; one raw or kept source keeps it reachable.
        swallowed_by = None
        for bpos, _ in bound:
            covering = [
                (npos, n) for npos, n in s.nodes.items() if npos < pos and n.start <= bpos < n.stop
            ]
            if not covering or any(key in kept_keys(n, s) or n.loss is LossClass.LOSSLESS for _, n in covering):
                swallowed_by = None
                break
            swallowed_by = min(npos for npos, _ in covering)
        if swallowed_by is not None and (swallowed_by, key) not in seen:
            seen.add((swallowed_by, key))
            findings.append(Finding(swallowed_by, key, bound[-1][0], pos, pos - swallowed_by, via))
    return findings
