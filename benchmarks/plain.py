"""The references the benchmarks divide by: the workload, plain inserts and a plain Merkle tree.

* ``turns``: the workload every append benchmark uses, 1 KiB turns: 1,024 random bytes,
  base64-encoded (1,368 characters), so a stored row is about 1.4 KB.
* ``PlainSQLite``: what a careful programmer writes with the standard library alone:
  ``sqlite3`` inserting the very rows compactstore stores (same columns, same STRICT
  table, same unique indexes, same bytes) into WAL at a chosen ``synchronous`` level.
* ``PlainPostgres``: the same with psycopg 3 against PostgreSQL.
* ``plain_tree_root``: the tightest plain RFC 9162 tree in Python over the ``blake3``
  package: one call per leaf and one per node, neighbours paired bottom-up, an odd last
  node carried up unchanged.
"""

from __future__ import annotations

import base64
import random
import sqlite3
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
