"""What "certified" rests on: live binding values, LOSSLESS by literals, retained facts and items held to the log."""

from __future__ import annotations

import msgspec
import pytest
from forge import unchecked
from test_compaction import ROLLBACK, migration

import compactstore as cs
from compactstore import compaction, markers, rules
from compactstore import events as ev
from compactstore.events import Excerpt, Fact, Item

REJECTION = Fact(4, "rejected", "user: No. Do not backfill in place.")


def _planted_marker(s: cs.Session, node: int) -> int:
    """Plant a marker that certifies ``node`` without the emission checks; return its position."""
    with unchecked():
        return s.append(markers.marker(s.view, s.size, node)).pos


def _falls_back(s: cs.Session, marker: int) -> None:
    """Assert that resuming from ``marker`` falls back to the raw log, with and without rehashing."""
    for rehash in (False, True):
        assert s.resume(marker, rehash=rehash).mode == "fallback", rehash


def _built(s: cs.Session, start: int, stop: int, **kwargs: object) -> ev.Summary:
    """Return the L1 node ``compact`` would append over ``[start, stop)`` now, without appending it."""
    node = compaction.compaction(s.view, s.size, start, stop, **kwargs)[-1]  # type: ignore[arg-type]
    assert isinstance(node, ev.Summary)
    return node


# --- class 2: a binding is kept by the position of its live value -----------------------------


def _rebound_then_needed(s: cs.Session) -> tuple[cs.Node, cs.Node]:
    """A keeps rollback=v1, B re-binds it to v2 and keeps nothing, then an obligation needs rollback."""
    s.append(cs.Turn("user", "Prepare the migration."))  # 0
    s.bind("rollback", "migrations/003_down.sql")  # 1: v1
    s.append(cs.Turn("assistant", "Rollback script v1 written."))  # 2
    a = s.compact(0, 3, keep=["rollback"])  # 3
    s.bind("rollback", "migrations/004_down.sql")  # 4: v2, the live value from here on
    s.append(cs.Turn("assistant", "Rollback script rewritten."))  # 5
    b = s.compact(3, 6)  # 6: no obligation needs rollback yet, so the gate lets v2 go
    s.oblige("roll-back", needs=["rollback"])  # 7
    return a, b


def test_an_l2_inheriting_a_stale_excerpt_does_not_certify(store: cs.Store) -> None:
    """An L2 over a node keeping v1 and one that re-bound the key to v2 keeps nothing the obligation can use."""
    s = store.session("m")
    a, b = _rebound_then_needed(s)
    with pytest.raises(cs.MarkerInvalid):
        s.mark(b)
    top = s.roll_up([a, b])
    assert Excerpt(1, "value", "migrations/003_down.sql") in a.kept
    assert top.kept == []  # a digest carries only the values still live at its stop
    with pytest.raises(cs.MarkerInvalid) as info:
        s.mark(top)
    assert ("anchoring", 4) in [(v.condition, v.pos) for v in info.value.violations]  # type: ignore[attr-defined]
    _falls_back(s, _planted_marker(s, top.pos))
    (finding,) = s.audit()
    assert (finding.node, finding.key, finding.binding_pos, finding.needed_at) == (b.pos, "rollback", 4, 7)


