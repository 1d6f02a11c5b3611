"""The SQLite file: its table layout, stores written in the older layout, and what a writer remembers."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import compactstore as cs
from compactstore import merkle

#: The schema of stores written before nodes and heads became WITHOUT ROWID tables,
#: as sqlite_master holds it (triggers and the view are unchanged since).
ROWID_LAYOUT = (
    'CREATE TABLE "meta" (\n   "name" TEXT PRIMARY KEY,\n   "value" TEXT NOT NULL\n) STRICT',
    'CREATE TABLE "sessions" (\n   "id" INTEGER PRIMARY KEY,\n   "name" TEXT NOT NULL\n) STRICT',
    'CREATE UNIQUE INDEX "idx_sessions_name"\n    ON "sessions" ("name")',
    'CREATE TABLE "events" (\n   "seq" INTEGER PRIMARY KEY,\n   "session_id" INTEGER NOT NULL,\n'
    '   "pos" INTEGER NOT NULL,\n   "kind" TEXT NOT NULL,\n   "idem_key" TEXT,\n   "leaf" BLOB NOT NULL,\n'
    '   "body" BLOB\n) STRICT',
    'CREATE UNIQUE INDEX "idx_events_session_id_pos"\n    ON "events" ("session_id", "pos")',
    "CREATE UNIQUE INDEX idx_events_idem ON events(session_id, idem_key) WHERE idem_key IS NOT NULL",
    'CREATE TABLE "nodes" (\n   "session_id" INTEGER,\n   "level" INTEGER,\n   "idx" INTEGER,\n'
    '   "hash" BLOB NOT NULL,\n   PRIMARY KEY ("session_id", "level", "idx")\n) STRICT',
    'CREATE TABLE "heads" (\n   "session_id" INTEGER,\n   "size" INTEGER,\n   "root" BLOB NOT NULL,\n'
    '   "prev" INTEGER NOT NULL,\n   "seal" BLOB NOT NULL,\n   PRIMARY KEY ("session_id", "size")\n) STRICT',
    'CREATE TABLE "redactions" (\n   "session_id" INTEGER,\n   "pos" INTEGER,\n   "by" INTEGER NOT NULL,\n'
    '   PRIMARY KEY ("session_id", "pos")\n) STRICT',
)


def _without_rowid(path: str | Path) -> dict[str, bool]:
    conn = sqlite3.connect(path)
    got = {name: "WITHOUT ROWID" in sql.upper() for name, sql in conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    return got


def _rowid_store(path: Path) -> None:
    """Write an empty store in the older layout: the library adds meta, triggers and view rows as then."""
    conn = sqlite3.connect(path)
    for sql in ROWID_LAYOUT:
        conn.execute(sql)
    conn.commit()
    conn.close()


def test_new_stores_keep_heads_and_nodes_in_their_primary_key(sqlite_target: str) -> None:
    """heads, nodes and the structural index are WITHOUT ROWID tables (one B-tree each); the rest keep their rowid."""
    cs.open(sqlite_target).close()
    assert _without_rowid(sqlite_target) == {
        "meta": False, "sessions": False, "events": False, "nodes": True, "heads": True, "redactions": False,
        "structure_index": True,
    }


def test_a_store_in_the_rowid_layout_is_read_and_extended_as_it_is(tmp_path: Path) -> None:
    """A store whose heads and nodes have rowids opens, appends, redacts and verifies, and keeps its layout."""
    path = tmp_path / "old.db"
    _rowid_store(path)
    with cs.open(str(path), clock=cs.tick_clock()) as st:
        s = st.session("s")
        s.extend([cs.Turn("user", f"t{i}") for i in range(40)])  # stored subtree roots at level 4
        s.append(cs.Turn("user", "one more"), idempotency_key="k")
        s.redact([3], "forget")
        assert st.verify().ok
    with cs.open(str(path), clock=cs.tick_clock(start=9)) as st:
        s = st.session("s")
        s.append(cs.Turn("user", "after reopening"))
        assert s.append(cs.Turn("user", "one more"), idempotency_key="k").pos == 40
        bodies = [r.body for r in s.scan()]
        assert s.head().root == merkle.root_of_leaves([r.leaf for r in s.scan()])
        assert len(bodies) == 43 and st.verify().ok
        head = s.head()
        assert merkle.verify_inclusion(s.read(7).body, 7, head.size, s.inclusion_proof(7), head.root)
    # The log keeps its layout; the structural index, added on open, takes the current one.
    assert _without_rowid(path) == {
        **dict.fromkeys(("meta", "sessions", "events", "nodes", "heads", "redactions"), False), "structure_index": True,
    }


def test_the_same_events_give_the_same_rows_in_either_layout(tmp_path: Path) -> None:
    """Both layouts hold the same heads, nodes and events for the same appends."""
    old, new = tmp_path / "old.db", tmp_path / "new.db"
    _rowid_store(old)
    for path in (old, new):
        with cs.open(str(path), clock=cs.tick_clock()) as st:
            s = st.session("s")
            s.extend([cs.Turn("user", f"t{i}") for i in range(20)])
            for i in range(5):
                s.append(cs.Turn("assistant", f"a{i}"))
    dumps = []
    for path in (old, new):
        conn = sqlite3.connect(path)
        dumps.append([sorted(conn.execute(f"SELECT * FROM {t}").fetchall())
                      for t in ("sessions", "events", "nodes", "heads", "redactions")])
        conn.close()
    assert dumps[0] == dumps[1]


def test_a_writer_notices_every_commit_of_another_connection(sqlite_target: str) -> None:
    """Heads and seqs one handle remembers are dropped as soon as another handle commits anything."""
    with cs.open(sqlite_target, clock=cs.tick_clock()) as one, cs.open(sqlite_target, clock=cs.tick_clock()) as two:
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
    with cs.open(sqlite_target, clock=cs.tick_clock()) as st:
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
