"""Tamper campaign: an attacker with write access to the SQLite file makes random changes.

The attacker drops the append-only triggers first. A change is *detected* when
``cs.open`` raises a ``CompactStoreError`` or ``verify().ok`` is false. A change that
makes ``open`` or ``verify`` raise anything else is counted apart: it is caught, but
by accident, and it is a bug of its own.

Mutation classes:

- ``cell``: one cell of any table gets a random new value (a bit flipped in a blob or
  text, an integer nudged or replaced, a NULL filled or a value nulled);
- ``field``: one field inside an event body (any kind: turn, binding, node, spill,
  marker...) is rewritten and the body re-encoded canonically; then, by *level*, the
  attacker recomputes nothing (``raw``), the leaf (``leaf``), leaf and subtree roots
  (``tree``), or everything a keyless attacker can: leaves, subtree roots, tree heads
  and their unkeyed seals (``forge``);
- ``row``: a row deleted, duplicated under a new key, or two rows' cells swapped;
- ``splice``: an event removed from the middle of a session (positions shifted) or two
  events swapped, with every hash recomputed as in ``forge``;
- ``inject``: a copy of a row inserted at coordinates outside the tree (an event at
  a negative position, a head of size zero or less, a subtree at a negative level or index);
- ``meta``: the meta table rewritten (hash, schema, key check, a keyed store
  downgraded to unkeyed with every seal recomputed);
- ``file``: a random byte of the database file flipped (only changes that alter what
  the tables hold are counted).

``forge`` and ``splice`` against an unkeyed store are undetectable by design (anyone
can recompute unkeyed seals) and are not attempted there; against a keyed store they
must be caught.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

import compactstore as cs
from compactstore import index, merkle
from compactstore.backends import Row
from compactstore.seal import seal, seq_runs

KEY = b"tamper-campaign-key-0123456789ab"
_enc = msgspec.json.Encoder(order="sorted")


def build(path: Path, key: bytes | None) -> None:
    """Write a store holding every kind of row: raw events, bindings, nodes, spills, markers."""
    with cs.open(str(path), key=key, clock=cs.events.tick_clock()) as st:
        a = st.session("agent-a")
        a.append(cs.Turn("user", "Make the users.email migration reversible."))
        a.append(cs.ToolCall("c1", "run_sql", {"sql": "ALTER TABLE users ADD email_new text", "dry_run": True}))
        a.append(cs.ToolResult("c1", "ERROR: lock timeout on users", ok=False, status="failed"))
        a.append(cs.Turn("assistant", "Approach: backfill in place."))
        a.append(cs.Turn("user", "No. Do not backfill in place.", status="rejected"))
        a.bind("rollback", "migrations/003_down.sql")
        a.bind("tables", ["users", "orders"], regenerable=True, how="\\dt")
        a.oblige("finish-migration", needs=["rollback", "tables"])
        a.append(cs.events.HandleOpened(handle="psql-1", resource="subprocess", detail="psql app"))
        a.append(cs.ToolCall("c2", "run_sql", {"sql": "BEGIN"}), idempotency_key="req-7")
        n1 = a.compact(0, 8, on_risk="spill")
        a.append(cs.ToolResult("c2", {"rows": 3, "ok": [1, 2.5, None]}))
        a.append(cs.events.HandleClosed(handle="psql-1"))
        n2 = a.compact(n1.stop, a.size, keep=[(9, "args.sql")])
        a.mark(n1)
        n3 = a.roll_up([n1, n2])
        a.append(cs.Turn("assistant", "resumed", meta={"why": "marker"}, uses=["rollback"]))
        a.mark(n3)
        a.mark_raw(5)
        a.reconstruct(a.artifact(n1), "plan", attempt="try-1")
        b = st.session("agent-b")
        b.extend([cs.Turn("assistant", f"b{i}", supersedes=i - 1 if i else None) for i in range(6)])
        b.mark_raw()
        c = st.session("c/../'; DROP TABLE events; --")
        c.append(cs.Turn("user", "ünïcödé ✓", name="x"))


def drop_triggers(conn: sqlite3.Connection) -> None:
    """Drop every trigger, as anyone holding the file can."""
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")


def tables(conn: sqlite3.Connection) -> list[str]:
    """Return the store's tables (whatever the schema version holds)."""
    # lower(): a bit flip that changes only the case of the schema's `type` text or of a
    # table's name changes nothing SQLite reads, and must not count as a change.
    return [n for (n,) in conn.execute(
        "SELECT lower(name) FROM sqlite_master WHERE lower(type) = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY 1")]


