"""What one store handle keeps between calls, per session, under one lock.

Everything kept is derived from the log, which only grows (a redaction appends an event
and erases bodies): an entry holds what the log says up to a size, or is kept per
redaction count and made afresh once another redaction is logged. Nothing here is
trusted beyond what was checked when it was kept: a commit still compares, a read still
proves what the kept entries do not cover.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar, cast

from .. import events as ev
from .. import merkle
from ..backends import HeadRow
from ..view import SpanRead

T = TypeVar("T")

#: Spans whose read was checked, kept per store for the commit that follows.
SPANS_KEPT = 64


class Prefix:
    """Leaves ``[0, len(leaves) // 32)`` of a session, proven in its sealed head ``(size, root)`` by earlier reads."""

    __slots__ = ("name", "size", "root", "leaves", "sealed")

    def __init__(self, name: str, size: int, root: bytes) -> None:
        self.name, self.size, self.root = name, size, root
        self.leaves = bytearray()
        #: the latest head row whose seal was checked: the same row read again needs no new MAC
        self.sealed: HeadRow | None = None


class Caches:
    """What a store handle keeps of its sessions (by session id): one lock for all of it.

    Attributes:
        lock: held for every read and write of what is kept.
        frontiers: the compact range of each session's whole tree after this handle's last commit.
        prefixes: the leaves of each session this handle proved in its latest sealed head.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.frontiers: dict[int, merkle.Frontier] = {}
        self.prefixes: dict[int, Prefix] = {}
        #: summary nodes read so far: ``sid -> (read up to, [(pos, node)])``
        self._nodes: dict[int, tuple[int, list[tuple[int, ev.Summary]]]] = {}
        #: spans read and checked: ``(sid, start, stop) -> (redactions, read)``
        self._spans: dict[tuple[int, int, int], tuple[int, SpanRead]] = {}
        #: per kind and session, what is kept under a redaction count
        self._kept: dict[tuple[str, int], tuple[int, object]] = {}

    def frontier(self, sid: int, size: int) -> merkle.Frontier | None:
        """Return a copy of the frontier kept for session ``sid`` if it is at ``size``, else None."""
        with self.lock:
            kept = self.frontiers.get(sid)
            return kept.copy() if kept is not None and kept.size == size else None

    def keep_frontier(self, sid: int, frontier: merkle.Frontier) -> None:
        """Keep ``frontier`` as session ``sid``'s, after a commit."""
        with self.lock:
            self.frontiers[sid] = frontier

    def nodes(self, sid: int, size: int, more: Callable[[int, int], list[tuple[int, ev.Summary]]]) -> list[tuple[int, ev.Summary]]:
        """Return the summary nodes of session ``sid`` before ``size``, reading with ``more(lo, hi)`` only those not read yet."""
        with self.lock:
            upto, known = self._nodes.get(sid, (0, []))
        if upto < size:
            known = known + more(upto, size)
            with self.lock:
                if self._nodes.get(sid, (0, []))[0] < size:
                    self._nodes[sid] = (size, known)
        return [(p, n) for p, n in known if p < size]

    def span(self, key: tuple[int, int, int], redactions: int) -> SpanRead | None:
        """Return the read of span ``key`` (session id, start, stop) kept under ``redactions``, or None."""
        with self.lock:
            kept = self._spans.get(key)
        return kept[1] if kept is not None and kept[0] == redactions else None

    def keep_span(self, key: tuple[int, int, int], redactions: int, read: SpanRead) -> None:
        """Keep the read of span ``key`` (without its records) under ``redactions``; the oldest goes first."""
        with self.lock:
            if len(self._spans) >= SPANS_KEPT:
                self._spans.pop(next(iter(self._spans)))
            self._spans[key] = (redactions, read._replace(records=[]))

    def kept(self, kind: str, sid: int, redactions: int, make: Callable[[], T]) -> T:
        """Return what is kept as ``kind`` for session ``sid`` under ``redactions``, made by ``make`` when there is none."""
        with self.lock:
            got = self._kept.get((kind, sid))
            if got is None or got[0] != redactions:
                got = self._kept[(kind, sid)] = (redactions, make())
            return cast(T, got[1])
