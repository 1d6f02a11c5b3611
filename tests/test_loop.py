"""The memory loop: a session digest that grows, markers over a cover, the context a resumed agent loads, loss manifests."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from forge import unchecked
from rich.console import Console

import compactstore as cs
from compactstore import events as ev
from compactstore.cli.page import page
from compactstore.cli.show import render
from compactstore.picture import picture
from compactstore.resolver import RawItem, SummaryItem


def _stretch(s: cs.Session, i: int, *, fail: bool = True) -> None:
    """Append one stretch of agent work: a user turn, a call and its result (failed when ``fail``), a reply."""
    s.append(cs.Turn("user", f"step {i}: migrate table t{i}"))
    s.append(cs.ToolCall(f"c{i}", "run_sql", {"sql": f"ALTER TABLE t{i}"}))
    if fail:
        s.append(cs.ToolResult(f"c{i}", f"ERROR {i}: lock timeout", ok=False, status="failed"))
    else:
        s.append(cs.ToolResult(f"c{i}", f"altered t{i}"))
    s.append(cs.Turn("assistant", f"done with t{i}"))


def _grown(s: cs.Session, times: int = 3, per: int = 2) -> tuple[list[cs.Node], list[cs.Node]]:
    """Compact stretches into L1 nodes and grow a digest over them ``times`` times; return the digests and the L1s after the last."""
    digests: list[cs.Node] = []
    start, i = 0, 0
    for _ in range(times):
        l1s = []
        for _ in range(per):
            _stretch(s, i)
            i += 1
            l1s.append(s.compact(start, s.size))
            start = l1s[-1].stop
        digests.append(s.roll_up(([digests[-1]] if digests else []) + l1s))
    after = []
    _stretch(s, i)
    after.append(s.compact(start, s.size))
    return digests, after


def test_a_digest_grown_three_times_certifies_over_its_cover(store: cs.Store) -> None:
    """A digest grown three times, then an L1 and a raw tail: the marker's cover is [digest, L1] and it certifies."""
    s = store.session("loop")
    digests, after = _grown(s)
    newest = digests[-1]
    assert [newest.start, newest.stop] == [0, digests[0].start + after[0].start]
    assert newest.children[0] == digests[1].pos and newest.tier == 2
    assert {x.pos for x in digests[0].negative_facts} <= {x.pos for x in newest.negative_facts}
    _stretch(s, 99, fail=False)
    m = s.mark()
    assert m.node == newest.pos and m.cover == [newest.pos, after[0].pos]
    assert [n.pos for n in s.cover()] == m.cover
    r = s.resume(m)
    assert r.mode == "certified", r.reasons
    summaries = [i for i in r.context if isinstance(i, SummaryItem)]
    assert [i.pos for i in summaries] == [newest.pos, after[0].pos]
    assert isinstance(r.context[0], SummaryItem) and isinstance(r.context[1], SummaryItem)
    raw = [i for i in r.context[2:] if isinstance(i, RawItem)]
    want = [x.pos for x in s.scan(after[0].stop, m.size) if x.kind not in ev.DERIVED_KINDS]
    assert len(raw) == len(r.context) - 2 and [i.pos for i in raw] == want and want
    assert r.loss is cs.LossClass.LOSSY_GIST
    assert s.resume(m, rehash=True).digest == r.digest


def test_an_old_digest_is_superseded_and_cannot_be_grown_again(store: cs.Store) -> None:
    """Once a digest is rolled up, growing it again is refused, through the API and through admission."""
    s = store.session("loop")
    digests, after = _grown(s, times=2)
    assert [n.pos for n in s.cover()] == [digests[-1].pos, after[0].pos]
    with pytest.raises(cs.InvalidArgument, match="already rolled up"):
        s.roll_up([digests[0], digests[1].children[1]])
    forged = ev.Summary(
        tier=2, start=0, stop=after[0].stop, span_root=s.span_root(0, after[0].stop).hex(), summary="fork",
        loss=cs.LossClass.LOSSY_GIST, children=[digests[0].pos, *digests[1].children[1:], after[0].pos],
    )
    with pytest.raises(cs.InvalidArgument, match="already rolled up"):
        s.append(forged)


