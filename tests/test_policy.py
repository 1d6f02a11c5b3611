"""A compaction policy keeps a session compacted: every N events or at a budget, through the gate, idempotently."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Sequence

import pytest

import compactstore as cs
from compactstore import events as ev
from compactstore.policy import Compact, Mark, RollUp, Step


def play(s: cs.Session, turns: int, start: int = 0) -> None:
    """Append ``turns`` agent turns of four events each: a turn, a tool call, its result (every 7th failed), a binding."""
    for t in range(start, start + turns):
        failed = t % 7 == 3
        s.extend([
            cs.Turn("user", f"step {t}: carry on"),
            cs.ToolCall(f"c{t}", "run", {"step": t}),
            cs.ToolResult(f"c{t}", f"ERROR at step {t}" if failed else f"done {t}", ok=not failed,
                          status="failed" if failed else None),
            cs.Binding(key=f"k{t % 3}", value=f"value {t}", regenerable=True, how="re-run"),
        ])  # fmt: skip


def fake_model(records: Sequence[cs.Record]) -> str:
    """Summarize as a deterministic stand-in for a language model: a count and the failures."""
    failed = [r.pos for r in records if r.event.status == "failed"]
    return f"fake model: {len(records)} items, failures at {failed}"


def l1_spans(s: cs.Session) -> list[tuple[int, int]]:
    """Return the spans of the session's L1 nodes, in log order."""
    return [(n.start, n.stop) for n in s.nodes() if n.tier == 1]


def raw_before(s: cs.Session, stop: int) -> int:
    """Return how many raw (not derived) events lie before ``stop``."""
    return sum(r.kind not in ev.DERIVED_KINDS for r in s.scan(0, stop))


def test_the_policy_defaults_follow_the_seeds_and_bad_values_name_their_field() -> None:
    """Every 40 events, 80% of a budget, a roll-up every 5 nodes, spill on risk; bad values are refused by name."""
    p = cs.CompactionPolicy()
    assert (p.every, p.budget, p.threshold, p.roll_up_every, p.on_risk) == (40, None, 0.8, 5, "spill")
    for kwargs, field in [
        ({"every": 0}, "every"), ({"every": True}, "every"), ({"budget": -1}, "budget"),
        ({"every": None}, "every"), ({"threshold": 1.5}, "threshold"), ({"roll_up_every": "5"}, "roll_up_every"),
        ({"summarizer": "llm"}, "summarizer"), ({"on_risk": "drop"}, "on_risk"), ({"measure": 3}, "measure"),
    ]:  # fmt: skip
        with pytest.raises(cs.InvalidArgument) as exc:
            cs.CompactionPolicy(**kwargs)  # type: ignore[arg-type]
        assert exc.value.field == field


def test_maintain_compacts_every_40_events_rolls_up_and_marks_a_certified_resume(store: cs.Store) -> None:
    """Over 60 turns maintained as they go: an L1 node per 40 raw events, one digest over 5 of them, markers that certify."""
    s = store.session("long")
    policy = cs.CompactionPolicy(summarizer=fake_model)
    markers = []
    for chunk in range(12):
        play(s, 5, chunk * 5)
        done = s.maintain(policy)
        assert done.refused == []
        if done.marker is not None:
            markers.append(done.marker)
    spans = l1_spans(s)
    assert len(spans) == 6  # 240 raw events
    assert all(raw_before(s, b) - raw_before(s, a) == 40 for a, b in spans)
    assert all(a.stop == b.start for a, b in zip(s.nodes()[:-1], s.nodes()[1:]) if a.tier == b.tier == 1)
    digests = [n for n in s.nodes() if n.tier == 2]
    assert len(digests) == 1 and (digests[0].start, digests[0].stop) == (0, spans[4][1])
    assert all(n.summary.startswith("fake model: ") for n in s.nodes())
    assert len(markers) == 6 and all(s.resume(m).mode == "certified" for m in markers)
    assert s.maintain(policy) == cs.policy.Maintenance()  # nothing left to do: nothing written
    size = s.size
    assert s.maintain(policy).marker is None and s.size == size


def test_amaintain_awaits_an_async_summarizer(store: cs.Store) -> None:
    """An ``async def`` summarizer (a model call) writes the nodes' text; the marker certifies."""
    calls: list[int] = []

    async def model(records: Sequence[cs.Record]) -> str:
        await asyncio.sleep(0)
        calls.append(len(records))
        return fake_model(records)

    s = store.session("async")
    play(s, 25)
    done = asyncio.run(s.amaintain(cs.CompactionPolicy(summarizer=model, roll_up_every=2)))
    assert len(done.compacted) == 2 and len(done.rolled_up) == 1 and calls == [40, 40, 2]
    assert [s.node(p).summary for p in done.compacted] == [fake_model(s.view.read_span(a, b, records=True).records)
                                                           for a, b in l1_spans(s)]
    assert done.marker is not None and s.resume(done.marker).mode == "certified"


