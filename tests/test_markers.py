"""Recovery markers: the three conditions at emission, and resume trusting a marker wholesale or not at all."""

from __future__ import annotations

import sqlite3

import msgspec
import pytest
from test_compaction import ROLLBACK, migration

import compactstore as cs
from forge import unchecked
from sqlite_edit import unguarded
from compactstore import events as ev


@pytest.fixture
def session(store: cs.Store) -> cs.Session:
    """Return a session holding the migration story."""
    s = store.session("migration")
    migration(s)
    return s


def _violations(exc: pytest.ExceptionInfo[cs.MarkerInvalid]) -> list[tuple[str, int]]:
    return [(v.condition, v.pos) for v in exc.value.violations]  # type: ignore[attr-defined]


def test_a_complete_node_is_marked_and_resumes_certified(session: cs.Session) -> None:
    """A node with every fact, item and needed binding certifies all three conditions."""
    node = session.compact(0, 8, on_risk="preserve")
    session.append(cs.Turn("assistant", "after the compaction"))
    marker = session.mark(node)
    assert marker.conditions == ["closure", "negative_facts", "anchoring"]
    assert (marker.node, marker.size, marker.root) == (node.pos, marker.pos, session.head(marker.pos).root)
    res = session.resume(marker)
    assert res.mode == "certified"
    kinds = [type(i).__name__ for i in res.context]
    assert kinds == ["SummaryItem", "RawItem", "RawItem", "RawItem", "RawItem"]
    summary = res.context[0]
    assert isinstance(summary, cs.resolver.SummaryItem) and cs.events.Excerpt(5, "value", ROLLBACK) in summary.kept
    assert [i.pos for i in res.context if isinstance(i, cs.resolver.RawItem)] == [8, 9, 10, node.pos + 1]


def test_closure_fails_when_an_open_call_is_not_listed(session: cs.Session) -> None:
    """A tool call open at the boundary and missing from UNRESOLVED breaks closure."""
    node = session.compact(0, 11, on_risk="preserve", unresolved=["finish-migration", "psql-1"])
    with pytest.raises(cs.MarkerInvalid) as info:
        session.mark(node)
    assert _violations(info) == [("closure", 9)]
    assert "c2" in str(info.value)


def test_closure_holds_for_calls_resolved_inside_the_span(store: cs.Store) -> None:
    """A call and its result both in the span need no UNRESOLVED entry."""
    s = store.session("s")
    s.append(cs.ToolCall("c1", "ls"))
    s.append(cs.ToolResult("c1", ["a", "b"]))
    assert s.mark(s.compact(0, 2)).conditions


def _push_answered_later(s: cs.Session) -> None:
    """A ``git push`` called at pos 0 and answered at pos 3, with a handle and an obligation closed at 4 and 5."""
    s.append(cs.ToolCall("push-1", "git", {"args": ["push", "origin", "main"]}))  # 0
    s.append(ev.HandleOpened(handle="ssh-1", resource="subprocess"))  # 1
    s.oblige("ship")  # 2
    s.append(cs.ToolResult("push-1", "main -> main"))  # 3
    s.append(ev.HandleClosed(handle="ssh-1"))  # 4
    s.fulfil("ship")  # 5
    s.append(cs.Turn("assistant", "pushed"))  # 6


def test_a_call_opened_before_the_span_and_answered_in_it_is_listed_resolved(target: str) -> None:
    """compact lists what its span closed of what came before it; the marker certifies and resume says so."""
    with cs.open(target, clock=cs.events.tick_clock()) as st:
        s = st.session("s")
        _push_answered_later(s)
        node = s.compact(3, 7)
        assert node.resolved == [
            ev.Item(0, "tool_call", "push-1"), ev.Item(1, "handle", "ssh-1"), ev.Item(2, "obligation", "ship"),
        ]
        assert node.unresolved == []
        marker = s.mark(node)
        res = s.resume(marker)
        assert res.mode == "certified" and res == s.resume(marker, rehash=True)
        summary = next(i for i in res.context if isinstance(i, cs.resolver.SummaryItem))
        assert summary.resolved == node.resolved
        # The opening is shown raw before the node, its answer only through the node.
        assert [i.pos for i in res.context if isinstance(i, cs.resolver.RawItem)] == [0, 1, 2]
    with cs.open(target) as st:  # the same after a reopen
        assert st.session("s").resume(marker) == res


