"""The references the benchmarks divide by: the workload, plain inserts, a plain Merkle tree and the peers' stores.

* ``turns``: the workload every append benchmark uses, 1 KiB turns: 1,024 random bytes,
  base64-encoded (1,368 characters), so a stored row is about 1.4 KB.
* ``PlainSQLite``: what a careful programmer writes with the standard library alone:
  ``sqlite3`` inserting the very rows compactstore stores (same columns, same STRICT
  table, same unique indexes, same bytes) into WAL at a chosen ``synchronous`` level.
* ``PlainPostgres``: the same with psycopg 3 against PostgreSQL.
* ``plain_tree_root``: the tightest plain RFC 9162 tree in Python over the ``blake3``
  package: one call per leaf and one per node, neighbours paired bottom-up, an odd last
  node carried up unchanged.
* ``Store`` and its subclasses: one store of chat messages on one SQLite file, as an
  agent framework keeps it (langgraph ``SqliteSaver.put_writes``, OpenAI Agents
  ``SQLiteSession.add_items``) and as compactstore's adapters keep it in their place;
  ``Run``: one timed round of one of them. ``peers.py`` and ``adapters.py`` both
  measure these, so the two compare the same calls.
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
from blake3 import blake3

import harness  # noqa: F401  (puts the checkout on sys.path when run from it)
import compactstore as cs
from compactstore import events as ev
from compactstore import merkle

TURN_BYTES = 1024
#: A fixed clock start, so that bodies (and so rows) are the same run after run.
CLOCK_START = 1_767_225_600_000_000


def turns(count: int, seed: int = 20240601, role: str = "user") -> list[cs.Turn]:
    """Return ``count`` turns of 1 KiB of random bytes each, base64-encoded."""
    rng = random.Random(seed)
    return [cs.Turn(role, base64.b64encode(rng.randbytes(TURN_BYTES)).decode()) for _ in range(count)]


def messages(count: int, seed: int = 20240601) -> list[dict[str, str]]:
    """Return ``count`` chat messages (what peers store): 1 KiB of random bytes each, base64-encoded, users and assistants in turn."""
    rng = random.Random(seed)
    return [{"role": "assistant" if i % 2 else "user", "content": base64.b64encode(rng.randbytes(TURN_BYTES)).decode()}
            for i in range(count)]


def rows_of(events: Sequence[cs.Turn], first_seq: int, first_pos: int, session_id: int = 1) -> list[tuple[Any, ...]]:
    """Return the rows compactstore stores for ``events`` (ts stamped from CLOCK_START), precomputed."""
    out = []
    for i, e in enumerate(events):
        body = ev.encode(e if e.ts is not None else _stamp(e, CLOCK_START + first_pos + i))
        out.append((first_seq + i, session_id, first_pos + i, e.kind, None, merkle.leaf_hash(body), body))
    return out


def _stamp(e: cs.Turn, ts: int) -> cs.Turn:
    return msgspec.structs.replace(e, ts=ts)


class PlainSQLite:
    """A plain ``sqlite3`` log with compactstore's events table, for the same rows.

    ``insert`` writes a batch in one transaction (``BEGIN``, ``executemany``, ``COMMIT``);
    a batch of one is a single-row commit.
    """

    DDL = (
        'CREATE TABLE events ("seq" INTEGER PRIMARY KEY, "session_id" INTEGER NOT NULL, '
        '"pos" INTEGER NOT NULL, "kind" TEXT NOT NULL, "idem_key" TEXT, "leaf" BLOB NOT NULL, "body" BLOB) STRICT',
        'CREATE UNIQUE INDEX idx_events_session_id_pos ON events ("session_id", "pos")',
        "CREATE UNIQUE INDEX idx_events_idem ON events(session_id, idem_key) WHERE idem_key IS NOT NULL",
    )

    def __init__(self, path: str | Path, synchronous: str = "NORMAL") -> None:
        """Create the table in a new database at ``path``, WAL, at ``synchronous`` (NORMAL or FULL)."""
        self.conn = sqlite3.connect(str(path), isolation_level=None)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute(f"PRAGMA synchronous = {synchronous}")
        for sql in self.DDL:
            self.conn.execute(sql)
        self.seq = 1
        self.pos = 0

    def insert(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert ``rows`` in one transaction."""
        conn = self.conn
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        conn.execute("COMMIT")

    def rows_for(self, events: Sequence[cs.Turn]) -> list[tuple[Any, ...]]:
        """Return the next rows for ``events`` and advance the counters (call outside the timing)."""
        rows = rows_of(events, self.seq, self.pos)
        self.seq += len(rows)
        self.pos += len(rows)
        return rows

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


