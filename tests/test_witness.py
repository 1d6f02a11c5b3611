"""A witness outside the store: a store restored to an older copy, truncated, deleted or forked is refused."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import compactstore as cs
from compactstore import witness as witnesses
from compactstore.errors import WitnessMismatch
from sqlite_edit import unguarded

KEY = b"witness test key"
TABLES = ("meta", "sessions", "events", "subtrees", "heads", "redactions", "structure_index")
Snapshot = dict[str, list[tuple[Any, ...]]]


def _build(target: str, key: bytes | None, witness: str) -> None:
    with cs.open(target, key=key, clock=cs.events.tick_clock(), witness=witness) as st:
        a, b = st.session("agent-a"), st.session("agent-b")
        for i in range(6):
            a.append(cs.Turn("user", f"a{i}"))
            b.append(cs.Turn("assistant", f"b{i}"))


def _more(target: str, key: bytes | None, witness: str | None, text: str = "later") -> None:
    with cs.open(target, key=key, clock=cs.events.tick_clock(), witness=witness) as st:
        st.session("agent-a").extend([cs.Turn("user", f"{text} {i}") for i in range(4)])
        st.session("agent-b").append(cs.Turn("assistant", text))


def _pg(target: str) -> Any:
    import psycopg

    conn = psycopg.connect(target, autocommit=True)
    for table, name in conn.execute(
        "SELECT tgrelid::regclass::text, tgname FROM pg_trigger WHERE NOT tgisinternal"
    ).fetchall():
        conn.execute(f"DROP TRIGGER {name} ON {table}")
    return conn


def _snapshot(target: str) -> Snapshot:
    """Return a copy of every row of the store, as anyone holding the database can take one."""
    conn = _pg(target) if target.startswith("postgresql") else sqlite3.connect(target)
    try:
        return {t: list(conn.execute(f"SELECT * FROM {t}").fetchall()) for t in TABLES}
    finally:
        conn.close()


def _restore(target: str, snap: Snapshot) -> None:
    """Put the store's rows back as ``snap`` holds them (what restoring a file or a dump does)."""
    pg = target.startswith("postgresql")
    conn = _pg(target) if pg else unguarded(target)
    mark = "%s" if pg else "?"
    override = " OVERRIDING SYSTEM VALUE" if pg else ""
    try:
        for table, rows in snap.items():
            conn.execute(f"DELETE FROM {table}")
            for row in rows:
                conn.execute(f"INSERT INTO {table}{override} VALUES ({', '.join([mark] * len(row))})", row)
        conn.commit()
    finally:
        conn.close()


def _run(target: str, sql: str, args: tuple[object, ...] = ()) -> None:
    pg = target.startswith("postgresql")
    conn = _pg(target) if pg else unguarded(target)
    try:
        conn.execute(sql.replace("?", "%s") if pg else sql, args)
        conn.commit()
    finally:
        conn.close()


def _sid(target: str, name: str) -> int:
    conn = _pg(target) if target.startswith("postgresql") else sqlite3.connect(target)
    try:
        mark = "%s" if target.startswith("postgresql") else "?"
        return int(conn.execute(f"SELECT id FROM sessions WHERE name = {mark}", (name,)).fetchone()[0])
    finally:
        conn.close()


def _snapshot_rollback(target: str, key: bytes | None, snap: Snapshot) -> None:
    _restore(target, snap)


def _truncate(target: str, key: bytes | None, snap: Snapshot) -> None:
    sid = _sid(target, "agent-a")
    for table, col in (("events", "pos"), ("structure_index", "pos"), ("heads", "size")):
        _run(target, f"DELETE FROM {table} WHERE session_id = ? AND {col} > ?", (sid, 5 if col == "pos" else 6))


def _delete(target: str, key: bytes | None, snap: Snapshot) -> None:
    sid = _sid(target, "agent-a")
    for table in ("events", "structure_index", "heads", "subtrees", "redactions"):
        _run(target, f"DELETE FROM {table} WHERE session_id = ?", (sid,))
    _run(target, "DELETE FROM sessions WHERE id = ?", (sid,))


