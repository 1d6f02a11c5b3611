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
from .errors import InvalidArgument
from .events import Record
from .rules import CONDITIONS, Violation
from .view import SessionView

__all__ = ["CONDITIONS", "Marker", "Violation", "marker", "raw_marker"]


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


def raw_marker(view: SessionView, size: int) -> ev.RecoveryMarker:
    """Return a raw-checkpoint marker at ``size``: it certifies nothing and resumes in ``fallback`` mode."""
    head = view.head(size)
    return ev.RecoveryMarker(
        size=size, root=head.root.hex(), node=None, mac=None if head.mac is None else head.mac.hex(),
        conditions=[], path=[],
    )


def _path(view: SessionView, node: int, size: int) -> list[int]:
    """Return the positions of the nodes from ``node`` down through its children (the summary nodes among them)."""
    path, stack = [], [node]
    while stack:
        pos = stack.pop()
        event = view.read(pos).event if 0 <= pos < size else None
        if not isinstance(event, ev.Summary):
            continue
        path.append(pos)
        if event.tier == 2 and 0 <= event.start < event.stop <= pos:
            stack.extend(c for c in event.children if c < pos)
    return sorted(path)
