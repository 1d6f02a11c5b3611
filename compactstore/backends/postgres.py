"""PostgreSQL through psycopg 3 and a connection pool: one store shared by many processes.

The tables and columns are those of the SQLite backend (``bytea`` for blobs, ``bigint``
for integers, text compared byte-wise with the ``C`` collation so that orders match).
The library creates and migrates the schema itself, under an advisory lock so that many
processes may open a fresh database at once, and records the schema version in ``meta``.
Triggers refuse UPDATE, DELETE and TRUNCATE on every log table.

A write transaction takes a transaction-scoped advisory lock keyed on its session, so
appends to one session are serialized (positions are read and written under the lock)
while appends to different sessions run in parallel. Sequence numbers come from an
identity column: unique and increasing within a session, but with gaps.

Every driver error is re-raised as a :class:`~compactstore.CompactStoreError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import errors as pgerr
from psycopg_pool import ConnectionPool

from ..errors import CompactStoreError, ConflictError, IntegrityError, InvalidEvent
from . import SCHEMA_VERSION, HeadRow, Row, keyset
from . import index as _index

if TYPE_CHECKING:
    from . import Backend

LOG_TABLES = ("meta", "sessions", "events", "nodes", "heads", "redactions")
#: How long a writer waits for its session's lock (or any row lock) before giving up.
LOCK_TIMEOUT = "60s"
#: Advisory lock classes (the first key of the two-key form): ``"cs"`` + a tag.
_LOCK_SCHEMA = 0x63730001
_LOCK_SESSION = 0x63730002
_ROW = "seq, session_id, pos, kind, idem_key, leaf, body"

_T = TypeVar("_T")

#: The schema of version 1, created in one transaction.
_SCHEMA = (
    'CREATE TABLE meta (name text COLLATE "C" PRIMARY KEY, value text COLLATE "C" NOT NULL)',
    'CREATE TABLE sessions (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, '
    'name text COLLATE "C" NOT NULL UNIQUE)',
    # One sequence, one value at a time: within a session seqs follow the append order.
    # Every unique key of the log tables leads with session_id, so a distributed engine
    # (Citus) can shard them by session as they are; seq is unique by construction.
    # body is NULL only once a redaction has erased it (see the events update trigger).
    'CREATE TABLE events (seq bigint GENERATED ALWAYS AS IDENTITY (CACHE 1) NOT NULL, '
    'session_id bigint NOT NULL, pos bigint NOT NULL, kind text COLLATE "C" NOT NULL, '
    'idem_key text COLLATE "C", leaf bytea NOT NULL, body bytea, PRIMARY KEY (session_id, pos))',
    "CREATE UNIQUE INDEX events_idem ON events (session_id, idem_key) WHERE idem_key IS NOT NULL",
    "CREATE TABLE nodes (session_id bigint NOT NULL, level bigint NOT NULL, idx bigint NOT NULL, "
    "hash bytea NOT NULL, PRIMARY KEY (session_id, level, idx))",
    "CREATE TABLE heads (session_id bigint NOT NULL, size bigint NOT NULL, root bytea NOT NULL, "
    "prev bigint NOT NULL, seal bytea NOT NULL, PRIMARY KEY (session_id, size))",
    "CREATE TABLE redactions (session_id bigint NOT NULL, pos bigint NOT NULL, by bigint NOT NULL, "
    "PRIMARY KEY (session_id, pos))",
    "CREATE FUNCTION compactstore_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "RAISE EXCEPTION 'compactstore: % is append-only', TG_TABLE_NAME "
    "USING ERRCODE = 'restrict_violation'; END $$",
    # The one change the log allows: erasing the body (and with it the kind and the
    # idempotency key) of a position already recorded as redacted; seq, position and
    # leaf stay.
    "CREATE FUNCTION compactstore_erase_only() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "IF NEW.body IS NULL AND OLD.body IS NOT NULL AND NEW.seq = OLD.seq "
    "AND NEW.session_id = OLD.session_id AND NEW.pos = OLD.pos AND NEW.kind = 'redacted' "
    "AND NEW.idem_key IS NULL AND NEW.leaf = OLD.leaf "
    "AND EXISTS (SELECT 1 FROM redactions r WHERE r.session_id = OLD.session_id AND r.pos = OLD.pos) "
    "THEN RETURN NEW; END IF; "
    "RAISE EXCEPTION 'compactstore: % is append-only', TG_TABLE_NAME "
    "USING ERRCODE = 'restrict_violation'; END $$",
    *(
        f"CREATE TRIGGER {table}_no_{op} BEFORE {spec} ON {table} "
        f"FOR EACH {'STATEMENT' if op == 'truncate' else 'ROW'} EXECUTE FUNCTION "
        f"{'compactstore_erase_only' if (table, op) == ('events', 'update') else 'compactstore_append_only'}()"
        for table in LOG_TABLES
        for op, spec in (("update", "UPDATE"), ("delete", "DELETE"), ("truncate", "TRUNCATE"))
    ),
    # A readable view, like the SQLite backend's.
    "CREATE VIEW events_readable AS SELECT e.seq, s.name AS session, e.pos, e.kind, e.idem_key, "
    "encode(e.leaf, 'hex') AS leaf, convert_from(e.body, 'UTF8') AS body "
    "FROM events e JOIN sessions s ON s.id = e.session_id",
)

#: Migrations: from a schema version to the next, as ``(next version, statements)``.
#: The version in ``meta`` is rewritten by the migration with the triggers disabled.
_MIGRATIONS: dict[str, tuple[str, tuple[str, ...]]] = {}


def redact_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***``, for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "postgresql://…"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def _error(exc: BaseException, doing: str) -> CompactStoreError:
    """Return the compactstore error for a driver error raised while ``doing``."""
    if isinstance(exc, pgerr.LockNotAvailable):
        return ConflictError(f"PostgreSQL: {doing}: timed out waiting for another writer ({exc})")
    if isinstance(exc, pgerr.UniqueViolation):
        return ConflictError(f"PostgreSQL: {doing}: another writer got there first ({exc})")
    return CompactStoreError(f"PostgreSQL: {doing}: {type(exc).__name__}: {exc}")


#: ``_lock_key`` in SQL, for locking in the same statement that finds the session.
_FOLD_SQL = "((id & 4294967295) - CASE WHEN (id & 4294967295) >= 2147483648 THEN 4294967296 ELSE 0 END)::int4"


def _lock_key(session_id: int) -> int:
    """Fold a session id into the signed 32-bit second key of an advisory lock."""
    folded = session_id & 0xFFFFFFFF
    return folded - (1 << 32) if folded >= 1 << 31 else folded


def _text(value: str, field: str) -> str:
    """Refuse text PostgreSQL cannot store (NUL characters) before it reaches the server."""
    if "\x00" in value:
        raise InvalidEvent(field, "must not contain NUL characters (PostgreSQL text cannot hold them)")
    return value


class PostgresBackend:
    """A store in one PostgreSQL database, reached through a pool of connections."""

    gapless_seq = False
    #: Whether opening created the structural index (the store above derives it for the log there is).
    index_created = False

    def __init__(self, url: str, *, durable: bool = False, min_size: int = 1, max_size: int = 4) -> None:
        """Connect to ``url``, creating or migrating the schema if needed.

        Args:
            url: a ``postgresql://`` (or ``postgres://``) URL, in libpq's syntax.
            durable: force ``synchronous_commit = on`` for this store's transactions
                (an acknowledged append then survives a server crash and power loss),
                whatever the server's default; otherwise the server's setting holds.
            min_size: connections the pool keeps open.
            max_size: connections the pool opens at most.

        Raises:
            CompactStoreError: the server cannot be reached, its encoding is not UTF8,
                or the database holds a schema newer than this library.
        """
        self._where = redact_url(url)
        self._durable = durable
        try:
            with psycopg.connect(url, autocommit=True, client_encoding="UTF8") as conn:
                encoding = conn.info.parameter_status("server_encoding")
                if encoding != "UTF8":
                    raise CompactStoreError(
                        f"PostgreSQL store {self._where}: server encoding is {encoding}, want UTF8",
                        hint="create the database with ENCODING 'UTF8'",
                    )
                self.index_created = _ensure_schema(conn)
        except psycopg.Error as exc:
            raise _error(exc, f"cannot open {self._where}") from exc
        try:
            self._pool: ConnectionPool[psycopg.Connection[tuple[Any, ...]]] = ConnectionPool(
                url,
                min_size=min_size,
                max_size=max(min_size, max_size),
                kwargs={"autocommit": True, "client_encoding": "UTF8"},
                configure=self._configure,
                name="compactstore",
                open=True,
            )
        except psycopg.Error as exc:
            raise _error(exc, f"cannot open {self._where}") from exc

    def _configure(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        if self._durable:
            conn.execute("SET synchronous_commit = on")

    def close(self) -> None:
        self._pool.close()

    def _run(self, doing: str, fn: Callable[[psycopg.Cursor[tuple[Any, ...]]], _T]) -> _T:
        try:
            with self._pool.connection() as conn, conn.cursor(binary=True) as cur:
                return fn(cur)
        except psycopg.Error as exc:
            raise _error(exc, doing) from exc

    def _all(self, sql: str, args: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        def go(cur: psycopg.Cursor[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
            cur.execute(sql, args)
            return cur.fetchall()

        return self._run("query", go)

    def meta(self) -> dict[str, str]:
        return {str(n): str(v) for n, v in self._all("SELECT name, value FROM meta")}

    def init_meta(self, values: dict[str, str]) -> dict[str, str]:
        def go(cur: psycopg.Cursor[tuple[Any, ...]]) -> None:
            conn = cur.connection
            with conn.transaction():
                # Serialize against other first openers: one set of values wins whole.
                cur.execute("SELECT pg_advisory_xact_lock(%s, 0)", (_LOCK_SCHEMA,))
                cur.execute("SELECT 1 FROM meta LIMIT 1")
                if cur.fetchone() is None:
                    cur.executemany(
                        "INSERT INTO meta (name, value) VALUES (%s, %s)",
                        [("schema_version", SCHEMA_VERSION), *values.items()],
                    )

        self._run("initialise meta", go)
        return self.meta()

    def sessions(self) -> list[tuple[int, str]]:
        return [(int(i), str(n)) for i, n in self._all("SELECT id, name FROM sessions ORDER BY name")]

    def session_id(self, name: str) -> int | None:
        got = self._all("SELECT id FROM sessions WHERE name = %s", (name,))
        return int(got[0][0]) if got else None

    @contextmanager
    def writer(self, name: str) -> Iterator[_PGWriter]:
        doing = f"append to session {name!r}"
        try:
            with (
                self._pool.connection() as conn,
                _pipeline(conn),
                conn.transaction(),
                conn.cursor(binary=True) as cur,
                conn.cursor(binary=True) as ahead,
            ):
                # The common case, an existing session, is one round trip: BEGIN, find the
                # session and take its lock, then (a statement later, so under the lock)
                # read its latest head.
                cur.execute(
                    f"SELECT id, pg_advisory_xact_lock(%s, {_FOLD_SQL}) FROM sessions WHERE name = %s",
                    (_LOCK_SESSION, name),
                )
                ahead.execute(
                    "SELECT h.size, h.root, h.prev, h.seal FROM sessions s JOIN heads h ON h.session_id = s.id "
                    "WHERE s.name = %s ORDER BY h.size DESC LIMIT 1",
                    (name,),
                )
                got = cur.fetchone()
                prefetched = ahead.fetchone()
                locked = got is not None
                if got is None:
                    # Race-free creation: a concurrent creator of the same name makes this
                    # insert wait for its commit and then do nothing; the select finds its row.
                    cur.execute(
                        "INSERT INTO sessions (name) VALUES (%s) ON CONFLICT (name) DO NOTHING RETURNING id", (name,)
                    )
                    got = cur.fetchone()
                    if got is None:
                        cur.execute("SELECT id FROM sessions WHERE name = %s", (name,))
                        got = cur.fetchone()
                if got is None:
                    raise ConflictError(f"session {name!r} vanished while being created", session=name)
                sid = int(got[0])
                if not locked:
                    # Held until commit or rollback: appends to this session, and only
                    # this session, wait here.
                    cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_LOCK_SESSION, _lock_key(sid)))
                head = (HeadRow(*prefetched) if prefetched else None) if locked else _UNREAD
                yield _PGWriter(cur, sid, head)
        except psycopg.Error as exc:
            raise _error(exc, doing) from exc

    def row(self, session_id: int, pos: int) -> Row | None:
        got = self._all(f"SELECT {_ROW} FROM events WHERE session_id = %s AND pos = %s", (session_id, pos))
        return Row(*got[0]) if got else None

    def rows(self, session_id: int, start: int, stop: int | None, chunk: int) -> Iterator[Row]:
        sql = f"SELECT {_ROW} FROM events WHERE session_id = %s AND pos >= %s AND pos < %s ORDER BY pos LIMIT %s"
        return keyset(lambda a, b, n: self._all(sql, (session_id, a, b, n)), start, stop, chunk)

    def head(self, session_id: int) -> HeadRow | None:
        got = self._all(
            "SELECT size, root, prev, seal FROM heads WHERE session_id = %s ORDER BY size DESC LIMIT 1", (session_id,)
        )
        return HeadRow(*got[0]) if got else None

    def hashes(self, session_id: int, coords: Sequence[tuple[int, int]]) -> list[bytes]:
        return self._run("read subtree roots", lambda cur: _hashes(cur, session_id, coords))

    def node_range(self, session_id: int, level: int, lo: int, hi: int) -> list[tuple[int, bytes]]:
        got = self._all(
            "SELECT idx, hash FROM nodes WHERE session_id = %s AND level = %s AND idx >= %s AND idx < %s ORDER BY idx",
            (session_id, level, lo, hi),
        )
        return [(int(i), bytes(h)) for i, h in got]

    def node_counts(self, session_id: int) -> dict[int, int]:
        got = self._all("SELECT level, count(*) FROM nodes WHERE session_id = %s GROUP BY level", (session_id,))
        return {int(lv): int(n) for lv, n in got}

    def heads(self, session_id: int, after: int, limit: int) -> list[HeadRow]:
        got = self._all(
            "SELECT size, root, prev, seal FROM heads WHERE session_id = %s AND size > %s ORDER BY size LIMIT %s",
            (session_id, after, limit),
        )
        return [HeadRow(*r) for r in got]

    def integrity(self) -> list[str]:
        """Return nothing: PostgreSQL checks its own pages and indexes (data checksums, amcheck)."""
        return []

    def redactions(self, session_id: int) -> dict[int, int]:
        got = self._all("SELECT pos, by FROM redactions WHERE session_id = %s", (session_id,))
        return {int(p): int(b) for p, b in got}

    def orphans(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for table in ("events", "nodes", "heads", "redactions"):
            got = self._all(
                f"SELECT DISTINCT session_id FROM {table} t "
                "WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = t.session_id) ORDER BY session_id"
            )
            out.extend((table, int(sid)) for (sid,) in got)
        return out

    def seq_bounds(self) -> tuple[int, int, int]:
        n, lo, hi = self._all("SELECT count(*), coalesce(min(seq), 0), coalesce(max(seq), 0) FROM events")[0]
        return int(n), int(lo), int(hi)

    def index_run(self, sql: str, args: Sequence[object]) -> list[tuple[Any, ...]]:
        """Run one statement of :mod:`compactstore.backends.index` and return its rows."""
        return self._all(_pg_sql(sql), args)


def _ensure_schema(conn: psycopg.Connection[tuple[Any, ...]]) -> bool:
    """Create the schema in an empty database, or migrate an older one, under a lock; say if the index is new."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s, 0)", (_LOCK_SCHEMA,))
        cur.execute("SELECT to_regclass('meta') IS NOT NULL")
        row = cur.fetchone()
        if not (row and row[0]):
            cur.execute(";\n".join(_SCHEMA))  # one round trip, one transaction
            return _index_schema(cur)
        cur.execute("SELECT value FROM meta WHERE name = 'schema_version'")
        got = cur.fetchone()
        version = None if got is None else str(got[0])
        while version in _MIGRATIONS:
            assert version is not None
            version, statements = _MIGRATIONS[version]
            for sql in statements:
                cur.execute(sql)
            cur.execute("ALTER TABLE meta DISABLE TRIGGER meta_no_update")
            cur.execute("UPDATE meta SET value = %s WHERE name = 'schema_version'", (version,))
            cur.execute("ALTER TABLE meta ENABLE TRIGGER meta_no_update")
        # A version this library does not know is reported by the store, which reads meta.
        return _index_schema(cur)


