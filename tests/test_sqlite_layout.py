"""The SQLite file: its table layout, and what a writer remembers."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import compactstore as cs


def _without_rowid(path: str | Path) -> dict[str, bool]:
    conn = sqlite3.connect(path)
    got = {name: "WITHOUT ROWID" in sql.upper() for name, sql in conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    return got


def test_new_stores_keep_heads_and_subtrees_in_their_primary_key(sqlite_target: str) -> None:
    """heads, subtrees and the structural index are WITHOUT ROWID tables (one B-tree each); the rest keep their rowid."""
    cs.open(sqlite_target).close()
    assert _without_rowid(sqlite_target) == {
        "meta": False, "sessions": False, "events": False, "subtrees": True, "heads": True, "redactions": False,
        "structure_index": True,
    }


def test_a_writer_notices_every_commit_of_another_connection(sqlite_target: str) -> None:
    """Heads and seqs one handle remembers are dropped as soon as another handle commits anything."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as one, cs.open(sqlite_target, clock=cs.events.tick_clock()) as two:
        a1, a2, b2 = one.session("a"), two.session("a"), two.session("b")
        a1.extend([cs.Turn("user", "x")] * 3)
        a1.append(cs.Turn("user", "y"))  # remembered by one
        b2.append(cs.Turn("user", "other session: the seq moves on"))
        r = a1.append(cs.Turn("user", "z"))
        assert (r.pos, r.seq) == (4, 6)
        a2.append(cs.Turn("user", "same session, other handle"))
        r = a1.append(cs.Turn("user", "w"))
        assert (r.pos, r.seq) == (6, 8)
        seqs = [rec.seq for rec in a1.scan()] + [rec.seq for rec in b2.scan()]
        assert sorted(seqs) == list(range(1, 9))
        assert one.verify().ok and two.verify().ok


def test_a_failed_transaction_leaves_nothing_remembered(sqlite_target: str) -> None:
    """A transaction that inserted its head and then failed is rolled back and forgotten."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        s = st.session("s")
        s.extend([cs.Turn("user", f"t{i}") for i in range(3)])
        s.redact([1], "forget")
        with pytest.raises(cs.InvalidEvent):
            s.redact([1], "again")  # refused after its rows were inserted, inside the transaction
        with pytest.raises(cs.InvalidEvent):
            st.session("new").extend([cs.Turn("user", "x"), cs.Turn("user", "y", supersedes=5)])
        assert s.append(cs.Turn("user", "after")).pos == 4
        assert st.sessions() == ["s"]
        assert st.session("new").append(cs.Turn("user", "x")).pos == 0
        assert st.verify().ok