def test_closure_fails_when_a_call_answered_in_the_span_is_not_listed_resolved(target: str) -> None:
    """A careless node that leaves out what its span closed would let a resumed agent push again: refused."""
    with cs.open(target, clock=cs.events.tick_clock()) as st:
        s = st.session("s")
        _push_answered_later(s)
        careless = s.compact(3, 7, resolved=[])
        with pytest.raises(cs.MarkerInvalid) as info:
            s.mark(careless)
        assert _violations(info) == [("closure", 0), ("closure", 1), ("closure", 2)]
        assert "push-1" in str(info.value) and "RESOLVED" in str(info.value)
        partial = s.compact(0, 3, summary="called", resolved=[])  # opened and still open: nothing to list
        assert s.mark(partial).conditions


def test_an_l2_lists_what_its_whole_span_closed(target: str) -> None:
    """An L2 over children lists the items opened before its span and closed anywhere in it; a forged one is refused."""
    with cs.open(target, clock=cs.events.tick_clock()) as st:
        s = st.session("s")
        _push_answered_later(s)
        a, b = s.compact(1, 4), s.compact(4, 7)  # ssh-1 and ship opened in a, closed in b
        assert a.resolved == [ev.Item(0, "tool_call", "push-1")]
        assert b.resolved == [ev.Item(1, "handle", "ssh-1"), ev.Item(2, "obligation", "ship")]
        l2 = s.roll_up([a, b])
        assert l2.resolved == [ev.Item(0, "tool_call", "push-1")]
        assert s.resume(s.mark(l2)).mode == "certified"
        top = s.read(l2.pos).event
        assert isinstance(top, ev.Summary)
        with unchecked():
            forged = s.append(msgspec.structs.replace(top, resolved=[]))  # an L2 written elsewhere, without them
        with pytest.raises(cs.MarkerInvalid) as info:
            s.mark(forged.pos)
        assert _violations(info) == [("closure", 0)]


def test_negative_facts_fail_when_the_summary_drops_them(session: cs.Session) -> None:
    """Seed 003: 'agent explored approaches' drops the failed dry run and the rejection: refused."""
    node = session.compact(
        0, 8, summary="User requested the schema migration be reversible; agent explored approaches.",
        negative_facts=[], on_risk="preserve",
    )
    with pytest.raises(cs.MarkerInvalid) as info:
        session.mark(node)
    assert _violations(info) == [("negative_facts", 2), ("negative_facts", 4)]


def test_a_supersession_inside_the_span_of_a_raw_event_before_it_is_retained(store: cs.Store) -> None:
    """An event before the span, superseded inside it, is a negative fact of the node.

    The certified context shows the events before the node raw, so a node that swallows
    the plan revision or the re-binding would leave the stale plan and value there as
    current, with nothing in the context to say otherwise.
    """
    s = store.session("s")
    s.append(cs.Turn("assistant", "Plan A"))  # 0
    s.bind("target", "prod-1")  # 1
    s.oblige("deploy", needs=["target"])  # 2
    s.append(cs.Turn("assistant", "Plan B", supersedes=0))  # 3
    s.bind("target", "prod-2", regenerable=True, how="ask the deploy tool")  # 4: the gate lets it go
    s.append(cs.Turn("user", "go"))  # 5
    node = s.compact(3, 6)
    assert [(f.pos, f.status) for f in node.negative_facts] == [(0, "superseded"), (1, "superseded")]
    res = s.resume(s.mark(node))
    summary = next(i for i in res.context if isinstance(i, cs.resolver.SummaryItem))
    assert res.mode == "certified" and {f.pos for f in summary.negative_facts} == {0, 1}
    s.bind("target", "prod-3", regenerable=True, how="ask the deploy tool")  # 8: supersedes pos 4
    s.append(cs.Turn("user", "y"))  # 9
    careless = s.compact(8, 10, negative_facts=[])  # says nothing of the re-binding
    with pytest.raises(cs.MarkerInvalid) as info:
        s.mark(careless)
    assert _violations(info) == [("negative_facts", 4)]


