"""The structural index: the indexed marker checks give exactly what the full pass gives."""

from __future__ import annotations

import itertools
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_compaction import migration

import compactstore as cs
from compactstore.backends.protocol import SCHEMA_VERSION
from forge import unchecked
from sqlite_edit import unguarded
from compactstore import events as ev
from compactstore import markers, merkle, rules, structure
from compactstore.facts import FullFacts, IndexedFacts
from compactstore.index import Index, verify_session

_names = itertools.count()
KEYS = ["k1", "k2", "k3"]
IDS = ["a", "b", "c"]


# --- random sessions ------------------------------------------------------------------------



def index_of(s: cs.Session) -> Index | None:
    """The session's index, or None where a redaction means it is not read (the full path is)."""
    backend = s.store.backend
    sid = backend.session_id(s.name)
    return None if sid is None or backend.redactions(sid) else Index(backend, sid)

def _raw_event(draw: st.DrawFn, size: int) -> ev.Event:
    kind = draw(st.sampled_from(["turn", "call", "result", "bind", "oblige", "fulfil", "open", "close"]))
    status = draw(st.sampled_from([None, None, None, "ok", "failed", "rejected", "superseded"]))
    supersedes = draw(st.none() | st.integers(0, size - 1)) if size and draw(st.integers(0, 5)) == 0 else None
    common = {"status": status, "supersedes": supersedes}
    i = draw(st.sampled_from(IDS))
    if kind == "turn":
        return cs.Turn(draw(st.sampled_from(["user", "assistant"])), f"t{size}", **common)
    if kind == "call":
        return cs.ToolCall(f"c{i}", "run", **common)
    if kind == "result":
        ok = draw(st.booleans())
        return cs.ToolResult(f"c{i}", f"r{size}", ok=ok, **common)
    if kind == "bind":
        return ev.Binding(key=draw(st.sampled_from(KEYS)), value=size, regenerable=draw(st.booleans()), **common)
    if kind == "oblige":
        return ev.Obligation(name=f"o{i}", needs=draw(st.lists(st.sampled_from(KEYS), max_size=2, unique=True)),
                             **common)
    if kind == "fulfil":
        return ev.Fulfilment(name=f"o{i}", **common)
    if kind == "open":
        return ev.HandleOpened(handle=f"h{i}", resource="file", **common)
    return ev.HandleClosed(handle=f"h{i}", **common)


@st.composite
def sessions(draw: st.DrawFn) -> list[tuple[str, object]]:
    """A script of steps: raw events, compactions (L1, some lossy or wrong), digests (L2) and forged nodes."""
    steps: list[tuple[str, object]] = []
    size = 0
    for _ in range(draw(st.integers(4, 40))):
        what = draw(st.sampled_from(["raw"] * 6 + ["rebind", "compact", "digest", "forge"]))
        if what == "raw" or size < 2:
            steps.append(("raw", _raw_event(draw, size)))
            size += 1
        elif what == "rebind":  # a key bound again and then needed: anchoring must follow its live value
            key = draw(st.sampled_from(KEYS[:1]))
            steps.append(("raw", ev.Binding(key=key, value=f"v{size}")))
            steps.append(("raw", ev.Obligation(name=f"o{draw(st.sampled_from(IDS))}", needs=[key])))
            size += 2
        elif what == "compact":
            a = draw(st.integers(0, size - 1))
            b = draw(st.integers(a + 1, size))
            steps.append(("compact", (a, b, draw(st.sampled_from(["spill", "preserve", "drop"])),
                                      draw(st.booleans()))))
            size += 3  # at most: spills and the node
        elif what == "digest":
            steps.append(("digest", draw(st.integers(1, 3))))
            size += 1
        else:
            a = draw(st.integers(0, size - 1))
            # Some forged nodes claim an item resolved: closed in the span or not.
            lie = ev.Item(draw(st.integers(0, size - 1)), draw(st.sampled_from(["tool_call", "handle", "obligation"])),
                          draw(st.sampled_from([f"{p}{i}" for p in "cho" for i in IDS])))
            steps.append(("forge", (a, draw(st.integers(a + 1, size)), draw(st.sampled_from([[], [lie]])))))
            size += 1
    return steps


def append_raw(s: cs.Session, event: object) -> None:
    """Append a drawn raw event; one the store refuses is left out, and the script goes on."""
    try:
        s.append(event)  # type: ignore[arg-type]
    except cs.InvalidEvent:
        pass