class PlainWithHeads(PlainSQLite):
    """``PlainSQLite`` plus compactstore's ``heads`` table: each transaction also inserts one head row.

    The SQL of compactstore's own commit with no Python work around it: the events rows
    and a sealed head (root, seal and seq runs of the sizes compactstore stores), the
    head's values made outside the transaction. Between plain and compactstore, it
    shows what the schema costs and what the Python work does.
    """

    HEADS = (
        'CREATE TABLE "heads" (\n   "session_id" INTEGER,\n   "size" INTEGER,\n   "root" BLOB NOT NULL,\n'
        '   "prev" INTEGER NOT NULL,\n   "seal" BLOB NOT NULL,\n   "seqs" BLOB NOT NULL,\n'
        '   PRIMARY KEY ("session_id", "size")\n) STRICT, WITHOUT ROWID'
    )

    def __init__(self, path: str | Path, synchronous: str = "NORMAL") -> None:
        """Create the events and heads tables in a new database at ``path``."""
        super().__init__(path, synchronous)
        self.conn.execute(self.HEADS)
        self.root, self.seal = os.urandom(32), os.urandom(32)

    def insert(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert ``rows`` and the head after them in one transaction."""
        conn = self.conn
        first, last = rows[0], rows[-1]
        head = (1, last[2] + 1, self.root, first[2], self.seal, first[0].to_bytes(8, "big") + len(rows).to_bytes(8, "big"))
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        conn.execute("INSERT INTO heads VALUES (?, ?, ?, ?, ?, ?)", head)
        conn.execute("COMMIT")


class PlainPostgres:
    """A plain psycopg 3 log with compactstore's PostgreSQL events table, for the same rows."""

    def __init__(self, url: str, table: str) -> None:
        """Create table ``table`` (dropped first) in the database at ``url``."""
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.table = table
        self.conn.execute(f"DROP TABLE IF EXISTS {table}")
        self.conn.execute(
            f'CREATE TABLE {table} (seq bigint GENERATED ALWAYS AS IDENTITY (CACHE 1) PRIMARY KEY, '
            'session_id bigint NOT NULL, pos bigint NOT NULL, kind text COLLATE "C" NOT NULL, '
            'idem_key text COLLATE "C", leaf bytea NOT NULL, body bytea, UNIQUE (session_id, pos))'
        )
        self.conn.execute(
            f"CREATE UNIQUE INDEX {table}_idem ON {table} (session_id, idem_key) WHERE idem_key IS NOT NULL"
        )
        self.seq = 1
        self.pos = 0

    def rows_for(self, events: Sequence[cs.Turn]) -> list[tuple[Any, ...]]:
        """Return the next rows (without seq, which the database assigns)."""
        rows = [r[1:] for r in rows_of(events, self.seq, self.pos)]
        self.seq += len(rows)
        self.pos += len(rows)
        return rows

    def insert(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert ``rows`` in one transaction."""
        with self.conn.transaction():
            with self.conn.cursor() as cur:
                cur.executemany(
                    f"INSERT INTO {self.table} (session_id, pos, kind, idem_key, leaf, body) "
                    "VALUES (%s, %s, %s, %s, %s, %s)",
                    rows,
                )

    def close(self) -> None:
        """Drop the table and close the connection."""
        self.conn.execute(f"DROP TABLE IF EXISTS {self.table}")
        self.conn.close()


def plain_tree_root(entries: Sequence[bytes]) -> bytes:
    """Return the RFC 9162 root of ``entries`` (BLAKE3): one call per leaf and per node, paired bottom-up."""
    h = blake3
    level = [h(b"\x00" + e).digest() for e in entries]
    if not level:
        return h(b"").digest()
    while len(level) > 1:
        n = len(level)
        paired = [h(b"\x01" + a + b).digest() for a, b in zip(level[0 : n - 1 : 2], level[1::2])]
        if n & 1:
            paired.append(level[-1])
        level = paired
    return level[0]


# --- the stores of chat messages the peers' benchmarks compare ----------------------

#: What every store must run at for its time to count: WAL, and an fsync per commit
#: (an acknowledged message survives power loss).
DURABILITY = ("wal", "FULL")
_SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def settings_of(conn: sqlite3.Connection) -> tuple[str, str]:
    """Return ``(journal_mode, synchronous)`` as ``conn`` writes."""
    mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    return mode, _SYNCHRONOUS.get(sync, str(sync))


class Store:
    """One store of chat messages in one fresh SQLite file: append calls, read-back, close.

    ``name`` labels it among the peers, ``call`` by the call measured.
    """

    name = ""
    call = ""

    def __init__(self, path: str) -> None:
        """Open a fresh store at ``path``."""
        self.path = path

    def append(self, turns: list[dict[str, str]]) -> None:
        """Append ``turns`` in one call."""
        raise NotImplementedError

    def read_back(self) -> int:
        """Read every turn back; return how many."""
        raise NotImplementedError

    def settings(self) -> tuple[str, str]:
        """Return ``(journal_mode, synchronous)`` of the connection that wrote.

        That is ``self.conn`` when the store keeps one, a compactstore store's own, else
        what a connection that sets nothing gets (the file's journal mode, SQLite's
        default ``synchronous``); a store whose connections are elsewhere overrides this.
        """
        store = getattr(self, "store", None)
        conn = getattr(store.backend, "_conn", None) if isinstance(store, cs.Store) else getattr(self, "conn", None)
        if isinstance(conn, sqlite3.Connection):
            return settings_of(conn)
        conn = sqlite3.connect(self.path)
        try:
            return settings_of(conn)
        finally:
            conn.close()

    def close(self) -> None:
        """Close the store (SQLite then folds the WAL into the file)."""


def sqlite_saver(path: str) -> tuple[sqlite3.Connection, Any]:
    """Return a connection at ``synchronous=FULL`` and langgraph's ``SqliteSaver`` on it, set up (WAL)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(path, check_same_thread=False)
    conn.execute("PRAGMA synchronous = FULL")
    saver = SqliteSaver(conn)
    saver.setup()
    return conn, saver


class LangGraphWrites(Store):
    """langgraph ``SqliteSaver.put_writes``: each turn a pending write of one task, against one checkpoint."""

    name = "langgraph put_writes"
    call = "SqliteSaver.put_writes"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.conn, saver = sqlite_saver(path)
        self._start(saver)

    def _start(self, saver: Any) -> None:
        from langgraph.checkpoint.base import empty_checkpoint

        self.saver = saver
        base = {"configurable": {"thread_id": "chat", "checkpoint_ns": ""}}
        self.config = saver.put(base, empty_checkpoint(), {"source": "input", "step": -1, "parents": {}}, {})
        self.n = 0

    def append(self, turns: list[dict[str, str]]) -> None:
        self.n += 1
        self.saver.put_writes(self.config, [("messages", t) for t in turns], task_id=f"task-{self.n}")

    def read_back(self) -> int:
        got = self.saver.get_tuple(self.config)
        return len(got.pending_writes or []) if got else 0

    def close(self) -> None:
        self.conn.close()


class AdapterLangGraphWrites(LangGraphWrites):
    """compactstore through its LangGraph adapter: ``CompactStoreSaver.put_writes``, durable=True."""

    name = "compactstore via langgraph adapter"
    call = "CompactStoreSaver.put_writes"

    def __init__(self, path: str) -> None:
        Store.__init__(self, path)
        from compactstore.adapters.langgraph import CompactStoreSaver

        self.store = cs.open(path, durable=True)
        self._start(CompactStoreSaver(self.store))

    def close(self) -> None:
        self.store.close()


class OpenAISession(Store):
    """OpenAI Agents ``SQLiteSession.add_items``, at ``synchronous=FULL``."""

    name = "openai-agents SQLiteSession"
    call = "SQLiteSession.add_items"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        from agents import SQLiteSession

        self.loop = asyncio.new_event_loop()
        self.session = SQLiteSession("chat", path)
        # Its connections (one per worker thread) keep SQLite's default synchronous: set
        # FULL on the one its calls use (the worker that ran this one is reused while idle).
        self._in_worker(lambda conn: conn.execute("PRAGMA synchronous = FULL"))

    def _in_worker(self, fn: Any) -> Any:
        """Return ``fn(connection)`` run in a worker thread on the connection the session uses there."""
        async def run() -> Any:
            return await asyncio.to_thread(lambda: fn(self.session._get_connection()))

        return self.loop.run_until_complete(run())

    def append(self, turns: list[dict[str, str]]) -> None:
        self.loop.run_until_complete(self.session.add_items(list(turns)))  # type: ignore[arg-type]

    def read_back(self) -> int:
        return len(self.loop.run_until_complete(self.session.get_items()))

    def settings(self) -> tuple[str, str]:
        got: tuple[str, str] = self._in_worker(settings_of)
        return got

    def close(self) -> None:
        self.session.close()
        self.loop.close()


class AdapterOpenAI(OpenAISession):
    """compactstore through its OpenAI Agents adapter: ``CompactStoreSession.add_items``, durable=True."""

    name = "compactstore via openai adapter"
    call = "CompactStoreSession.add_items"

    def __init__(self, path: str) -> None:
        Store.__init__(self, path)
        from compactstore.adapters.openai_agents import CompactStoreSession

        self.loop = asyncio.new_event_loop()
        self.store = cs.open(path, durable=True)
        self.session = CompactStoreSession("chat", self.store)  # type: ignore[assignment]

    #: the store's own connection, not the SDK session's
    settings = Store.settings

    def close(self) -> None:
        self.store.close()
        self.loop.close()


class Run:
    """One timed round of a store: a fresh file, its appends timed, then read-back, durability and size.

    Each call returns the seconds the appends took, and keeps the read-back time and
    the bytes on disk. A store not at :data:`DURABILITY` fails the round: its time
    would not compare.
    """

    def __init__(self, cls: type[Store], turns: list[dict[str, str]], per_call: int, tmp: str) -> None:
        """Prepare rounds of ``cls`` over ``turns``, ``per_call`` turns per call, in files under ``tmp``."""
        self.cls, self.turns, self.per_call, self.tmp = cls, turns, per_call, tmp
        self.read: list[float] = []
        self.bytes: list[int] = []
        self.k = 0

    def __call__(self) -> float:
        self.k += 1
        path = os.path.join(self.tmp, f"{self.cls.__name__}-{self.per_call}-{self.k}.db")
        store = self.cls(path)
        turns, step = self.turns, self.per_call
        chunks = [turns[i : i + step] for i in range(0, len(turns), step)]
        t0 = time.perf_counter()
        for chunk in chunks:
            store.append(chunk)
        elapsed = time.perf_counter() - t0
        t1 = time.perf_counter()
        n = store.read_back()
        self.read.append(time.perf_counter() - t1)
        assert n == len(turns), f"{self.cls.name} read back {n} of {len(turns)} turns"
        settings = store.settings()
        if settings != DURABILITY:
            raise RuntimeError(f"{self.cls.name} ran at journal_mode, synchronous = {settings}, "
                               f"not {DURABILITY}: its time would not compare")
        store.close()
        self.bytes.append(harness.disk_bytes(path))
        for suffix in ("", "-wal", "-shm"):
            Path(path + suffix).unlink(missing_ok=True)
        return elapsed
