"""Restoration: the raw events a summary node replaced, exactly as logged, certified against the tree.

What is trusted is the latest sealed head (its seal under the key, the witness where one
is configured). The node is read and proven in it, so it is the one the store appended,
and the store admitted it only if its content digest and span root were those of the
span's stored bodies and leaves. The span's bodies are then read and certified by one
BLAKE3 over them against the node's content digest (a node without one, such as a
lossy session digest, by rebuilding their Merkle root against its span root). Any loss
class: the raw log, not the summary, is the source.
"""

from __future__ import annotations

from typing import Literal

from . import merkle, rules
from .compaction import Node
from .content import digester, unhex
from .errors import BodyDroppedError, IntegrityError, InvalidArgument, ReconstructionUnsoundError, shown
from .events import JSON, Dropped, Redacted, Spill, Summary
from .resolver import RestoredSpan, position_of
from .view import SessionView


def restore_span(view: SessionView, node: Node | int) -> RestoredSpan:
    """Return the raw events ``node`` replaced; see :meth:`compactstore.store.Session.restore_span`.

    Raises:
        IntegrityError: a body, the node or the tree does not match: nothing is returned.
        ReconstructionUnsoundError: the node, or a body in its span, was redacted.
        InvalidArgument: there is no summary node at that position.
        KeyRequired: the store is keyed and was opened without its key.
    """
    pos = position_of(view, "node", node)
    if isinstance(pos, bool) or not isinstance(pos, int) or pos < 0:
        raise InvalidArgument("node", f"want a Node or a position, got {pos!r}")
    record = view.proven(pos)  # the sealed head, the witness, the node's leaf and its inclusion
    if isinstance(record.event, Redacted):
        raise ReconstructionUnsoundError(
            f"node at pos {pos} was redacted by the event at pos {record.event.by}: it cannot vouch for a span")
    if not isinstance(record.event, Summary):
        raise InvalidArgument("node", f"pos {pos} is a {record.kind!r} event, not a summary node")
    n = record.event
    name, start, stop = view.name, n.start, n.stop
    if not 0 <= start < stop <= pos:
        raise IntegrityError(f"node at pos {pos} covers [{start}, {stop}), not a span before it", session=name, pos=pos)
    digest = None if n.content_digest is None else unhex(n.content_digest)
    got: list[bytes | None] = []
    by: Literal["content_digest", "span_root"]
    try:
        if digest is not None:
            by = "content_digest"
            # Each batch of bodies is hashed as it is read, while it is in cache: no pass
            # over the whole span after the read, and no copy of it in one buffer.
            content = digester()
            got = view.bodies(start, stop, content.update)  # a None (erased) body: TypeError
            ok = content.digest() == digest
        else:
            by = "span_root"
            got = view.bodies(start, stop)
            _counted(got, start, stop, name)
            ok = merkle.span_root_of_leaves(merkle.leaf_hashes(got), start, stop, first=start) == unhex(n.span_root)  # type: ignore[arg-type]
    except TypeError:
        got = got or view.bodies(start, stop)  # the read the digest ended at an erased body
        if None not in got:
            raise
        _counted(got, start, stop, name)
        erased = [start + i for i, b in enumerate(got) if b is None]
        for p in erased:
            gone = view.read(p).event  # erased behind the store's back: tampering, not a redaction
            if isinstance(gone, Dropped):
                raise BodyDroppedError(p, gone.by, view.read(gone.by).event.ts, f"restore [{start}, {stop})") from None
        raise ReconstructionUnsoundError(
            f"[{start}, {stop}) cannot be restored: positions {erased} were redacted, only their leaves remain"
        ) from None
    _counted(got, start, stop, name)
    if not ok:
        for _ in view.scan(start, stop):  # names the body that no longer matches its leaf or the head, if one does
            pass
        raise IntegrityError(
            f"the bodies of [{start}, {stop}) do not give the {by.replace('_', ' ')} of node at pos {pos}",
            session=name, pos=pos,
        )
    return RestoredSpan(name, pos, start, stop, got, by)  # type: ignore[arg-type]


def _counted(got: list[bytes | None], start: int, stop: int, name: str) -> None:
    if len(got) != stop - start:
        raise IntegrityError(f"[{start}, {stop}) holds {len(got)} events, want {stop - start}", session=name, pos=start)


def spilled(view: SessionView, handle: str) -> JSON:
    """Return the exact value spilled under ``handle``; see :meth:`compactstore.store.Session.spilled`.

    Raises:
        InvalidArgument: ``handle`` names no spill.
        IntegrityError: the spill does not match its leaf, the sealed head or its digest.
        KeyRequired: the store is keyed and was opened without its key.
        ReconstructionUnsoundError: the spill was redacted.
    """
    pos = rules.spill_position(handle) if isinstance(handle, str) else None
    if pos is None:
        raise InvalidArgument("handle", f"want 'spill:<pos>', got {shown(handle)}")
    record = view.proven(pos)
    spill = record.event
    if isinstance(spill, Redacted):
        raise ReconstructionUnsoundError(f"{handle} was redacted by the event at pos {spill.by}: its value is gone")
    if not isinstance(spill, Spill):
        raise InvalidArgument("handle", f"{handle} names a {record.kind!r} event, not a spill")
    source = view.proven(spill.source).event if 0 <= spill.source < pos else None
    if why := rules.spill_problem(spill, source, handle):
        raise IntegrityError(why, session=view.name, pos=pos)
    return spill.value