def test_anchoring_fails_for_a_needed_binding_neither_kept_nor_spilled(session: cs.Session) -> None:
    """A binding compacted before an obligation needed it breaks anchoring once it is needed."""
    session.fulfil("finish-migration")
    node = session.compact(0, 8)  # nothing open needs the rollback script now
    session.mark(node)  # so this marker is valid
    session.oblige("roll-back", needs=["rollback"])
    with pytest.raises(cs.MarkerInvalid) as info:
        session.mark(node)
    assert _violations(info) == [("anchoring", 5)]


def test_anchoring_holds_for_a_spilled_binding(session: cs.Session) -> None:
    """Spilling the binding anchors it: the marker certifies."""
    node = session.compact(0, 8, on_risk="spill")
    assert session.resume(session.mark(node)).mode == "certified"


def test_anchoring_fails_for_a_forged_span_root(session: cs.Session) -> None:
    """A node whose span root does not match the log is refused at emission."""
    with unchecked():
        forged = session.append(ev.Summary(tier=1, start=0, stop=2, span_root="00" * 32, summary="x"))
    with pytest.raises(cs.MarkerInvalid) as info:
        session.mark(forged.pos)
    assert ("anchoring", forged.pos) in _violations(info)


def test_a_raw_marker_resumes_in_fallback_with_exactly_the_raw_events(session: cs.Session) -> None:
    """mark_raw names a checkpoint whose context is the raw log."""
    session.compact(0, 5)
    marker = session.mark_raw()
    res = session.resume(marker)
    assert res.mode == "fallback" and "raw-checkpoint" in res.reasons[0]
    raw = [r for r in session.scan(0, marker.size) if r.kind not in ev.DERIVED_KINDS]
    assert [(i.pos, i.event) for i in res.context if isinstance(i, cs.resolver.RawItem)] == [(r.pos, r.event) for r in raw]
    assert len(res.context) == len(raw)
    older = session.mark_raw(3)
    assert session.resume(older).size == 3 and len(session.resume(older).context) == 3


def test_a_forged_marker_written_past_emission_falls_back(session: cs.Session) -> None:
    """Seed 003's story: the lossy summary is refused at emission; forged into the log it resumes as fallback."""
    node = session.compact(0, 8, summary="agent explored approaches", negative_facts=[], keep=[], on_risk="preserve")
    with pytest.raises(cs.MarkerInvalid):
        session.mark(node)
    size = session.size
    with unchecked():
        forged = session.append(ev.RecoveryMarker(
            size=size, root=session.head(size).root.hex(), node=node.pos, conditions=["closure", "negative_facts", "anchoring"],
        ))
    res = session.resume(forged.pos)
    assert res.mode == "fallback"
    assert any("negative_facts at pos 2" in r for r in res.reasons)
    assert all(isinstance(i, cs.resolver.RawItem) for i in res.context)
    assert [i.pos for i in res.context] == [r.pos for r in session.scan(0, size) if r.kind not in ev.DERIVED_KINDS]


def test_a_marker_that_certified_less_falls_back(session: cs.Session) -> None:
    """A marker that does not claim every condition is not trusted."""
    node = session.compact(0, 8, on_risk="preserve")
    size = session.size
    with unchecked():
        partial = session.append(ev.RecoveryMarker(size=size, root=session.head(size).root.hex(), node=node.pos,
                                                   conditions=["closure"]))
    assert session.resume(partial.pos).mode == "fallback"


def test_one_marker_gives_one_digest_over_a_thousand_resumes_and_a_reopen(target: str) -> None:
    """Resolution digests are byte-identical on every call and after reopening."""
    with cs.open(target, clock=cs.events.tick_clock()) as st:
        s = st.session("m")
        migration(s)
        marker = s.mark(s.compact(0, 8, on_risk="spill"))
        digests = {s.resume(marker).digest for _ in range(1000)}
        raw = s.mark_raw()
        fallback = {s.resume(raw).digest for _ in range(3)}
    assert len(digests) == 1 and len(fallback) == 1 and digests != fallback
    with cs.open(target) as st:
        again = st.session("m").resume(marker.pos)
    assert {again.digest} == digests and again.mode == "certified"


