"""Retention: dropping the raw bodies a certified cover stands for keeps every proof, certification and context.

On both backends, through the public API: a session maintained on the default policy,
then ``Session.retain``. What must hold after: the context fed to the model is the same,
every marker resumes to the digest it gave, ``verify()`` passes, a dropped body reads as
dropped (by what and when), a restoration over it is refused with that reason, the
session goes on (maintenance, markers, redaction) and the store's file shrinks.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable

import msgspec
import pytest
from forge import unchecked
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compactstore as cs
from compactstore import events as ev
from compactstore import retention

KEPT_KINDS = {"binding", "obligation", "fulfilment", "node", "spill", "marker", "attempt", "redaction", "retention"}


def _turn(s: cs.Session, t: int, pad: int = 200) -> None:
    failed = t % 7 == 3
    s.extend([
        cs.Turn("user", f"turn {t}: continue with table t{t % 5} " + "x" * pad),
        cs.ToolCall(f"c{t}", "run_sql", {"table": f"t{t % 5}", "n": t}),
        cs.ToolResult(f"c{t}", f"ERROR E{t}" if failed else {"rows": t, "note": "y" * pad}, ok=not failed,
                      status="failed" if failed else None),
        cs.Turn("assistant", f"step {t} {'failed' if failed else 'done'}"),
    ])  # fmt: skip
    if t % 11 == 5:
        s.append(cs.Turn("user", f"no, not in place ({t})", status="rejected"))
    if t % 5 == 0:
        s.bind(f"snap{t % 3}", f"snap-{t}")
    if t % 20 == 10:
        s.oblige(f"restore-{t}", needs=[f"snap{t % 3}"])
    if t % 20 == 0 and t:
        s.fulfil(f"restore-{t - 10}")


def _maintained(store: cs.Store, turns: int = 120, name: str = "agent", pad: int = 200) -> cs.Session:
    s = store.session(name)
    policy = cs.CompactionPolicy()
    for t in range(turns):
        _turn(s, t, pad)
        s.maintain(policy)
    return s


def _markers(s: cs.Session) -> list[int]:
    return [r.pos for r in s.scan() if r.kind == "marker"]


def test_retention_keeps_the_context_every_marker_and_verify(store: cs.Store) -> None:
    s = _maintained(store)
    before = s.context()
    assert before.mode == "certified"
    resumed = {p: s.resume(p) for p in _markers(s)}
    messages = msgspec.json.encode(before.as_messages("chat"))
    kinds = {r.pos: r.kind for r in s.scan()}
    record = s.retain()
    assert record is not None and isinstance(record.event, ev.Retention)
    dropped = list(ev.SpanSet(record.event.spans))
    assert dropped and all(kinds[p] in retention.KINDS for p in dropped)
    after = s.context()
    assert msgspec.json.encode(after.as_messages("chat")) == messages
    assert after.context == before.context and after.marker == before.marker and after.mode == "certified"
    assert s.resume(before.marker).digest == resumed[before.marker].digest
    gone = set(dropped)
    for p, was in resumed.items():  # an older marker: its items but what its raw tail lost to retention
        now = s.resume(p)
        assert now.mode == was.mode
        assert [i for i in now.context if i.pos not in gone] == [i for i in was.context if i.pos not in gone]
    assert store.verify().ok
    assert s.resume(before.marker, rehash=True).mode == "certified"
    # What stays: bindings, obligations, failures, rejections, every derived event.
    for r in s.scan():
        if r.pos in gone:
            assert r.kind == "dropped" and isinstance(r.event, ev.Dropped) and r.event.by == record.pos
        elif kinds.get(r.pos, "retention") in KEPT_KINDS or r.event.status is not None:
            assert r.body


def test_a_dropped_body_reads_as_dropped_and_is_not_restored(store: cs.Store) -> None:
    s = _maintained(store, 60)
    record = s.retain()
    assert record is not None
    pos = record.event.spans[0].start  # type: ignore[attr-defined]
    with pytest.raises(cs.errors.BodyDroppedError) as got:
        s.read(pos)
    assert (got.value.pos, got.value.by, got.value.when) == (pos, record.pos, record.event.ts)
    assert isinstance(got.value, cs.ReconstructionUnsoundError)
    node = next(n for n in s.nodes() if n.tier == 1 and n.start <= pos < n.stop)
    with pytest.raises(cs.errors.BodyDroppedError, match=f"pos {pos}|dropped"):
        s.restore_span(node)
    with pytest.raises(cs.errors.BodyDroppedError):
        s.lookup(f"{pos}:content")


def test_the_session_goes_on_after_retention(store: cs.Store) -> None:
    s = _maintained(store, 80)
    first = s.retain(keep_last=30)
    assert first is not None
    policy = cs.CompactionPolicy()
    for t in range(80, 160):
        _turn(s, t)
        s.maintain(policy)
    assert s.context().mode == "certified"
    second = s.retain()
    assert second is not None and set(ev.SpanSet(second.event.spans)).isdisjoint(ev.SpanSet(first.event.spans))  # type: ignore[attr-defined]
    s.redact([p for p in range(s.size) if s.view.read(p).kind == "turn"][-1:], "asked to forget")
    assert store.verify().ok
    assert not s.rule_problems()


def test_keep_last_keeps_the_newest_positions(store: cs.Store) -> None:
    s = _maintained(store, 60)
    size = s.size
    record = s.retain(keep_last=size // 2)
    assert record is not None
    assert max(ev.SpanSet(record.event.spans)) < size - size // 2  # type: ignore[attr-defined]
    assert s.retain(keep_last=size // 2) is None  # nothing more to drop there


def test_nothing_to_drop_without_a_certified_context(store: cs.Store) -> None:
    s = store.session("raw")
    for t in range(20):
        _turn(s, t)
    assert s.retain() is None and s.size == store.session("raw").size
    with pytest.raises(cs.InvalidArgument):
        s.retain(keep_last=-1)


def _forged(s: cs.Session, **change: object) -> ev.Retention:
    plan = retention.planned(s.view, s.view.facts(), s.context().marker, 0)
    assert plan is not None
    return msgspec.structs.replace(plan, **change)


@pytest.mark.parametrize("case", ["binding", "failure", "marker", "digest", "order", "other-batch", "twice"])
def test_admission_refuses_a_retention_that_drops_what_it_may_not(store: cs.Store, case: str) -> None:
    """A retention appended by hand is held to the same rule: nothing is written on refusal."""
    s = _maintained(store, 60)
    kinds = {r.pos: r for r in s.scan()}
    plan = _forged(s)
    if case == "binding":
        p = next(p for p, r in kinds.items() if r.kind == "binding" and p < plan.spans[-1].stop)
        event = _forged(s, spans=retention.runs([*ev.SpanSet(plan.spans), p]))
    elif case == "failure":
        p = next(p for p, r in kinds.items() if r.event.status == "failed" and p < plan.spans[-1].stop)
        event = _forged(s, spans=retention.runs([*ev.SpanSet(plan.spans), p]))
    elif case == "marker":
        raw = s.mark_raw()
        event = _forged(s, marker=raw.pos)
    elif case == "digest":
        event = _forged(s, index_digest="00" * 32)
    elif case == "order":
        event = _forged(s, spans=list(reversed(plan.spans)))
    elif case == "twice":
        s.retain()
        event = plan
    else:
        size = s.size
        with pytest.raises(cs.InvalidEvent, match="alone"):
            s.extend([cs.Turn("user", "x"), plan])
        assert s.size == size
        return
    size = s.size
    with pytest.raises(cs.InvalidEvent):
        s.append(event)
    assert s.size == size


def test_a_changed_index_row_at_a_dropped_position_fails_verify(sqlite_target: str) -> None:
    with cs.open(sqlite_target) as store:
        s = _maintained(store, 60)
        record = s.retain()
        assert record is not None
        pos = record.event.spans[0].start  # type: ignore[attr-defined]
    conn = sqlite3.connect(sqlite_target)
    conn.execute("INSERT INTO structure_index (session_id, pos, rel, key, num, text) "
                 "SELECT id, ?, 'negative', 'failed', ?, 'invented' FROM sessions", (pos, pos))
    conn.commit()
    conn.close()
    with cs.open(sqlite_target) as store:
        report = store.verify()
    assert not report.ok and any("this retention dropped" in p.what for p in report.problems)


def test_a_body_erased_behind_the_store_is_not_a_drop(sqlite_target: str) -> None:
    """A body set to NULL with kind 'dropped' and an erasure record, but no retention listing it, is refused."""
    with cs.open(sqlite_target) as store:
        s = _maintained(store, 60)
        record = s.retain()
        assert record is not None
        listed = set(ev.SpanSet(record.event.spans))  # type: ignore[attr-defined]
        victim = next(r.pos for r in s.scan() if r.kind == "turn" and r.pos not in listed)
    conn = sqlite3.connect(sqlite_target)
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("INSERT INTO redactions (session_id, pos, by) SELECT session_id, ?, ? FROM events LIMIT 1",
                 (victim, record.pos))
    conn.execute("UPDATE events SET body = NULL, kind = 'dropped', idem_key = NULL WHERE pos = ?", (victim,))
    conn.commit()
    conn.close()
    with cs.open(sqlite_target) as store:
        with pytest.raises(cs.IntegrityError, match=f"pos {victim}"):
            store.session("agent").view.read(victim)
        assert not store.verify().ok


def test_reclaim_shrinks_the_file(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "big.db")
    with cs.open(path) as store:
        s = _maintained(store, 150, "agent", pad=1000)
        store.reclaim()
        before = os.path.getsize(path)
        assert s.retain() is not None
        freed = store.reclaim()
        after = os.path.getsize(path)
        assert freed > 0 and after < before * 0.5, (before, after)
        assert store.verify().ok


def test_reclaim_on_postgres_keeps_every_event(open_store: Callable[..., cs.Store], target: str) -> None:
    store = open_store()
    s = _maintained(store, 40)
    root = s.head().root
    assert s.retain() is not None
    assert store.reclaim() >= 0
    assert store.verify().ok and s.head(s.size - 1).root == root


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.integers(20, 70), keep=st.integers(0, 40), pad=st.integers(0, 300), seed=st.integers(0, 5))
def test_for_any_session_retention_changes_no_context_and_verifies(tmp_path: object, turns: int, keep: int, pad: int,
                                                                     seed: int) -> None:
    path = os.path.join(str(tmp_path), f"p{turns}-{keep}-{pad}-{seed}.db")
    with cs.open(path, clock=ev.tick_clock()) as store:
        s = store.session("p")
        policy = cs.CompactionPolicy(every=20 + 10 * seed)
        for t in range(turns):
            _turn(s, t + seed, pad)
            s.maintain(policy)
        before = s.context()
        resumed = s.resume(before.marker).digest if before.marker >= 0 else None
        s.retain(keep_last=keep)
        after = s.context()
        assert after.context == before.context and after.mode == before.mode
        if resumed is not None:
            assert s.resume(before.marker).digest == resumed
            assert s.resume(before.marker, rehash=True).mode == before.mode
        assert store.verify().ok and not s.rule_problems()
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)


def test_a_retention_written_behind_the_rules_is_named_by_verify(sqlite_target: str) -> None:
    """A retention appended past admission that drops a binding: its facts still say what it dropped, and verify names it."""
    with cs.open(sqlite_target) as store:
        s = _maintained(store, 40)
        plan = _forged(s)
        binding = next(r.pos for r in s.scan() if r.kind == "binding" and r.pos < plan.spans[-1].stop)
        with unchecked():
            forged = s.append(_forged(s, spans=retention.runs([*ev.SpanSet(plan.spans), binding])))
        problems = s.rule_problems()
        assert any(pos == forged.pos and "binding" in why for pos, why in problems), problems
        report = store.verify()
    assert not report.ok and any(p.pos == forged.pos for p in report.problems)


def test_a_policy_with_retain_last_keeps_the_store_to_what_its_cover_does_not_stand_for(store: cs.Store) -> None:
    s = store.session("loop")
    policy = cs.CompactionPolicy(retain_last=40)
    retained = []
    for t in range(150):
        _turn(s, t)
        got = s.maintain(policy)
        if got.retained is not None:
            retained.append(got.retained)
    assert len(retained) >= 2 and s.context().mode == "certified"
    dropped = {p for p in range(s.size) if s.view.read(p).kind == "dropped"}
    assert dropped and max(dropped) < s.size - 40
    # What a full retention would drop now, the runs have dropped, but for the newest nodes' spans.
    rest = retention.planned(s.view, s.view.facts(), s.context().marker, 40)
    assert rest is None or len(ev.SpanSet(rest.spans)) < len(dropped)
    assert store.verify().ok and not s.rule_problems()
    with pytest.raises(cs.InvalidArgument, match="retain_last"):
        cs.CompactionPolicy(retain_last=-1)


def test_a_redaction_after_retention_erases_what_was_built_from_the_dropped_bodies(store: cs.Store) -> None:
    """Redacting a dropped position names it (it stays dropped) and erases the summaries built from it."""
    s = _maintained(store, 60)
    record = s.retain()
    assert record is not None
    pos = record.event.spans[0].start  # type: ignore[attr-defined]
    built = [n.pos for n in s.nodes() if n.start <= pos < n.stop]
    red = s.redact([pos], "forget it")
    named = set(red.event.positions)  # type: ignore[attr-defined]
    assert pos in named and set(built) <= named
    assert s.view.read(pos).kind == "dropped"
    assert all(s.view.read(p).kind == "redacted" for p in built)
    assert store.verify().ok
    with pytest.raises(cs.InvalidEvent, match="redaction or a retention"):
        s.redact([record.pos], "no")
