"""Tree heads as the latest sealed head vouches for them, span roots and RFC 9162 proofs, in O(log n).

Every write transaction stores the subtree roots it completes and a sealed head, so a
head, a span root or a proof for any size comes from stored roots. What certifies rests
on :meth:`Heads.sealed_head`: the latest stored head's seal checked (a keyed MAC when the
handle has the key), an earlier size proven a prefix of it, and the witness, where one
is configured, holding a head the store extends.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import events as ev
from .. import merkle
from ..backends import HeadRow
from ..errors import IntegrityError, InvalidArgument, KeyRequired, shown
from ..events import TreeHead
from .host import Host

HASH = "blake3"
EMPTY_ROOT = merkle.empty_root(HASH)
position = ev.as_position


class Heads:
    """The heads, span roots and proofs of session ``name`` of ``host``."""

    def __init__(self, host: Host, name: str) -> None:
        self.host = host
        self.name = name

    def sid(self) -> int | None:
        """Return the session's id, or None before its first append."""
        return self.host.backend.session_id(self.name)

    def require_sid(self) -> int:
        """Return the session's id.

        Raises:
            InvalidArgument: the session has no events.
        """
        sid = self.sid()
        if sid is None:
            raise InvalidArgument("session", f"{self.name!r} has no events")
        return sid

    @property
    def size(self) -> int:
        """Return the number of events in the session."""
        sid = self.sid()
        head = self.host.backend.head(sid) if sid is not None else None
        return head.size if head else 0

    @property
    def store_id(self) -> str:
        """Return the identity of the store the session lives in."""
        return self.host.store_id

    def witnessed(self) -> None:
        """Refuse the session unless its stored head extends the one the witness holds (when one is configured)."""
        if self.host.watch is not None:
            self.host.watch.check(self.name)

    def bounded(self, name: str, value: int | None, lo: int) -> tuple[int, int | None]:
        """Return ``(value or size, session id)`` after checking ``lo <= value <= size``."""
        sid = self.sid()
        head = self.host.backend.head(sid) if sid is not None else None
        size = head.size if head else 0
        value = size if value is None else position(name, value)
        if not lo <= value <= size:
            raise InvalidArgument(name, f"must be in [{lo}, {size}] for session {self.name!r}, got {value!r}")
        return value, sid

    def roots(self, spans: Sequence[merkle.Span], sid: int | None) -> list[bytes]:
        """Return the root of each span from stored roots, all read in one ``hashes`` call."""
        if sid is None:
            return merkle.spans_root(spans, {}, HASH)
        backend = self.host.backend
        return merkle.serve(spans, lambda c: backend.hashes(sid, c), HASH)

    def head(self, size: int | None = None, *, verify: bool = True) -> TreeHead:
        """Return the tree head at ``size`` (default: now), with a MAC when the store is keyed; see :meth:`Session.head`."""
        host = self.host
        if not ev.as_flag("verify", verify) or (host.keyed and not host.has_key):
            size, sid = self.bounded("size", size, 0)
            (root,) = self.roots([(0, size)], sid)
            return TreeHead(self.name, size, root, None)
        if size is None or position("size", size):
            sid = self.sid()
            row = host.backend.head(sid) if sid is not None else None
            if sid is not None and row is not None:
                self.witnessed()
                return self.sealed_at(sid, row, size)
        size, _ = self.bounded("size", size, 0)  # an empty tree (size 0, or a session without events)
        return TreeHead(self.name, size, EMPTY_ROOT, host.head_mac(self.name, size, EMPTY_ROOT))

    def sealed_head(self, size: int | None = None) -> TreeHead:
        """Return the tree head at ``size`` (default: the latest) as the latest sealed head vouches for it.

        Raises:
            KeyRequired: the store is keyed and was opened without its key.
            IntegrityError: the seal or the consistency proof does not verify.
            WitnessMismatch: the stored head does not extend the witness's.
            InvalidArgument: the session is empty, or ``size`` is not in [0, latest size].
        """
        host = self.host
        if host.keyed and not host.has_key:
            raise KeyRequired("certify", session=self.name)
        self.witnessed()
        sid = self.require_sid()
        return self.sealed_at(sid, host.backend.head(sid), size)

    def sealed_at(self, sid: int, row: HeadRow | None, size: int | None) -> TreeHead:
        """Return :meth:`sealed_head` of ``size`` from ``row``, the latest stored head of session ``sid``."""
        host, name = self.host, self.name
        if row is None or row.seal != host.seal_head(name, row.size, row.root, row.prev, row.seqs):
            raise IntegrityError("the latest tree head's seal does not verify", session=name)
        size = row.size if size is None else size
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= row.size:
            raise InvalidArgument("size", f"must be in [0, {row.size}] for session {name!r}, got {shown(size)}")
        root = row.root
        if size < row.size:
            root, *proof = self.roots([(0, size), *merkle.consistency_spans(size, row.size)], sid)
            if not merkle.verify_consistency(size, row.size, root, row.root, proof, HASH):
                raise IntegrityError(f"the stored tree at size {size} is not a prefix of the sealed head", session=name, pos=size)
        return TreeHead(name, size, root, host.head_mac(name, size, root))

    def span_root(self, start: int, stop: int) -> bytes:
        """Return the root of positions ``[start, stop)`` from stored roots (see :func:`merkle.span_root`), in O(log n)."""
        stop, sid = self.bounded("stop", stop, 0)
        if not 0 <= position("start", start) <= stop:
            raise InvalidArgument("start", f"must be in [0, {stop}], got {shown(start)}")
        return self.roots([(start, stop)], sid)[0]

    def inclusion_proof(self, pos: int, size: int | None = None) -> list[bytes]:
        """Return the RFC 9162 inclusion proof of ``pos`` in the tree of ``size`` (default: now)."""
        self.witnessed()
        size, sid = self.bounded("size", size, 1)
        if not 0 <= position("pos", pos) < size:
            raise InvalidArgument("pos", f"must be in [0, {size - 1}], got {shown(pos)}")
        return self.roots(merkle.inclusion_spans(pos, size), sid)

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> list[bytes]:
        """Return the RFC 9162 consistency proof between tree sizes ``old_size`` and ``new_size``."""
        self.witnessed()
        return self.consistency(old_size, new_size)

    def consistency(self, old_size: int, new_size: int | None) -> list[bytes]:
        """Return :meth:`consistency_proof` from the stored roots, unwitnessed (what the witness's own check reads)."""
        new_size, sid = self.bounded("new_size", new_size, 0)
        if not 0 <= position("old_size", old_size) <= new_size:
            raise InvalidArgument("old_size", f"must be in [0, {new_size}], got {shown(old_size)}")
        return self.roots(merkle.consistency_spans(old_size, new_size), sid)