def test_keep_naming_an_older_position_of_the_key_does_not_pass_the_gate(store: cs.Store) -> None:
    """keep=(pos, "value") of a value re-bound since does not keep the live one: the gate refuses, admission too."""
    s = store.session("m")
    s.bind("rollback", "migrations/003_down.sql")  # 0
    s.bind("rollback", "migrations/004_down.sql")  # 1
    s.oblige("roll-back", needs=["rollback"])  # 2
    with pytest.raises(cs.CompactionInvariantError) as info:
        s.compact(0, 3, keep=[(0, "value")])
    assert [(r.key, r.binding_pos) for r in info.value.risks] == [("rollback", 1)]  # type: ignore[attr-defined]
    s.assert_compaction_safe(0, 3, keep=["rollback"])  # a key keeps its live value
    stale = msgspec.structs.replace(
        _built(s, 0, 3, keep=[(0, "value")], on_risk="preserve"), kept=[Excerpt(0, "value", "migrations/003_down.sql")],
        contract=None)
    size = s.size
    with pytest.raises(cs.CompactionInvariantError, match="'rollback' bound at pos 1"):
        s.append(stale)
    assert s.size == size
    node = s.compact(0, 3, keep=[(0, "value")], on_risk="preserve")
    assert Excerpt(1, "value", "migrations/004_down.sql") in node.kept
    assert s.resume(s.mark(node)).mode == "certified"


def test_a_planted_node_keeping_a_stale_value_is_not_certified(store: cs.Store) -> None:
    """A node that entered the log around admission, keeping only the old value, is refused at mark and at resume."""
    s = store.session("m")
    s.bind("rollback", "migrations/003_down.sql")  # 0
    s.bind("rollback", "migrations/004_down.sql")  # 1
    s.oblige("roll-back", needs=["rollback"])  # 2
    stale = msgspec.structs.replace(
        _built(s, 0, 2, on_risk="preserve"), kept=[Excerpt(0, "value", "migrations/003_down.sql")], contract=None)
    with unchecked():
        node = s.append(stale).pos
    with pytest.raises(cs.MarkerInvalid, match="live value of binding 'rollback'"):
        s.mark(node)
    _falls_back(s, _planted_marker(s, node))


# --- class 4: LOSSLESS means every literal of the span is kept verbatim ------------------------


def _did_some_work(s: cs.Session) -> None:
    s.append(cs.Turn("user", "I authorize deploying build 4812 to prod."))  # 0: a decision
    s.append(cs.ToolCall("c1", "deploy", {"path": "/srv/releases/4812", "retries": 3}))  # 1
    s.append(cs.ToolResult("c1", "ERROR: E1234 disk quota exceeded on /srv", ok=False, status="failed"))  # 2
    s.append(cs.Turn("assistant", "The deploy failed; I will retry after cleanup."))  # 3


def test_a_summary_that_lists_but_does_not_keep_literals_is_not_lossless(store: cs.Store) -> None:
    """An authorization, a path argument and an exact error summarized as "did some work" is no LOSSLESS node."""
    s = store.session("m")
    _did_some_work(s)
    with pytest.raises(cs.CompactionInvariantError, match="pos 0 content, pos 1 name, pos 1 args.path"):
        s.compact(0, 4, summary="did some work", loss=cs.LossClass.LOSSLESS)
    assert [(e.pos, e.path) for e in rules.span_literals(s.view.facts(), 0, 4)] == [
        (0, "content"), (1, "name"), (1, "args.path"), (1, "args.retries"), (2, "output")]
    forged = msgspec.structs.replace(_built(s, 0, 4, summary="did some work", loss=cs.AUTO),
                                     loss=cs.LossClass.LOSSLESS)
    with pytest.raises(cs.CompactionInvariantError, match="cannot be LOSSLESS"):
        s.append(forged)
    node = s.compact(0, 4, summary="did some work", loss=cs.AUTO)
    assert node.loss is cs.LossClass.LOSSY_LITERAL
    with pytest.raises(cs.ReconstructionUnsoundError, match="LOSSY_LITERAL"):
        s.reconstruct(s.artifact(node), "authorize")


