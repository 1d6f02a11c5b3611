"""Recovery markers and the three conditions checked when one is emitted.

A marker is a pointer plus a promise: the pointer names a summary node, the promise is
that the node holds everything needed to go on without re-reading the raw log. The
promise holds only if, for the node the agent will load:

1. closure: every tool call, handle or obligation opened in its span and still open
   at its boundary is listed there as UNRESOLVED, and every one opened before its span
   and closed inside it is listed as RESOLVED (the context shows its opening raw, and
   only the node can say it was closed);
2. negative-fact retention: every failed, rejected or superseded event of its span
   is retained in it, and so is every earlier event its span supersedes (the context
   shows that event raw, and only the node can say it is no longer current);
3. anchoring: every node on its path carries the span root the log gives for its
   span, its excerpts and spills match the log, and every non-regenerable binding an
   open obligation needs from its span is kept verbatim or spilled.

The check is a function of the events and leaf hashes ``[0, size)``, so emission and
resume run the very same code over the very same inputs. It has two paths that give the
same violations and path for every session (a property test holds them side by side):
:func:`check`, one pass over the events, and :func:`check_indexed`, which reads the few
events it looks at, span roots from the stored tree and the rest from the structural
index (:mod:`compactstore.index`), in O(log n) plus what the node lists. The indexed path
is taken whenever the index answers for the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Literal

import msgspec

from . import events as ev
from . import merkle
from .compaction import _extract, kept_keys, value_digest
from .errors import IntegrityError, InvalidArgument, MarkerInvalid
from .index import Index
from .seal import head_mac
from .structure import Structure, build, split_item

if TYPE_CHECKING:
    from .store import Record, Session

CONDITIONS = ("closure", "negative_facts", "anchoring")
Condition = Literal["closure", "negative_facts", "anchoring"]


class Violation(msgspec.Struct, frozen=True, order=True):
    """One failed condition: which, at which position, about which item."""

    condition: Condition
    pos: int
    item: str

    def __str__(self) -> str:
        return f"{self.condition} at pos {self.pos}: {self.item}"


class Marker(msgspec.Struct, frozen=True):
    """A recovery marker as stored at position ``pos`` of its session.

    Attributes:
        node: the summary node it points at (None: a raw-checkpoint marker).
        size, root: the raw checkpoint it names; ``mac`` when the store is keyed.
        conditions: what was certified at emission.
        path: the node positions whose digests were checked.
    """

    session: str
    pos: int
    node: int | None
    size: int
    root: bytes
    mac: bytes | None
    conditions: list[str]
    path: list[int]
    leaf: bytes

    @classmethod
    def from_record(cls, record: Record) -> Marker:
        """Return the marker stored in ``record``.

        Raises:
            InvalidArgument: the record is not a marker.
        """
        m = record.event
        if not isinstance(m, ev.RecoveryMarker):
            raise InvalidArgument("marker", f"pos {record.pos} is a {record.kind!r} event, not a marker")
        return cls(
            record.session, record.pos, m.node, m.size, _unhex(m.root), _unhex(m.mac) if m.mac else None,
            list(m.conditions), list(m.path), record.leaf,
        )


def _unhex(text: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        return b""


#: Reads the event at a position (None when there is none before the checkpoint).
Get = Callable[[int], "ev.Event | None"]
#: Returns the hex root the log gives for positions ``[start, stop)``.
SpanRoot = Callable[[int, int], str]


def check(
    events: Sequence[ev.Event], leaves: Sequence[bytes], node_pos: int, structure: Structure | None = None
) -> tuple[list[Violation], list[int]]:
    """Check the three conditions for resuming from ``node_pos`` at checkpoint ``len(events)``.

    The full path: a pass over every event before the checkpoint. Returns the
    violations (sorted, empty when the marker may be emitted or trusted) and the
    positions of the nodes on the path.
    """
    size = len(events)
    found: list[Violation] = []
    top = events[node_pos] if 0 <= node_pos < size else None
    if not isinstance(top, ev.Summary):
        return [Violation("anchoring", node_pos, "not a summary node before the checkpoint")], []
    s = structure if structure is not None else build(enumerate(events))

    def get(pos: int) -> ev.Event | None:
        return events[pos] if 0 <= pos < size else None

    path = _check_path(get, lambda a, b: merkle.span_root_of_leaves(leaves, a, b).hex(), node_pos, found)
    listed = set(top.unresolved)
    for item in s.unresolved_at(top.start, top.stop):
        if item not in listed:
            found.append(_unlisted(item))
    _check_resolved(top, s.resolved_in(top.start, top.stop), found)
    retained = {f.pos for f in top.negative_facts}
    for fact in s.negatives_in(top.start, top.stop):
        if fact.pos not in retained:
            found.append(_dropped(fact.pos, fact.status, fact.text))
    kept = kept_keys(top, s)
    for opos, obligation in s.open_obligations():
        for key in obligation.needs:
            latest = s.latest_binding(key, size)
            if latest and top.start <= latest[0] < top.stop and not latest[1].regenerable and key not in kept:
                found.append(_unanchored(latest[0], key, obligation.name, opos))
    return sorted(set(found)), path


def check_indexed(
    get: Get, span_root: SpanRoot, index: Index, node_pos: int, size: int
) -> tuple[list[Violation], list[int]]:
    """Check the three conditions as :func:`check` does, from the structural index.

    ``get`` reads the few events the check looks at (the nodes on the path, their
    excerpts' and spills' sources), ``span_root`` gives the log's root of a span and
    ``index`` the structural facts, so the cost is O(log n) queries plus the size of
    what the node lists, whatever the length of its span. Gives exactly what
    :func:`check` gives over the events ``[0, size)``.
    """
    found: list[Violation] = []
    top = get(node_pos) if 0 <= node_pos < size else None
    if not isinstance(top, ev.Summary):
        return [Violation("anchoring", node_pos, "not a summary node before the checkpoint")], []
    path = _check_path(get, span_root, node_pos, found)
    listed = set(top.unresolved)
    at_stop = index.open_at(top.stop)
    for pos, name in sorted(at_stop.items()):
        kind, ident = split_item(name)
        item = ev.Item(pos, kind, ident)  # type: ignore[arg-type]
        if top.start <= pos and item not in listed:
            found.append(_unlisted(item))
    # An item open at the start and no longer open at the stop was closed inside the span
    # (a close closes every earlier open of its item): two snapshots, whatever the span's length.
    resolved = []
    for pos, name in sorted(index.open_at(top.start).items()):
        if pos not in at_stop:
            kind, ident = split_item(name)
            resolved.append(ev.Item(pos, kind, ident))  # type: ignore[arg-type]
    _check_resolved(top, resolved, found)
    retained = {f.pos for f in top.negative_facts}
    for row in index.negatives(top.start, top.stop):
        # A position made negative only at or after the boundary was not negative there.
        if row.num < top.stop and row.pos not in retained:
            found.append(_dropped(row.pos, row.key, row.text))
    at = {e.pos for e in top.kept if e.path == "value" and 0 <= e.pos < size}
    kept = {b.key for b in map(get, sorted(at)) if isinstance(b, ev.Binding)} | {sp.key for sp in top.spills}
    items = {p: split_item(name) for p, name in index.open_at(size).items()}
    obligations = {p: ident for p, (kind, ident) in items.items() if kind == "obligation"}
    needs = index.needs(sorted(obligations))
    for opos, name in sorted(obligations.items()):
        for key in needs.get(opos, []):
            latest = index.latest_binding(key, size)
            if latest and top.start <= latest.pos < top.stop and not latest.num and key not in kept:
                found.append(_unanchored(latest.pos, key, name, opos))
    return sorted(set(found)), path


def _check_resolved(top: ev.Summary, resolved: Iterable[ev.Item], found: list[Violation]) -> None:
    """Hold ``top.resolved`` to ``resolved``: the items opened before its span and closed inside it.

    A missing one looks still open in a resumed context; one listed that was not closed
    there would tell the agent something was done that was not.
    """
    listed, want = set(top.resolved), set(resolved)
    for item in sorted(want - listed, key=lambda i: (i.pos, i.kind, i.id)):
        found.append(Violation(
            "closure", item.pos, f"{item.kind} {item.id!r} is closed in the span but not listed as RESOLVED"
        ))
    for item in sorted(listed - want, key=lambda i: (i.pos, i.kind, i.id)):
        found.append(Violation(
            "closure", item.pos,
            f"{item.kind} {item.id!r} is listed as RESOLVED but was not opened before the span and closed in it",
        ))


def _unlisted(item: ev.Item) -> Violation:
    return Violation("closure", item.pos, f"{item.kind} {item.id!r} is open at the boundary but not listed as UNRESOLVED")


def _dropped(pos: int, status: str, text: str) -> Violation:
    return Violation("negative_facts", pos, f"{status} item dropped: {text}")


def _unanchored(pos: int, key: str, obligation: str, opos: int) -> Violation:
    return Violation(
        "anchoring", pos, f"binding {key!r} needed by open obligation {obligation!r} (pos {opos}) is neither kept nor spilled"
    )


def _check_path(get: Get, span_root: SpanRoot, node_pos: int, found: list[Violation]) -> list[int]:
    """Check every node from ``node_pos`` down through its children; return their positions."""
    path, stack = [], [node_pos]
    while stack:
        pos = stack.pop()
        node = get(pos)
        if not isinstance(node, ev.Summary):
            found.append(Violation("anchoring", pos, "path names a position that is not a summary node"))
            continue
        path.append(pos)
        if not 0 <= node.start < node.stop <= pos:
            found.append(Violation("anchoring", pos, f"span [{node.start}, {node.stop}) is not before the node"))
            continue
        root = span_root(node.start, node.stop)
        if node.span_root != root:
            found.append(Violation("anchoring", pos, f"span root of [{node.start}, {node.stop}) is {node.span_root[:16]}…, the log gives {root[:16]}…"))
        if node.tier == 2:
            _check_children(get, pos, node, found)
            stack.extend(c for c in node.children if c < pos)
        for e in node.kept:
            try:
                source = get(e.pos) if 0 <= e.pos < pos else None
                ok = source is not None and _extract(source, e.path) == e.value
            except (KeyError, IndexError, ValueError):
                ok = False
            if not ok:
                found.append(Violation("anchoring", e.pos, f"kept excerpt {e.path!r} does not match the log"))
        for ref in node.spills:
            if not _spill_matches(get, ref, pos):
                found.append(Violation("anchoring", ref.source, f"spill {ref.handle} of {ref.key!r} does not match the log"))
    return sorted(path)


def _check_children(get: Get, pos: int, node: ev.Summary, found: list[Violation]) -> None:
    kids = [get(c) if 0 <= c < pos else None for c in node.children]
    spans = [(k.start, k.stop) for k in kids if isinstance(k, ev.Summary) and k.tier == 1]
    contiguous = len(spans) == len(kids) > 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    if not contiguous or spans[0][0] != node.start or spans[-1][1] != node.stop:
        found.append(Violation("anchoring", pos, "children are not contiguous L1 nodes covering its span"))


def _spill_matches(get: Get, ref: ev.SpillRef, before: int) -> bool:
    try:
        at = int(ref.handle.split(":", 1)[1])
    except (IndexError, ValueError):
        return False
    spill = get(at) if 0 <= at < before else None
    source = get(ref.source) if 0 <= ref.source < before else None
    return (
        isinstance(spill, ev.Spill)
        and isinstance(source, ev.Binding)
        and spill.key == ref.key == source.key
        and spill.value == source.value
        and value_digest(spill.value) == spill.digest == ref.digest
    )


def _load(session: Session, size: int) -> tuple[list[ev.Event], list[bytes]]:
    events, leaves = [], []
    for r in session.scan(0, size):
        events.append(r.event)
        leaves.append(r.leaf)
    return events, leaves


class Reader:
    """Reads events of a session before a checkpoint one position at a time, each once.

    With ``verify``, each body read is re-hashed and compared with its stored leaf
    (:class:`IntegrityError` when it differs), and the re-computed leaves are kept in
    ``leaves`` so that the caller can hold them against a tree head.
    """

    def __init__(self, session: Session, size: int, *, verify: bool = False) -> None:
        self.session, self.size, self.verify = session, size, verify
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
        """Read the events at ``positions`` (those before the checkpoint and not read yet) in one query."""
        sid = self.session._sid()
        wanted = sorted({p for p in positions if 0 <= p < self.size and p not in self.events})
        if sid is None or not wanted:
            return
        for row in self.session.store.backend.rows_at(sid, wanted):
            self.add(self.session._record(row))

    def add(self, record: Record) -> None:
        """Take in a record read elsewhere (checking it like the ones read here)."""
        if self.verify:
            leaf = record.leaf if isinstance(record.event, ev.Redacted) else merkle.leaf_hash(record.body)
            if leaf != record.leaf:
                raise IntegrityError(
                    f"event at pos {record.pos} does not match its leaf", session=self.session.name, pos=record.pos
                )
            self.leaves[record.pos] = leaf
        self.events[record.pos] = record.event


def refused(node: int, violations: list[Violation]) -> MarkerInvalid:
    """Return the error that refuses a marker for ``node``, naming the first violations."""
    return MarkerInvalid(
        f"marker for node at pos {node} refused: " + "; ".join(str(v) for v in violations[:5])
        + (f"; and {len(violations) - 5} more" if len(violations) > 5 else ""),
        violations,
    )


def mark(session: Session, node: int) -> Marker:
    """Emit a marker for ``node`` after checking the three conditions; see :meth:`Session.mark`."""
    if not isinstance(node, int):
        raise InvalidArgument("node", f"want a Node or its position, got {type(node).__name__}")

    def build_events(size: int) -> list[tuple[ev.Event, str | None]]:
        index = Index.of(session, size)
        if index is None:  # no index for this checkpoint: the full path over the events
            events, leaves = _load(session, size)
            violations, path = check(events, leaves, node)
            root = merkle.root_of_leaves(leaves)
        else:
            violations, path = check_indexed(
                Reader(session, size), lambda a, b: session.span_root(a, b).hex(), index, node, size
            )
            root = session.head(size).root
        if violations:
            raise refused(node, violations)
        return [(_marker_event(session, size, root, node, list(CONDITIONS), path), None)]

    return Marker.from_record(session._commit(build_events)[-1])


def mark_raw(session: Session, size: int | None = None) -> Marker:
    """Emit a raw-checkpoint marker at ``size`` (default: now); see :meth:`Session.mark_raw`."""

    def build_events(now: int) -> list[tuple[ev.Event, str | None]]:
        at = now if size is None else size
        if not isinstance(at, int) or not 0 <= at <= now:
            raise InvalidArgument("size", f"must be in [0, {now}], got {at!r}")
        return [(_marker_event(session, at, session.head(at).root, None, [], []), None)]

    return Marker.from_record(session._commit(build_events)[-1])


def _marker_event(
    session: Session, size: int, root: bytes, node: int | None, conditions: list[str], path: list[int]
) -> ev.RecoveryMarker:
    key = session.store.mac_key
    mac = head_mac(key, session.name, size, root).hex() if key else None
    return ev.RecoveryMarker(size=size, root=root.hex(), node=node, mac=mac, conditions=conditions, path=path)
