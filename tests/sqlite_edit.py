"""Editing a store's database as anyone holding it can: its append-only triggers dropped first."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def unguarded(path: str | Path, **connect: Any) -> sqlite3.Connection:
    """Return a connection to the store at ``path`` with its triggers dropped."""
    conn: sqlite3.Connection = sqlite3.connect(path, **connect)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    return conn


def tamper(path: str | Path, sql: str, args: tuple[object, ...] = ()) -> None:
    """Run one statement on the store at ``path``, triggers dropped, and commit it."""
    conn = unguarded(path)
    conn.execute(sql, args)
    conn.commit()
    conn.close()


Run = Callable[..., list[tuple[Any, ...]]]


@contextmanager
def edited(target: str) -> Iterator[Run]:
    """Yield ``run(sql, *args)`` over the store's database (SQLite or PostgreSQL), its triggers dropped; commit at the end."""
    if target.startswith("postgresql"):
        import psycopg

        conn: Any = psycopg.connect(target, autocommit=False)
        for table, name in conn.execute("SELECT tgrelid::regclass::text, tgname FROM pg_trigger WHERE NOT tgisinternal").fetchall():
            conn.execute(f"DROP TRIGGER {name} ON {table}")
        mark = "%s"
    else:
        conn = unguarded(target)
        mark = "?"

    def run(sql: str, *args: object) -> list[tuple[Any, ...]]:
        cur = conn.execute(sql.replace("?", mark), args)
        return list(cur.fetchall()) if cur.description else []

    try:
        yield run
        conn.commit()
    finally:
        conn.close()
