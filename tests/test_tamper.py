"""Tamper evidence: an attacker with write access to the file changes one cell at a time.

The attacker drops the append-only triggers first, as anyone holding the file can.
Every single-cell change to every table must then be reported by ``verify()`` (or
refused when the store is opened).
"""

from __future__ import annotations

import random
import shutil
import sqlite3
from pathlib import Path

import pytest

import compactstore as cs
from sqlite_edit import unguarded

TABLES = ("meta", "sessions", "events", "subtrees", "heads", "redactions", "structure_index")


def _build(path: Path, key: bytes | None) -> None:
    with cs.open(str(path), key=key, clock=cs.events.tick_clock()) as st:
        a = st.session("agent-a")
        a.extend([cs.Turn("user", f"step {i}") for i in range(20)])  # > 16: a stored subtree root
        a.append(cs.ToolCall("c1", "run_sql", {"sql": "ALTER TABLE t ADD c"}), idempotency_key="k-1")
        a.append(cs.ToolResult("c1", "dry run failed", ok=False, status="failed"))
        b = st.session("agent-b")
        for i in range(6):
            b.append(cs.Turn("assistant", f"b{i}"))
        b.redact([1], "forget b1")


def _mutations(value: object) -> list[object]:
    if isinstance(value, bytes):
        flipped = bytearray(value)
        if flipped:
            flipped[len(flipped) // 2] ^= 0x01
        return [bytes(flipped), value[:-1]] if value else [b"\x00"]
    if isinstance(value, int):
        return [value + 1, value + 1000]
    if isinstance(value, str):
        return [value + "x", value[:-1]] if value else ["x"]
    return ["x"]  # NULL


def _where(conn: sqlite3.Connection, table: str) -> tuple[list[str], str]:
    """Return the primary key columns of ``table`` and a WHERE clause that picks one row by them.

    Rows are addressed by primary key, not rowid: subtrees and heads are WITHOUT ROWID tables.
    """
    info = conn.execute(f"PRAGMA table_info({table})").fetchall()
    keys = [r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5])]
    return keys, " AND ".join(f"{k} = ?" for k in keys)


def _cells(path: Path) -> list[tuple[str, tuple[object, ...], str, object]]:
    conn = sqlite3.connect(path)
    cells = []
    for table in TABLES:
        cols = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
        keys, _ = _where(conn, table)
        for row in conn.execute(f"SELECT {', '.join(keys)}, * FROM {table}"):
            key, values = tuple(row[:len(keys)]), row[len(keys):]
            for col, value in zip(cols, values):
                for new in _mutations(value):
                    cells.append((table, key, col, new))
    conn.close()
    return cells


def _detected(path: Path, key: bytes | None) -> bool:
    try:
        with cs.open(str(path), key=key) as st:
            return not st.verify().ok
    except cs.CompactStoreError:
        return True


def _sample(
    cells: list[tuple[str, tuple[object, ...], str, object]], exhaustive: bool
) -> list[tuple[str, tuple[object, ...], str, object]]:
    """Return every cell, or a fixed sample that still changes every column of every table."""
    if exhaustive:
        return cells
    first: dict[tuple[str, str], tuple[str, tuple[object, ...], str, object]] = {}
    for cell in cells:
        first.setdefault((cell[0], cell[2]), cell)
    rest = [c for c in cells if c not in first.values()]
    return list(first.values()) + random.Random(7).sample(rest, min(len(rest), 120))


@pytest.mark.parametrize("key", [None, b"k" * 32], ids=["unkeyed", "keyed"])
def test_every_single_cell_change_is_detected(tmp_path: Path, key: bytes | None, request: pytest.FixtureRequest) -> None:
    """Changing any one cell of any table (triggers dropped) is reported by verify().

    The default run changes every column of every table and a fixed sample of the
    other cells; ``--slow`` changes every cell.
    """
    clean = tmp_path / "clean.db"
    _build(clean, key)
    with cs.open(str(clean), key=key) as st:
        assert st.verify().ok
    work = tmp_path / "work.db"
    tried, missed = 0, []
    for table, row, col, new in _sample(_cells(clean), request.config.getoption("--slow")):
        shutil.copyfile(clean, work)
        conn = unguarded(work)
        try:
            conn.execute(f"UPDATE {table} SET {col} = ? WHERE {_where(conn, table)[1]}", (new, *row))
        except sqlite3.DatabaseError:
            conn.close()  # a constraint refused it: the attacker cannot make this change either
            continue
        conn.commit()
        conn.close()
        tried += 1
        if not _detected(work, key):
            missed.append((table, row, col, new))
    assert tried > 120
    assert missed == [], str(missed[:40])


