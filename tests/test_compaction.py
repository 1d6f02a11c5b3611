"""Compaction: summary nodes, loss classes, the pre-compaction gate, spills and the audit."""

from __future__ import annotations

import pytest

import compactstore as cs
from compactstore.resolver import SummaryItem
from compactstore import merkle

ROLLBACK = "migrations/003_down.sql"


def migration(s: cs.Session) -> None:
    """Write the seed's migration story: failed dry run, rejection, rollback script, obligation."""
    s.append(cs.Turn("user", "Make the users.email migration reversible."))  # 0
    s.append(cs.ToolCall("c1", "run_sql", {"sql": "ALTER TABLE users ADD email_new text", "dry_run": True}))  # 1
    s.append(cs.ToolResult("c1", "ERROR: lock timeout on users", ok=False, status="failed"))  # 2
    s.append(cs.Turn("assistant", "Approach: add the column, then backfill in place."))  # 3
    s.append(cs.Turn("user", "No. Do not backfill in place.", status="rejected"))  # 4
    s.bind("rollback", ROLLBACK)  # 5: non-regenerable
    s.bind("tables", ["users", "orders"], regenerable=True, how="\\dt")  # 6
    s.oblige("finish-migration", needs=["rollback", "tables"])  # 7
    s.append(cs.events.HandleOpened(handle="psql-1", resource="subprocess", detail="psql app"))  # 8
    s.append(cs.ToolCall("c2", "run_sql", {"sql": "BEGIN"}))  # 9
    s.append(cs.Turn("assistant", "Running the migration now."))  # 10


@pytest.fixture
def session(store: cs.Store) -> cs.Session:
    """Return a session holding the migration story."""
    s = store.session("migration")
    migration(s)
    return s


def test_the_gate_refuses_a_lossy_compaction_that_loses_a_needed_binding(session: cs.Session) -> None:
    """Compacting the rollback script's span while an obligation needs it is refused; nothing is written."""
    with pytest.raises(cs.CompactionInvariantError) as info:
        session.compact(0, 8)
    assert [(r.obligation, r.key, r.binding_pos) for r in info.value.risks] == [  # type: ignore[attr-defined]
        ("finish-migration", "rollback", 5)
    ]
    assert "rollback" in str(info.value) and info.value.hint
    assert session.size == 11
    with pytest.raises(cs.CompactionInvariantError):
        session.assert_compaction_safe(0, 8)
    session.assert_compaction_safe(0, 5)  # the binding is outside this span
    session.assert_compaction_safe(6, 11)  # only the regenerable binding is inside


def test_preserve_keeps_the_binding_verbatim_under_a_contract(session: cs.Session) -> None:
    """on_risk="preserve" keeps the exact value in the node and says why."""
    node = session.compact(0, 8, on_risk="preserve")
    assert cs.events.Excerpt(5, "value", ROLLBACK) in node.kept
    assert node.contract and "finish-migration" in node.contract
    assert node.loss is cs.LossClass.LOSSY_GIST
    assert session.read(node.pos).kind == "node"


def test_spill_stores_the_binding_addressable_by_handle(session: cs.Session) -> None:
    """on_risk="spill" writes the value to the store; the handle in the node returns it exactly."""
    node = session.compact(0, 8, on_risk="spill")
    (ref,) = node.spills
    assert ref.key == "rollback" and ref.source == 5
    assert session.spilled(ref.handle) == ROLLBACK
    assert session.read(int(ref.handle.split(":")[1])).kind == "spill"
    assert node.pos == session.size - 1
    with pytest.raises(cs.InvalidArgument):
        session.spilled("spill:0")


def test_regenerable_bindings_never_block(store: cs.Store) -> None:
    """An obligation that needs only regenerable bindings does not stop a compaction."""
    s = store.session("s")
    s.bind("tables", ["users"], regenerable=True, how="\\dt")
    s.oblige("list", needs=["tables"])
    s.append(cs.Turn("user", "go"))
    node = s.compact(0, 3)
    assert node.kept == [] and node.spills == []


