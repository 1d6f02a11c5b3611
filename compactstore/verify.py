"""Whole-store verification: every cell is checked against a leaf, a head or a rule.

Bodies are re-hashed and the trees rebuilt from them alone; stored leaves, subtree
roots, heads and seals are then compared with what the bodies imply. Rows are read in
chunks and only a frontier of O(log n) hashes is kept per session, so memory does not
grow with the log.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import msgspec

from . import events as ev
from . import merkle
from .backends import HeadRow, Row
from .errors import InvalidEvent

if TYPE_CHECKING:
    from .store import Store

MAX_PROBLEMS = 10_000
_CHUNK = 4096


class Problem(msgspec.Struct, frozen=True):
    """One thing verification found wrong.

    Attributes:
        session: the session's name (None for store-wide problems).
        table: where: ``events``, ``nodes``, ``heads``, ``sessions`` or ``meta``.
        pos: the event position, or the first position a subtree or head covers.
        what: what is wrong, with got/want where it helps.
    """

    session: str | None
    table: str
    pos: int | None
    what: str

    def __str__(self) -> str:
        where = f"{self.session!r}" if self.session is not None else "store"
        at = "" if self.pos is None else f" {'size' if self.table == 'heads' else 'pos'} {self.pos}"
        return f"{where} {self.table}{at}: {self.what}"


class VerifyReport(msgspec.Struct, frozen=True):
    """The outcome of :meth:`Store.verify`: ``ok`` when ``problems`` is empty."""

    ok: bool
    problems: list[Problem]
    sessions: int
    events: int
    #: problems found beyond the first MAX_PROBLEMS, counted but not listed.
    more: int = 0
    #: positions whose bodies were erased by a redaction event (not problems).
    redacted: int = 0


class _Problems:
    def __init__(self) -> None:
        self.items: list[Problem] = []
        self.more = 0
        self.redacted = 0

    def add(self, session: str | None, table: str, pos: int | None, what: str) -> None:
        if len(self.items) < MAX_PROBLEMS:
            self.items.append(Problem(session, table, pos, what))
        else:
            self.more += 1


def _short(h: bytes) -> str:
    return h.hex()[:16] + "…"


def verify_store(store: Store, *, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Check every table of ``store``; see :meth:`Store.verify`."""
    backend = store.backend
    found = _Problems()
    if store.keyed and store.mac_key is None:
        found.add(None, "meta", None, "the store is keyed: open it with its key to check head MACs")
    for table, sid in backend.orphans():
        found.add(None, table, None, f"rows name session id {sid}, which does not exist")
    count, lo, hi = backend.seq_bounds()
    if backend.gapless_seq and count and (lo != 1 or hi != count):
        found.add(None, "events", None, f"sequence numbers are not 1..{count}: got {lo}..{hi}")
    done = 0
    sessions = backend.sessions()
    for sid, name in sessions:
        for n in _verify_session(store, sid, name, found):
            done += n
            if progress is not None:
                progress(done, count)
    return VerifyReport(not found.items, found.items, len(sessions), done, found.more, found.redacted)