def _index_schema(cur: psycopg.Cursor[tuple[Any, ...]]) -> bool:
    """Create the structural index's table in a store that lacks it (new, or written before it); say if it did."""
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (_index.TABLE,))
    row = cur.fetchone()
    if row and row[0]:
        return False
    cur.execute(";\n".join(_index.POSTGRES_SCHEMA))
    return True


def _pg_sql(sql: str) -> str:
    """Return a statement of :mod:`compactstore.backends.index` with psycopg's placeholders."""
    return sql.replace("?", "%s")


def _hashes(cur: psycopg.Cursor[tuple[Any, ...]], session_id: int, coords: Sequence[tuple[int, int]]) -> list[bytes]:
    """Return the subtree roots at ``coords`` in one round trip; raise naming a missing one."""
    if not coords:
        return []
    cur.execute(
        "SELECT c.level, c.idx, CASE WHEN c.level = 0 THEN e.leaf ELSE n.hash END "
        "FROM unnest(%s::bigint[], %s::bigint[]) WITH ORDINALITY AS c(level, idx, ord) "
        "LEFT JOIN events e ON c.level = 0 AND e.session_id = %s AND e.pos = c.idx "
        "LEFT JOIN nodes n ON c.level > 0 AND n.session_id = %s AND n.level = c.level AND n.idx = c.idx "
        "ORDER BY c.ord",
        ([lv for lv, _ in coords], [i for _, i in coords], session_id, session_id),
    )
    out: list[bytes] = []
    for level, idx, h in cur.fetchall():
        if h is None:
            raise IntegrityError(f"subtree ({level}, {idx}) is missing", pos=int(idx) << int(level))
        out.append(bytes(h))
    return out