def test_a_fulfilled_obligation_no_longer_blocks(session: cs.Session) -> None:
    """Once the obligation is fulfilled, its binding may be compacted away."""
    session.fulfil("finish-migration")
    node = session.compact(0, 8)
    # It was still open at the node's boundary (fulfilled after it), so it is listed.
    assert [i.id for i in node.unresolved] == ["finish-migration"]
    with pytest.raises(cs.InvalidArgument):
        session.fulfil("finish-migration")


def test_nodes_record_span_root_and_structural_facts_by_default(session: cs.Session) -> None:
    """The default node retains every negative fact and lists every open item of its span."""
    node = session.compact(0, 11, on_risk="preserve")
    bodies = [r.body for r in session.scan(0, 11)]
    assert node.span_root == merkle.span_root(bodies, 0, 11) == session.span_root(0, 11)
    assert [(f.pos, f.status) for f in node.negative_facts] == [(2, "failed"), (4, "rejected")]
    assert [(i.pos, i.kind, i.id) for i in node.unresolved] == [
        (7, "obligation", "finish-migration"),
        (8, "handle", "psql-1"),
        (9, "tool_call", "c2"),
    ]
    assert (node.tier, node.start, node.stop) == (1, 0, 11)


def test_superseded_events_are_negative_facts(store: cs.Store) -> None:
    """An event named by a later `supersedes` is retained as superseded."""
    s = store.session("s")
    s.append(cs.Turn("assistant", "Plan A"))
    s.append(cs.Turn("assistant", "Plan B", supersedes=0))
    node = s.compact(0, 2)
    assert [(f.pos, f.status, f.text) for f in node.negative_facts] == [(0, "superseded", "assistant: Plan A")]


def test_explicit_lists_are_recorded_as_given(session: cs.Session) -> None:
    """A caller's own (incomplete) lists are kept as given, for the marker check to judge."""
    node = session.compact(0, 5, negative_facts=[2], unresolved=[], summary="explored approaches")
    assert [f.pos for f in node.negative_facts] == [2]
    assert node.unresolved == [] and node.summary == "explored approaches"
    with pytest.raises(cs.InvalidArgument):
        session.compact(5, 7, negative_facts=[6])  # pos 6 is not a negative fact


def test_bad_spans_are_refused_with_a_clear_error(session: cs.Session) -> None:
    """Empty, out-of-range and overlapping spans are refused and write nothing."""
    session.compact(0, 5)
    size = session.size
    for start, stop in ((3, 3), (5, 99), (-1, 2), (4, 6)):
        with pytest.raises(cs.InvalidArgument) as info:
            session.compact(start, stop)
        assert info.value.field == "span"
    assert "overlaps" in str(info.value)
    assert session.size == size
    with pytest.raises(cs.InvalidArgument):
        session.compact(5, 7, on_risk="ignore")  # type: ignore[arg-type]


def test_a_span_may_contain_earlier_derived_events(session: cs.Session) -> None:
    """An L1 span may cover an earlier node's event; only raw-position overlap is refused."""
    first = session.compact(0, 5)
    second = session.compact(5, first.pos + 1, on_risk="spill")
    assert second.start == 5 and second.stop == first.pos + 1


def test_lossless_needs_every_literal_kept(session: cs.Session) -> None:
    """LOSSLESS is refused unless every literal of the span (not only its bindings) is kept verbatim."""
    with pytest.raises(cs.CompactionInvariantError, match="cannot be LOSSLESS"):
        session.compact(0, 8, loss=cs.LossClass.LOSSLESS, keep=["rollback"])
    with pytest.raises(cs.CompactionInvariantError, match="pos 0 content, pos 1 name, pos 1 args.dry_run"):
        session.compact(0, 8, loss=cs.LossClass.LOSSLESS, keep=["rollback", "tables"])
    node = session.compact(0, 8, loss=cs.LossClass.LOSSLESS, keep=cs.AUTO)
    assert node.loss is cs.LossClass.LOSSLESS
    assert cs.events.Excerpt(5, "value", ROLLBACK) in node.kept
    assert cs.events.Excerpt(6, "value", ["users", "orders"]) in node.kept


