"""The memory loop on its defaults: bounded by construction, cheap when nothing is due, and safe under racing maintainers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import compactstore as cs
from compactstore import events as ev
from compactstore.errors import SummaryTooLongError
from compactstore.resolver import RawItem, SummaryItem


def turn(s: cs.Session, t: int) -> None:
    """Append agent turn ``t``: a user turn, a tool call and its result (every 9th fails), now and then a binding and an obligation."""
    events: list[ev.Event] = [
        cs.Turn("user", f"step {t}: carry on with table t{t % 13}"),
        cs.ToolCall(f"c{t}", "run", {"step": t, "table": f"t{t % 13}"}),
        cs.ToolResult(f"c{t}", "timeout" if t % 9 == 4 else {"rows": t % 97}, ok=t % 9 != 4,
                      status="failed" if t % 9 == 4 else None),
    ]  # fmt: skip
    if t % 11 == 5:
        events.append(cs.Turn("user", f"No: do not backfill t{t % 13} in place.", status="rejected"))
    if t % 5 == 0:
        events.append(cs.Binding(key=f"snapshot{t % 4}", value=f"snap-{t:06d}"))
    if t % 50 == 10:
        events.append(cs.Obligation(name=f"restore-{t}", needs=[f"snapshot{t % 4}"]))
    if t % 50 == 40:
        events.append(cs.Fulfilment(name=f"restore-{t - 30}"))
    s.extend(events)


def fed(r: cs.Resolution) -> int:
    """Return the characters of the model input a resolution gives, as chat messages encoded as JSON."""
    return len(json.dumps(r.as_messages("chat"), ensure_ascii=False))


def test_the_defaults_keep_the_fed_context_and_the_digest_bounded(target: str) -> None:
    """With CompactionPolicy() and no summarizer the fed context and the digest's body stop growing with the session.

    A context's size moves with the phase of the policy (the raw tail, the L1 nodes not
    rolled up yet), so the most fed over a stretch of turns is held to the most fed over
    an earlier stretch of the same length.
    """
    most: dict[str, list[int]] = {"early": [0, 0], "late": [0, 0]}
    with cs.open(target, clock=ev.tick_clock()) as store:
        s = store.session("loop")
        for t in range(800):
            turn(s, t)
            s.maintain(cs.CompactionPolicy())
            stretch = "early" if 300 <= t < 400 else "late" if 700 <= t < 800 else None
            if stretch is not None:
                got = s.context()
                assert got.mode == "certified", got.reasons
                digest = max(i.pos for i in got.context if isinstance(i, SummaryItem) and i.tier == 2)
                top = most[stretch]
                top[0], top[1] = max(top[0], fed(got)), max(top[1], len(s.read(digest).body))
        assert store.verify().ok
    (fed_early, body_early), (fed_late, body_late) = most["early"], most["late"]
    assert fed_late <= 1.25 * fed_early, most
    assert body_late <= 1.25 * body_early, most


def test_an_l1_summarizer_reads_raw_events_and_a_roll_up_reads_each_child_once(store: cs.Store) -> None:
    """What the summarizer is handed: an L1 the raw events of its span only, a roll-up the digest and the L1 nodes after it."""
    s = store.session("inputs")
    seen: list[list[str]] = []

    def model(records: Sequence[cs.Record]) -> str:
        seen.append([r.kind for r in records])
        return f"{len(records)} records"

    policy = cs.CompactionPolicy(every=6, roll_up_every=2, summarizer=model)
    for t in range(40):
        turn(s, t)
        s.maintain(policy)
    l1 = [kinds for kinds in seen if "node" not in kinds]
    ups = [kinds for kinds in seen if "node" in kinds]
    assert l1 and ups
    assert all(not set(kinds) & ev.DERIVED_KINDS for kinds in l1)
    assert all(set(kinds) == {"node"} and len(kinds) <= 3 for kinds in ups)


def test_a_summary_over_the_limit_is_refused_by_name_and_nothing_is_written(store: cs.Store) -> None:
    """A summarizer returning more than summary_limit raises SummaryTooLongError naming both; the next maintain works."""
    s = store.session("long")
    for t in range(20):
        turn(s, t)
    size = s.size
    policy = cs.CompactionPolicy(every=10, summary_limit=50, summarizer=lambda records: "x" * 51)
    with pytest.raises(SummaryTooLongError) as info:
        s.maintain(policy)
    assert (info.value.field, info.value.limit, info.value.size) == ("summarizer", 50, 51)
    assert isinstance(info.value, cs.InvalidArgument) and "50" in str(info.value) and "51" in str(info.value)
    assert s.size == size
    done = s.maintain(cs.CompactionPolicy(every=10, summary_limit=50, summarizer=lambda records: "short"))
    assert done.compacted and done.marker is not None and s.context().mode == "certified"


def test_the_default_summarizer_stays_within_the_default_limit_however_long_its_input(store: cs.Store) -> None:
    """The extractive summarizer's text is at most its LIMIT, itself within the policy's default summary_limit."""
    s = store.session("wide")
    s.extend([cs.Turn("user", "word " * 500) for _ in range(300)])
    text = cs.summarize.extractive(list(s.scan()))
    assert len(text) <= cs.summarize.LIMIT <= cs.CompactionPolicy().summary_limit
    assert "more events" in text


def _rows_read(store: cs.Store) -> Callable[[], int]:
    """Count the event rows the store's backend reads from now on; return the counter."""
    backend = store.backend
    counted = [0]
    rows, rows_at, row = backend.rows, backend.rows_at, backend.row

    def spy_rows(*args: Any, **kwargs: Any) -> Any:
        for r in rows(*args, **kwargs):
            counted[0] += 1
            yield r

    def spy_rows_at(*args: Any, **kwargs: Any) -> Any:
        got = rows_at(*args, **kwargs)
        counted[0] += len(got)
        return got

    def spy_row(*args: Any, **kwargs: Any) -> Any:
        counted[0] += 1
        return row(*args, **kwargs)

    backend.rows, backend.rows_at, backend.row = spy_rows, spy_rows_at, spy_row  # type: ignore[method-assign]
    return lambda: counted[0]