def _play(s: cs.Session, steps: list[tuple[str, object]]) -> None:
    for what, arg in steps:
        if what == "raw":
            append_raw(s, arg)
        elif what == "compact":
            a, b, risk, drop = arg  # type: ignore[misc]
            try:
                if risk == "drop":
                    s.compact(a, b, negative_facts=[], unresolved=[], resolved=[], summary="gist",
                              on_risk="preserve") if drop \
                        else s.compact(a, b, on_risk="preserve", summary="gist")
                else:
                    s.compact(a, b, on_risk=risk, summary="gist")
            except (cs.InvalidArgument, cs.CompactionInvariantError):
                pass
        elif what == "digest":
            l1 = sorted((n for n in s.nodes() if n.tier == 1), key=lambda n: n.start)
            runs = [l1[i : i + arg] for i in range(len(l1))]  # type: ignore[operator]
            for run in runs:
                if len(run) == arg and all(x.stop == y.start for x, y in zip(run, run[1:])):
                    try:
                        s.roll_up(run, summary="roll-up")
                    except (cs.InvalidArgument, cs.CompactionInvariantError):
                        pass
                    break
        else:
            a, b, resolved = arg  # type: ignore[misc]
            b = min(b, s.size)
            if a < b:  # the script's sizes are estimates: some steps write nothing
                with unchecked():  # a node the store refuses: the checks must still see through it
                    s.append(ev.Summary(tier=1, start=a, stop=b, span_root=s.span_root(a, b).hex(), summary="forged",
                                        resolved=resolved))


def _both(s: cs.Session, size: int, node: int) -> tuple[object, object]:
    records = list(s.scan(0, size))
    leaves = [r.leaf for r in records]
    full = rules.check_marker(FullFacts([r.event for r in records], lambda a, b: merkle.span_root_of_leaves(leaves, a, b)), node)
    facts = s.view.facts(size)
    assert isinstance(facts, IndexedFacts)
    return full, rules.check_marker(facts, node)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=sessions(), data=st.data())
def test_indexed_checks_equal_the_full_pass(store: cs.Store, small_snapshots: None,
                                            steps: list[tuple[str, object]], data: st.DataObject) -> None:
    """For random sessions, every node and checkpoint: same violations and path, indexed or full; verify() is clean."""
    s = store.session(f"s{next(_names)}")
    _play(s, steps)
    size = s.size
    nodes = [n.pos for n in s.nodes()]
    for node in nodes:
        for at in sorted({node + 1, size, data.draw(st.integers(node + 1, size))}):
            full, indexed = _both(s, at, node)
            assert indexed == full, (node, at)
    if size:
        full, indexed = _both(s, size, data.draw(st.integers(0, size - 1)))
        assert indexed == full
        _verified(store, s)


@pytest.mark.parametrize("snapshots", [4, structure.SNAPSHOT_EVERY])
def test_items_opened_before_a_span_and_closed_in_it_are_checked_alike(
    store: cs.Store, monkeypatch: pytest.MonkeyPatch, snapshots: int
) -> None:
    """Calls, handles and obligations opened before a node's span and closed in it: same violations either path."""
    monkeypatch.setattr(structure, "SNAPSHOT_EVERY", snapshots)
    s = store.session(f"s{next(_names)}")
    s.append(cs.ToolCall("c1", "git push"))  # 0
    s.append(ev.HandleOpened(handle="h1", resource="file"))  # 1
    s.append(ev.Obligation(name="o1"))  # 2
    s.append(cs.ToolCall("c2", "ls"))  # 3: closed before the span
    s.append(cs.ToolResult("c2", "ok"))  # 4
    for i in range(5):
        s.append(cs.Turn("user", f"filler {i}"))  # 5..9
    s.append(cs.ToolResult("c1", "pushed"))  # 10
    s.append(ev.HandleClosed(handle="h1"))  # 11
    s.append(cs.Turn("user", "more"))  # 12
    s.append(ev.Fulfilment(name="o1"))  # 13
    careful = s.compact(8, 14, summary="pushed, closed, fulfilled")
    assert [(i.pos, i.kind) for i in careful.resolved] == [(0, "tool_call"), (1, "handle"), (2, "obligation")]
    careless = s.compact(6, 8, summary="filler")
    later = s.compact(5, 6, summary="one turn")
    l2 = s.roll_up([later, careless, careful], summary="all")
    assert l2.resolved == careful.resolved
    with unchecked():
        forged = s.append(ev.Summary(tier=1, start=10, stop=12, span_root=s.span_root(10, 12).hex(), summary="done"))
    with unchecked():
        liar = s.append(ev.Summary(tier=1, start=10, stop=12, span_root=s.span_root(10, 12).hex(), summary="done",
                               resolved=[*careful.resolved, ev.Item(3, "tool_call", "c2")]))
    seen = {}
    for node in (careful.pos, careless.pos, later.pos, l2.pos, forged.pos, liar.pos):
        full, indexed = _both(s, s.size, node)
        assert indexed == full, node
        seen[node] = [(v.condition, v.pos) for v in full[0]]  # type: ignore[index]
    assert seen[careful.pos] == seen[l2.pos] == [] and seen[careless.pos] == seen[later.pos] == []
    assert seen[forged.pos] == [("closure", 0), ("closure", 1)]
    assert seen[liar.pos] == [("closure", 2), ("closure", 3)]  # o1 is closed at 13, c2 before the span
    _verified(store, s)