def test_admission_accepts_only_a_digest_first_then_l1_nodes(store: cs.Store) -> None:
    """An L2 child anywhere but first, or a digest with no L1 node after it, is refused."""
    s = store.session("loop")
    digests, after = _grown(s, times=1)
    d = digests[0]
    with pytest.raises(cs.InvalidArgument, match="L2"):
        s.roll_up([d])
    stop = after[0].stop
    backwards = ev.Summary(tier=2, start=0, stop=stop, span_root=s.span_root(0, stop).hex(), summary="x",
                           loss=cs.LossClass.LOSSY_GIST, children=[*d.children, after[0].pos])
    with pytest.raises(cs.InvalidArgument, match="overlaps"):
        s.append(backwards)  # L1 nodes a digest already holds, rolled up again
    two = s.roll_up([d, after[0]])
    _stretch(s, 50)
    late = s.compact(two.stop, s.size)
    nested = ev.Summary(tier=2, start=0, stop=late.stop, span_root=s.span_root(0, late.stop).hex(), summary="x",
                        loss=cs.LossClass.LOSSY_GIST, children=[late.pos, two.pos])
    with pytest.raises(cs.InvalidArgument):
        s.append(nested)


def test_a_negative_fact_dropped_in_a_later_l1_refuses_the_cover_marker(store: cs.Store) -> None:
    """The conditions hold over the whole cover: an L1 after the digest that drops a failure refuses the marker."""
    s = store.session("loop")
    digests, after = _grown(s, times=2)
    _stretch(s, 77)
    careless = s.compact(after[0].stop, s.size, negative_facts=[])
    assert careless.negative_facts == []
    with pytest.raises(cs.MarkerInvalid) as refused:
        s.mark()
    assert any(v.condition == "negative_facts" for v in refused.value.violations)
    assert s.mark(digests[-1]).node == digests[-1].pos  # the digest alone still certifies


def test_a_forged_cover_marker_falls_back_at_resume(store: cs.Store) -> None:
    """A cover marker appended past admission over a careless L1 resumes as fallback, naming the dropped fact."""
    s = store.session("loop")
    digests, after = _grown(s, times=2)
    _stretch(s, 77)
    careless = s.compact(after[0].stop, s.size, negative_facts=[])
    good = s.mark(digests[-1])
    event = ev.decode(s.read(good.pos).body)
    assert isinstance(event, ev.RecoveryMarker)
    cover = [digests[-1].pos, after[0].pos, careless.pos]
    forged = msgspec.structs.replace(event, size=s.size, root=s.head().root.hex(), cover=cover,
                                     path=sorted({*event.path, after[0].pos, careless.pos}), ts=None)
    with unchecked():
        pos = s.append(forged).pos
    r = s.resume(pos)
    assert r.mode == "fallback" and any("negative_facts" in why for why in r.reasons)


def test_context_picks_the_latest_certifying_marker_and_adds_the_raw_tail(store: cs.Store) -> None:
    """context() resolves the latest marker that certifies and appends the raw events since, derived ones left out."""
    s = store.session("loop")
    assert s.context().mode == "fallback" and s.latest_marker() is None
    digests, after = _grown(s, times=2)
    first = s.mark()
    _stretch(s, 40)
    s.mark_raw()  # the latest marker certifies nothing: the one before it is used
    _stretch(s, 41, fail=False)
    r = s.context()
    assert r.mode == "certified" and r.marker == first.pos
    latest = s.latest_marker()
    assert latest is not None and latest.pos == first.pos
    assert r.size == s.size and r.root == s.head().root
    tail = [i for i in r.context if isinstance(i, RawItem) and i.pos >= first.size]
    want = [x.pos for x in s.scan(first.size) if x.kind not in ev.DERIVED_KINDS]
    assert [i.pos for i in tail] == want and tail
    assert s.context().digest == r.digest


def test_context_falls_back_with_reasons_when_no_marker_certifies(store: cs.Store) -> None:
    """With only a raw marker and a marker an obligation opened since makes stale, context() falls back and says why."""
    s = store.session("loop")
    s.append(cs.Turn("user", "keep the snapshot id"))
    s.bind("snapshot", "snap-0042")
    node = s.compact(0, 2)
    m = s.mark(node)
    s.mark_raw()
    assert s.context().marker == m.pos
    s.oblige("restore", needs=["snapshot"])  # needs a value the node dropped
    r = s.context()
    assert r.mode == "fallback" and r.marker == -1 and s.latest_marker() is None
    assert any("raw-checkpoint" in why for why in r.reasons)
    assert any(f"marker at pos {m.pos}" in why and "snapshot" in why for why in r.reasons)
    assert [i.pos for i in r.context if isinstance(i, RawItem)] == [0, 1, 5]


