"""The order of events across sessions is sealed: each head seals the global seqs of the events its commit added.

Each test moves events of two sessions against each other in the stored global order (their
``seq``), as anyone holding the database can (triggers dropped), on SQLite and PostgreSQL,
keyed and unkeyed, and checks what ``verify()`` and the verified reads make of it.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlite_edit import Run
from sqlite_edit import edited as _db

import compactstore as cs
from compactstore.seal import runs_of, seal, seq_lookup, seq_runs

KEY = b"global order key"


def _build(target: str, key: bytes | None) -> None:
    """Four commits: a [0, 3), b [0, 1), a [3, 4), b [1, 3): seqs 1..7 in that order."""
    with cs.open(target, key=key, clock=cs.events.tick_clock()) as st:
        a, b = st.session("a"), st.session("b")
        a.extend([cs.Turn("user", f"a{i}") for i in range(3)])
        b.append(cs.Turn("user", "b0"))
        a.append(cs.Turn("user", "a3"))
        b.extend([cs.Turn("user", "b1"), cs.Turn("user", "b2")])


def _seq(run: Run, name: str, pos: int) -> int:
    return int(run("SELECT e.seq FROM events e JOIN sessions s ON s.id = e.session_id WHERE s.name = ? AND e.pos = ?",
                   name, pos)[0][0])


def _swap(target: str) -> tuple[int, int]:
    """Swap the seqs of a's last event and b's second (adjacent in the global order); return them."""
    with _db(target) as run:
        s1, s2 = _seq(run, "a", 3), _seq(run, "b", 1)
        run("UPDATE events SET seq = -1 WHERE seq = ?", s1)
        run("UPDATE events SET seq = ? WHERE seq = ?", s1, s2)
        run("UPDATE events SET seq = ? WHERE seq = -1", s2)
    return s1, s2


def _reseal(target: str) -> None:
    """Store the seqs of each head whose events moved as they now hold them, and recompute its plain seal."""
    with _db(target) as run:
        for sid, name in run("SELECT id, name FROM sessions"):
            seqs = [int(q) for (q,) in run("SELECT seq FROM events WHERE session_id = ? ORDER BY pos", sid)]
            for size, root, prev, stored in run("SELECT size, root, prev, seqs FROM heads WHERE session_id = ?", sid):
                runs = seq_runs(seqs[prev:size])
                if runs != bytes(stored):
                        run("UPDATE heads SET seqs = ?, seal = ? WHERE session_id = ? AND size = ?",
                        runs, seal(None, name, size, bytes(root), prev, runs), sid, size)


def _reads(st: cs.Store) -> list[str]:
    """Return the outcome of a verified read of each session's latest event and a scan of each: ok or the error."""
    out = []
    for name, pos in (("a", 3), ("b", 1)):
        for how in ("read", "scan"):
            try:
                s = st.session(name)
                s.read(pos) if how == "read" else list(s.scan())
                out.append("ok")
            except cs.IntegrityError as exc:
                out.append(str(exc))
    return out


def test_each_head_stores_the_seqs_of_its_commit(target: str) -> None:
    """A head's seqs are its own events' seqs, and every commit's come after those of the commits before it."""
    _build(target, None)
    with _db(target) as run:
        heads = run("SELECT s.name, h.prev, h.size, h.seqs FROM heads h JOIN sessions s ON s.id = h.session_id")
        got = sorted((runs_of(bytes(seqs)), name, prev, size) for name, prev, size, seqs in heads)
        for runs, name, prev, size in got:
            assert [_seq(run, name, p) for p in range(prev, size)] == [f + i for f, n in runs for i in range(n)]
    assert [(runs, name, prev) for runs, name, prev, _ in got] == [
        ([(1, 3)], "a", 0), ([(4, 1)], "b", 0), ([(5, 1)], "a", 3), ([(6, 2)], "b", 1)]


@pytest.mark.parametrize("key", [None, KEY], ids=["unkeyed", "keyed"])
def test_a_swap_across_sessions_is_caught_by_verify_and_by_reads(target: str, key: bytes | None) -> None:
    """Swapping the seqs of two events of different sessions: verify() names both, and a verified read or scan of
    either session's latest commit refuses it, keyed or not (the heads say which seqs they seal)."""
    _build(target, key)
    s1, s2 = _swap(target)
    with cs.open(target, key=key) as st:
        report = st.verify()
        reads = _reads(st)
        assert st.session("a").read(3, verify=False).seq == s2  # what an unverified read serves
    assert sorted((p.session, p.table, p.pos, p.what) for p in report.problems) == [
        ("a", "events", 3, f"sequence number {s2}, where the head of size 4 seals {s1}"),
        ("b", "events", 1, f"sequence number {s1}, where the head of size 3 seals {s2}")]
    assert all(r != "ok" and "seq" in r for r in reads), reads


@pytest.mark.parametrize("key", [None, KEY], ids=["unkeyed", "keyed"])
def test_a_resealed_reorder_across_sessions_passes_only_without_the_key(target: str, key: bytes | None) -> None:
    """A forger who swaps the seqs and stores and reseals the heads' seqs without a key: the boundary of an unkeyed
    store (verify and reads pass); with a key both seals give it away, at verify() and at every verified read."""
    _build(target, key)
    _swap(target)
    _reseal(target)
    with cs.open(target, key=key) as st:
        report = st.verify()
        reads = _reads(st)
    if key is None:
        assert report.ok, [str(p) for p in report.problems]
        assert reads == ["ok"] * 4
    else:
        assert sorted((p.session, p.table, p.pos, "seal does not match" in p.what) for p in report.problems) == [
            ("a", "heads", 4, True), ("b", "heads", 3, True)]
        assert all("seal that does not verify" in r for r in reads), reads


def test_a_later_commit_takes_later_seqs_whichever_handle_writes(target: str) -> None:
    """Two handles on one store append to different sessions in turn: each commit's seqs come after the last's."""
    _build(target, KEY)
    order: list[int] = []
    with cs.open(target, key=KEY) as one, cs.open(target, key=KEY) as two:
        for i in range(3):
            order.append(one.session("a").append(cs.Turn("user", f"one {i}")).seq)
            order += [r.seq for r in two.session("b").extend([cs.Turn("user", f"two {i}"), cs.Turn("user", f"two {i}'")])]
        assert one.verify().ok
    assert order == sorted(order) and order[0] > 7 and len(set(order)) == 9


@given(st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=60),
       st.integers(min_value=-3, max_value=70))
def test_seq_lookup_gives_each_packed_seq_by_index(seqs: list[int], index: int) -> None:
    """seq_lookup over seq_runs' packing gives the index-th seq, None outside them, however the runs fall."""
    at = seq_lookup(seq_runs(seqs))
    assert at(index) == (seqs[index] if 0 <= index < len(seqs) else None)
    assert [at(i) for i in range(len(seqs))] == seqs
