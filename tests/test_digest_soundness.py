"""Digests that retain by reference: what a forged index row, a forged digest, a redaction or a batch cannot make certify."""

from __future__ import annotations

import json

import msgspec
import pytest

import compactstore as cs
from compactstore import compaction, markers
from compactstore import events as ev
from compactstore.resolver import SummaryItem
from forge import unchecked
from sqlite_edit import edited


def _failing_turn(s: cs.Session, t: int, error: str | None = None) -> None:
    """Append a user turn, a tool call and its failed result (the failure is a negative fact)."""
    s.extend([
        cs.Turn("user", f"step {t}"),
        cs.ToolCall(f"c{t}", "run", {"t": t}),
        cs.ToolResult(f"c{t}", error or f"permission denied on t{t}", ok=False, status="failed"),
    ])  # fmt: skip


def _grown_digest(s: cs.Session) -> tuple[cs.Node, cs.Node]:
    """Write L1 a, L1 b, digest D = [a, b], L1 c and digest D2 = [D, c]; return (D, D2). Pos 2 is a's failure."""
    _failing_turn(s, 0)
    a = s.compact(0, s.size, summary="a")
    _failing_turn(s, 1)
    b = s.compact(a.stop, s.size, summary="b")
    d = s.roll_up([a, b], summary="d")
    _failing_turn(s, 2)
    c = s.compact(b.stop, s.size, summary="c")
    return d, s.roll_up([d, c], summary="d2")


def _digest_facts(r: cs.Resolution) -> list[ev.Fact]:
    return [x for i in r.context if isinstance(i, SummaryItem) and i.tier == 2 for x in i.negative_facts]


@pytest.mark.parametrize("edit", [
    "UPDATE structure_index SET text = 'result c0 failed: transient, safe to retry' WHERE rel = 'negative' AND pos = 2",
    "DELETE FROM structure_index WHERE rel = 'negative' AND pos = 2",
    "INSERT INTO structure_index (session_id, pos, rel, key, num, text) "
    "SELECT session_id, 1, 'negative', 'rejected', 1, 'user rejected the migration' FROM structure_index LIMIT 1",
])  # fmt: skip
def test_a_forged_index_row_is_never_served_as_a_certified_digest_fact(target: str, edit: str) -> None:
    """A certified resume serves a digest's negative facts as the log gives them, never as an edited index row says (exact error, no dropped or invented fact)."""
    with cs.open(target, clock=ev.tick_clock()) as store:
        s = store.session("s")
        _grown_digest(s)
        marker = s.mark()
        honest = _digest_facts(s.resume(marker))
        assert ev.Fact(2, "failed", "result c0 failed: permission denied on t0") in honest
    with edited(target) as run:  # the index is outside the tree; this row is in the first digest's span
        run(edit)
    with cs.open(target) as store:
        s = store.session("s")
        for resolve in (lambda: s.resume(marker.pos), s.context):
            try:
                got = resolve()
            except cs.IntegrityError:
                continue
            assert got.mode == "fallback" or _digest_facts(got) == honest, (got.mode, _digest_facts(got))


def test_a_digest_grown_over_a_forged_digest_that_drops_a_failure_does_not_certify(target: str) -> None:
    """A digest written past admission that drops a failure: verify() names it, and a resume that re-hashes every body falls back.

    A default resume trusts that an earlier digest was admitted, as it trusts the stored
    tree for the bodies it does not read; rehash=True holds the whole chain to the log.
    """
    with cs.open(target, clock=ev.tick_clock()) as store:
        s = store.session("s")
        _failing_turn(s, 0)  # pos 2: failed
        l1a = compaction.compaction(s.view, s.size, 0, s.size, summary="a")[-1]
        assert isinstance(l1a, ev.Summary) and [x.pos for x in l1a.negative_facts] == [2]
        with unchecked():  # a writer skipping admission (the key and the database): L1 a drops the failure
            a = s.extend([msgspec.structs.replace(l1a, negative_facts=[])])[-1]
        _failing_turn(s, 1)
        b = s.compact(a.event.stop, s.size, summary="b")  # type: ignore[attr-defined]
        digest = compaction.roll_up(s.view, s.size, [a.pos, b.pos], summary="d")[-1]
        assert isinstance(digest, ev.Summary) and 2 in [x.pos for x in digest.negative_facts]
        with unchecked():  # ... and so does the digest over it
            d = s.extend([msgspec.structs.replace(digest, negative_facts=[])])[-1]
        assert any(p == d.pos for p, _ in s.rule_problems())  # verify() sees the forged digest
        # The honest writer grows the digest and marks its cover.
        _failing_turn(s, 2)
        c = s.compact(b.stop, s.size, summary="c")
        refused = (cs.CompactionInvariantError, cs.InvalidArgument, cs.InvalidEvent, cs.MarkerInvalid)
        try:
            d2 = s.roll_up([d.pos, c], summary="d2")
            marker = s.mark()
        except refused:
            return
        retained = {x.pos for n in (d2, c) for x in n.negative_facts}
        assert 2 not in retained  # no node of the tier lists the failure at pos 2
        assert s.resume(marker, rehash=True).mode == "fallback"
        assert not store.verify().ok


