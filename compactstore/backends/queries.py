"""The structural index's table, and the reads both backends answer with the same statements.

``structure_index(session_id, pos, rel, key, num, text)`` holds, per session, the rows
:class:`compactstore.structure.Deriver` derives from the events: opens and closes of
items, negative facts, bindings and snapshots of the open items. It is written in the
transaction that appends the events, insert-only (triggers refuse UPDATE, DELETE and
TRUNCATE, as on the log), and ``verify()`` derives it again from the bodies and
compares.

:class:`Reads` implements the protocol's verbs over the index, the events at given
positions, the summary nodes and the stored subtree roots for both backends: the
statements are written once here, in the placeholder style of the backend that runs
them, and never leave the backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..errors import IntegrityError
from ..structure import IndexRow
from .protocol import Row

TABLE = "structure_index"

#: ``(statement, arguments) -> rows``: one statement run on a backend's connection.
Fetch = Callable[[str, Sequence[object]], Sequence[tuple[Any, ...]]]

#: The one change the index allows: blanking the text of a negative fact (the rendering of
#: its event, which can quote a literal) at a position a redaction erased.
_ERASE_TEXT = (
    "NEW.text = '' AND NEW.session_id = OLD.session_id AND NEW.pos = OLD.pos AND NEW.rel = 'negative' "
    "AND OLD.rel = 'negative' AND NEW.key = OLD.key AND NEW.num = OLD.num "
    "AND EXISTS (SELECT 1 FROM redactions r WHERE r.session_id = OLD.session_id AND r.pos = OLD.pos)"
)

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
        f"CREATE TRIGGER IF NOT EXISTS {TABLE}_no_{op.lower()} BEFORE {op} ON {TABLE}"
        f"{f' WHEN NOT ({_ERASE_TEXT})' if op == 'UPDATE' else ''} "
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
    "CREATE OR REPLACE FUNCTION compactstore_index_erase_only() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    f"IF {_ERASE_TEXT} THEN RETURN NEW; END IF; "
    "RAISE EXCEPTION 'compactstore: % is append-only', TG_TABLE_NAME "
    "USING ERRCODE = 'restrict_violation'; END $$",
    *(
        f"CREATE OR REPLACE TRIGGER {TABLE}_no_{op} BEFORE {spec} ON {TABLE} "
        f"FOR EACH {'STATEMENT' if op == 'truncate' else 'ROW'} EXECUTE FUNCTION "
        f"{'compactstore_index_erase_only' if op == 'update' else 'compactstore_append_only'}()"
        for op, spec in (("update", "UPDATE"), ("delete", "DELETE"), ("truncate", "TRUNCATE"))
    ),
)

_COLS = "pos, rel, key, num, text"
_EVENT = "seq, session_id, pos, kind, idem_key, leaf, body"
#: Rows per multi-row insert: six parameters a row, under every backend's limit on one statement.
INSERT_ROWS = 150
#: Values per ``IN`` list, for the same reason.
_IN_VALUES = 500


class Queries:
    """The statements of :class:`Reads`, written with one backend's placeholder (``?`` or ``%s``)."""

    def __init__(self, mark: str) -> None:
        """Write the fixed statements with placeholder ``mark``."""
        m = self.mark = mark
        # rel as a literal, and no bound on pos (a range the primary key would take
        # instead): the partial index on num serves it.
        self.negatives_caused = (
            f"SELECT {_COLS} FROM {TABLE} WHERE session_id = {m} AND rel = 'negative' AND num >= {m} AND num < {m} "
            f"AND pos < {m} ORDER BY pos, num"
        )
        self.latest_binding = (
            f"SELECT {_COLS} FROM {TABLE} WHERE session_id = {m} AND rel = 'binding' AND key = {m} AND pos < {m} "
            "ORDER BY pos DESC LIMIT 1"
        )
        self.index_after = (
            f"SELECT {_COLS} FROM {TABLE} WHERE session_id = {m} AND (pos > {m} OR (pos = {m} AND (rel > {m} OR "
            f"(rel = {m} AND num > {m})))) ORDER BY pos, rel, num LIMIT {m}"
        )
        self.index_orphans = (
            f"SELECT DISTINCT session_id FROM {TABLE} WHERE session_id NOT IN (SELECT id FROM sessions) "
            "ORDER BY session_id"
        )
        self.node_bodies = (
            f"SELECT pos, body FROM events WHERE session_id = {m} AND pos >= {m} AND pos < {m} AND kind = 'node' "
            "ORDER BY pos"
        )
        self.derived_positions = (
            f"SELECT pos FROM events WHERE session_id = {m} AND pos >= {m} AND pos < {m} "
            "AND kind IN ('node', 'spill', 'marker', 'attempt') ORDER BY pos"
        )
        # Down the (session_id, pos) index from ``before``: it stops at the first markers it meets.
        self.latest_markers = (
            f"SELECT pos FROM events WHERE session_id = {m} AND pos < {m} AND kind = 'marker' "
            f"ORDER BY pos DESC LIMIT {m}"
        )
        self.body = f"SELECT body FROM events WHERE session_id = {m} AND pos = {m}"
        self.leaves = f"SELECT pos, leaf FROM events WHERE session_id = {m} AND pos >= {m} AND pos < {m} ORDER BY pos"
        self.subtrees = (
            f"SELECT idx, hash FROM subtrees WHERE session_id = {m} AND level = {m} AND idx >= {m} AND idx < {m} "
            "ORDER BY idx"
        )
        self.subtree_counts = f"SELECT level, count(*) FROM subtrees WHERE session_id = {m} GROUP BY level"
        #: blanks the negative facts' texts at one erased position (see ``_ERASE_TEXT``)
        self.erase_text = (
            f"UPDATE {TABLE} SET text = '' WHERE session_id = {m} AND pos = {m} AND rel = 'negative' AND text <> ''"
        )

    def _in(self, n: int) -> str:
        return "(" + ", ".join([self.mark] * n) + ")"

    def index_rows(self, rels: int) -> str:
        """Return the statement reading the rows of ``rels`` kinds in a position range."""
        m = self.mark
        return (
            f"SELECT {_COLS} FROM {TABLE} WHERE session_id = {m} AND rel IN {self._in(rels)} AND pos >= {m} "
            f"AND pos < {m} ORDER BY pos, num"
        )

    def index_rows_at(self, positions: int) -> str:
        """Return the statement reading the rows of one kind at ``positions`` positions."""
        m = self.mark
        return (
            f"SELECT {_COLS} FROM {TABLE} WHERE session_id = {m} AND rel = {m} AND pos IN {self._in(positions)} "
            "ORDER BY pos"
        )

    def rows_at(self, positions: int) -> str:
        """Return the statement reading the events at ``positions`` positions."""
        return f"SELECT {_EVENT} FROM events WHERE session_id = {self.mark} AND pos IN {self._in(positions)} ORDER BY pos"

    def insert_index(self, rows: int) -> str:
        """Return the statement inserting ``rows`` index rows (six values each, the session id first)."""
        return f"INSERT INTO {TABLE} (session_id, {_COLS}) VALUES " + ", ".join([self._in(6)] * rows)