def test_keep_accepts_field_paths_provable_against_the_leaf(session: cs.Session) -> None:
    """keep=(pos, path) stores the exact field value of that event."""
    node = session.compact(0, 5, keep=[(2, "output"), (1, "args.sql")])
    assert node.kept == [
        cs.events.Excerpt(1, "args.sql", "ALTER TABLE users ADD email_new text"),
        cs.events.Excerpt(2, "output", "ERROR: lock timeout on users"),
    ]
    with pytest.raises(cs.InvalidArgument):
        session.compact(0, 5, keep=[(2, "nope")])


def test_l2_digest_carries_facts_forward(session: cs.Session) -> None:
    """An L2 node over contiguous L1 nodes carries their facts and drops items resolved inside."""
    a = session.compact(0, 5)
    session.append(cs.ToolResult("c2", "COMMIT", ok=True))  # resolves c2 (opened at 9)
    b = session.compact(5, 11, on_risk="preserve")
    assert any(i.id == "c2" for i in b.unresolved)
    c = session.compact(11, session.size - 1, on_risk="preserve")  # covers the result of c2
    top = session.roll_up([a, b, c])
    assert (top.tier, top.start, top.stop, top.children) == (2, 0, c.stop, [a.pos, b.pos, c.pos])
    assert [f.pos for f in top.negative_facts] == [2, 4]  # the newest of what its children retain
    assert [f.pos for f in _retained(session, top)] == [2, 4]
    assert [i.id for i in top.unresolved] == ["finish-migration", "psql-1"]
    assert cs.events.Excerpt(5, "value", ROLLBACK) in top.kept
    assert top.loss is cs.LossClass.LOSSY_GIST
    assert top.span_root == session.span_root(0, c.stop)
    with pytest.raises(cs.InvalidArgument, match="overlaps"):
        session.roll_up([a, b])


def test_l2_refuses_gaps_and_stronger_loss_claims(session: cs.Session) -> None:
    """Non-contiguous children and a LOSSLESS claim over lossy children are refused."""
    a = session.compact(0, 3)
    c = session.compact(4, 5)
    with pytest.raises(cs.InvalidArgument, match="not contiguous"):
        session.roll_up([a, c])
    b = session.compact(3, 4)
    with pytest.raises(cs.CompactionInvariantError):
        session.roll_up([a, b], loss=cs.LossClass.LOSSLESS)
    with pytest.raises(cs.InvalidArgument):
        session.roll_up([session.roll_up([a, b])])


def test_nodes_survive_reopen_and_are_covered_by_verify(target: str) -> None:
    """Nodes are events: they are read back after reopening and verify() covers them."""
    with cs.open(target, clock=cs.events.tick_clock()) as st:
        s = st.session("m")
        migration(s)
        node = s.compact(0, 8, on_risk="spill")
    with cs.open(target) as st:
        s = st.session("m")
        assert s.node(node.pos) == node
        assert s.nodes() == [node]
        assert st.verify().ok
        assert s.spilled(node.spills[0].handle) == ROLLBACK


def test_the_extractive_summarizer_is_deterministic_and_drops_literals(session: cs.Session) -> None:
    """Same span, same text; binding values do not appear in it."""
    records = list(session.scan(0, 8))
    text = cs.summarize.extractive(records)
    assert text == cs.summarize.extractive(records)
    assert ROLLBACK not in text and "bound rollback" in text and "[rejected]" in text


def test_a_summarizer_is_a_plain_callable_over_the_span(session: cs.Session) -> None:
    """The summarizer receives the span's records and its text is stored."""
    seen: list[int] = []

    def summarize(records: list[cs.Record]) -> str:
        seen.extend(r.pos for r in records)
        return f"{len(records)} events"

    node = session.compact(0, 4, summarizer=summarize)
    assert seen == [0, 1, 2, 3] and node.summary == "4 events"