def test_a_keyed_marker_carries_and_checks_a_mac(target: str) -> None:
    """In a keyed store the marker's checkpoint carries a MAC that resume checks."""
    with cs.open(target, key=b"k", clock=cs.events.tick_clock()) as st:
        s = st.session("m")
        migration(s)
        marker = s.mark(s.compact(0, 8, on_risk="preserve"))
        assert marker.mac is not None and st.check_head(s.head(marker.size))
        assert s.resume(marker).mode == "certified"
        size = s.size
        with unchecked():
            forged = s.append(ev.RecoveryMarker(size=size, root=s.head(size).root.hex(), node=marker.node,
                                                conditions=list(marker.conditions)))
        with pytest.raises(cs.IntegrityError, match="MAC"):
            s.resume(forged.pos)


def _sqlite(target: str) -> sqlite3.Connection:
    if "://" in target:
        pytest.skip("edits the SQLite file directly")
    return unguarded(target)


def _flip(target: str, pos: int, *, leaf: bool = False) -> None:
    """Flip one byte in the middle of the body at ``pos`` (and recompute its leaf when ``leaf``)."""
    conn = _sqlite(target)
    body = bytearray(conn.execute("SELECT body FROM events WHERE pos = ?", (pos,)).fetchone()[0])
    body[len(body) // 2] ^= 0x20
    conn.execute("UPDATE events SET body = ? WHERE pos = ?", (bytes(body), pos))
    if leaf:
        conn.execute("UPDATE events SET leaf = ? WHERE pos = ?", (cs.merkle.leaf_hash(bytes(body)), pos))
    conn.commit()
    conn.close()


@pytest.mark.parametrize("pos", [0, 2, 5, 7])
def test_one_tampered_raw_byte_under_a_certified_marker_never_certifies(target: str, pos: int) -> None:
    """With rehash=True, flipping a byte of any raw body under the marker gives IntegrityError, never certified."""
    with cs.open(target, clock=cs.events.tick_clock()) as st:
        s = st.session("m")
        migration(s)
        marker = s.mark(s.compact(0, 8, on_risk="preserve"))
        assert s.resume(marker).mode == "certified"
    _flip(target, pos)
    with cs.open(target) as st:
        try:
            res = st.session("m").resume(marker.pos, rehash=True)
        except (cs.IntegrityError, cs.InvalidEvent):
            return
    assert res.mode == "fallback"


@pytest.mark.parametrize(("pos", "what"), [(2, "a retained negative fact"), (4, "a retained negative fact"),
                                           (5, "a kept excerpt"), (9, "a raw event of the context"),
                                           (11, "the node"), (13, "the marker")])
@pytest.mark.parametrize("leaf", [False, True], ids=["body", "body-and-leaf"])
def test_a_tampered_byte_in_what_resume_reads_is_found_without_rehash(target: str, pos: int, what: str,
                                                                       leaf: bool) -> None:
    """By default resume re-hashes every body it reads or returns: a flipped byte there is an IntegrityError."""
    with cs.open(target, clock=cs.events.tick_clock()) as st:
        s = st.session("m")
        migration(s)  # 0..10
        node = s.compact(0, 8, on_risk="preserve")  # 11
        s.append(cs.Turn("assistant", "after the compaction"))  # 12
        marker = s.mark(node)  # 13
        assert marker.pos == 13 and s.resume(marker).mode == "certified"
    _flip(target, pos, leaf=leaf)
    with cs.open(target) as st, pytest.raises((cs.IntegrityError, cs.InvalidEvent)):
        st.session("m").resume(marker.pos)


def test_a_tampered_byte_resume_does_not_read_is_left_to_verify(sqlite_target: str) -> None:
    """A byte of a plain turn inside the compacted span: resume serves the summary, verify() and rehash=True find it."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        s = st.session("m")
        migration(s)
        marker = s.mark(s.compact(0, 8, on_risk="preserve"))
    _flip(sqlite_target, 3)
    with cs.open(sqlite_target) as st:
        s = st.session("m")
        assert s.resume(marker.pos).mode == "certified"
        assert not st.verify().ok
        with pytest.raises(cs.IntegrityError):
            s.resume(marker.pos, rehash=True)