def _verified(store: cs.Store, s: cs.Session) -> None:
    """Assert that the session's index is what its bodies give (verify()'s check, for one session)."""
    sid = s.view.sid()
    assert sid is not None
    problems: list[tuple[int | None, str]] = []
    heads = [h.size for h in store.backend.heads(sid, -1, 10**6)]
    verify_session(store.backend, sid, heads, lambda pos, what: problems.append((pos, what)))
    assert problems == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_batch_writes_the_index_its_events_write_one_by_one(store: cs.Store, small_snapshots: None,
                                                              data: st.DataObject) -> None:
    """Events appended in two batches give the very index rows they give appended one at a time."""
    one = store.session(f"s{next(_names)}")
    for i in range(data.draw(st.integers(1, 24))):
        append_raw(one, _raw_event(data.draw, i))
    events = [r.event for r in one.scan()]
    split = data.draw(st.integers(0, len(events)))
    batched = store.session(f"s{next(_names)}")
    batched.extend(events[:split])
    batched.extend(events[split:])

    def rows(s: cs.Session) -> list[object]:
        sid = s.view.sid()
        assert sid is not None
        return list(store.backend.index_after(sid, (-1, "", -1), 10**6))

    assert rows(batched) == rows(one)
    _verified(store, batched)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=sessions())
def test_resume_equals_resume_with_rehash(store: cs.Store, small_snapshots: None,
                                          steps: list[tuple[str, object]]) -> None:
    """A marker claiming every condition resumes to the same resolution with or without rehash."""
    s = store.session(f"s{next(_names)}")
    _play(s, steps)
    for node in [n.pos for n in s.nodes()]:
        size = s.size
        with unchecked():
            forged = s.append(ev.RecoveryMarker(size=size, root=s.head(size).root.hex(), node=node,
                                                conditions=list(markers.CONDITIONS)))
        assert s.resume(forged.pos) == s.resume(forged.pos, rehash=True)
        try:
            marker = s.mark(node)
        except cs.MarkerInvalid as exc:
            assert s.resume(forged.pos).mode == "fallback" and exc.violations  # type: ignore[attr-defined]
        else:
            assert s.resume(marker) == s.resume(marker, rehash=True)
            assert s.resume(marker).mode == "certified"


def test_the_index_is_written_with_the_events_and_read_for_open_items(store: cs.Store) -> None:
    """The migration story gives one row per fact: negatives, bindings, opens; the open items at the end."""
    s = store.session("m")
    migration(s)
    index = index_of(s)
    assert index is not None
    assert [(r.pos, r.key) for r in index.negatives(0, s.size)] == [(2, "failed"), (4, "rejected")]
    assert index.open_at(s.size) == {7: "obligation/finish-migration", 8: "handle/psql-1", 9: "tool_call/c2"}
    assert index.open_at(2) == {1: "tool_call/c1"} and index.open_at(3) == {}
    assert index.needs([7]) == {7: ["rollback", "tables"]}
    latest = index.latest_binding("rollback", s.size)
    assert latest is not None and (latest.pos, latest.num) == (5, 0)