def test_audit_is_empty_on_a_clean_log(session: cs.Session) -> None:
    """A log where every needed binding stayed reachable yields no findings."""
    session.compact(0, 8, on_risk="preserve")
    session.oblige("verify-rollback", needs=["rollback"])
    assert session.audit() == []


def test_audit_finds_a_binding_destroyed_before_anyone_needed_it(store: cs.Store) -> None:
    """Seed 001's signal: compacted while unneeded, then needed by a later obligation."""
    s = store.session("s")
    s.append(cs.Turn("user", "prepare the migration"))  # 0
    s.bind("rollback", ROLLBACK)  # 1: no obligation needs it yet, so the gate lets it go
    s.append(cs.Turn("assistant", "rollback script written"))  # 2
    node = s.compact(0, 3)  # 3
    for i in range(4):
        s.append(cs.Turn("assistant", f"step {i}"))  # 4..7
    s.oblige("roll-back", needs=["rollback"])  # 8
    s.append(cs.ToolCall("c9", "run_file", {"path": "?"}, uses=["rollback"]))  # 9
    (finding,) = s.audit()
    assert (finding.node, finding.key, finding.binding_pos, finding.needed_at) == (node.pos, "rollback", 1, 8)
    assert finding.steps_later == 5 and "roll-back" in finding.via


def test_audit_spares_kept_spilled_and_rebound_bindings(store: cs.Store) -> None:
    """A node that kept the binding, or a later raw re-binding, keeps it reachable."""
    s = store.session("s")
    s.bind("commit", "9f2c1e0")
    s.bind("path", "/srv/app")
    s.append(cs.Turn("user", "x"))
    s.compact(0, 3, keep=["commit"])
    s.bind("path", "/srv/app")  # re-bound raw, outside any compacted span
    s.append(cs.Turn("user", "use them", uses=["commit", "path"]))
    assert s.audit() == []


def test_l2_retains_what_became_negative_after_its_children_were_written(store: cs.Store) -> None:
    """An event of the first L1 superseded inside the second L1's span is a negative fact of the L2."""
    s = store.session("s")
    s.append(cs.Turn("assistant", "Plan A"))  # 0
    s.append(cs.Turn("user", "go"))  # 1
    a = s.compact(0, 2)
    s.append(cs.Turn("assistant", "Plan B", supersedes=0))  # 3
    b = s.compact(2, 4)  # from the first node's own event on: contiguous with it
    top = s.roll_up([a, b])
    assert [(f.pos, f.status) for f in b.negative_facts] == [(0, "superseded")]
    assert [(f.pos, f.status) for f in _retained(s, top)] == [(0, "superseded")]
    assert s.resume(s.mark(top)).mode == "certified"


def _retained(s: cs.Session, node: cs.Node) -> list[cs.events.Fact]:
    """Return the negative facts a certified resume from ``node`` shows it retains (an L2's, its children's too)."""
    got = s.resume(s.mark(node))
    assert got.mode == "certified", got.reasons
    (item,) = [i for i in got.context if isinstance(i, SummaryItem)]
    return item.negative_facts


def test_rebinding_a_key_supersedes_its_earlier_value(store: cs.Store) -> None:
    """A summary that keeps an old binding value must also retain that it was superseded."""
    s = store.session("s")
    s.bind("target", "prod-1")  # 0
    s.bind("target", "prod-2", regenerable=True, how="ask the deploy tool")  # 1
    s.oblige("deploy", needs=["target"])  # 2
    node = s.compact(0, 2, keep=[(0, "value")], negative_facts=[])
    with pytest.raises(cs.MarkerInvalid) as info:
        s.mark(node)
    assert [(v.condition, v.pos) for v in info.value.violations] == [("negative_facts", 0)]  # type: ignore[attr-defined]
    assert [(f.pos, f.status) for f in s.compact(2, 3).negative_facts] == []
