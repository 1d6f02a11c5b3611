"""The issue's "must show" property: "certified" means safe, and only an honest LOSSLESS node restores.

Hypothesis writes sessions with re-bound keys, obligations needing them, failed results,
rejected and superseding turns, redactions, L1 nodes built by ``compact`` with varied
``keep=``, ``on_risk=`` and ``loss=`` (AUTO included), L2 nodes by ``roll_up``, derived
events forged around admission (:func:`forge.unchecked`: stale excerpts, relabelled loss,
dropped facts, phantom items) and markers planted over them, and at times a body erased
behind the store's back. Then, for every marker and every resume, and for every node and
every restoration operation, the outcome is held to an oracle written here from the log
(a naive pass over ``Session.scan()``), never to :mod:`compactstore.rules`.

On PostgreSQL a body is erased as the database's owner does it, with triggers skipped for
that one connection (``session_replication_role = replica``); a server that does not
allow it (a URL given by environment, not a superuser) skips that step.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from forge import unchecked
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import compactstore as cs
from compactstore import compaction, markers
from compactstore import events as ev
from compactstore.resolver import RESTORATION_OPS, artifact_digest

KEYS = ("rollback", "token", "sha")
#: Values a key is bound to: re-binding may give the same value, and ``1`` is not ``true``.
VALUES: tuple[object, ...] = (
    "migrations/003_down.sql", "migrations/004_down.sql", "tok-7f3a-91", 1, True, ["a", "b"], {"id": 7, "tag": "v2"},
)
ERRORS = ("ERROR: lock timeout on users", "E1234 disk quota exceeded on /srv", "403 Forbidden: token expired")
LOSSES = (cs.LossClass.LOSSY_GIST, cs.LossClass.LOSSY_LITERAL, cs.LossClass.LOSSLESS, cs.AUTO)
REFUSED = (cs.CompactionInvariantError, cs.MarkerInvalid, cs.InvalidArgument, cs.InvalidEvent)

_names = itertools.count()


# --- writing a session ----------------------------------------------------------------------


@dataclass
class Story:
    """What a drawn session did, beyond what its log says: which body was erased behind the store's back."""

    calls: list[str] = field(default_factory=list)
    handles: list[str] = field(default_factory=list)
    obligations: list[str] = field(default_factory=list)
    erased: int | None = None


def _raw_positions(s: cs.Session) -> list[int]:
    return [r.pos for r in s.scan() if r.kind not in ev.DERIVED_KINDS and r.kind != "redacted"]


def _nodes(s: cs.Session) -> list[tuple[int, ev.Summary]]:
    return [(r.pos, r.event) for r in s.scan() if isinstance(r.event, ev.Summary)]


def _span(data: st.DataObject, size: int) -> tuple[int, int]:
    start = data.draw(st.integers(0, size - 1), label="start")
    return start, data.draw(st.integers(start + 1, size), label="stop")