def test_a_session_with_redactions_takes_the_full_path(store: cs.Store) -> None:
    """A redacted body no longer gives its facts: the index is not read, and the checks agree with the full pass."""
    s = store.session("m")
    migration(s)
    node = s.compact(0, 8, on_risk="preserve")
    s.redact([10], "personal data")  # after the span: the node still certifies
    assert index_of(s) is None
    marker = s.mark(node)
    assert s.resume(marker).mode == "certified"
    s.redact([3], "personal data")  # in the span: unknown now, so nothing certifies over it
    assert s.resume(marker).mode == "fallback"
    assert store.verify().ok


@pytest.mark.parametrize("change", [
    "UPDATE structure_index SET text = 'x' WHERE rel = 'negative' AND pos = 4",
    "UPDATE structure_index SET num = 1 WHERE rel = 'binding' AND pos = 5",
    "DELETE FROM structure_index WHERE rel = 'open' AND pos = 9",
    "INSERT INTO structure_index SELECT session_id, 3, 'negative', 'failed', 3, 'x' FROM structure_index LIMIT 1",
    "UPDATE structure_index SET session_id = 99 WHERE rel = 'close'",
    "INSERT INTO structure_index SELECT session_id, 100, 'size', '', 0, '' FROM structure_index LIMIT 1",
])
def test_a_tampered_index_row_is_reported_by_verify(sqlite_target: str, change: str) -> None:
    """Any change to the index (a cell, a row removed, added or moved to another session) makes verify() fail."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        migration(st.session("m"))
        assert st.verify().ok
    conn = unguarded(sqlite_target)
    conn.execute(change)
    conn.commit()
    conn.close()
    with cs.open(sqlite_target) as st:
        report = st.verify()
    assert not report.ok and any(p.table == "structure_index" for p in report.problems), report.problems


@pytest.mark.parametrize("sql", ["DELETE FROM structure_index", "UPDATE structure_index SET text = 'x'"])
def test_the_index_refuses_update_and_delete(target: str, sql: str) -> None:
    """The index is insert-only, like the log: the database refuses UPDATE and DELETE on it."""
    with cs.open(target, clock=cs.events.tick_clock()) as st:
        migration(st.session("m"))
    if target.startswith("postgresql"):
        import psycopg

        with psycopg.connect(target, autocommit=True) as pg, pytest.raises(psycopg.Error, match="append-only"):
            pg.execute(sql)  # type: ignore[arg-type]
    else:
        conn = sqlite3.connect(target)
        with pytest.raises(sqlite3.Error, match="append-only"):
            conn.execute(sql)
        conn.close()


def test_two_stores_appending_in_turn_keep_the_index_whole(target: str) -> None:
    """Two stores open on one target append to one session in turn: the index stays what the log gives."""
    with cs.open(target, clock=cs.events.tick_clock()) as a, cs.open(target, clock=cs.events.tick_clock()) as b:
        for i in range(6):
            s = (a if i % 2 else b).session("s")
            s.extend([cs.ToolCall(f"c{i}", "run"), cs.ToolResult(f"c{i}", "ERROR", ok=False, status="failed")])
            s.bind("k", i)
        assert a.verify().ok
        s = a.session("s")
        index = index_of(s)
        assert index is not None and len(index.negatives(0, s.size)) == 6 + 5  # failed results, superseded bindings


def _set_schema_version(target: str, version: str) -> None:
    """Rewrite the schema version a store's meta table records, as someone holding the database could."""
    sql = "UPDATE meta SET value = '{}' WHERE name = 'schema_version'".format(version)
    if target.startswith("postgresql"):
        import psycopg

        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute("ALTER TABLE meta DISABLE TRIGGER USER")
            conn.execute(sql)  # type: ignore[arg-type]
            conn.execute("ALTER TABLE meta ENABLE TRIGGER USER")
    else:
        conn = unguarded(target)
        conn.execute(sql)
        conn.commit()
        conn.close()


@pytest.mark.parametrize("version", ["1", str(int(SCHEMA_VERSION) - 1), str(int(SCHEMA_VERSION) + 1), ""])
def test_a_store_of_another_schema_version_is_refused(target: str, version: str) -> None:
    """A store whose meta names a schema version other than this library's is refused on open, with a hint."""
    with cs.open(target, clock=cs.events.tick_clock()) as st:
        migration(st.session("m"))
    _set_schema_version(target, version)
    with pytest.raises(cs.CompactStoreError, match=f"schema '?{version}'?[,;]") as info:
        cs.open(target)
    assert info.value.hint is not None