class _Unread:
    """The head was not read under the lock yet."""


_UNREAD = _Unread()


def _pipeline(conn: psycopg.Connection[tuple[Any, ...]]) -> AbstractContextManager[object]:
    """Batch statements whose results are not needed at once into fewer round trips."""
    return conn.pipeline() if psycopg.Pipeline.is_supported() else nullcontext()


class _PGWriter:
    __slots__ = ("_cur", "_head", "session_id")

    def __init__(self, cur: psycopg.Cursor[tuple[Any, ...]], session_id: int, head: HeadRow | None | _Unread) -> None:
        self._cur = cur
        self._head = head
        self.session_id = session_id

    def _do(self, doing: str, sql: str, args: Sequence[object] | Mapping[str, object], fetch: bool = True) -> list[tuple[Any, ...]]:
        try:
            self._cur.execute(sql, args)
            return self._cur.fetchall() if fetch else []
        except psycopg.Error as exc:
            raise _error(exc, doing) from exc

    def head(self) -> HeadRow | None:
        head, self._head = self._head, _UNREAD
        if not isinstance(head, _Unread):
            return head  # read under the lock when the writer opened
        got = self._do(
            "read the latest head",
            "SELECT size, root, prev, seal FROM heads WHERE session_id = %s ORDER BY size DESC LIMIT 1",
            (self.session_id,),
        )
        return HeadRow(*got[0]) if got else None

    def hashes(self, coords: Sequence[tuple[int, int]]) -> list[bytes]:
        try:
            return _hashes(self._cur, self.session_id, coords)
        except psycopg.Error as exc:
            raise _error(exc, "read subtree roots") from exc

    def find_idempotent(self, key: str) -> Row | None:
        got = self._do(
            "look up an idempotency key",
            f"SELECT {_ROW} FROM events WHERE session_id = %s AND idem_key = %s",
            (self.session_id, _text(key, "idempotency_key")),
        )
        return Row(*got[0]) if got else None

    def next_seq(self) -> int | None:
        return None  # the identity column assigns it

    def insert(self, rows: Sequence[Row], nodes: Sequence[tuple[int, int, bytes]], head: HeadRow) -> list[int]:
        # One statement: the events (seqs assigned in position order), the subtree roots
        # and the head. Arrays travel in binary.
        got = self._do(
            "insert events, subtree roots and the head",
            "WITH e AS (INSERT INTO events (session_id, pos, kind, idem_key, leaf, body) "
            "SELECT %(sid)s, u.pos, u.kind, u.idem_key, u.leaf, u.body "
            "FROM unnest(%(pos)b::bigint[], %(kind)b::text[], %(key)b::text[], %(leaf)b::bytea[], %(body)b::bytea[]) "
            "AS u(pos, kind, idem_key, leaf, body) ORDER BY u.pos RETURNING pos, seq), "
            "n AS (INSERT INTO nodes (session_id, level, idx, hash) SELECT %(sid)s, u.level, u.idx, u.hash "
            "FROM unnest(%(level)b::bigint[], %(idx)b::bigint[], %(hash)b::bytea[]) AS u(level, idx, hash)), "
            "h AS (INSERT INTO heads (session_id, size, root, prev, seal) "
            "VALUES (%(sid)s, %(size)s, %(root)s, %(prev)s, %(seal)s)) "
            "SELECT pos, seq FROM e",
            {
                "sid": self.session_id,
                "pos": [r.pos for r in rows],
                "kind": [r.kind for r in rows],
                "key": [None if r.idem_key is None else _text(r.idem_key, "idempotency_key") for r in rows],
                "leaf": [r.leaf for r in rows],
                "body": [r.body for r in rows],
                "level": [lv for lv, _, _ in nodes],
                "idx": [i for _, i, _ in nodes],
                "hash": [h for _, _, h in nodes],
                "size": head.size,
                "root": head.root,
                "prev": head.prev,
                "seal": head.seal,
            },
        )
        seqs = {int(pos): int(seq) for pos, seq in got}
        return [seqs[r.pos] for r in rows]

    def index_run(self, sql: str, args: Sequence[object]) -> list[tuple[Any, ...]]:
        """Run one statement of :mod:`compactstore.backends.index` inside the write transaction."""
        return self._do("structural index", _pg_sql(sql), args, fetch=sql.startswith("SELECT"))

    def erase(self, positions: Sequence[int], by: int) -> None:
        sid, positions = self.session_id, list(positions)
        self._do(
            "record redactions",
            "INSERT INTO redactions (session_id, pos, by) SELECT %s, p, %s FROM unnest(%s::bigint[]) AS p",
            (sid, by, positions),
            fetch=False,
        )
        self._do(
            "erase redacted bodies",
            "UPDATE events SET body = NULL, kind = 'redacted', idem_key = NULL "
            "WHERE session_id = %s AND pos = ANY(%s::bigint[])",
            (sid, positions),
            fetch=False,
        )


if TYPE_CHECKING:
    _check: Backend = PostgresBackend("postgresql://")