def _raw_step(s: cs.Session, story: Story, data: st.DataObject) -> None:
    """Append one raw event of a drawn kind."""
    kind = data.draw(st.sampled_from(
        ["turn", "turn", "call", "result", "bind", "bind", "oblige", "fulfil", "open", "close"]), label="kind")
    raw = _raw_positions(s)
    if kind == "turn":
        role = data.draw(st.sampled_from(["user", "assistant"]))
        status = data.draw(st.sampled_from([None, None, "rejected", "superseded", "failed"]))
        supersedes = data.draw(st.none() | st.sampled_from(raw)) if raw else None
        words = data.draw(st.sampled_from(["Backfill in place.", "Use the v2 rollback.", "I authorize deploy 4812."]))
        s.append(cs.Turn(role, f"{words} #{s.size}", status=status, supersedes=supersedes))
    elif kind == "call":
        cid = f"c{s.size}"
        story.calls.append(cid)
        args = data.draw(st.sampled_from([{}, {"path": "/srv/releases/4812"}, {"sql": "BEGIN", "retries": 3},
                                          {"rows": [1, {"id": "x"}], "dry_run": True}]))
        s.append(cs.ToolCall(cid, data.draw(st.sampled_from(["run_sql", "deploy"])), args))
    elif kind == "result":
        cid = data.draw(st.sampled_from(story.calls)) if story.calls else "c-none"
        ok = data.draw(st.booleans())
        output = "done" if ok else data.draw(st.sampled_from(ERRORS))
        status = data.draw(st.sampled_from([None, "failed"]))
        s.append(cs.ToolResult(cid, output, ok=ok, status=status))
    elif kind == "bind":
        key = data.draw(st.sampled_from(KEYS))
        s.bind(key, data.draw(st.sampled_from(VALUES)), regenerable=data.draw(st.sampled_from([False, False, True])))
    elif kind == "oblige":
        bound = sorted({r.event.key for r in s.scan() if isinstance(r.event, ev.Binding)})
        if not bound:
            return
        name = f"o{s.size}"
        story.obligations.append(name)
        s.oblige(name, needs=data.draw(st.lists(st.sampled_from(bound), min_size=1, max_size=2, unique=True)))
    elif kind == "fulfil":
        if story.obligations:
            s.fulfil(data.draw(st.sampled_from(story.obligations)))
    elif kind == "open":
        h = f"h{s.size}"
        story.handles.append(h)
        s.append(ev.HandleOpened(handle=h, resource="subprocess", detail=f"psql app {s.size}"))
    elif story.handles:
        s.append(ev.HandleClosed(handle=data.draw(st.sampled_from(story.handles))))


def _forged(s: cs.Session, data: st.DataObject) -> list[ev.Event] | None:
    """Return derived events built honestly, then altered one way, or None when nothing can be built."""
    nodes = _nodes(s)
    l1 = sorted((n.start, p) for p, n in nodes if n.tier == 1)
    if l1 and data.draw(st.booleans(), label="forge an L2"):
        i = data.draw(st.integers(0, len(l1) - 1))
        run = [l1[i][1]]
        while i + 1 < len(l1) and s.read(run[-1]).event.stop == l1[i + 1][0] and data.draw(st.booleans()):  # type: ignore[attr-defined]
            i += 1
            run.append(l1[i][1])
        try:
            built = compaction.roll_up(s.view, s.size, run)
        except REFUSED:
            return None
    else:
        start, stop = _span(data, s.size)
        try:
            built = compaction.compaction(
                s.view, s.size, start, stop, on_risk=data.draw(st.sampled_from(["preserve", "spill"])),
                keep=data.draw(st.sampled_from([(), cs.AUTO])), loss=cs.AUTO)
        except REFUSED:
            return None
    node = built[-1]
    assert isinstance(node, ev.Summary)
    how = data.draw(st.sampled_from(["stale excerpt", "relabel", "drop facts", "phantom item", "drop kept",
                                     "drop items", "lie in a fact"]), label="forgery")
    if how == "stale excerpt":
        older = [(r.pos, r.event) for r in s.scan(0, node.stop) if isinstance(r.event, ev.Binding)]
        stale = []
        for e in node.kept:
            b = s.read(e.pos).event
            if e.path == "value" and isinstance(b, ev.Binding):
                earlier = [(p, x) for p, x in older if x.key == b.key and p < e.pos]
                if earlier:
                    p, x = earlier[-1]
                    stale.append(ev.Excerpt(p, "value", x.value))
                    continue
            stale.append(e)
        node = msgspec.structs.replace(node, kept=stale, spills=[], contract=None)
        built = [node]
    elif how == "relabel":
        node = msgspec.structs.replace(node, loss=cs.LossClass.LOSSLESS)
    elif how == "drop facts":
        node = msgspec.structs.replace(node, negative_facts=node.negative_facts[1:])
    elif how == "phantom item":
        pos = data.draw(st.integers(node.start, node.stop - 1))
        node = msgspec.structs.replace(node, unresolved=[*node.unresolved, ev.Item(pos, "tool_call", "ghost")])
    elif how == "drop kept":
        node, built = msgspec.structs.replace(node, kept=[], spills=[], contract=None), []
    elif how == "drop items":
        node = msgspec.structs.replace(node, unresolved=[], resolved=[])
    else:
        node = msgspec.structs.replace(node, negative_facts=[
            ev.Fact(x.pos, "superseded" if x.status != "superseded" else "failed", "user approved the plan")
            for x in node.negative_facts])
    return [*built[:-1], node]