def test_deleting_any_row_is_detected(tmp_path: Path) -> None:
    """Removing any one row from any table is reported."""
    clean = tmp_path / "clean.db"
    _build(clean, None)
    work = tmp_path / "work.db"
    conn = sqlite3.connect(clean)
    rows = [(t, r) for t in TABLES for r in conn.execute(f"SELECT {', '.join(_where(conn, t)[0])} FROM {t}")]
    conn.close()
    missed = []
    for table, row in rows:
        shutil.copyfile(clean, work)
        conn = unguarded(work)
        assert conn.execute(f"DELETE FROM {table} WHERE {_where(conn, table)[1]}", row).rowcount == 1
        conn.commit()
        conn.close()
        if not _detected(work, None):
            missed.append((table, row))
    assert missed == [], str(missed[:40])


def test_a_consistent_rewrite_without_the_key_is_caught(tmp_path: Path) -> None:
    """Rewriting a body and recomputing leaf, subtrees and heads without the key fails the MACs."""
    from compactstore import merkle
    from compactstore.seal import seal

    path = tmp_path / "s.db"
    _build(path, b"k" * 32)
    conn = unguarded(path)
    sid = conn.execute("SELECT id FROM sessions WHERE name = 'agent-b'").fetchone()[0]
    rows = conn.execute("SELECT body, leaf FROM events WHERE session_id = ? ORDER BY pos", (sid,)).fetchall()
    body = rows[2][0].replace(b"b2", b"b9")
    leaves = [leaf for _, leaf in rows]
    leaves[2] = merkle.leaf_hash(body)
    conn.execute("UPDATE events SET body = ?, leaf = ? WHERE session_id = ? AND pos = 2", (body, leaves[2], sid))
    conn.execute("DELETE FROM subtrees WHERE session_id = ?", (sid,))
    frontier = merkle.Frontier()
    for leaf in leaves:
        for level, idx, h in frontier.append(leaf):
            if merkle.is_stored(level):
                conn.execute("INSERT INTO subtrees VALUES (?, ?, ?, ?)", (sid, level, idx, h))
    for size in range(1, len(leaves) + 1):
        root = merkle.root_of_leaves(leaves[:size])
        (seqs,) = conn.execute("SELECT seqs FROM heads WHERE session_id = ? AND size = ?", (sid, size)).fetchone()
        conn.execute("UPDATE heads SET root = ?, seal = ? WHERE session_id = ? AND size = ?",
                     (root, seal(None, "agent-b", size, root, size - 1, seqs), sid, size))
    conn.commit()
    conn.close()
    with cs.open(str(path), key=b"k" * 32) as st:
        report = st.verify()
    assert not report.ok
    assert {p.table for p in report.problems} == {"heads"}
    assert all("seal" in p.what for p in report.problems)
    # Without a key the same rewrite is self-consistent: only the key makes it detectable.
    assert report.problems[0].session == "agent-b"


def test_parallel_verify_reports_exactly_what_serial_verify_reports(tmp_path: Path) -> None:
    """Worker processes re-hashing bodies change nothing in the report, clean or tampered."""
    path = tmp_path / "p.db"
    with cs.open(str(path), clock=cs.events.tick_clock()) as st:
        big = st.session("big")
        for k in range(5):
            big.extend([cs.Turn("user", f"turn {k}-{i}") for i in range(2000)])
        big.redact([7, 4099], "forget")
        _build(path, None)
    with cs.open(str(path)) as st:
        clean = st.verify(workers=2)
        assert clean.ok and clean.events == st.verify(workers=1).events and clean.redacted == 3
    conn = unguarded(path)
    conn.execute("UPDATE events SET body = CAST(replace(CAST(body AS TEXT), 'turn 3-5', 'turn 3-6') AS BLOB) WHERE pos = 6005")
    conn.execute("UPDATE subtrees SET hash = zeroblob(32) WHERE level = 8 AND idx = 3")
    conn.execute("UPDATE events SET leaf = zeroblob(32) WHERE pos = 9000")
    conn.commit()
    conn.close()
    with cs.open(str(path)) as st:
        serial, parallel = st.verify(workers=1), st.verify(workers=2)
    assert not serial.ok and parallel.problems == serial.problems
    assert {p.table for p in serial.problems} >= {"events", "subtrees", "heads"}


