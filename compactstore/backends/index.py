"""The structural index's table and queries, written once for every backend.

Also the batched reads the indexed marker checks make of the log and the tree (events
at a few positions, runs of stored subtree roots).

``structure_index(session_id, pos, rel, key, num, text)`` holds, per session, the rows
:class:`compactstore.structure.Deriver` derives from the events: opens and closes of
items, negative facts, bindings and snapshots of the open items. It is written in the
transaction that appends the events, insert-only (triggers refuse UPDATE, DELETE and
TRUNCATE, as on the log), and ``verify()`` derives it again from the bodies and
compares.

A backend exposes ``index_run(sql, args)`` (and its writer the same, inside the write
transaction); the SQL here uses ``?`` placeholders and ``IN`` lists, which the
PostgreSQL backend rewrites.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..errors import IntegrityError

TABLE = "structure_index"

#: ``(sql, args) -> rows``: one statement run by a backend or a writer.
Run = Callable[[str, Sequence[object]], list[tuple[Any, ...]]]
#: One index row as stored: ``(pos, rel, key, num, text)``.
IndexTuple = tuple[int, str, str, int, str]

SQLITE_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (session_id INTEGER NOT NULL, pos INTEGER NOT NULL, "
    "rel TEXT NOT NULL, key TEXT NOT NULL, num INTEGER NOT NULL, text TEXT NOT NULL, "
    # One B-tree keyed as it is read: a row per append costs fewer pages than a table and an index.
    "PRIMARY KEY (session_id, rel, pos, num)) STRICT, WITHOUT ROWID",
    # Partial, so an event without such facts touches no page of them; covering, so the
    # planner takes them over the primary key without statistics.
    f"CREATE INDEX IF NOT EXISTS idx_{TABLE}_key ON {TABLE} (session_id, rel, key, pos, num, text) "
    "WHERE rel = 'binding'",
    f"CREATE INDEX IF NOT EXISTS idx_{TABLE}_num ON {TABLE} (session_id, rel, num, pos, key, text) "
    "WHERE rel = 'negative'",
    *(
        f"CREATE TRIGGER IF NOT EXISTS {TABLE}_no_{op.lower()} BEFORE {op} ON {TABLE} "
        f"BEGIN SELECT RAISE(ABORT, 'compactstore: {TABLE} is append-only'); END"
        for op in ("UPDATE", "DELETE")
    ),
)

POSTGRES_SCHEMA = (
    f'CREATE TABLE IF NOT EXISTS {TABLE} (session_id bigint NOT NULL, pos bigint NOT NULL, '
    'rel text COLLATE "C" NOT NULL, key text COLLATE "C" NOT NULL, num bigint NOT NULL, '
    'text text COLLATE "C" NOT NULL)',
    f"CREATE UNIQUE INDEX IF NOT EXISTS {TABLE}_pos ON {TABLE} (session_id, rel, pos, num)",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_key ON {TABLE} (session_id, rel, key, pos) WHERE rel = 'binding'",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_num ON {TABLE} (session_id, rel, num) WHERE rel = 'negative'",
    *(
        f"CREATE OR REPLACE TRIGGER {TABLE}_no_{op} BEFORE {spec} ON {TABLE} "
        f"FOR EACH {'STATEMENT' if op == 'truncate' else 'ROW'} EXECUTE FUNCTION compactstore_append_only()"
        for op, spec in (("update", "UPDATE"), ("delete", "DELETE"), ("truncate", "TRUNCATE"))
    ),
)

_COLS = "pos, rel, key, num, text"


def _rows(got: Iterable[tuple[Any, ...]]) -> list[IndexTuple]:
    try:
        return [(int(p), str(r), str(k), int(n), str(t)) for p, r, k, n, t in got]
    except (TypeError, ValueError) as exc:  # a damaged file can hold any type in any cell
        raise IntegrityError(f"the structural index holds a damaged row: {exc}") from exc


def _chunks(values: Sequence[int], size: int = 500) -> list[Sequence[int]]:
    """Split ``values`` so that no statement carries more parameters than a backend takes."""
    return [values[i : i + size] for i in range(0, len(values), size)]


def _in(values: Sequence[object]) -> str:
    return "(" + ", ".join("?" * len(values)) + ")"


class IndexSQL:
    """The queries on one session's structural index, through ``run``."""

    def __init__(self, run: Run, session_id: int) -> None:
        self.run = run
        self.sid = session_id

    def rows(self, rels: Sequence[str], lo: int, hi: int) -> list[IndexTuple]:
        """Return the rows of kinds ``rels`` at positions ``[lo, hi)``, by position."""
        got = self.run(
            f"SELECT {_COLS} FROM {TABLE} WHERE session_id = ? AND rel IN {_in(rels)} AND pos >= ? AND pos < ? "
            "ORDER BY pos, num",
            (self.sid, *rels, lo, hi),
        )
        return _rows(got)

    def negatives_caused(self, lo: int, hi: int) -> list[IndexTuple]:
        """Return the ``negative`` rows before ``lo`` made negative in ``[lo, hi)`` (``num``), by position."""
        # rel as a literal, and no bound on pos (a range the primary key would take
        # instead): the partial index on num serves it. Rows in the span are dropped here.
        got = self.run(
            f"SELECT {_COLS} FROM {TABLE} WHERE session_id = ? AND rel = 'negative' AND num >= ? AND num < ? "
            "ORDER BY pos, num",
            (self.sid, lo, hi),
        )
        return [r for r in _rows(got) if r[0] < lo]

    def rows_at(self, rel: str, positions: Sequence[int]) -> list[IndexTuple]:
        """Return the rows of kind ``rel`` at ``positions`` (sorted), by position."""
        got: list[tuple[Any, ...]] = []
        for chunk in _chunks(positions):
            got += self.run(
                f"SELECT {_COLS} FROM {TABLE} WHERE session_id = ? AND rel = ? AND pos IN {_in(chunk)} ORDER BY pos",
                (self.sid, rel, *chunk),
            )
        return _rows(got)

    def latest_binding(self, key: str, before: int) -> IndexTuple | None:
        """Return the ``binding`` row of the last binding of ``key`` before ``before``."""
        got = self.run(
            f"SELECT {_COLS} FROM {TABLE} WHERE session_id = ? AND rel = 'binding' AND key = ? AND pos < ? "
            "ORDER BY pos DESC LIMIT 1",
            (self.sid, key, before),
        )
        return _rows(got)[0] if got else None

    def nodes(self, lo: int, hi: int) -> list[tuple[int, bytes | None]]:
        """Return ``(pos, body)`` of the summary nodes (events of kind ``node``) at positions ``[lo, hi)``, by position."""
        got = self.run(
            "SELECT pos, body FROM events WHERE session_id = ? AND pos >= ? AND pos < ? AND kind = 'node' ORDER BY pos",
            (self.sid, lo, hi),
        )
        return [(int(p), None if b is None else bytes(b)) for p, b in got]

    def body(self, pos: int) -> bytes | None:
        """Return the stored body of the event at ``pos`` (None: redacted or missing)."""
        got = self.run("SELECT body FROM events WHERE session_id = ? AND pos = ?", (self.sid, pos))
        return bytes(got[0][0]) if got and got[0][0] is not None else None

    def events_at(self, positions: Sequence[int]) -> list[tuple[Any, ...]]:
        """Return the event rows (``seq, session_id, pos, kind, idem_key, leaf, body``) at ``positions``."""
        got: list[tuple[Any, ...]] = []
        for chunk in _chunks(positions):
            got += self.run(
                "SELECT seq, session_id, pos, kind, idem_key, leaf, body FROM events "
                f"WHERE session_id = ? AND pos IN {_in(chunk)} ORDER BY pos",
                (self.sid, *chunk),
            )
        return got

    def subtrees(self, level: int, lo: int, hi: int) -> list[tuple[int, bytes]]:
        """Return ``(idx, hash)`` of the stored subtree roots at ``level`` (0: the leaves) with ``lo <= idx < hi``."""
        if level == 0:
            sql = "SELECT pos, leaf FROM events WHERE session_id = ? AND pos >= ? AND pos < ? ORDER BY pos"
            got = self.run(sql, (self.sid, lo, hi))
        else:
            sql = "SELECT idx, hash FROM nodes WHERE session_id = ? AND level = ? AND idx >= ? AND idx < ? ORDER BY idx"
            got = self.run(sql, (self.sid, level, lo, hi))
        return [(int(i), bytes(h)) for i, h in got]

    def insert(self, rows: Sequence[IndexTuple]) -> None:
        """Insert ``rows`` (a writer's transaction only)."""
        step = 150  # six parameters a row, under every backend's limit on one statement
        for i in range(0, len(rows), step):
            chunk = rows[i : i + step]
            self.run(
                f"INSERT INTO {TABLE} (session_id, {_COLS}) VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(chunk)),
                [v for r in chunk for v in (self.sid, *r)],
            )

    def all_rows(self, after: tuple[int, str, int], limit: int) -> list[IndexTuple]:
        """Return up to ``limit`` rows after ``(pos, rel, num)`` in that order, for streaming the whole index."""
        pos, rel, num = after
        got = self.run(
            f"SELECT {_COLS} FROM {TABLE} WHERE session_id = ? AND (pos > ? OR (pos = ? AND (rel > ? OR "
            "(rel = ? AND num > ?)))) ORDER BY pos, rel, num LIMIT ?",
            (self.sid, pos, pos, rel, rel, num, limit),
        )
        return _rows(got)


def orphans(run: Run) -> list[object]:
    """Return the session ids the index names that no session has, as stored (a damaged file may hold a NULL)."""
    got = run(f"SELECT DISTINCT session_id FROM {TABLE} WHERE session_id NOT IN (SELECT id FROM sessions) "
              "ORDER BY session_id", ())
    return [s for (s,) in got]