def write(s: cs.Session, data: st.DataObject, *, steps: int) -> Story:
    """Write a drawn session into ``s``: raw events, compactions, roll-ups, forgeries, markers and redactions."""
    story = Story()
    s.append(cs.Turn("user", "Make the users.email migration reversible."))
    for _ in range(3):
        _raw_step(s, story, data)
    for _ in range(data.draw(st.integers(4, steps), label="steps")):
        what = data.draw(st.sampled_from(
            ["raw"] * 6 + ["compact", "compact", "roll_up", "forge", "mark", "plant", "redact"]), label="step")
        try:
            if what == "raw":
                _raw_step(s, story, data)
            elif what == "compact":
                start, stop = _span(data, s.size)
                bound = sorted({r.event.key for r in s.scan(0, stop) if isinstance(r.event, ev.Binding)})
                keep = data.draw(st.sampled_from([(), cs.AUTO, *([[k] for k in bound]),
                                                  *([[(p, "value")] for p in range(start, stop)
                                                     if s.read(p).kind == "binding"])]), label="keep")
                s.compact(start, stop, keep=keep, on_risk=data.draw(st.sampled_from(["refuse", "preserve", "spill"])),
                          loss=data.draw(st.sampled_from(LOSSES)))
            elif what == "roll_up":
                l1 = sorted((n.start, p) for p, n in _nodes(s) if n.tier == 1)
                if l1:
                    i = data.draw(st.integers(0, len(l1) - 1))
                    j = data.draw(st.integers(i, min(i + 2, len(l1) - 1)))
                    s.roll_up([p for _, p in l1[i: j + 1]], loss=data.draw(st.sampled_from([None, *LOSSES])))
            elif what == "forge":
                forged = _forged(s, data)
                if forged:
                    with unchecked():
                        s.extend(forged)
            elif what in ("mark", "plant"):
                nodes = _nodes(s)
                if nodes:
                    pos = data.draw(st.sampled_from([p for p, _ in nodes]))
                    if what == "mark":
                        s.mark(pos)
                    else:
                        with unchecked():
                            s.append(markers.marker(s.view, s.size, pos))
            else:
                raw = _raw_positions(s)
                if raw:
                    s.redact([data.draw(st.sampled_from(raw))], "personal data")
        except REFUSED:
            pass  # a refusal writes nothing; the session goes on
    for r in s.scan():
        note(f"{r.pos}: {r.event!r}")
    if s.size and data.draw(st.integers(0, 3), label="erase") == 0:
        story.erased = data.draw(st.integers(0, s.size - 1), label="erased pos")
    return story


@contextmanager
def _owner(target: str) -> Iterator[Any]:
    """Yield a DB-API connection to the store as its owner, who may change any row (triggers skipped); None if not allowed."""
    if "://" in target:
        import psycopg

        conn = psycopg.connect(target, autocommit=True)
        try:
            try:
                conn.execute("SET session_replication_role = replica")
            except psycopg.Error:
                yield None
                return
            yield conn
        finally:
            conn.close()
        return
    lite = sqlite3.connect(target, isolation_level=None)
    try:
        lite.execute("BEGIN IMMEDIATE")
        triggers = lite.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'").fetchall()
        for name, _ in triggers:
            lite.execute(f"DROP TRIGGER {name}")
        yield lite
        for _, sql in triggers:
            lite.execute(sql)  # the store keeps its guards for the next example
        lite.execute("COMMIT")
    finally:
        lite.close()


def erase(target: str, session: str, pos: int) -> bool:
    """Set the body at ``pos`` of ``session`` to NULL with no redaction event; return False when it cannot be done."""
    with _owner(target) as conn:
        if conn is None:
            return False
        mark = "%s" if "://" in target else "?"
        (sid,) = conn.execute(f"SELECT id FROM sessions WHERE name = {mark}", (session,)).fetchone()
        conn.execute(f"UPDATE events SET body = NULL WHERE session_id = {mark} AND pos = {mark}", (sid, pos))
    return True


# --- the oracle: a naive pass over the log ----------------------------------------------------