def test_keeping_every_literal_makes_an_honest_lossless_node(store: cs.Store) -> None:
    """keep=AUTO keeps each literal as an excerpt provable against its leaf; loss=AUTO then says LOSSLESS."""
    s = store.session("m")
    _did_some_work(s)
    node = s.compact(0, 4, summary="did some work", keep=cs.AUTO, loss=cs.AUTO)
    assert node.loss is cs.LossClass.LOSSLESS
    assert Excerpt(0, "content", "I authorize deploying build 4812 to prod.") in node.kept
    payload = s.reconstruct(s.artifact(node), "authorize")
    assert payload["literals"]["1:args.path"] == "/srv/releases/4812"  # type: ignore[index]
    # An excerpt of a whole field keeps every leaf under it.
    other = store.session("n")
    _did_some_work(other)
    whole = [(0, "content"), (1, "name"), (1, "args"), (2, "output")]
    assert other.compact(0, 4, keep=whole, loss=cs.LossClass.LOSSLESS).loss is cs.LossClass.LOSSLESS


def test_an_excerpt_equal_only_in_python_does_not_keep_a_literal(store: cs.Store) -> None:
    """Excerpts are held to their leaf by value digest: ``true`` does not keep the number ``1``."""
    s = store.session("m")
    s.append(cs.ToolCall("c1", "resize", {"replicas": 1}))
    s.append(cs.ToolResult("c1", "ok"))
    forged = msgspec.structs.replace(_built(s, 0, 2), kept=[Excerpt(0, "args.replicas", True)])
    with pytest.raises(cs.CompactionInvariantError, match="kept excerpt 'args.replicas' does not match"):
        s.append(forged)


def test_a_failed_results_error_longer_than_160_characters_is_retained_exactly(store: cs.Store) -> None:
    """The negative fact of a failed result holds its whole error, as the literal does; the index agrees."""
    error = "ERROR: migration 0042 failed: " + "duplicate key value violates unique constraint; " * 5 + "\n  at line 7"
    assert len(error) > 160
    s = store.session("m")
    s.append(cs.ToolCall("c1", "migrate", {"to": "0042"}))  # 0
    s.append(cs.ToolResult("c1", error, ok=False, status="failed"))  # 1
    node = s.compact(0, 2)
    assert node.negative_facts == [Fact(1, "failed", f"result c1 failed: {error}")]
    assert Excerpt(1, "output", error) in rules.span_literals(s.view.facts(), 0, 2)
    res = s.resume(s.mark(node))
    assert res.mode == "certified" and res == s.resume(res.marker, rehash=True)
    assert store.verify().ok


# --- class 5: retained facts and listed items are the log's --------------------------------------


@pytest.fixture
def session(store: cs.Store) -> cs.Session:
    """Return a session holding the migration story (pos 4: the user rejects backfilling in place)."""
    s = store.session("migration")
    migration(s)
    return s


def test_a_rejection_retained_as_a_supersession_is_refused(session: cs.Session) -> None:
    """A fact at the rejection's position with another status and text is refused by the API, admission and mark."""
    lie = Fact(4, "superseded", "user approved the backfill plan")
    size = session.size
    with pytest.raises(cs.InvalidEvent, match="does not match the log") as info:
        session.compact(0, 5, negative_facts=[2, lie])
    assert info.value.field == "negative_facts"
    forged = msgspec.structs.replace(_built(session, 0, 5), negative_facts=[*_built(session, 0, 5).negative_facts[:1], lie])
    with pytest.raises(cs.InvalidEvent) as info:
        session.append(forged)
    assert info.value.field == "negative_facts" and session.size == size
    # The right fact next to the false one does not make it true.
    with pytest.raises(cs.InvalidEvent):
        session.append(msgspec.structs.replace(forged, negative_facts=[*forged.negative_facts, REJECTION]))
    with unchecked():
        planted = session.append(forged).pos
    with pytest.raises(cs.MarkerInvalid) as marked:
        session.mark(planted)
    assert ("negative_facts", 4) in [(v.condition, v.pos) for v in marked.value.violations]  # type: ignore[attr-defined]
    _falls_back(session, _planted_marker(session, planted))