def test_a_certified_digest_context_does_not_silently_drop_its_earlier_negative_facts(store: cs.Store) -> None:
    """A certified digest's note lists its newest facts and names the earlier ones it retains by the recall handle that fetches them."""
    s = store.session("many")
    nodes: list[cs.Node] = []
    for chunk in range(5):
        start = nodes[-1].stop if nodes else 0
        for t in range(10):
            i = chunk * 10 + t
            s.extend([cs.ToolCall(f"c{i}", "run", {"t": i}),
                      cs.ToolResult(f"c{i}", f"error E{i:03d}: disk quota", ok=False, status="failed")])
        nodes.append(s.compact(start, s.size, summary=f"chunk {chunk}"))
    s.roll_up(nodes, summary="digest")
    s.mark()
    got = s.context()
    assert got.mode == "certified"
    (item,) = [i for i in got.context if isinstance(i, SummaryItem)]
    note = json.dumps(got.as_messages("chat"))
    missing = [f"E{i:03d}" for i in range(50) if f"E{i:03d}" not in note]
    first = cs.render.listed_from(item)
    told = f"recall facts:0-{first}" in note
    assert not missing or told, f"failures {missing} are certified retained but neither listed nor named in the note"
    assert len(item.negative_facts) == cs.rules.DIGEST_FACTS and missing == [f"E{i:03d}" for i in range(10)]
    assert "E000" in cs.recall.recall(s, f"facts:0-{first}")


def test_a_summary_written_before_a_redaction_does_not_bring_the_redacted_literal_back(target: str) -> None:
    """A redaction reaches every copy: a maintain that lost its race to a redaction does not append a summary quoting what it erased."""
    secret = "sk-live-7f3a9c21d0"
    with cs.open(target, clock=ev.tick_clock()) as store, cs.open(target) as other:
        s = store.session("r")
        s.append(cs.Turn("user", "set up the token"))
        bound = s.bind("token", secret, regenerable=True)
        for t in range(6):
            s.append(cs.Turn("user", f"step {t}"))
        summarized = []

        def model(records: list[cs.Record]) -> str:
            summarized.append(len(records))
            if len(summarized) == 1:  # another process redacts while the model writes
                other.session("r").redact([bound.pos], "leaked credential")
            return "notes: " + ", ".join(str(r.event.value) for r in records if isinstance(r.event, ev.Binding))

        s.maintain(cs.CompactionPolicy(every=8, roll_up_every=None, summarizer=model))
        erased_by = s.read(bound.pos).event
        assert isinstance(erased_by, ev.Redacted)
        copies = [r.pos for r in s.scan() if r.body is not None and secret.encode() in r.body]
        assert copies == [], f"the redacted literal is back in the log at {copies}"


def test_a_marker_appended_after_a_redaction_in_one_batch_is_not_certified(store: cs.Store) -> None:
    """A marker is emitted only if its conditions hold at its checkpoint: one after a redaction of its span in the same batch is refused, not certified to fall back at resume."""
    s = store.session("b")
    s.extend([cs.Turn("user", "plan"), cs.ToolCall("c1", "run", {}),
              cs.ToolResult("c1", "boom", ok=False, status="failed"), cs.Turn("user", "go on")])
    s.compact(0, 4, summary="s")
    marker = markers.cover_marker(s.view, s.size)
    try:
        got = s.extend([cs.Redaction(positions=[1], reason="pii"), marker])
    except (cs.MarkerInvalid, cs.InvalidEvent):
        return
    assert s.resume(got[-1].pos).mode == "certified", "the marker was emitted certified but resumes as fallback"