_NEGATIVE = ("failed", "rejected", "superseded")
_OPENERS = {"tool_call": ("tool_call", "call_id"), "handle_opened": ("handle", "handle"), "obligation": ("obligation", "name")}
_CLOSERS = {"tool_result": ("tool_call", "call_id"), "handle_closed": ("handle", "handle"), "fulfilment": ("obligation", "name")}


def _canon(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class Log:
    """The log as ``scan()`` gives it, and what it says at a checkpoint, found by a plain walk of its events."""

    def __init__(self, records: list[ev.Record]) -> None:
        self.events = [r.event for r in records]
        self.redacted = {r.pos for r in records if isinstance(r.event, ev.Redacted)}

    def _raw(self, p: int) -> bool:
        e = self.events[p]
        return not isinstance(e, ev.Redacted) and e.kind not in ev.DERIVED_KINDS

    def negatives(self, start: int, stop: int) -> dict[int, str]:
        """Return position -> status of every negative fact a node over ``[start, stop)`` owes, as the log gives it by ``stop``.

        An event is negative by its own status (or a result that is not ok), else when a
        later event supersedes it (``supersedes``, or binding its key again); the first
        reason counts. Owed: those in the span, and those before it made negative in it.
        """
        cause: dict[int, tuple[int, str]] = {}
        last_bound: dict[str, int] = {}
        for q in range(stop):
            e = self.events[q]
            if not self._raw(q):
                continue
            own = e.status if e.status in _NEGATIVE else ("failed" if isinstance(e, ev.ToolResult) and not e.ok else None)
            if own is not None:
                cause.setdefault(q, (q, own))
            olds = [e.supersedes] if e.supersedes is not None else []
            if isinstance(e, ev.Binding):
                if e.key in last_bound:
                    olds.append(last_bound[e.key])
                last_bound[e.key] = q
            for old in olds:
                # A redacted event is unknown, but that a later one superseded it is not.
                if old < q and (self._raw(old) or old in self.redacted):
                    cause.setdefault(old, (q, "superseded"))
        return {p: status for p, (by, status) in cause.items() if p >= start or by >= start}

    def open_items(self, start: int, stop: int) -> set[tuple[int, str, str]]:
        """Return ``(pos, kind, id)`` of the items opened in ``[start, stop)`` and not closed after their opening before ``stop``."""
        out = set()
        for p in range(start, stop):
            e = self.events[p]
            if self._raw(p) and e.kind in _OPENERS:
                kind, attr = _OPENERS[e.kind]
                ident = getattr(e, attr)
                if not self._closed(kind, ident, p + 1, stop):
                    out.add((p, kind, ident))
        return out

    def resolved(self, start: int, stop: int) -> set[tuple[int, str, str]]:
        """Return the items opened before ``start``, still open there, and closed in ``[start, stop)``."""
        out = set()
        for p in range(start):
            e = self.events[p]
            if self._raw(p) and e.kind in _OPENERS:
                kind, attr = _OPENERS[e.kind]
                ident = getattr(e, attr)
                if not self._closed(kind, ident, p + 1, start) and self._closed(kind, ident, start, stop):
                    out.add((p, kind, ident))
        return out

    def _closed(self, kind: str, ident: str, a: int, b: int) -> bool:
        for q in range(a, b):
            e = self.events[q]
            if self._raw(q) and e.kind in _CLOSERS and _CLOSERS[e.kind][0] == kind and getattr(e, _CLOSERS[e.kind][1]) == ident:
                return True
        return False

    def needed(self, size: int) -> list[tuple[str, int, object]]:
        """Return ``(key, pos, value)`` of the live non-regenerable binding of each key an obligation open at ``size`` needs."""
        out = []
        for p in range(size):
            o = self.events[p]
            if not (self._raw(p) and isinstance(o, ev.Obligation)) or self._closed("obligation", o.name, p + 1, size):
                continue
            for key in o.needs:
                live = [(q, b) for q in range(size) if self._raw(q) and isinstance(b := self.events[q], ev.Binding)
                        and b.key == key]
                if live and not live[-1][1].regenerable:  # type: ignore[attr-defined]
                    out.append((key, live[-1][0], live[-1][1].value))  # type: ignore[attr-defined]
        return out

    def literals(self, start: int, stop: int) -> list[tuple[int, str, object]]:
        """Return ``(pos, field, value)`` of what an operation could act on in ``[start, stop)``: decisions, arguments, outputs, values."""
        out = []
        for p in range(start, stop):
            e = self.events[p]
            if not self._raw(p):
                continue
            if isinstance(e, ev.Binding):
                out.append((p, "value", e.value))
            elif isinstance(e, ev.ToolCall):
                out += [(p, "name", e.name)] + ([(p, "args", e.args)] if e.args else [])
            elif isinstance(e, ev.ToolResult) and e.output is not None:
                out.append((p, "output", e.output))
            elif isinstance(e, ev.Turn) and (e.role == "user" or e.status == "rejected"):
                out.append((p, "content", e.content))
            elif isinstance(e, ev.HandleOpened) and e.detail:
                out.append((p, "detail", e.detail))
        return out


def _reassembled(kept: list[ev.Excerpt], pos: int, name: str) -> object:
    """Return field ``name`` of the event at ``pos`` put back together from the excerpts of it (a sentinel if none)."""
    parts = [(e.path[len(name):], e.value) for e in kept
             if e.pos == pos and (e.path == name or e.path.startswith(name + ".") or e.path.startswith(name + "["))]
    whole = [v for rest, v in parts if rest == ""]
    if whole:
        return whole[0]
    if not parts:
        return _MISSING
    holder: list[Any] = [None]
    for rest, value in parts:
        cur: Any = holder
        slot: Any = 0
        for step in [x for x in rest.replace("[", ".[").split(".") if x]:
            key: Any = int(step[1:-1]) if step.startswith("[") else step
            if cur[slot] is None:
                cur[slot] = [] if isinstance(key, int) else {}
            container = cur[slot]
            if isinstance(key, int) != isinstance(container, list):
                return _MISSING  # excerpts that disagree on the field's shape keep nothing
            if isinstance(container, list):
                container.extend([None] * (key + 1 - len(container)))
            else:
                container.setdefault(key, None)
            cur, slot = container, key
        cur[slot] = value
    return holder[0]


_MISSING = object()


def retained(log: Log, node: ev.Summary) -> list[ev.Fact]:
    """Return the negative facts ``node`` retains: those it lists and, for an L2 node, those its children retain."""
    out = list(node.negative_facts)
    if node.tier == 2:
        for c in node.children:
            kid = log.events[c] if 0 <= c < len(log.events) else None
            if isinstance(kid, ev.Summary):
                out += retained(log, kid)
    return out


def tier_problems(log: Log, top: ev.Summary, size: int, spills: dict[int, ev.Spill]) -> list[str]:
    """Return what a summary tier at checkpoint ``size`` fails to hold, by the oracle: empty when it is safe to resume from."""
    start, stop = top.start, top.stop
    problems = []
    erased = sorted(log.redacted & set(range(start, stop)))
    if erased:
        problems.append(f"redacted positions {erased} in the span")
    owed = log.negatives(start, stop)
    facts = {(x.pos, x.status): x for x in retained(log, top)}
    for p, status in sorted(owed.items()):
        fact = facts.get((p, status))
        if fact is None:
            problems.append(f"negative fact at {p} ({status}) not retained")
            continue
        e = log.events[p]
        if isinstance(e, ev.ToolResult) and status == "failed" and isinstance(e.output, str) and e.output not in fact.text:
            problems.append(f"failed result at {p}: its error is not retained exactly")
        if isinstance(e, ev.Turn) and status == "rejected" and e.content not in fact.text:
            problems.append(f"rejection at {p}: its words are not retained")
    for x in top.negative_facts:
        if owed.get(x.pos) != x.status:
            problems.append(f"retained fact at {x.pos} ({x.status}) is not the log's")
    listed = {(i.pos, i.kind, i.id) for i in top.unresolved}
    open_items = log.open_items(start, stop)
    if listed != open_items:
        problems.append(f"unresolved items {sorted(listed)}, the log leaves open {sorted(open_items)}")
    done = {(i.pos, i.kind, i.id) for i in top.resolved}
    if done != log.resolved(start, stop):
        problems.append(f"resolved items {sorted(done)}, the log closes {sorted(log.resolved(start, stop))}")
    for key, pos, value in log.needed(size):
        if not start <= pos < stop:
            continue
        excerpt = any(e.pos == pos and e.path == "value" and _canon(e.value) == _canon(value) for e in top.kept)
        spilled = any(
            r.source == pos and r.handle.startswith("spill:") and (sp := spills.get(int(r.handle[6:]))) is not None
            and sp.source == pos and sp.key == key and _canon(sp.value) == _canon(value)
            for r in top.spills
        )
        if not (excerpt or spilled):
            problems.append(f"live value of {key!r} (pos {pos}) neither kept nor spilled")
    return problems


def lossless_problems(log: Log, node: ev.Summary, size: int, spills: dict[int, ev.Spill]) -> list[str]:
    """Return why ``node`` is no LOSSLESS node by the oracle: a literal of its span not kept exactly, or what a tier owes."""
    problems = [p for p in tier_problems(log, node, size, spills) if "neither kept nor spilled" not in p]
    for pos, name, value in log.literals(node.start, node.stop):
        got = _reassembled(node.kept, pos, name)
        if got is _MISSING or _canon(got) != _canon(value):
            problems.append(f"literal {pos}:{name} not kept exactly")
    return problems


# --- the property ------------------------------------------------------------------------


def _variants(art: cs.Artifact, other_pos: int | None) -> dict[str, cs.Artifact]:
    """Return ``art`` altered each way an artifact can be on its way through a context window."""

    def redigest(a: cs.Artifact) -> cs.Artifact:
        return msgspec.structs.replace(a, digest=artifact_digest(
            a.payload, a.span_root, loss=a.loss, session=a.session, node=a.node, size=a.size, root=a.root, store=a.store))

    payload = {**art.payload, "summary": f"{art.payload.get('summary')} (all kept)"}
    literals = art.payload.get("literals")
    if isinstance(literals, dict) and literals:
        name = sorted(literals)[0]
        payload = {**art.payload, "literals": {**literals, name: "migrations/EVIL_down.sql"}}
    out = {
        "relabelled": msgspec.structs.replace(art, loss="LOSSLESS"),
        "relabelled, digest recomputed": redigest(msgspec.structs.replace(art, loss="LOSSLESS")),
        "payload edited": msgspec.structs.replace(art, payload=payload),
        "payload edited, digest recomputed": redigest(msgspec.structs.replace(art, payload=payload)),
        "from another session": redigest(msgspec.structs.replace(art, session=f"{art.session}-other")),
    }
    if other_pos is not None:
        out["node position changed"] = redigest(msgspec.structs.replace(art, node=other_pos))
    return {k: v for k, v in out.items() if v != art}


def res_path(log: Log, node: int) -> list[int]:
    """Return the positions of the node at ``node`` and, for an L2, its children."""
    top = log.events[node]
    return [node, *(top.children if isinstance(top, ev.Summary) else [])]


def check(s: cs.Session, story: Story, marker_positions: list[int], log: Log, data: st.DataObject) -> None:
    """Hold every resume and every restoration of ``s`` to the oracle."""
    spills = {p: e for p, e in enumerate(log.events) if isinstance(e, ev.Spill)}
    # Erasing a redaction's body also leaves the positions it erased unaccounted for.
    gone: set[int] = set()
    if story.erased is not None:
        eraser = log.events[story.erased]
        gone = {story.erased, *(eraser.positions if isinstance(eraser, ev.Redaction) else ())}
    for m in marker_positions:
        marker = log.events[m]
        assert isinstance(marker, ev.RecoveryMarker)
        for rehash in (False, True):
            try:
                res = s.resume(m, rehash=rehash)
            except cs.IntegrityError:
                assert gone and min(gone) <= m, (m, rehash)
                continue
            if gone and min(gone) <= m:
                # An erased body under the marker: with rehash every body is read; without, one the resume reads.
                assert not rehash, f"resume({m}, rehash=True) passed over the body erased at {story.erased}"
            if res.mode != "certified":
                continue
            assert marker.node is not None, m
            top = log.events[marker.node]
            assert isinstance(top, ev.Summary), m
            problems = tier_problems(log, top, marker.size, spills)
            # With rehash every body under the marker is read. Without, the ones the resume reads
            # (its docstring: the rest of the span is vouched for by the stored tree and verify()).
            read = set(range(marker.size)) if rehash else (
                {m, *res_path(log, marker.node), *(x.pos for x in top.negative_facts), *(e.pos for e in top.kept),
                 *(r.source for r in top.spills), *(int(r.handle[6:]) for r in top.spills if r.handle[6:].isdigit()),
                 *range(top.start), *range(top.stop, marker.size)})
            problems += [f"the body at {p} was erased" for p in sorted(gone & read) if top.start <= p < top.stop]
            assert not gone & read, f"resume({m}, rehash={rehash}) certified over the body erased at {sorted(gone & read)}"
            assert not problems, (f"marker {m} (node {marker.node}, rehash={rehash}) certified", problems)
            if res.loss is cs.LossClass.LOSSLESS and res.restorable:
                assert not lossless_problems(log, top, marker.size, spills), (m, res.restorable)
    if story.erased is not None:
        return  # the restorations read the log through the same checked reads; the resumes showed them
    nodes = [(p, e) for p, e in enumerate(log.events) if isinstance(e, ev.Summary)]
    for pos, node in nodes:
        art = s.artifact(pos)
        honest = node.loss is cs.LossClass.LOSSLESS and not lossless_problems(log, node, len(log.events), spills)
        for op in sorted(RESTORATION_OPS):
            for how, restore in (
                ("Session.reconstruct", lambda a, o: s.reconstruct(a, o, attempt=f"a{next(_names)}")),
                ("cs.reconstruct", lambda a, o: cs.reconstruct(a, o, s.lookup, prior={})),
            ):
                if not honest:
                    with pytest.raises(cs.ReconstructionUnsoundError):
                        restore(art, op)
                        pytest.fail(f"{how} {op} restored from node {pos} ({node.loss.value}), which is not LOSSLESS")
        other = data.draw(st.sampled_from([p for p, _ in nodes if p != pos] or [None]), label="other node")
        for name, variant in _variants(art, other).items():
            if name == "node position changed":
                twin = s.artifact(other)  # type: ignore[arg-type]
                if (twin.loss, twin.payload, twin.span_root) == (variant.loss, variant.payload, variant.span_root):
                    continue  # the same artifact as the other node's: not altered
            for op in sorted(RESTORATION_OPS):
                with pytest.raises(cs.ReconstructionUnsoundError):
                    s.reconstruct(variant, op, attempt=f"a{next(_names)}")
                    pytest.fail(f"Session.reconstruct {op} restored from an artifact of node {pos}, {name}")
                if name == "from another session":
                    continue  # the pure function knows the durable source it is given, not whose it is
                with pytest.raises(cs.ReconstructionUnsoundError):
                    cs.reconstruct(variant, op, s.lookup, prior={})
                    pytest.fail(f"cs.reconstruct {op} restored from an artifact of node {pos}, {name}")


def run_property(target: str, data: st.DataObject, steps: int) -> None:
    """Write one drawn session, erase a body if drawn, and check every marker and node against the oracle."""
    name = f"p{next(_names)}"
    with cs.open(target, clock=cs.events.tick_clock()) as st_:
        s = st_.session(name)
        story = write(s, data, steps=steps)
        records = list(s.scan())
    log = Log(records)
    marker_positions = [r.pos for r in records if r.kind == "marker"]
    if story.erased is not None and (story.erased in log.redacted or not erase(target, name, story.erased)):
        story.erased = None
    with cs.open(target, clock=cs.events.tick_clock()) as st_:
        check(st_.session(name), story, marker_positions, log, data)


_SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}