@pytest.mark.parametrize("pos", [-7, 5, 10**6], ids=["negative", "at the stop", "far past the log"])
def test_a_negative_fact_at_an_impossible_position_is_refused(session: cs.Session, pos: int) -> None:
    """A fact outside [0, stop) of the node is refused naming the field, by the API and at admission; never certified."""
    fact = Fact(pos, "failed", "ERROR: lock timeout on users")
    size = session.size
    with pytest.raises(cs.InvalidEvent, match="outside") as info:
        session.compact(0, 5, negative_facts=[*_built(session, 0, 5).negative_facts, fact])
    assert info.value.field == "negative_facts"
    forged = msgspec.structs.replace(_built(session, 0, 5), negative_facts=[fact, REJECTION, Fact(2, "failed", "x")])
    with pytest.raises(cs.InvalidEvent) as info:
        session.append(forged)
    assert info.value.field == "negative_facts" and session.size == size
    with unchecked():
        planted = session.append(msgspec.structs.replace(
            _built(session, 0, 5), negative_facts=[*_built(session, 0, 5).negative_facts, fact])).pos
    with pytest.raises(cs.MarkerInvalid, match="outside"):
        session.mark(planted)
    _falls_back(session, _planted_marker(session, planted))


@pytest.mark.parametrize("item", [
    Item(3, "tool_call", "ghost"),  # nothing was opened at pos 3
    Item(1, "tool_call", "c1"),  # opened there, but closed at 2, inside the span
    Item(9, "tool_call", "c2"),  # real and open, but after the span
    Item(-7, "handle", "psql-1"),
], ids=["ghost", "closed in the span", "outside the span", "negative"])
def test_a_phantom_unresolved_item_is_refused(session: cs.Session, item: Item) -> None:
    """An item listed as UNRESOLVED that the log did not open there and leave open is refused everywhere."""
    size = session.size
    with pytest.raises(cs.InvalidEvent) as info:
        session.compact(0, 5, unresolved=[item])
    assert info.value.field == "unresolved"
    forged = msgspec.structs.replace(_built(session, 0, 5), unresolved=[item])
    with pytest.raises(cs.InvalidEvent) as info:
        session.append(forged)
    assert info.value.field == "unresolved" and session.size == size
    with unchecked():
        planted = session.append(forged).pos
    with pytest.raises(cs.MarkerInvalid) as marked:
        session.mark(planted)
    assert ("closure", item.pos) in [(v.condition, v.pos) for v in marked.value.violations]  # type: ignore[attr-defined]
    _falls_back(session, _planted_marker(session, planted))


def test_a_phantom_resolved_item_is_refused_at_admission(session: cs.Session) -> None:
    """An item listed as resolved that was not opened before the span and closed in it is refused naming the field."""
    session.append(cs.ToolResult("c2", "COMMIT"))  # 11: closes c2, opened at 9
    size = session.size
    assert _built(session, 10, 12).resolved == [Item(9, "tool_call", "c2")]
    for lie in (Item(8, "handle", "psql-1"), Item(12, "tool_call", "c2")):
        with pytest.raises(cs.InvalidEvent) as info:
            session.compact(10, 12, resolved=[Item(9, "tool_call", "c2"), lie])
        assert info.value.field == "resolved" and session.size == size


def test_an_artifact_names_a_key_by_its_latest_kept_value(store: cs.Store) -> None:
    """A LOSSLESS artifact over a re-bound key carries both values: the key names the live one, ``pos:value`` the other."""
    s = store.session("m")
    s.bind("rollback", "migrations/003_down.sql")  # 0
    s.bind("rollback", ROLLBACK.replace("003", "004"))  # 1
    art = s.artifact(s.compact(0, 2, keep=cs.AUTO, loss=cs.LossClass.LOSSLESS))
    assert art.payload["literals"] == {"0:value": "migrations/003_down.sql", "rollback": "migrations/004_down.sql"}
    assert cs.reconstruct(art, "authorize", s.lookup) == art.payload