def test_context_digests_are_identical_across_backends(pg_url: str, tmp_path: Path) -> None:
    """The same log gives a byte-identical context digest on SQLite and on PostgreSQL."""
    digests = []
    for target in (str(tmp_path / "a.db"), pg_url):
        with cs.open(target, clock=cs.events.tick_clock()) as st:
            s = st.session("loop")
            _grown(s)
            s.mark()
            _stretch(s, 90)
            r = s.context()
            assert r.mode == "certified"
            digests.append(r.digest)
    assert digests[0] == digests[1]


def test_a_single_node_marker_keeps_its_bytes_and_digest(store: cs.Store) -> None:
    """A marker over one node is written without a cover, and resumes to the context it always gave."""
    s = store.session("loop")
    _stretch(s, 0)
    node = s.compact(0, s.size)
    m = s.mark()
    assert m.node == node.pos and m.cover == []
    assert b'"cover"' not in s.read(m.pos).body
    r = s.resume(m)
    assert [type(i).__name__ for i in r.context] == ["SummaryItem"]


def test_node_lost_lists_exactly_the_dropped_literals(store: cs.Store) -> None:
    """Node.lost lists each literal of the span neither kept nor stated in the summary, with its key or kind."""
    s = store.session("loop")
    s.append(cs.Turn("user", "make it reversible"))
    s.append(cs.ToolCall("c1", "run_sql", {"sql": "DROP COLUMN email"}))
    s.append(cs.ToolResult("c1", "lock timeout", ok=False, status="failed"))
    s.bind("rollback", "migrations/003_down.sql")
    s.bind("ticket", "OPS-7", regenerable=True)
    node = s.compact(0, 5, summary="user: make it reversible; run_sql failed: lock timeout", keep=["ticket"])
    # "run_sql" is stated in the summary, the SQL is not; the ticket is kept verbatim
    want = [ev.Lost(1, "args.sql", "tool_call"), ev.Lost(3, "value", "binding", "rollback")]
    assert node.lost == want
    assert s.node(node.pos).lost == want and [n.lost for n in s.nodes()] == [want]
    assert cs.Node.from_record(s.read(node.pos)).lost is None


def test_a_lossless_node_loses_nothing_and_a_redacted_position_is_listed(store: cs.Store) -> None:
    """A node that keeps every literal lists none; a node over a redacted position lists it as unknown."""
    s = store.session("loop")
    s.append(cs.Turn("user", "approve the plan"))
    s.bind("key", "k-1")
    node = s.compact(0, 2, keep=cs.AUTO, loss=cs.AUTO)
    assert node.loss is cs.LossClass.LOSSLESS and node.lost == []
    s.append(cs.Turn("user", "secret token tok-123"))
    s.append(cs.Turn("assistant", "noted"))
    later = s.compact(3, 5, summary="a token was given")
    assert [x.path for x in later.lost] == ["content"]
    s.redact([3], "secret")
    assert s.read(later.pos).kind == "redacted"  # built from the erased turn: erased with it
    again = s.compact(3, 5, summary="a turn was erased")
    assert again.lost == [ev.Lost(3, "", "redacted")]


def test_show_and_page_draw_the_loss_manifest(store: cs.Store) -> None:
    """The terminal picture and the HTML page list each node's lost literals."""
    s = store.session("loop")
    s.append(cs.Turn("user", "go"))
    s.bind("rollback", "migrations/003_down.sql")
    s.compact(0, 2, summary="user said go")
    pic = picture(s)
    assert pic.nodes[0].lost == [ev.Lost(1, "value", "binding", "rollback")]
    console = Console(width=200, record=True, highlight=False)
    console.print(render(pic, 200))
    text = console.export_text()
    assert "1:value (rollback)" in text
    assert "1:value (rollback)" in page(pic) and "lost (neither kept nor stated" in page(pic)
