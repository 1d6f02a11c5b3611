"""Editing a SQLite store's file as anyone holding it can: its append-only triggers dropped first."""

from __future__ import annotations

import sqlite3
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