@settings(max_examples=25, **_SETTINGS)  # type: ignore[arg-type]
@given(data=st.data())
def test_certified_means_safe_and_only_honest_lossless_restores(target: str, data: st.DataObject) -> None:
    """For drawn sessions, every certified resume holds what the oracle owes and every restoration is of an honest LOSSLESS node."""
    run_property(target, data, steps=14)


@pytest.mark.slow
@settings(max_examples=600, **_SETTINGS)  # type: ignore[arg-type]
@given(data=st.data())
def test_certified_means_safe_long_campaign(target: str, data: st.DataObject) -> None:
    """The same property over many more and longer sessions (run with --slow)."""
    run_property(target, data, steps=30)


# --- what the property found, one case each ----------------------------------------------------


def _lossless(s: cs.Session) -> cs.Node:
    s.append(cs.Turn("user", "I authorize deploying build 4812."))  # 0
    s.append(cs.ToolCall("c1", "deploy", {"path": "/srv/releases/4812"}))  # 1
    s.append(cs.Turn("assistant", "Deploying."))  # 2
    return s.compact(0, 3, keep=cs.AUTO, loss=cs.AUTO)


def test_an_artifact_edited_but_keeping_its_digest_is_refused(store: cs.Store) -> None:
    """Session.reconstruct refuses an artifact whose payload was edited while its old digest was kept."""
    s = store.session("m")
    art = s.artifact(_lossless(s))
    assert s.reconstruct(art, "authorize") == art.payload
    edited = msgspec.structs.replace(art, payload={**art.payload, "summary": "the user authorized build 9999"})
    for op in sorted(RESTORATION_OPS):
        with pytest.raises(cs.ReconstructionUnsoundError, match="altered"):
            s.reconstruct(edited, op, attempt="a-1")