def test_a_maintain_with_nothing_due_reads_only_what_was_appended_since(store: cs.Store) -> None:
    """Once a session is maintained, maintaining it again reads the rows appended since, not the session."""
    s = store.session("idle")
    for t in range(300):
        turn(s, t)
        s.maintain(cs.CompactionPolicy())
    count = _rows_read(store)
    assert s.maintain(cs.CompactionPolicy()) == cs.policy.Maintenance()
    idle = count()
    s.append(cs.Turn("user", "one more"))
    assert s.maintain(cs.CompactionPolicy(every=1000)) == cs.policy.Maintenance()  # the same plan, nothing due
    assert idle == 0 and count() - idle <= 2


def test_a_cold_context_reads_what_the_cover_needs_not_the_session(tmp_path: Path) -> None:
    """A fresh handle's context() reads about as many rows at 600 turns as at 150: the cover and the raw tail."""
    read: dict[int, int] = {}
    for turns in (150, 600):
        path = str(tmp_path / f"cold{turns}.db")
        with cs.open(path) as store:
            s = store.session("cold")
            for t in range(turns):
                turn(s, t)
                s.maintain(cs.CompactionPolicy())
        with cs.open(path) as store:
            count = _rows_read(store)
            assert store.session("cold").context().mode == "certified"
            read[turns] = count()
    assert read[600] <= read[150] + 40, read


MAINTAINER = textwrap.dedent(
    """
    import json, sys
    import compactstore as cs
    target, who, turns = sys.argv[1], sys.argv[2], int(sys.argv[3])
    done = {"compacted": 0, "rolled_up": 0, "markers": 0}
    with cs.open(target) as store:
        s = store.session("raced")
        for t in range(turns):
            s.extend([cs.Turn("user", f"{who} step {t}"), cs.ToolCall(f"{who}-{t}", "run", {"t": t}),
                      cs.ToolResult(f"{who}-{t}", "timeout" if t % 7 == 3 else "ok", ok=t % 7 != 3,
                                    status="failed" if t % 7 == 3 else None)])
            got = s.maintain(cs.CompactionPolicy(every=12, roll_up_every=3))
            done["compacted"] += len(got.compacted)
            done["rolled_up"] += len(got.rolled_up)
            done["markers"] += got.marker is not None
    print(json.dumps(done))
    """
)