SQLITE = Queries("?")
POSTGRES = Queries("%s")


def _index_rows(got: Iterable[tuple[Any, ...]]) -> list[IndexRow]:
    try:
        return [IndexRow(int(p), str(r), str(k), int(n), str(t)) for p, r, k, n, t in got]
    except (TypeError, ValueError) as exc:  # a damaged file can hold any type in any cell
        raise IntegrityError(f"the structural index holds a damaged row: {exc}") from exc


def _chunks(values: Sequence[int]) -> list[Sequence[int]]:
    """Split ``values`` so that no statement carries more parameters than a backend takes."""
    return [values[i : i + _IN_VALUES] for i in range(0, len(values), _IN_VALUES)]


class Reads:
    """The protocol's reads of the index, the events and the subtree roots, through ``fetch``.

    Each backend answers these verbs through one of these, with its own connection
    handling and error wrapping in ``fetch``; a writer through one on its transaction.
    """

    def __init__(self, fetch: Fetch, queries: Queries) -> None:
        """Run ``queries`` through ``fetch``."""
        self._fetch = fetch
        self._q = queries

    def index_rows(self, session_id: int, rels: Sequence[str], lo: int, hi: int) -> list[IndexRow]:
        """Return the index rows of kinds ``rels`` at positions ``[lo, hi)``, by position."""
        return _index_rows(self._fetch(self._q.index_rows(len(rels)), (session_id, *rels, lo, hi)))

    def index_rows_at(self, session_id: int, rel: str, positions: Sequence[int]) -> list[IndexRow]:
        """Return the index rows of kind ``rel`` at ``positions`` (sorted), by position."""
        got: list[tuple[Any, ...]] = []
        for chunk in _chunks(positions):
            got += self._fetch(self._q.index_rows_at(len(chunk)), (session_id, rel, *chunk))
        return _index_rows(got)

    def negatives_caused(self, session_id: int, lo: int, hi: int) -> list[IndexRow]:
        """Return the ``negative`` rows before ``lo`` made negative in ``[lo, hi)`` (their ``num``), by position."""
        return _index_rows(self._fetch(self._q.negatives_caused, (session_id, lo, hi, lo)))

    def latest_binding(self, session_id: int, key: str, before: int) -> IndexRow | None:
        """Return the ``binding`` row of the last binding of ``key`` before position ``before``."""
        got = _index_rows(self._fetch(self._q.latest_binding, (session_id, key, before)))
        return got[0] if got else None

    def index_after(self, session_id: int, after: tuple[int, str, int], limit: int) -> list[IndexRow]:
        """Return up to ``limit`` index rows after ``(pos, rel, num)`` in that order."""
        pos, rel, num = after
        return _index_rows(self._fetch(self._q.index_after, (session_id, pos, pos, rel, rel, num, limit)))

    def index_orphans(self) -> list[object]:
        """Return the session ids the index names that no session has, as stored."""
        return [s for (s,) in self._fetch(self._q.index_orphans, ())]

    def rows_at(self, session_id: int, positions: Sequence[int]) -> list[Row]:
        """Return the events at ``positions`` (sorted), by position."""
        got: list[Row] = []
        for chunk in _chunks(positions):
            got += [Row(*r) for r in self._fetch(self._q.rows_at(len(chunk)), (session_id, *chunk))]
        return got

    def node_bodies(self, session_id: int, lo: int, hi: int) -> list[tuple[int, bytes | None]]:
        """Return ``(pos, body)`` of the events of kind ``node`` at positions ``[lo, hi)``, by position."""
        got = self._fetch(self._q.node_bodies, (session_id, lo, hi))
        return [(int(p), None if b is None else bytes(b)) for p, b in got]

    def derived_positions(self, session_id: int, lo: int, hi: int) -> list[int]:
        """Return the positions in ``[lo, hi)`` of derived events (nodes, spills, markers, attempts), in order."""
        return [int(p) for (p,) in self._fetch(self._q.derived_positions, (session_id, lo, hi))]

    def latest_markers(self, session_id: int, before: int, limit: int) -> list[int]:
        """Return the positions of up to ``limit`` markers before position ``before``, latest first."""
        return [int(p) for (p,) in self._fetch(self._q.latest_markers, (session_id, before, limit))]

    def body(self, session_id: int, pos: int) -> bytes | None:
        """Return the stored body at ``pos`` (None: redacted or missing)."""
        got = self._fetch(self._q.body, (session_id, pos))
        return bytes(got[0][0]) if got and got[0][0] is not None else None

    def subtree_range(self, session_id: int, level: int, lo: int, hi: int) -> list[tuple[int, bytes]]:
        """Return ``(idx, hash)`` of the stored subtree roots at ``level`` with ``lo <= idx < hi`` (level 0: leaves)."""
        if level == 0:
            got = self._fetch(self._q.leaves, (session_id, lo, hi))
        else:
            got = self._fetch(self._q.subtrees, (session_id, level, lo, hi))
        return [(i, h) for i, h in got]  # as stored: verify compares what a damaged cell holds

    def subtree_counts(self, session_id: int) -> dict[int, int]:
        """Return the number of stored subtree roots per level."""
        return {int(lv): int(n) for lv, n in self._fetch(self._q.subtree_counts, (session_id,))}
