"""Recovery markers: a pointer plus a promise.

The pointer names a summary node and the raw checkpoint (size and root) it was emitted
at; the promise is that the node holds everything needed to go on without re-reading
the raw log. The promise holds only if closure, negative-fact retention and anchoring
hold at that checkpoint (see :func:`compactstore.rules.check_marker`, the one place the
conditions are written). The store checks them when a marker is appended, whichever
way it arrives, and the resolver checks them again at resume.

This module builds marker events from what it reads through a
:class:`compactstore.view.SessionView`; it never writes.
"""

from __future__ import annotations

import msgspec

from . import events as ev
from . import rules
from .errors import InvalidArgument
from .events import Record
from .rules import CONDITIONS, Violation
from .view import SessionView

__all__ = ["CONDITIONS", "Marker", "Violation", "cover_marker", "marker", "raw_marker"]


class Marker(msgspec.Struct, frozen=True):
    """A recovery marker as stored at position ``pos`` of its session.

    Attributes:
        node: the summary node it points at (None: a raw-checkpoint marker).
        size, root: the raw checkpoint it names; ``mac`` when the store is keyed.
        conditions: what was certified at emission.
        path: the node positions whose digests were checked.
        cover: the nodes it resolves to, in span order (its node first); empty when
            the cover is its node alone.
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
    cover: list[int] = []

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
            list(m.conditions), list(m.path), record.leaf, list(m.cover),
        )


def _unhex(text: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        return b""


def marker(view: SessionView, size: int, node: object) -> ev.RecoveryMarker:
    """Return the marker event that certifies ``node`` at checkpoint ``size``.

    The conditions are checked when the store appends it (``MarkerInvalid`` then).

    Raises:
        InvalidArgument: ``node`` is not a position before ``size``.
    """
    if not isinstance(node, int) or isinstance(node, bool):
        raise InvalidArgument("node", f"want a Node or its position, got {type(node).__name__}")
    head = view.head(size)
    return ev.RecoveryMarker(
        size=size, root=head.root.hex(), node=node, mac=None if head.mac is None else head.mac.hex(),
        conditions=list(CONDITIONS), path=_path(view, node, size),
    )


def cover_marker(view: SessionView, size: int) -> ev.RecoveryMarker:
    """Return the marker that certifies the session's cover at checkpoint ``size``.

    The cover (:func:`compactstore.rules.cover`) is the newest session digest and the
    L1 nodes after it; a resumed context is those nodes and the raw events outside
    their spans. A cover of one node gives the single-node marker :func:`marker` gives.
    The conditions are checked when the store appends it (``MarkerInvalid`` then).

    Raises:
        InvalidArgument: no summary node before ``size``.
    """
    found = rules.cover(view.facts(size))
    if not found:
        raise InvalidArgument("node", f"no summary node before size {size} in session {view.name!r}: mark_raw() marks the raw log")
    made = marker(view, size, found[0])
    if len(found) == 1:
        return made
    path = sorted({p for n in found for p in _path(view, n, size)})
    return msgspec.structs.replace(made, cover=found, path=path)


def raw_marker(view: SessionView, size: int) -> ev.RecoveryMarker:
    """Return a raw-checkpoint marker at ``size``: it certifies nothing and resumes in ``fallback`` mode."""
    head = view.head(size)
    return ev.RecoveryMarker(
        size=size, root=head.root.hex(), node=None, mac=None if head.mac is None else head.mac.hex(),
        conditions=[], path=[],
    )


def _path(view: SessionView, node: int, size: int) -> list[int]:
    """Return the positions of ``node`` and its children (the summary nodes among them), as :func:`rules.check_marker` walks them."""
    path, stack = [], [(node, True)]
    while stack:
        pos, top = stack.pop()
        event = view.read(pos).event if 0 <= pos < size else None
        if not isinstance(event, ev.Summary):
            continue
        path.append(pos)
        if event.tier == 2 and top and 0 <= event.start < event.stop <= pos:
            stack.extend((c, False) for c in event.children if c < pos)
    return sorted(path)