def _fork(target: str, key: bytes | None, snap: Snapshot) -> None:
    # Back to the older copy, then another history written by the library itself, with the key:
    # every head and seal in the store is genuine, and the store is longer than the witness's.
    _restore(target, snap)
    with cs.open(target, key=key, clock=cs.events.tick_clock()) as st:
        st.session("agent-a").extend([cs.Turn("user", f"other {i}") for i in range(9)])


ATTACKS: dict[str, Callable[[str, bytes | None, Snapshot], None]] = {
    "snapshot-rollback": _snapshot_rollback, "truncate": _truncate, "delete": _delete, "fork": _fork,
}  # fmt: skip
READS: dict[str, Callable[[cs.Session], object]] = {
    "read": lambda s: s.read(0), "scan": lambda s: list(s.scan()), "context": lambda s: s.context(),
}  # fmt: skip


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_open_refuses_a_store_that_does_not_extend_its_witness(target: str, tmp_path: Path, attack: str, keyed: bool) -> None:
    """A store rolled back to a copy, truncated, with a session deleted or forked is refused on open, naming session and sizes."""
    key, witness = (KEY if keyed else None), str(tmp_path / "witness.json")
    _build(target, key, witness)
    snap = _snapshot(target)
    _more(target, key, witness)
    ATTACKS[attack](target, key, snap)
    with pytest.raises(WitnessMismatch) as caught:
        cs.open(target, key=key, witness=witness)
    assert caught.value.session == "agent-a" and caught.value.held == 10
    assert caught.value.got != 10 or attack == "fork"
    assert "agent-a" in str(caught.value) and "size 10" in str(caught.value)


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
@pytest.mark.parametrize("read", sorted(READS))
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_reads_refuse_a_store_changed_under_an_open_handle(
    target: str, tmp_path: Path, attack: str, read: str, keyed: bool
) -> None:
    """read, scan and context refuse a session once the store beneath an open handle no longer extends the witness."""
    key, witness = (KEY if keyed else None), str(tmp_path / "witness.json")
    _build(target, key, witness)
    snap = _snapshot(target)
    _more(target, key, witness)
    with cs.open(target, key=key, witness=witness) as st:
        READS[read](st.session("agent-a"))  # intact: the read passes
        ATTACKS[attack](target, key, snap)
        with pytest.raises(WitnessMismatch):
            READS[read](st.session("agent-a"))
        report = st.verify()
        assert not report.ok and any(p.table == "witness" and p.session == "agent-a" for p in report.problems)


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
def test_without_a_witness_a_snapshot_rollback_verifies(target: str, tmp_path: Path, keyed: bool) -> None:
    """The limit a witness lifts: an older copy of the store restored whole still verifies and reads on its own."""
    key = KEY if keyed else None
    _build(target, key, str(tmp_path / "witness.json"))
    snap = _snapshot(target)
    _more(target, key, None)
    _restore(target, snap)
    with cs.open(target, key=key) as st:
        assert st.verify().ok
        assert st.session("agent-a").size == 6 and st.session("agent-a").context().size == 6


def test_witness_holds_the_latest_head_of_every_session(target: str, tmp_path: Path) -> None:
    """After commits, the witness file holds each session's latest head, MAC'd under the key, and the store's identity."""
    witness = str(tmp_path / "witness.json")
    _build(target, KEY, witness)
    _more(target, KEY, witness)
    held = witnesses.FileWitness(witness).load()
    with cs.open(target, key=KEY) as st:
        assert held.store_id == st.store_id
        for name in ("agent-a", "agent-b"):
            head = st.session(name).head()
            assert held.heads[name] == head and st.check_head(held.heads[name])