def test_two_maintainers_racing_on_one_session_each_do_the_work_or_find_it_done(target: str) -> None:
    """Two processes appending and maintaining one session raise nothing; the nodes never overlap and the store verifies."""
    cs.open(target).close()
    procs = [subprocess.Popen([sys.executable, "-c", MAINTAINER, target, who, "60"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
             for who in ("a", "b")]  # fmt: skip
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        outs.append(json.loads(out))
    with cs.open(target) as store:
        s = store.session("raced")
        l1 = sorted((n.start, n.stop) for n in s.nodes() if n.tier == 1)
        assert all(a[1] <= b[0] for a, b in zip(l1, l1[1:]))
        assert sum(o["compacted"] for o in outs) == len(l1)
        assert s.maintain(cs.CompactionPolicy(every=12, roll_up_every=3)).compacted == []
        got = s.context()
        assert got.mode == "certified" and any(isinstance(i, SummaryItem) for i in got.context)
        assert store.verify().ok


def test_a_tool_result_outside_the_cover_comes_with_its_summarized_call(target: str) -> None:
    """A result whose call a node summarized (open at its stop) is fed right after that call, read from the log."""
    with cs.open(target, clock=ev.tick_clock()) as store:
        s = store.session("pair")
        s.extend([cs.Turn("user", "Deploy it."), cs.ToolCall("c1", "deploy", {"env": "prod"})])
        s.compact(0, 2)  # 2: the call is open at the stop, listed UNRESOLVED
        s.append(cs.ToolResult("c1", "deployed"))  # 3
        marker = s.mark()
        for got in (s.resume(marker), s.context()):
            assert got.mode == "certified"
            raw = [(i.pos, i.event.kind) for i in got.context if isinstance(i, RawItem)]
            assert raw == [(1, "tool_call"), (3, "tool_result")]
            chat = got.as_messages("chat")
            calls = [m for m in chat if m.get("tool_calls")]
            assert calls and calls[-1]["tool_calls"][0]["id"] == "c1"  # type: ignore[index]
            assert chat[chat.index(calls[-1]) + 1] == {"role": "tool", "tool_call_id": "c1", "content": "deployed"}


def _note_bound(limit: int) -> int:
    """Return the most characters one summary node adds to the fed context, its summary at most ``limit`` long.

    The renderer's caps, each with room for its line's framing and JSON escaping.
    """
    r = cs.render
    per_node = (
        400 + min(limit, r.SUMMARY_EXCERPT)
        + r.FACTS_IN_FULL * (r.FACT_EXCERPT + 60) + r.EARLIER_GROUPS * (r.GROUP_EXCERPT + 120) + 600
        + 3 * (r.ITEMS_LISTED * (r.NAME_EXCERPT + 80) + 200)
        + r.SPILLS_LISTED * (2 * r.NAME_EXCERPT + 120) + r.CONTRACT_EXCERPT + 200
    )
    return 2 * per_node  # every character may be escaped once in JSON


def _shared_bound() -> int:
    """Return the most characters the fed context's note gives besides its nodes: logged raw events and needed literals."""
    r = cs.render
    return 2 * (r.LOGGED_LINES * (r.TEXT_EXCERPT + r.VALUE_EXCERPT + 100) + r.NEEDED_LINES * (r.VALUE_EXCERPT + 2 * r.NAME_EXCERPT + 100) + 1000)


turn_shapes = st.lists(st.sampled_from(["say", "call", "fail", "reject", "bind", "oblige", "fulfil", "open"]), min_size=1, max_size=6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=st.lists(turn_shapes, min_size=40, max_size=160), every=st.integers(2, 25), up=st.integers(1, 4),
       limit=st.sampled_from([1, 300, 1500]))
def test_the_fed_context_is_at_most_the_raw_window_plus_a_constant_times_the_summary_bound(
        turns: list[list[str]], every: int, up: int, limit: int) -> None:
    """For any session and any summarizer bounded by B: fed <= the raw events after the cover + (nodes) x (B + the caps), nodes <= roll_up_every + 1."""
    policy = cs.CompactionPolicy(every=every, roll_up_every=up, summary_limit=limit,
                                 summarizer=lambda records: ("s" * limit)[:limit])
    with cs.open(":memory:") as store:
        s = store.session("bound")
        opened: list[str] = []
        for t, shapes in enumerate(turns):
            events: list[ev.Event] = []
            for i, shape in enumerate(shapes):
                cid = f"c{t}-{i}"
                if shape == "say":
                    events.append(cs.Turn("user", f"turn {t}: " + "words " * (i + 1)))
                elif shape in ("call", "fail"):
                    events += [cs.ToolCall(cid, "run", {"t": t}), cs.ToolResult(cid, f"ERROR {t}" if shape == "fail" else "ok",
                               ok=shape == "call", status="failed" if shape == "fail" else None)]  # fmt: skip
                elif shape == "reject":
                    events.append(cs.Turn("user", f"No, not plan {t}.", status="rejected"))
                elif shape == "bind":
                    events.append(cs.Binding(key=f"k{t % 3}", value=f"value {t}"))
                elif shape == "oblige" and t % 3 == 0:
                    events.append(cs.Obligation(name=f"o{t}", needs=[f"k{t % 3}"]))
                    opened.append(f"o{t}")
                elif shape == "fulfil" and opened:
                    events.append(cs.Fulfilment(name=opened.pop(0)))
                elif shape == "open":
                    events.append(cs.ToolCall(cid, "wait", {"t": t}))  # left open
            if any(isinstance(e, cs.Obligation) for e in events) and not any(
                    isinstance(e, cs.Binding) for e in events) and s.size == 0:
                events = [cs.Binding(key=f"k{t % 3}", value="first")] + events
            try:
                s.extend(events)
            except cs.InvalidArgument:
                continue  # an obligation on a key never bound: the script's own slip, nothing written
            s.maintain(policy)
        got = s.context()
        nodes = [i for i in got.context if isinstance(i, SummaryItem)]
        event(f"{got.mode}, {len(nodes)} nodes fed")
        assert len(nodes) <= up + 1
        stop = max((n.stop for n in nodes), default=0)
        tail = [i for i in got.context if isinstance(i, RawItem) and i.pos >= stop]
        raw_chars = len(json.dumps(cs.render.messages(tail, "chat"), ensure_ascii=False)) if tail else 0
        assert fed(got) <= raw_chars + len(nodes) * _note_bound(limit) + _shared_bound()