def test_a_summary_edited_with_its_digest_recomputed_is_refused_by_the_pure_function(store: cs.Store) -> None:
    """cs.reconstruct holds the summary, facts, items and spills of the payload to the durable source too."""
    s = store.session("m")
    art = s.artifact(_lossless(s))
    payload = {**art.payload, "summary": "the user authorized build 9999"}
    edited = msgspec.structs.replace(art, payload=payload, digest=artifact_digest(
        payload, art.span_root, loss=art.loss, session=art.session, node=art.node, size=art.size, root=art.root,
        store=art.store))
    assert cs.reconstruct(art, "authorize", s.lookup) == art.payload
    with pytest.raises(cs.ReconstructionUnsoundError, match="summary differ"):
        cs.reconstruct(edited, "authorize", s.lookup)


def test_a_planted_lossless_node_restores_nothing_through_the_pure_function(store: cs.Store) -> None:
    """A node claiming LOSSLESS around admission, keeping nothing, is refused by cs.reconstruct as by the session."""
    s = store.session("m")
    node = _lossless(s)
    planted = msgspec.structs.replace(s.read(node.pos).event, kept=[], start=0, stop=3, ts=None)
    with unchecked():
        pos = s.append(planted).pos
    art = s.artifact(pos)
    assert art.loss is cs.LossClass.LOSSLESS and s.lookup(f"{pos}:restorable") is False
    with pytest.raises(cs.ReconstructionUnsoundError, match="does not vouch"):
        cs.reconstruct(art, "authorize", s.lookup)
    with pytest.raises(cs.ReconstructionUnsoundError, match="not kept"):
        s.reconstruct(art, "authorize")


def test_a_lossless_node_listing_a_phantom_item_restores_nothing(store: cs.Store) -> None:
    """A LOSSLESS node that lists an open call the log never opened is no exact record: no restoration, no restorable literal."""
    s = store.session("m")
    node = _lossless(s)
    phantom = msgspec.structs.replace(
        s.read(node.pos).event, unresolved=[ev.Item(2, "tool_call", "ghost")], ts=None)
    with unchecked():
        pos = s.append(phantom).pos
        marker = s.append(markers.marker(s.view, s.size, pos)).pos
    art = s.artifact(pos)
    for op in sorted(RESTORATION_OPS):
        with pytest.raises(cs.ReconstructionUnsoundError, match="ghost"):
            s.reconstruct(art, op, attempt="a-1")
        with pytest.raises(cs.ReconstructionUnsoundError):
            cs.reconstruct(art, op, s.lookup, prior={})
    for rehash in (False, True):
        res = s.resume(marker, rehash=rehash)
        assert res.restorable == [] and res.mode == "fallback"