def dump(conn: sqlite3.Connection) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """Return every row of every table, for telling a real change from a no-op."""
    return [(t, sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr)) for t in tables(conn)]


# --- mutations: each takes (conn, rng, keyed) and returns a description, or None to skip ---


def _cols(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]


def _new_value(rng: random.Random, value: object) -> object:
    if isinstance(value, bytes):
        if not value or rng.random() < 0.1:
            return value[:-1] if value and rng.random() < 0.5 else value + b"\x00"
        b = bytearray(value)
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return bytes(b)
    if isinstance(value, int):
        return rng.choice([value + 1, value - 1, -value - 1, value + rng.randint(2, 1000), 0, rng.randint(-5, 2**40)])
    if isinstance(value, str):
        if not value or rng.random() < 0.2:
            return value + "x" if rng.random() < 0.5 else value[:-1]
        i = rng.randrange(len(value))
        return value[:i] + chr((ord(value[i]) ^ (1 << rng.randrange(5))) or 1) + value[i + 1:]
    return rng.choice([0, "x", b"x"])  # NULL


Address = tuple[str, tuple[Any, ...]]
"""One row: a WHERE clause on the table's primary key, and its values."""


def _random_row(conn: sqlite3.Connection, rng: random.Random, table: str) -> Address | None:
    # By primary key, not rowid: subtrees and heads are WITHOUT ROWID tables.
    info = conn.execute(f"PRAGMA table_info({table})").fetchall()
    keys = [r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5])]
    rows = conn.execute(f"SELECT {', '.join(keys)} FROM {table}").fetchall()
    return (" AND ".join(f"{k} IS ?" for k in keys), tuple(rng.choice(rows))) if rows else None


def m_cell(conn: sqlite3.Connection, rng: random.Random, keyed: bool) -> str | None:
    table = rng.choice(tables(conn))
    row = _random_row(conn, rng, table)
    if row is None:
        return None
    where, key = row
    col = rng.choice(_cols(conn, table))
    (value,) = conn.execute(f"SELECT {col} FROM {table} WHERE {where}", key).fetchone()
    new = None if value is not None and rng.random() < 0.05 else _new_value(rng, value)
    conn.execute(f"UPDATE {table} SET {col} = ? WHERE {where}", (new, *key))
    return f"cell {table}.{col} at {key!r:.40}: {value!r:.40} -> {new!r:.40}"


def _scalar_paths(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _scalar_paths(v, (*path, k))] or [path]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in _scalar_paths(v, (*path, i))] or [path]
    return [path]


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    obj[path[0]] = _set(obj[path[0]], path[1:], value)
    return obj