def test_maintain_refuses_an_async_summarizer_by_name_and_writes_nothing(store: cs.Store) -> None:
    """``maintain`` names ``summarizer`` for an async one, or one that returns a coroutine, before writing anything."""

    async def model(records: Sequence[cs.Record]) -> str:
        return "never"

    s = store.session("sync")
    play(s, 12)
    size = s.size
    for summarizer in (model, lambda records: model(records)):
        with pytest.raises(cs.InvalidArgument) as exc:
            s.maintain(cs.CompactionPolicy(summarizer=summarizer))
        assert exc.value.field == "summarizer" and "amaintain" in str(exc.value)
        assert s.size == size


def test_a_budget_triggers_compaction_at_80_percent_of_it(store: cs.Store) -> None:
    """With a budget only, the raw tail is compacted whole once its size reaches 80% of the budget, not before."""
    s = store.session("budget")
    policy = cs.CompactionPolicy(every=None, budget=1000, roll_up_every=None, measure=lambda r: 100)
    play(s, 1)
    s.append(cs.Turn("user", "three more"))
    s.append(cs.Turn("user", "two more"))
    s.append(cs.Turn("user", "one more"))  # 7 raw events: 700 of 1000
    assert s.maintain(policy) == cs.policy.Maintenance() and s.nodes() == []
    s.append(cs.Turn("user", "the eighth"))  # 800: due
    done = s.maintain(policy)
    assert l1_spans(s) == [(0, 8)] and done.marker is not None
    assert s.resume(done.marker).mode == "certified"


def test_a_gate_refusal_is_reported_and_retried_once_the_obligation_is_fulfilled(store: cs.Store) -> None:
    """Under ``on_risk="refuse"`` a compaction that would lose a needed binding is reported, not written, and done later."""
    s = store.session("gate")
    s.bind("rollback", "migrations/003_down.sql")
    s.oblige("finish-migration", needs=["rollback"])
    play(s, 10)
    policy = cs.CompactionPolicy(on_risk="refuse", roll_up_every=None)
    done = s.maintain(policy)
    assert done.compacted == [] and done.marker is None
    assert len(done.refused) == 1 and "rollback" in done.refused[0] and "[0, 40)" in done.refused[0]
    s.fulfil("finish-migration")
    done = s.maintain(policy)
    assert l1_spans(s) == [(0, 40)] and done.refused == [] and s.resume(done.marker or -1).mode == "certified"


def test_progress_reports_each_step_before_it_is_taken(store: cs.Store) -> None:
    """``progress`` sees the compactions, the roll-up and the marker, in order."""
    s = store.session("progress")
    play(s, 20)
    seen: list[Step] = []
    s.maintain(cs.CompactionPolicy(roll_up_every=2), progress=seen.append)
    assert [type(x) for x in seen] == [Compact, Compact, RollUp, Mark]


CRASH = textwrap.dedent(
    """
    import os, signal, sys
    import compactstore as cs
    calls = 0
    def dying_model(records):
        global calls
        calls += 1
        if calls == 3:  # two nodes are committed; the third summary never comes
            os.kill(os.getpid(), signal.SIGKILL)
        return f"model: {len(records)} items"
    with cs.open(sys.argv[1]) as store:
        store.session("crash").maintain(cs.CompactionPolicy(summarizer=dying_model, roll_up_every=3))
    """
)


def test_maintain_killed_partway_is_finished_by_running_it_again_without_duplicates(
    store: cs.Store, target: str
) -> None:
    """A process killed by SIGKILL mid-maintain leaves two nodes; maintain again writes the rest once, and it certifies."""
    s = store.session("crash")
    play(s, 40)
    proc = subprocess.run([sys.executable, "-c", CRASH, target], capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})  # fmt: skip
    assert proc.returncode == -signal.SIGKILL
    assert l1_spans(s) == [(0, 40), (40, 80)]
    done = s.maintain(cs.CompactionPolicy(summarizer=fake_model, roll_up_every=3))
    assert l1_spans(s) == [(0, 40), (40, 80), (80, 120), (120, 160)]
    assert len(done.compacted) == 2 and len(done.rolled_up) == 1
    assert [(n.start, n.stop) for n in s.nodes() if n.tier == 2] == [(0, 160)]
    assert done.marker is not None and s.resume(done.marker).mode == "certified"
    assert s.maintain(cs.CompactionPolicy(summarizer=fake_model, roll_up_every=3)) == cs.policy.Maintenance()
    assert store.verify().ok