def _verify_session(store: Store, sid: int, name: str, found: _Problems) -> Iterator[int]:
    backend = store.backend
    frontier = merkle.Frontier(algo="blake3")
    heads = _stream_heads(store, sid)
    head = next(heads, None)
    prev = 0
    last_seq = 0
    redacted = backend.redactions(sid)
    erased_by: dict[int, set[int]] = defaultdict(set)
    for p, by in redacted.items():
        erased_by[by].add(p)
    for chunk in _chunks(backend.rows(sid, 0, None, _CHUNK)):
        made: dict[int, dict[int, bytes]] = defaultdict(dict)
        for row in chunk:
            pos = frontier.size
            if row.pos != pos:
                found.add(name, "events", row.pos, f"position out of order: want {pos}")
            if row.seq <= last_seq:
                found.add(name, "events", row.pos, f"sequence number {row.seq} not after {last_seq}")
            last_seq = row.seq
            if row.body is None:
                # Erased by a redaction: only the tree can vouch for the stored leaf.
                leaf = row.leaf
                if row.pos in redacted and row.kind == "redacted" and row.idem_key is None:
                    found.redacted += 1
                elif row.pos in redacted:
                    found.add(name, "events", row.pos, "a redacted row must have kind 'redacted' and no idem_key")
                else:
                    found.add(name, "events", row.pos, "body is missing and no redaction erased it")
            else:
                leaf = merkle.leaf_hash(row.body)
                if row.leaf != leaf:
                    found.add(name, "events", row.pos, f"leaf does not match body: got {_short(row.leaf)}, want {_short(leaf)}")
                if row.pos in redacted:
                    found.add(name, "redactions", row.pos, f"recorded as erased by pos {redacted[row.pos]}, but the body is there")
                event = _check_body(row.body, row.kind, row.idem_key, name, row.pos, found)
                if isinstance(event, ev.Redaction) or row.pos in erased_by:
                    listed = set(event.positions) if isinstance(event, ev.Redaction) else set()
                    erased = erased_by.pop(row.pos, set())
                    if listed != erased:
                        found.add(name, "redactions", row.pos, f"redaction lists {sorted(listed)}, the store erased {sorted(erased)}")
            for level, idx, h in frontier.append(leaf):
                if merkle.is_stored(level):
                    made[level][idx] = h
            while head is not None and head.size <= frontier.size:
                _check_head(store, name, head, prev, frontier, found)
                prev = head.size
                head = next(heads, None)
        for level, want in made.items():
            stored = dict(backend.node_range(sid, level, min(want), max(want) + 1))
            for idx, h in want.items():
                got = stored.get(idx)
                if got != h:
                    what = "missing" if got is None else f"got {_short(got)}, want {_short(h)}"
                    found.add(name, "nodes", idx << level, f"subtree ({level}, {idx}): {what}")
        yield len(chunk)
    size = frontier.size
    if size == 0:
        found.add(name, "sessions", None, "session has no events")
    for by, erased in sorted(erased_by.items()):
        found.add(name, "redactions", by, f"positions {sorted(erased)} are recorded as erased by pos {by}, which is no redaction")
    while head is not None:
        found.add(name, "heads", head.size, f"head of size {head.size} beyond the log's {size} events")
        head = next(heads, None)
    if size and prev != size:
        found.add(name, "heads", prev, f"latest head is at size {prev}, but the log has {size} events")
    for level, n in backend.node_counts(sid).items():
        if n != (size >> level if merkle.is_stored(level) else 0):
            found.add(name, "nodes", None, f"{n} subtrees stored at level {level}, want {size >> level}")


def _check_body(body: bytes, kind: str, idem_key: str | None, name: str, pos: int, found: _Problems) -> ev.Event | None:
    try:
        event = ev.decode(body)
    except InvalidEvent as exc:
        found.add(name, "events", pos, f"body is not a valid event: {exc.reason}")
        return None
    if ev.encode(event) != body:
        found.add(name, "events", pos, "body is not in canonical form")
    if event.kind != kind:
        found.add(name, "events", pos, f"kind column says {kind!r}, body says {event.kind!r}")
    if event.idempotency_key != idem_key:
        found.add(name, "events", pos, f"idem_key column says {idem_key!r}, body says {event.idempotency_key!r}")
    return event


def _check_head(store: Store, name: str, head: HeadRow, prev: int, frontier: merkle.Frontier, found: _Problems) -> None:
    if head.size != frontier.size:  # a size the log never passed through in order
        found.add(name, "heads", head.size, "head of a size that was skipped")
        return
    root = frontier.root()
    if head.root != root:
        found.add(name, "heads", head.size, f"root mismatch: got {_short(head.root)}, want {_short(root)}")
    if head.prev != prev:
        found.add(name, "heads", head.size, f"chain broken: previous head is at size {head.prev}, want {prev}")
    if head.seal != store._seal(name, head.size, head.root, head.prev):
        found.add(name, "heads", head.size, "seal does not match (session name, size, root, prev)" + (" under the key" if store.mac_key else ""))


def _stream_heads(store: Store, sid: int) -> Iterator[HeadRow]:
    after = 0
    while True:
        got = store.backend.heads(sid, after, _CHUNK)
        yield from got
        if len(got) < _CHUNK:
            return
        after = got[-1].size


def _chunks(rows: Iterator[Row]) -> Iterator[list[Row]]:
    chunk: list[Row] = []
    for r in rows:
        chunk.append(r)
        if len(chunk) == _CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