def _get(obj: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def _field_value(rng: random.Random, value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rng.choice([value + 1, value - 1, 0, value * 2 + 1])
    if isinstance(value, float):
        return value + 1.0
    if isinstance(value, str):
        if value and all(c in "0123456789abcdef" for c in value) and len(value) >= 16:
            i = rng.randrange(len(value))
            return value[:i] + ("0" if value[i] != "0" else "1") + value[i + 1:]
        return rng.choice([value + ".", value[:-1] if value else "x", value.upper() if value != value.upper() else value + "Z"])
    if value is None:
        return rng.choice([0, "", False])
    if isinstance(value, list):
        return [*value, 0] if rng.random() < 0.5 else []
    return {"x": 1} if not value else {}


def _sessions(conn: sqlite3.Connection) -> dict[int, str]:
    return {int(i): str(n) for i, n in conn.execute("SELECT id, name FROM sessions")}


def _stored(level: int) -> bool:
    is_stored = getattr(merkle, "is_stored", None)
    return True if is_stored is None else bool(is_stored(level))


def _reroot(conn: sqlite3.Connection, seq: int, body: bytes, leaves: list[bytes]) -> bytes:
    """Rewrite a marker's root to the forged log's root at its size (a keyless marker carries no MAC)."""
    try:
        event = cs.events.decode(body)
    except cs.InvalidEvent:
        return body
    if not isinstance(event, cs.events.RecoveryMarker) or event.mac is not None or event.size > len(leaves):
        return body
    root = merkle.root_of_leaves(leaves[: event.size]) if event.size else merkle.empty_root()
    if root.hex() == event.root:
        return body
    _, new = cs.events.canonical(msgspec.structs.replace(event, root=root.hex()))
    conn.execute("UPDATE events SET body = ? WHERE seq = ?", (new, seq))
    return new


def rehash(conn: sqlite3.Connection, sid: int, level: str) -> None:
    """Recompute what a keyless attacker can for session ``sid``: ``leaf``, ``tree`` or ``forge``."""
    if level == "raw":
        return
    rows = conn.execute("SELECT seq, pos, leaf, body FROM events WHERE session_id = ? ORDER BY pos", (sid,)).fetchall()
    leaves: list[bytes] = []
    for seq, _pos, leaf, body in rows:
        if level == "forge" and body is not None:
            body = _reroot(conn, seq, body, leaves)
        new = merkle.leaf_hash(body) if body is not None else leaf
        if new != leaf:
            conn.execute("UPDATE events SET leaf = ? WHERE seq = ?", (new, seq))
        leaves.append(new)
    if level == "leaf":
        return
    conn.execute("DELETE FROM subtrees WHERE session_id = ?", (sid,))
    frontier = merkle.Frontier()
    roots = {}
    for i, leaf in enumerate(leaves):
        for lv, idx, h in frontier.append(leaf):
            if _stored(lv):  # the attacker stores exactly the levels the library stores
                conn.execute("INSERT INTO subtrees (session_id, level, idx, hash) VALUES (?, ?, ?, ?)", (sid, lv, idx, h))
        roots[i + 1] = frontier.root()
    if level == "tree":
        return
    name = _sessions(conn)[sid]
    sizes = [s for (s,) in conn.execute("SELECT size FROM heads WHERE session_id = ? ORDER BY size", (sid,))]
    sizes = [s for s in sizes if s <= len(leaves)]
    if not sizes or sizes[-1] != len(leaves):
        sizes.append(len(leaves))
    conn.execute("DELETE FROM heads WHERE session_id = ?", (sid,))
    prev = 0
    for size in sizes:
        if size == 0:
            continue
        root, seqs = roots[size], seq_runs([q for q, *_ in rows[prev:size]])  # the seqs as the rows hold them
        conn.execute("INSERT INTO heads (session_id, size, root, prev, seal, seqs) VALUES (?, ?, ?, ?, ?, ?)",
                     (sid, size, root, prev, seal(None, name, size, root, prev, seqs), seqs))
        prev = size
    # The structural index too: derived again from the rewritten log, as the library derives it.
    try:
        reindex(conn, sid, max(sizes, default=0))
    except cs.InvalidEvent:
        return  # a body the library cannot read: nothing to derive


class RawLog:
    """The reads :func:`compactstore.index.derive` makes, over the attacker's own connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def rows(self, sid: int, start: int, stop: int | None, chunk: int) -> list[Row]:
        """Return the events of session ``sid`` at positions ``[start, stop)``, by position."""
        got = self.conn.execute("SELECT seq, session_id, pos, kind, idem_key, leaf, body FROM events "
                                "WHERE session_id = ? AND pos >= ? AND pos < ? ORDER BY pos",
                                (sid, start, 1 << 62 if stop is None else stop))
        return [Row(*r) for r in got]

    def body(self, sid: int, pos: int) -> bytes | None:
        """Return the body at ``pos`` of session ``sid``."""
        got = self.conn.execute("SELECT body FROM events WHERE session_id = ? AND pos = ?", (sid, pos)).fetchone()
        return None if got is None or got[0] is None else bytes(got[0])


def reindex(conn: sqlite3.Connection, sid: int, size: int) -> None:
    """Replace session ``sid``'s structural index by what its first ``size`` positions give, as the library derives it.

    Raises:
        cs.InvalidEvent: a body is not a valid event (the session's index is left empty).
    """
    conn.execute("DELETE FROM structure_index WHERE session_id = ?", (sid,))
    rows = index.derive(RawLog(conn), sid, size)  # type: ignore[arg-type]
    conn.executemany("INSERT INTO structure_index VALUES (?, ?, ?, ?, ?, ?)", [(sid, *r) for r in rows])


def m_field(level: str) -> Callable[[sqlite3.Connection, random.Random, bool], str | None]:
    def mutate(conn: sqlite3.Connection, rng: random.Random, keyed: bool) -> str | None:
        rows = conn.execute("SELECT seq, session_id, pos, kind, body FROM events WHERE body IS NOT NULL").fetchall()
        seq, sid, pos, kind, body = rng.choice(rows)
        obj = msgspec.json.decode(body)
        path = rng.choice(_scalar_paths(obj))
        old = _get(obj, path)
        new = _field_value(rng, old)
        body2 = _enc.encode(_set(obj, path, new))
        if body2 == body:
            return None
        conn.execute("UPDATE events SET body = ? WHERE seq = ?", (body2, seq))
        if path == ("kind",):
            conn.execute("UPDATE events SET kind = ? WHERE seq = ?", (new if isinstance(new, str) else kind, seq))
        rehash(conn, sid, level)
        return f"field/{level} {kind} at {sid}:{pos} {'.'.join(map(str, path))}: {old!r:.30} -> {new!r:.30}"

    return mutate


def m_row(conn: sqlite3.Connection, rng: random.Random, keyed: bool) -> str | None:
    table = rng.choice(tables(conn))
    row = _random_row(conn, rng, table)
    if row is None:
        return None
    where, key = row
    op = rng.choice(["delete", "duplicate", "swap"])
    if op == "delete":
        conn.execute(f"DELETE FROM {table} WHERE {where}", key)
        return f"row delete {table} at {key!r:.40}"
    cols = _cols(conn, table)
    if op == "duplicate":
        values = list(conn.execute(f"SELECT * FROM {table} WHERE {where}", key).fetchone())
        i = rng.randrange(len(cols))  # change one key column so the copy fits
        values[i] = _new_value(rng, values[i])
        conn.execute(f"INSERT INTO {table} VALUES ({', '.join('?' * len(cols))})", values)
        return f"row duplicate {table} at {key!r:.40} with {cols[i]} = {values[i]!r:.40}"
    other = _random_row(conn, rng, table)
    assert other is not None
    col = rng.choice(cols)
    a = conn.execute(f"SELECT {col} FROM {table} WHERE {where}", key).fetchone()[0]
    b = conn.execute(f"SELECT {col} FROM {table} WHERE {where}", other[1]).fetchone()[0]
    if a == b:
        return None
    # Read both rows before writing either: a swapped key column moves the first row.
    conn.execute(f"UPDATE {table} SET {col} = ? WHERE {where}", (b, *key))
    conn.execute(f"UPDATE {table} SET {col} = ? WHERE {where}", (a, *other[1]))
    return f"row swap {table}.{col} between {key!r:.40} and {other[1]!r:.40}"


def m_splice(conn: sqlite3.Connection, rng: random.Random, keyed: bool) -> str | None:
    sid = rng.choice(list(_sessions(conn)))
    rows = conn.execute("SELECT seq, pos, kind, idem_key, body FROM events WHERE session_id = ? ORDER BY pos", (sid,)).fetchall()
    if len(rows) < 3:
        return None
    if rng.random() < 0.5:
        i = rng.randrange(len(rows) - 1)  # never the last: dropping the tail is a rollback
        conn.execute("DELETE FROM events WHERE seq = ?", (rows[i][0],))
        for seq, pos, *_ in rows[i + 1:]:
            conn.execute("UPDATE events SET pos = ? WHERE seq = ?", (pos - 1, seq))
        conn.execute("DELETE FROM heads WHERE session_id = ? AND size >= ?", (sid, len(rows)))
        what = f"splice remove {sid}:{i}"
    else:
        i, j = sorted(rng.sample(range(len(rows)), 2))
        for (seq, *_), (_, _, kind, idem, body) in ((rows[i], rows[j]), (rows[j], rows[i])):
            conn.execute("UPDATE events SET kind = ?, idem_key = ?, body = ? WHERE seq = ?", (kind, idem, body, seq))
        what = f"splice swap {sid}:{i}<->{j}"
    rehash(conn, sid, "forge")
    return what


def m_inject(conn: sqlite3.Connection, rng: random.Random, keyed: bool) -> str | None:
    """Insert a copy of a row at coordinates outside the tree: a negative position, size, level or index."""
    sid = rng.choice(list(_sessions(conn)))
    choice = rng.choice(["event", "head", "subtree"])
    if choice == "event":
        seq = conn.execute("SELECT max(seq) + 1 FROM events").fetchone()[0]
        row = rng.choice(conn.execute("SELECT kind, idem_key, leaf, body FROM events WHERE session_id = ?",
                                      (sid,)).fetchall())
        pos = -rng.randint(1, 3)
        conn.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)", (seq, sid, pos, row[0], None, row[2], row[3]))
        return f"inject event at {sid}:{pos} (seq {seq})"
    if choice == "head":
        row = rng.choice(conn.execute("SELECT root, prev, seal, seqs FROM heads WHERE session_id = ?", (sid,)).fetchall())
        size = -rng.randint(0, 3)
        conn.execute("INSERT INTO heads VALUES (?, ?, ?, ?, ?, ?)", (sid, size, *row))
        return f"inject head of size {size} in session {sid}"
    hashes = [h for (h,) in conn.execute("SELECT hash FROM subtrees WHERE session_id = ?", (sid,))]
    h = rng.choice(hashes) if hashes else b"\0" * 32
    level, idx = rng.choice([(-rng.randint(1, 3), 0), (rng.randint(1, 3), -rng.randint(1, 3))])
    conn.execute("INSERT INTO subtrees VALUES (?, ?, ?, ?)", (sid, level, idx, h))
    return f"inject subtree ({level}, {idx}) in session {sid}"


def m_meta(conn: sqlite3.Connection, rng: random.Random, keyed: bool) -> str | None:
    meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
    choice = rng.choice(["value", "delete", "add", "downgrade"] if keyed else ["value", "delete", "add", "upgrade"])
    if choice == "value":
        name = rng.choice(sorted(meta))
        new = _new_value(rng, meta[name])
        if not isinstance(new, str):
            new = str(new)
        conn.execute("UPDATE meta SET value = ? WHERE name = ?", (new, name))
        return f"meta {name}: {meta[name]!r} -> {new!r}"
    if choice == "delete":
        name = rng.choice(sorted(meta))
        conn.execute("DELETE FROM meta WHERE name = ?", (name,))
        return f"meta delete {name}"
    if choice == "add":
        name = rng.choice(["key_check", "keyed", "hash2", "schema_version"])
        conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (name, {"key_check": "0" * 64, "schema_version": "0"}.get(name, "1")))
        return f"meta set {name}"
    if choice == "upgrade":
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('keyed', '1')")
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('key_check', 'ab')")
        return "meta claims a key"
    conn.execute("UPDATE meta SET value = '0' WHERE name = 'keyed'")
    conn.execute("DELETE FROM meta WHERE name = 'key_check'")
    for sid in _sessions(conn):
        rehash(conn, sid, "forge")
    return "meta downgrade keyed -> unkeyed, every seal recomputed without the key"


# --- the campaign -------------------------------------------------------------------


@dataclass
class Figures:
    """What a campaign measured."""

    tried: Counter[str] = field(default_factory=Counter)
    detected: Counter[str] = field(default_factory=Counter)
    untyped: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    skipped: int = 0
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.tried.values())

    @property
    def rate(self) -> float:
        return sum(self.detected.values()) / self.total if self.total else 1.0

    def summary(self) -> str:
        per = ", ".join(f"{k} {self.detected[k]}/{v}" for k, v in sorted(self.tried.items()))
        return (
            f"mutations {self.total}, detected {sum(self.detected.values())} ({100 * self.rate:.2f}%), "
            f"missed {len(self.missed)}, caught only by an untyped error {len(self.untyped)}, "
            f"no-ops skipped {self.skipped}; by class: {per}; {self.seconds:.1f} s"
        )


def detect(path: Path, key: bytes | None) -> str:
    """Return ``open`` or ``verify`` (detected), ``missed``, or ``untyped:<error>``."""
    try:
        st = cs.open(str(path), key=key)
    except cs.CompactStoreError:
        return "open"
    except Exception as exc:  # noqa: BLE001 - counted as a bug of its own
        return f"untyped: open raised {type(exc).__name__}: {exc}"
    try:
        return "missed" if st.verify().ok else "verify"
    except cs.CompactStoreError:
        return "verify"
    except Exception as exc:  # noqa: BLE001
        return f"untyped: verify raised {type(exc).__name__}: {exc}"
    finally:
        st.close()


def _flip_file(path: Path, rng: random.Random, clean_dump: object, tries: int = 32) -> str | None:
    # Most bytes of a small store are free space in its pages: flip until one changes what it holds.
    clean = path.read_bytes()
    for _ in range(tries):
        data = bytearray(clean)
        at = rng.randrange(len(data))
        data[at] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
        try:
            conn = sqlite3.connect(path)
            same = dump(conn) == clean_dump
            conn.close()
        except (sqlite3.DatabaseError, UnicodeDecodeError):  # the schema itself is damaged
            same = False
        if not same:
            return f"file byte {at} flipped"
    return None


CLASSES: dict[str, Callable[[sqlite3.Connection, random.Random, bool], str | None]] = {
    "cell": m_cell,
    "field/raw": m_field("raw"),
    "field/leaf": m_field("leaf"),
    "field/tree": m_field("tree"),
    "field/forge": m_field("forge"),
    "row": m_row,
    "splice": m_splice,
    "inject": m_inject,
    "meta": m_meta,
}
#: Classes that only a key can catch: not attempted on an unkeyed store.
KEYED_ONLY = {"field/forge", "splice"}


def campaign(workdir: Path, n: int, *, keyed: bool, seed: int = 0) -> Figures:
    """Try ``n`` random mutations on copies of one store; return the figures."""
    rng = random.Random(seed)
    key = KEY if keyed else None
    clean = workdir / f"clean-{'k' if keyed else 'u'}.db"
    build(clean, key)
    with cs.open(str(clean), key=key) as st:
        assert st.verify().ok
    image = clean.read_bytes()
    conn = sqlite3.connect(clean)
    clean_dump = dump(conn)
    conn.close()
    classes = [c for c in CLASSES if keyed or c not in KEYED_ONLY] + ["file"]
    figures = Figures()
    t0 = time.perf_counter()
    attempt = 0
    while figures.total < n:
        cls = rng.choice(classes)
        # A fresh file name each time: a connection that a failed open leaves behind
        # must not share its WAL index with the next copy.
        attempt += 1
        work = workdir / f"work-{attempt}.db"
        work.write_bytes(image)
        try:
            _one(work, cls, rng, keyed, key, clean_dump, figures)
        finally:
            for suffix in ("", "-wal", "-shm"):
                Path(str(work) + suffix).unlink(missing_ok=True)
    figures.seconds = time.perf_counter() - t0
    return figures


def _one(work: Path, cls: str, rng: random.Random, keyed: bool, key: bytes | None, clean_dump: object,
         figures: Figures) -> None:
    if cls == "file":
        what = _flip_file(work, rng, clean_dump)
    else:
        conn = sqlite3.connect(work)
        try:
            drop_triggers(conn)
            what = CLASSES[cls](conn, rng, keyed)
            conn.commit()
            if what is not None and dump(conn) == clean_dump:
                what = None
        except sqlite3.DatabaseError:
            what = None  # a constraint refused the change: the attacker cannot make it either
        finally:
            conn.close()
    if what is None:
        figures.skipped += 1
        return
    figures.tried[cls] += 1
    outcome = detect(work, key)
    if outcome in ("open", "verify"):
        figures.detected[cls] += 1
    elif outcome == "missed":
        figures.missed.append(what)
    else:
        figures.detected[cls] += 1
        figures.untyped.append(f"{what}: {outcome}")


# --- every path, not only open and verify --------------------------------------------------------


def _probe(call: Callable[[], object]) -> object:
    """Return what ``call`` serves, or ``("refused", error type)`` when it refuses with a typed error."""
    try:
        return call()
    except cs.CompactStoreError as exc:
        return ("refused", type(exc).__name__)


def probes(path: Path, key: bytes | None) -> dict[str, object]:
    """Return what every path that decides, copies or serves gives on the store at ``path``.

    Context, resume of each marker, restoration of each node, lookup by key and by
    position, spills, a compaction built (not appended) over a raw span, and a copy.
    Each is a value, or the typed refusal it ended in.
    """
    from compactstore import compaction

    out: dict[str, object] = {}
    try:
        st = cs.open(str(path), key=key, create=False)
    except cs.CompactStoreError as exc:
        return {"open": ("refused", type(exc).__name__)}
    try:
        s = st.session("agent-a")
        out["context"] = _probe(lambda: s.context().digest)
        size = _probe(lambda: s.size)
        records = _probe(lambda: [(r.pos, r.kind, r.event) for r in s.scan(verify=False)])
        if not isinstance(records, list) or not isinstance(size, int):
            return {**out, "scan": records}
        for pos, kind, event in records:
            if kind == "marker":
                out[f"resume {pos}"] = _probe(lambda p=pos: s.resume(p).digest)
            elif kind == "node":
                out[f"restore {pos}"] = _probe(lambda p=pos: s.restore_span(p).bodies)
            elif kind == "spill":
                out[f"spilled {pos}"] = _probe(lambda p=pos: s.spilled(f"spill:{p}"))
            elif kind == "binding" and isinstance(event, cs.Binding):
                out[f"lookup {event.key}"] = _probe(lambda k=event.key: s.lookup(k))
                out[f"lookup {pos}:value"] = _probe(lambda p=pos: s.lookup(f"{p}:value"))
        out["compaction"] = _probe(lambda: [msgspec.json.encode(e) for e in compaction.compaction(s.view, size, 0, 4)])
        out["copy"] = _probe(lambda: _copied(st, path))
    finally:
        st.close()
    return out


def _copied(st: cs.Store, path: Path) -> list[tuple[str, int, bytes]]:
    dst = path.with_name(path.name + ".copy.db")
    for suffix in ("", "-wal", "-shm"):
        Path(str(dst) + suffix).unlink(missing_ok=True)
    try:
        with cs.open(str(dst), key=KEY if st.keyed else None) as d:
            return [(c.name, c.events, c.root) for c in cs.copy(st, d).sessions]
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(str(dst) + suffix).unlink(missing_ok=True)


def served_forgeries(clean: dict[str, object], got: dict[str, object]) -> list[str]:
    """Return each path that served something the clean store does not, without refusing: a forgery served."""
    out = []
    for name, value in got.items():
        refused = isinstance(value, tuple) and len(value) == 2 and value[0] == "refused"
        if not refused and name in clean and value != clean[name]:
            out.append(name)
    return out


def paths_campaign(workdir: Path, n: int, *, keyed: bool, seed: int = 0) -> tuple[int, list[str]]:
    """Try ``n`` random mutations that open and verify must catch; return how many, and every path that served a forgery."""
    rng = random.Random(seed)
    key = KEY if keyed else None
    clean = workdir / f"paths-clean-{'k' if keyed else 'u'}.db"
    build(clean, key)
    want = probes(clean, key)
    image = clean.read_bytes()
    conn = sqlite3.connect(clean)
    clean_dump = dump(conn)
    conn.close()
    classes = [c for c in CLASSES if keyed or c not in KEYED_ONLY]
    tried, found, attempt = 0, [], 0
    while tried < n:
        attempt += 1
        work = workdir / f"paths-{attempt}.db"
        work.write_bytes(image)
        try:
            conn = sqlite3.connect(work)
            try:
                drop_triggers(conn)
                cls = rng.choice(classes)
                what = CLASSES[cls](conn, rng, keyed)
                conn.commit()
                if what is not None and dump(conn) == clean_dump:
                    what = None
            except sqlite3.DatabaseError:
                what = None
            finally:
                conn.close()
            if what is None:
                continue
            tried += 1
            found += [f"{what}: {p}" for p in served_forgeries(want, probes(work, key))]
        finally:
            for suffix in ("", "-wal", "-shm"):
                Path(str(work) + suffix).unlink(missing_ok=True)
    return tried, found