def test_a_witness_of_another_store_is_refused(tmp_path: Path) -> None:
    """A witness that watched another store refuses this one: a whole store swapped for a fresh one is caught."""
    witness = str(tmp_path / "witness.json")
    _build(str(tmp_path / "one.db"), None, witness)
    _build(str(tmp_path / "two.db"), None, str(tmp_path / "other.json"))
    with pytest.raises(cs.IntegrityError, match="holds the heads of store"):
        cs.open(str(tmp_path / "two.db"), witness=witness)


def test_the_store_itself_is_not_a_witness(tmp_path: Path) -> None:
    """A witness must live outside the store."""
    path = str(tmp_path / "s.db")
    with pytest.raises(cs.InvalidArgument, match="outside the store"):
        cs.open(path, witness=path)


def test_a_witness_object_with_load_and_save(target: str) -> None:
    """Any object with load() and save(merge) is a witness: a rollback through it is refused the same way."""

    class Memory:
        def __init__(self) -> None:
            self.held = witnesses.Held()

        def load(self) -> witnesses.Held:
            return self.held

        def save(self, merge: Callable[[witnesses.Held], witnesses.Held]) -> None:
            self.held = merge(self.held)

    memory = Memory()
    with cs.open(target, witness=memory) as st:
        st.session("s").extend([cs.Turn("user", "x")] * 3)
    snap = _snapshot(target)
    with cs.open(target, witness=memory) as st:
        st.session("s").append(cs.Turn("user", "y"))
    assert memory.held.heads["s"].size == 4
    _restore(target, snap)
    with pytest.raises(WitnessMismatch, match="holds size 3, the witness holds size 4"):
        cs.open(target, witness=memory)


def test_merge_keeps_the_larger_head_only_when_it_extends_the_smaller() -> None:
    """advance: a later head wins when the tree extends the held one, an earlier one leaves it, a fork is refused."""
    from compactstore import merkle

    leaves = [merkle.leaf_hash(bytes([i])) for i in range(8)]

    def head(n: int, lv: list[bytes] = leaves) -> cs.TreeHead:
        return cs.TreeHead("s", n, merkle.span_root_of_leaves(lv, 0, n))

    def prove(a: int, b: int) -> list[bytes]:
        return [merkle.span_root_of_leaves(leaves, x, y) for x, y in merkle.consistency_spans(a, b)]

    held = witnesses.advance(witnesses.Held(), "id", head(3), prove)
    held = witnesses.advance(held, "id", head(7), prove)
    assert witnesses.advance(held, "id", head(5), prove).heads["s"].size == 7
    forked = [merkle.leaf_hash(b"x")] * 8
    with pytest.raises(WitnessMismatch):
        witnesses.advance(held, "id", head(8, forked), prove)


WRITER = textwrap.dedent(
    """
    import json, sys
    import compactstore as cs
    target, witness, who, sessions, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    acked = []
    with cs.open(target, witness=witness) as st:
        for i in range(n):
            s = st.session(f"s{(who + i) % sessions}")
            s.append(cs.Turn("user", f"{who}:{i}"))
            h = s.head()
            acked.append([h.session, h.size, h.root.hex()])
    print(json.dumps(acked))
    """
)


def test_writer_processes_sharing_one_witness_file_lose_no_head(target: str, tmp_path: Path) -> None:
    """Several processes append to several sessions through one witness file: it ends holding every session's latest head."""
    witness = str(tmp_path / "witness.json")
    cs.open(target).close()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, target, witness, str(who), "3", "12"],
                              stdout=subprocess.PIPE, text=True) for who in range(4)]
    acked = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    held = witnesses.FileWitness(witness).load()
    with cs.open(target, witness=witness) as st:
        assert st.verify().ok
        for name in st.sessions():
            s = st.session(name)
            assert held.heads[name] == s.head()
            for who in acked:
                for session, size, root in who:
                    if session == name:
                        assert s.head(size).root.hex() == root  # every acknowledged head is a prefix of the held one
    assert sum(h.size for h in held.heads.values()) == 48
