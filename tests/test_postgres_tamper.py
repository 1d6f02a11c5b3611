"""Tamper evidence on PostgreSQL: the database's owner changes one cell, or removes one row, at a time.

The owner can do anything: drop the append-only triggers and the identity columns'
protection first. Every change must then be reported by ``verify()`` (or refused when
the store is opened). ``events.seq`` is sealed by the head of its commit (gaps allowed);
its single-cell mutations here also break its order within the session.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import compactstore as cs

pytest.importorskip("psycopg")

import psycopg  # noqa: E402

from compactstore import merkle  # noqa: E402
from compactstore.seal import seal  # noqa: E402

TABLES = ("meta", "sessions", "events", "subtrees", "heads", "redactions", "structure_index")
BLOBS = ("body", "leaf", "hash", "root", "seal")


def _build(url: str, key: bytes | None) -> None:
    with cs.open(url, key=key, clock=cs.events.tick_clock()) as st:
        a = st.session("agent-a")
        a.extend([cs.Turn("user", f"step {i}") for i in range(9)])
        a.append(cs.ToolCall("c1", "run_sql", {"sql": "ALTER TABLE t ADD c"}), idempotency_key="k-1")
        a.append(cs.ToolResult("c1", "dry run failed", ok=False, status="failed"))
        b = st.session("agent-b")
        for i in range(6):
            b.append(cs.Turn("assistant", f"b{i}"))
        b.redact([1], "forget b1")


@pytest.fixture
def attacker(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    """Return the owner's connection (see _disarm for removing the triggers and identity protection)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


def _disarm(conn: psycopg.Connection[Any]) -> None:
    for table, name in conn.execute(
        "SELECT tgrelid::regclass::text, tgname FROM pg_trigger WHERE NOT tgisinternal"
    ).fetchall():
        conn.execute(f"DROP TRIGGER {name} ON {table}")
    conn.execute("ALTER TABLE sessions ALTER COLUMN id DROP IDENTITY")


def _mutations(table: str, col: str, value: object, row: dict[str, Any]) -> list[object]:
    if table == "events" and col == "seq":
        return [-int(row["seq"])]  # before every earlier event of its session
    if isinstance(value, bytes):
        flipped = bytearray(value)
        if flipped:
            flipped[len(flipped) // 2] ^= 0x01
        return [bytes(flipped), value[:-1]] if value else [b"\x00"]
    if isinstance(value, int):
        return [value + 1, value + 1000]
    if isinstance(value, str):
        return [value + "x", value[:-1]] if value else ["x"]
    return [b"x" if col in BLOBS else "x"]  # NULL


def _detected(url: str, key: bytes | None, open_store: cs.Store | None) -> bool:
    if open_store is not None:
        return not open_store.verify().ok
    try:
        with cs.open(url, key=key) as st:
            return not st.verify().ok
    except cs.CompactStoreError:
        return True


@pytest.mark.parametrize("key", [None, b"k" * 32], ids=["unkeyed", "keyed"])
def test_every_single_cell_change_is_detected(pg_url: str, attacker: psycopg.Connection[Any], key: bytes | None) -> None:
    """Changing any one cell of any table (triggers dropped) is reported by verify() or refused at open."""
    _build(pg_url, key)
    _disarm(attacker)
    tried, missed = 0, []
    with cs.open(pg_url, key=key) as st:
        assert st.verify().ok
        for table in TABLES:
            cur = attacker.execute(f"SELECT ctid, * FROM {table}")
            cols = [d.name for d in cur.description or []][1:]
            for ctid, *values in cur.fetchall():
                row = dict(zip(cols, values))
                for col, value in row.items():
                    for new in _mutations(table, col, value, row):
                        try:
                            got = attacker.execute(
                                f"UPDATE {table} SET {col} = %s WHERE ctid = %s RETURNING ctid", (new, ctid)
                            ).fetchone()
                        except psycopg.errors.IntegrityError:
                            continue  # a constraint refused it: the attacker cannot make this change either
                        assert got is not None
                        tried += 1
                        if not _detected(pg_url, key, None if table == "meta" else st):
                            missed.append((table, col, row, new))
                        ctid = attacker.execute(
                            f"UPDATE {table} SET {col} = %s WHERE ctid = %s RETURNING ctid", (value, got[0])
                        ).fetchone()[0]  # type: ignore[index]
        assert st.verify().ok  # every change was undone
    assert tried > 250
    assert missed == [], str(missed[:20])


def test_deleting_any_row_is_detected(pg_url: str, attacker: psycopg.Connection[Any]) -> None:
    """Removing any one row from any table is reported."""
    _build(pg_url, None)
    _disarm(attacker)
    missed = []
    with cs.open(pg_url) as st:
        for table in TABLES:
            for ctid, *values in attacker.execute(f"SELECT ctid, * FROM {table}").fetchall():
                attacker.execute(f"DELETE FROM {table} WHERE ctid = %s", (ctid,))
                if not _detected(pg_url, None, None if table == "meta" else st):
                    missed.append((table, values))
                marks = ", ".join(["%s"] * len(values))
                attacker.execute(f"INSERT INTO {table} VALUES ({marks})", values)
        assert st.verify().ok
    assert missed == [], str(missed[:20])


def test_a_consistent_rewrite_without_the_key_is_caught(pg_url: str, attacker: psycopg.Connection[Any]) -> None:
    """Rewriting a body and recomputing leaf, subtrees and heads without the key fails the MACs, and only them."""
    key = b"k" * 32
    _build(pg_url, key)
    _disarm(attacker)
    (sid,) = attacker.execute("SELECT id FROM sessions WHERE name = 'agent-b'").fetchone()  # type: ignore[misc]
    rows = attacker.execute("SELECT body, leaf FROM events WHERE session_id = %s ORDER BY pos", (sid,)).fetchall()
    body = rows[2][0].replace(b"b2", b"b9")
    leaves = [leaf for _, leaf in rows]  # position 1 is redacted: only its leaf is left
    leaves[2] = merkle.leaf_hash(body)
    attacker.execute("UPDATE events SET body = %s, leaf = %s WHERE session_id = %s AND pos = 2", (body, leaves[2], sid))
    # Recompute every stored subtree root (at the levels the store keeps) from the new leaves.
    levels = {lv for (lv,) in attacker.execute("SELECT DISTINCT level FROM subtrees WHERE session_id = %s", (sid,))}
    attacker.execute("DELETE FROM subtrees WHERE session_id = %s", (sid,))
    frontier = merkle.Frontier()
    for leaf in leaves:
        for level, idx, h in frontier.append(leaf):
            if level in levels:
                attacker.execute("INSERT INTO subtrees VALUES (%s, %s, %s, %s)", (sid, level, idx, h))
    for size in range(1, len(leaves) + 1):
        root = merkle.root_of_leaves(leaves[:size])
        got = attacker.execute("SELECT seqs FROM heads WHERE session_id = %s AND size = %s", (sid, size)).fetchone()
        assert got is not None
        attacker.execute(
            "UPDATE heads SET root = %s, seal = %s WHERE session_id = %s AND size = %s",
            (root, seal(None, "agent-b", size, root, size - 1, got[0]), sid, size),
        )
    with cs.open(pg_url, key=key) as st:
        report = st.verify()
    assert not report.ok
    assert {p.table for p in report.problems} == {"heads"}, [str(p) for p in report.problems]
    assert all("seal" in p.what and p.session == "agent-b" for p in report.problems)
