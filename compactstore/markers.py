"""Recovery markers and the three conditions checked when one is emitted.

A marker is a pointer plus a promise: the pointer names a summary node, the promise is
that the node holds everything needed to go on without re-reading the raw log. The
promise holds only if, for the node the agent will load:

1. closure: every tool call, handle or obligation opened in its span and still open
   at its boundary is listed there as UNRESOLVED;
2. negative-fact retention: every failed, rejected or superseded event of its span
   is retained in it, and so is every earlier event its span supersedes (the context
   shows that event raw, and only the node can say it is no longer current);
3. anchoring: every node on its path carries the span root the log gives for its
   span, its excerpts and spills match the log, and every non-regenerable binding an
   open obligation needs from its span is kept verbatim or spilled.

The check is a pure function of the events and leaf hashes ``[0, size)``, so emission
and resume run the very same code over the very same inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import msgspec

from . import events as ev
from . import merkle
from .compaction import _extract, kept_keys, value_digest
from .errors import InvalidArgument, MarkerInvalid
from .seal import head_mac
from .structure import Structure, build

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


def check(
    events: Sequence[ev.Event], leaves: Sequence[bytes], node_pos: int, structure: Structure | None = None
) -> tuple[list[Violation], list[int]]:
    """Check the three conditions for resuming from ``node_pos`` at checkpoint ``len(events)``.

    Returns the violations (sorted, empty when the marker may be emitted or trusted)
    and the positions of the nodes on the path.
    """
    size = len(events)
    found: list[Violation] = []
    top = events[node_pos] if 0 <= node_pos < size else None
    if not isinstance(top, ev.Summary):
        return [Violation("anchoring", node_pos, "not a summary node before the checkpoint")], []
    s = structure if structure is not None else build(enumerate(events))
    path = _check_path(events, leaves, node_pos, found)
    for item in s.unresolved_at(top.start, top.stop):
        if item not in top.unresolved:
            found.append(Violation("closure", item.pos, f"{item.kind} {item.id!r} is open at the boundary but not listed as UNRESOLVED"))
    retained = {f.pos for f in top.negative_facts}
    for fact in s.negatives_in(top.start, top.stop):
        if fact.pos not in retained:
            found.append(Violation("negative_facts", fact.pos, f"{fact.status} item dropped: {fact.text}"))
    kept = kept_keys(top, s)
    for opos, obligation in s.open_obligations():
        for key in obligation.needs:
            latest = s.latest_binding(key, size)
            if latest and top.start <= latest[0] < top.stop and not latest[1].regenerable and key not in kept:
                found.append(Violation(
                    "anchoring", latest[0],
                    f"binding {key!r} needed by open obligation {obligation.name!r} (pos {opos}) is neither kept nor spilled",
                ))
    return sorted(set(found)), path


def _check_path(events: Sequence[ev.Event], leaves: Sequence[bytes], node_pos: int, found: list[Violation]) -> list[int]:
    """Check every node from ``node_pos`` down through its children; return their positions."""
    path, stack = [], [node_pos]
    while stack:
        pos = stack.pop()
        node = events[pos] if 0 <= pos < len(events) else None
        if not isinstance(node, ev.Summary):
            found.append(Violation("anchoring", pos, "path names a position that is not a summary node"))
            continue
        path.append(pos)
        if not 0 <= node.start < node.stop <= pos:
            found.append(Violation("anchoring", pos, f"span [{node.start}, {node.stop}) is not before the node"))
            continue
        root = merkle.span_root_of_leaves(leaves, node.start, node.stop).hex()
        if node.span_root != root:
            found.append(Violation("anchoring", pos, f"span root of [{node.start}, {node.stop}) is {node.span_root[:16]}…, the log gives {root[:16]}…"))
        if node.tier == 2:
            _check_children(events, pos, node, found)
            stack.extend(c for c in node.children if c < pos)
        for e in node.kept:
            try:
                ok = 0 <= e.pos < pos and _extract(events[e.pos], e.path) == e.value
            except (KeyError, IndexError, ValueError):
                ok = False
            if not ok:
                found.append(Violation("anchoring", e.pos, f"kept excerpt {e.path!r} does not match the log"))
        for ref in node.spills:
            if not _spill_matches(events, ref, pos):
                found.append(Violation("anchoring", ref.source, f"spill {ref.handle} of {ref.key!r} does not match the log"))
    return sorted(path)


def _check_children(events: Sequence[ev.Event], pos: int, node: ev.Summary, found: list[Violation]) -> None:
    kids = [events[c] if 0 <= c < pos else None for c in node.children]
    spans = [(k.start, k.stop) for k in kids if isinstance(k, ev.Summary) and k.tier == 1]
    contiguous = len(spans) == len(kids) > 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    if not contiguous or spans[0][0] != node.start or spans[-1][1] != node.stop:
        found.append(Violation("anchoring", pos, "children are not contiguous L1 nodes covering its span"))


def _spill_matches(events: Sequence[ev.Event], ref: ev.SpillRef, before: int) -> bool:
    try:
        at = int(ref.handle.split(":", 1)[1])
    except (IndexError, ValueError):
        return False
    spill = events[at] if 0 <= at < before else None
    source = events[ref.source] if 0 <= ref.source < before else None
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


def mark(session: Session, node: int) -> Marker:
    """Emit a marker for ``node`` after checking the three conditions; see :meth:`Session.mark`."""
    if not isinstance(node, int):
        raise InvalidArgument("node", f"want a Node or its position, got {type(node).__name__}")

    def build_events(size: int) -> list[tuple[ev.Event, str | None]]:
        events, leaves = _load(session, size)
        violations, path = check(events, leaves, node)
        if violations:
            raise MarkerInvalid(
                f"marker for node at pos {node} refused: " + "; ".join(str(v) for v in violations[:5])
                + (f"; and {len(violations) - 5} more" if len(violations) > 5 else ""),
                violations,
            )
        return [(_marker_event(session, size, merkle.root_of_leaves(leaves), node, list(CONDITIONS), path), None)]

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
