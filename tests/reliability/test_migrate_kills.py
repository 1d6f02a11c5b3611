"""A migration killed with SIGKILL at random moments leaves the store wholly old or wholly new.

The store is made by today's code and put back into schema 5's layout (the only
differences are a trigger, the index's finer snapshots and the version; the layout is
checked against the schema-5 fixture's). A child process migrates it and is killed at a
random moment; after each kill the store is at schema 5 with its old index, or at
schema 6 with all of its new rows, its log untouched either way, and migrating again
(from whatever it is) finishes and verifies.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import compactstore as cs
from compactstore.backends import queries
from compactstore.backends import sqlite as sqlite_backend

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CHILD = "import sys, compactstore as cs; cs.open(sys.argv[1], migrate=True).close()"


def _schema5_sql(name: str) -> str:
    """Return the statement that made ``name`` in schema 5's fixture, as its own code wrote it."""
    fixture = sqlite3.connect(":memory:")
    fixture.executescript((FIXTURES / "schema5" / "sqlite.sql").read_text(encoding="utf-8"))
    return str(fixture.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0])


def as_schema5(path: str) -> None:
    """Put a store made by today's code into schema 5's layout and version."""
    conn = sqlite3.connect(path)
    conn.executescript(
        "DROP TRIGGER heads_follow; DROP TRIGGER structure_index_no_delete; DROP TRIGGER events_no_update; "
        "DELETE FROM structure_index WHERE rel = 'open_at' AND pos % 512 != 0; "
        "DROP TRIGGER meta_no_update; UPDATE meta SET value = '5' WHERE name = 'schema_version';"
    )
    conn.execute(_schema5_sql("events_no_update"))
    conn.execute(sqlite_backend._append_only("meta", "UPDATE"))
    conn.execute(next(q for q in queries.SQLITE_SCHEMA if "_no_delete" in q))
    conn.commit()
    conn.close()


def _layout(conn: sqlite3.Connection) -> set[tuple[str, str]]:
    return {(str(n), str(s)) for n, s in conn.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL")}


def _state(path: str) -> tuple[str, bool, int, str]:
    """Return the store's version, whether it has schema 6's trigger, its index row count and its log's digest."""
    conn = sqlite3.connect(path)
    try:
        version = str(conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()[0])
        trigger = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'heads_follow'").fetchone() is not None
        rows = int(conn.execute("SELECT count(*) FROM structure_index").fetchone()[0])
        log = hashlib.blake2b()
        for table, cols in (("events", "seq, session_id, pos, kind, idem_key, leaf, body"),
                            ("heads", "session_id, size, root, prev, seal, seqs"), ("subtrees", "*")):
            for row in conn.execute(f"SELECT {cols} FROM {table} ORDER BY 1, 2, 3"):
                log.update(repr(row).encode())
        return version, trigger, rows, log.hexdigest()
    finally:
        conn.close()


def test_a_migration_killed_at_random_moments_is_never_half_done(tmp_path: Path) -> None:
    base = str(tmp_path / "base.db")
    with cs.open(base) as store:
        for k in range(2):
            s = store.session(f"s{k}")
            for b in range(12):
                s.extend([cs.ToolCall(f"c{b}-{i}", "t", {"i": i}) if i % 3 == 0 else cs.Turn("user", f"{b} {i} " + "x" * 120)
                          for i in range(100)])
    as_schema5(base)
    fixture = sqlite3.connect(":memory:")
    fixture.executescript((FIXTURES / "schema5" / "sqlite.sql").read_text(encoding="utf-8"))
    made = sqlite3.connect(base)
    assert _layout(made) == _layout(fixture)  # the layout is schema 5's, as its own code wrote it
    made.close()
    old = _state(base)
    done = str(tmp_path / "done.db")
    shutil.copy(base, done)
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", CHILD, done], check=True)
    took = time.monotonic() - start
    new = _state(done)
    assert new[0] == "6" and new[1] and new[2] > old[2] and new[3] == old[3]

    rng = random.Random(20261206)
    outcomes = {"old": 0, "new": 0}
    work = str(tmp_path / "work.db")
    kills = 0
    while kills < 50:
        for suffix in ("", "-wal", "-shm"):
            Path(work + suffix).unlink(missing_ok=True)
        shutil.copy(base, work)
        child = subprocess.Popen([sys.executable, "-c", CHILD, work])
        time.sleep(rng.uniform(0.2 * took, 1.05 * took))  # from import to past the commit
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            kills += 1
        child.wait()
        got = _state(work)
        assert got in (old, new), f"half-migrated after a kill: {got[:3]}, want {old[:3]} or {new[:3]}"
        outcomes["old" if got == old else "new"] += 1
        with cs.open(work, migrate=True) as store:  # from wherever it was left, it finishes
            assert store.verify().ok
        assert _state(work) == new
    print(f"{kills} kills: {outcomes['old']} left at schema 5, {outcomes['new']} at schema 6, 0 half-migrated, 0 lost")