@pytest.fixture(scope="module")
def chunked_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two whole chunks of verify's and a part of a third, heads inside chunks, a redaction, a second session."""
    path = tmp_path_factory.mktemp("chunks") / "clean.db"
    with cs.open(str(path), clock=cs.events.tick_clock()) as st:
        s = st.session("long")
        for k in range(9):
            s.extend([cs.Turn("user", f"turn {k}-{i}") for i in range(997)])
            s.append(cs.Turn("assistant", f"single {k}"))
        s.redact([5000], "forget")
        st.session("short").extend([cs.Turn("user", f"s{i}") for i in range(40)])
    return path


#: (what, SQL) against chunked_store: one change each, all over the tree's chunks.
CHUNK_TAMPERS = [
    ("nothing", ""),
    ("body in the second chunk", "UPDATE events SET body = CAST(replace(CAST(body AS TEXT), 'turn 5-1', 'turn 5-2') "
     "AS BLOB) WHERE pos = 5000 + 1"),
    ("leaf in the last chunk", "UPDATE events SET leaf = zeroblob(32) WHERE pos = 8500"),
    ("level-4 subtree", "UPDATE subtrees SET hash = zeroblob(32) WHERE level = 4 AND idx = 300"),
    ("level-8 subtree", "UPDATE subtrees SET hash = zeroblob(32) WHERE level = 8 AND idx = 17"),
    ("level-12 subtree", "UPDATE subtrees SET hash = zeroblob(32) WHERE level = 12 AND idx = 1"),
    ("level-12 subtree deleted", "DELETE FROM subtrees WHERE level = 12 AND idx = 0"),
    ("head root", "UPDATE heads SET root = zeroblob(32) WHERE size = 5 * 998"),
    ("head chain", "UPDATE heads SET prev = prev - 1 WHERE size = 8 * 998"),
    ("head deleted", "DELETE FROM heads WHERE size = 4 * 998"),
    ("head of a size skipped", "UPDATE heads SET size = 0 WHERE size = 998"),
    ("sequence out of order", "UPDATE events SET seq = 1 + (SELECT max(seq) FROM events) WHERE pos = 6000"),
    ("row deleted", "DELETE FROM events WHERE pos = 4100"),
    ("row moved below 0", "UPDATE events SET pos = -5 WHERE pos = 20"),
    ("a whole chunk deleted", "DELETE FROM events WHERE pos >= 4096 AND pos < 8192"),
    ("redaction record moved", "UPDATE redactions SET pos = 5002"),
    ("redacted body restored", "UPDATE events SET body = CAST('{}' AS BLOB) WHERE pos = 5000"),
]


@pytest.mark.parametrize("sql", [sql for _, sql in CHUNK_TAMPERS], ids=[what for what, _ in CHUNK_TAMPERS])
def test_verify_by_whole_chunks_reports_what_row_by_row_reports(
    chunked_store: Path, tmp_path: Path, sql: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Summarising clean chunks, in this process or in workers, reports exactly what checking every row does."""
    from compactstore import verify

    path = tmp_path / "c.db"
    shutil.copyfile(chunked_store, path)
    if sql:
        conn = unguarded(path)
        conn.execute(sql)
        conn.commit()
        conn.close()
    whole = verify._SessionCheck._whole
    summarised = []
    monkeypatch.setattr(verify._SessionCheck, "_whole", lambda self, c: summarised.append(whole(self, c)) or summarised[-1])
    with cs.open(str(path)) as st:
        serial, parallel = st.verify(workers=1), st.verify(workers=2)
        monkeypatch.setattr(verify._SessionCheck, "_whole", lambda self, c: False)
        rowwise = st.verify(workers=1)
    assert rowwise.ok == (not sql) and any(summarised)
    assert serial == rowwise and parallel == rowwise
