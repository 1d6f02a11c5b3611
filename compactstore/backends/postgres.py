"""PostgreSQL through psycopg 3 and a connection pool: one store shared by many processes.

The tables and columns are those of the SQLite backend (``bytea`` for blobs, ``bigint``
for integers, text compared byte-wise with the ``C`` collation so that orders match).
The library creates the schema itself, under an advisory lock so that many processes
may open a fresh database at once, and records the schema version in ``meta``.
Triggers refuse UPDATE, DELETE and TRUNCATE on every log table.

A write transaction takes a transaction-scoped advisory lock keyed on its session, so
appends to one session are serialized (positions are read and written under the lock)
while appends to different sessions run in parallel. Sequence numbers come from one
sequence (``events_seq``, no cache), drawn by the append before its head is sealed (the
seal covers them): unique, after those of every commit that ended before the append
began, increasing within a session, but with gaps (a number drawn by a
transaction that rolls back is not used again) and, between transactions that run at
once, not in the order they commit. Nothing orders commits to different sessions
against each other but what they could see, so no writer waits for another's.

An append on the head this backend committed last (the common case: one process
appending to a session) is one statement, a prepared call of ``compactstore_append``
(lock, check the head, draw the seqs, insert) with its arguments in binary, committed as
the implicit transaction of that statement: one round trip when its seqs are the ones
after this backend's last (it seals them before the server draws them, and the server
refuses others, see :meth:`PostgresBackend._expected_seq`), two where other processes
draw too (the draw first, in a round trip of its own). Otherwise
an append costs three round trips, each one message: BEGIN with a call of the
``compactstore_open`` function (find or create the session, lock it, read its head), the
draw, then a call of ``compactstore_insert_indexed`` (the structural index's rows, the
events, subtree roots and head) with COMMIT. A redaction commits after its erasures instead, and a batch of
more than :data:`INLINE_BYTES` of bodies commits in a third. The functions are created
with the schema.

Every driver error is re-raised as a :class:`~compactstore.CompactStoreError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import pq
from psycopg.types.numeric import Int8BinaryDumper
from psycopg_pool import ConnectionPool

from ..errors import CompactStoreError, ConflictError, IntegrityError, InvalidEvent, LockTimeout, NotAStore, StaleHead
from ..structure import IndexRow
from .gate import Gate
from .protocol import BODY_BATCH, SCHEMA_VERSION, HeadRow, Row, caller, identified, keyset
from . import queries
from .queries import Reads

if TYPE_CHECKING:
    from .protocol import Backend, Writer

LOG_TABLES = ("meta", "sessions", "events", "subtrees", "heads", "redactions")
#: How long a writer waits for its session's lock (or any row lock) before giving up.
LOCK_TIMEOUT = "60s"
#: Advisory lock classes (the first key of the two-key form): ``"cs"`` + a tag.
_LOCK_SCHEMA = 0x63730001
_LOCK_SESSION = 0x63730002
_ROW = "seq, session_id, pos, kind, idem_key, leaf, body"

_T = TypeVar("_T")

class _Pin:
    """The connection a :meth:`PostgresBackend.snapshot` holds, for the thread that opened it, while it is open.

    A context variable carries it, and a task or thread started inside the context
    copies the variable: the pin serves only the thread and task that opened it, and
    none once the context has ended and the connection went back to the pool. Another
    task's own snapshot, opened meanwhile, is a transaction of its own.
    """

    __slots__ = ("conn", "owner", "open")

    def __init__(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        self.conn, self.owner, self.open = conn, caller(), True

    def live(self) -> bool:
        """Whether the caller (its thread and task) reads through this pin now."""
        return self.open and self.owner == caller()


#: Each backend's open snapshot, for the thread (or task) that opened it.
_PINNED: ContextVar[Mapping[PostgresBackend, _Pin]] = ContextVar("compactstore_pinned", default={})


def _pinned(backend: PostgresBackend) -> _Pin | None:
    """Return ``backend``'s snapshot open in the calling thread, if any."""
    pin = _PINNED.get().get(backend)
    return pin if pin is not None and pin.live() else None

def _fold_sql(expr: str) -> str:
    """Return SQL folding the bigint ``expr`` into the signed 32-bit second key of an advisory lock."""
    low = f"({expr} & 4294967295)"
    return f"({low} - CASE WHEN {low} >= 2147483648 THEN 4294967296 ELSE 0 END)::int4"


#: The one change the log allows: erasing the body (and with it the kind and the
#: idempotency key) of a position already recorded as erased (redacted, or dropped by
#: retention); seq, position and leaf stay.
_ERASE_ONLY = (
    "CREATE OR REPLACE FUNCTION compactstore_erase_only() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "IF NEW.body IS NULL AND OLD.body IS NOT NULL AND NEW.seq = OLD.seq "
    "AND NEW.session_id = OLD.session_id AND NEW.pos = OLD.pos AND NEW.kind IN ('redacted', 'dropped') "
    "AND NEW.idem_key IS NULL AND NEW.leaf = OLD.leaf "
    "AND EXISTS (SELECT 1 FROM redactions r WHERE r.session_id = OLD.session_id AND r.pos = OLD.pos) "
    "THEN RETURN NEW; END IF; "
    "RAISE EXCEPTION 'compactstore: % is append-only', TG_TABLE_NAME "
    "USING ERRCODE = 'restrict_violation'; END $$"
)

#: A head follows the head it extends (see the SQLite backend's heads_follow).
_HEAD_FOLLOWS = (
    "CREATE FUNCTION compactstore_head_follows() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "IF NEW.prev > 0 AND NOT EXISTS (SELECT 1 FROM heads h WHERE h.session_id = NEW.session_id "
    "AND h.size = NEW.prev) THEN RAISE EXCEPTION 'compactstore: a head must follow the head it extends' "
    "USING ERRCODE = 'restrict_violation'; END IF; RETURN NEW; END $$",
    "CREATE TRIGGER heads_follow BEFORE INSERT ON heads FOR EACH ROW EXECUTE FUNCTION compactstore_head_follows()",
)

#: What each schema version adds to the one before: statements run in the upgrade's transaction.
UPGRADES: dict[str, tuple[str, ...]] = {"6": (*_HEAD_FOLLOWS, _ERASE_ONLY)}

#: The log's tables, triggers and view, created in one transaction.
_SCHEMA = (
    'CREATE TABLE meta (name text COLLATE "C" PRIMARY KEY, value text COLLATE "C" NOT NULL)',
    'CREATE TABLE sessions (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, '
    'name text COLLATE "C" NOT NULL UNIQUE)',
    # No cache: a connection's cached numbers would be older than those others drew meanwhile.
    "CREATE SEQUENCE events_seq AS bigint CACHE 1",
    # seq is drawn from events_seq by the writer (see _DRAW): within a session seqs follow the append order.
    # Every unique key of the log tables leads with session_id, so a distributed engine
    # (Citus) can shard them by session as they are; seq is unique by construction.
    # body is NULL only once a redaction has erased it (see the events update trigger).
    'CREATE TABLE events (seq bigint NOT NULL, '
    'session_id bigint NOT NULL, pos bigint NOT NULL, kind text COLLATE "C" NOT NULL, '
    'idem_key text COLLATE "C", leaf bytea NOT NULL, body bytea, PRIMARY KEY (session_id, pos))',
    "CREATE UNIQUE INDEX events_idem ON events (session_id, idem_key) WHERE idem_key IS NOT NULL",
    "CREATE TABLE subtrees (session_id bigint NOT NULL, level bigint NOT NULL, idx bigint NOT NULL, "
    "hash bytea NOT NULL, PRIMARY KEY (session_id, level, idx))",
    "CREATE TABLE heads (session_id bigint NOT NULL, size bigint NOT NULL, root bytea NOT NULL, "
    "prev bigint NOT NULL, seal bytea NOT NULL, seqs bytea NOT NULL, PRIMARY KEY (session_id, size))",
    "CREATE TABLE redactions (session_id bigint NOT NULL, pos bigint NOT NULL, by bigint NOT NULL, "
    "PRIMARY KEY (session_id, pos))",
    "CREATE FUNCTION compactstore_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "RAISE EXCEPTION 'compactstore: % is append-only', TG_TABLE_NAME "
    "USING ERRCODE = 'restrict_violation'; END $$",
    _ERASE_ONLY,
    *(
        f"CREATE TRIGGER {table}_no_{op} BEFORE {spec} ON {table} "
        f"FOR EACH {'STATEMENT' if op == 'truncate' else 'ROW'} EXECUTE FUNCTION "
        f"{'compactstore_erase_only' if (table, op) == ('events', 'update') else 'compactstore_append_only'}()"
        for table in LOG_TABLES
        for op, spec in (("update", "UPDATE"), ("delete", "DELETE"), ("truncate", "TRUNCATE"))
    ),
    *_HEAD_FOLLOWS,
    # A readable view, like the SQLite backend's.
    "CREATE VIEW events_readable AS SELECT e.seq, s.name AS session, e.pos, e.kind, e.idem_key, "
    "encode(e.leaf, 'hex') AS leaf, convert_from(e.body, 'UTF8') AS body "
    "FROM events e JOIN sessions s ON s.id = e.session_id",
)

#: Begin an append in one call: find or create the session, take its lock, then read its
#: latest head. Each statement of a VOLATILE function takes a fresh snapshot under READ
#: COMMITTED, so the head is read after the lock is held and no writer can have appended
#: since. A concurrent creator of the same name makes the insert wait for its commit and
#: then do nothing; the select after it finds that row. The plans of the statements inside
#: are cached per connection, where a statement sent as text is planned on every call.
#: Change its body only with a new schema version: a store keeps the functions it was made with.
_OPEN_FUNCTION = (
    "CREATE FUNCTION compactstore_open(p_name text, OUT sid bigint, OUT head_size bigint, OUT head_root bytea, "
    "OUT head_prev bigint, OUT head_seal bytea, OUT head_seqs bytea) LANGUAGE plpgsql VOLATILE AS $$ BEGIN "
    "SELECT s.id INTO sid FROM sessions s WHERE s.name = p_name; "
    "IF sid IS NULL THEN "
    "INSERT INTO sessions AS s (name) VALUES (p_name) ON CONFLICT (name) DO NOTHING RETURNING s.id INTO sid; "
    "IF sid IS NULL THEN SELECT s.id INTO sid FROM sessions s WHERE s.name = p_name; END IF; "
    "IF sid IS NULL THEN RAISE EXCEPTION 'compactstore: session % vanished while being created', p_name "
    "USING ERRCODE = 'serialization_failure'; END IF; "
    "END IF; "
    f"PERFORM pg_advisory_xact_lock({_LOCK_SESSION}, {_fold_sql('sid')}); "
    "SELECT h.size, h.root, h.prev, h.seal, h.seqs INTO head_size, head_root, head_prev, head_seal, head_seqs "
    "FROM heads h "
    "WHERE h.session_id = sid ORDER BY h.size DESC LIMIT 1; "
    "END $$"
)

#: Insert a batch in one call: the structural index's rows, the events (with the seqs the
#: writer drew, returned in position order), the completed subtree roots and the head.
#: Leaves, bodies and subtree roots arrive as one byte string each, sliced here (a body's
#: offset is the sum of the lengths before it; length -1 is NULL): a long string literal
#: costs the client one C call to write and the server one pass to read, where an array
#: of byte strings costs a step per element on both sides. The index rows come as arrays because a statement of their own,
#: sent as text, is parsed and planned on every append, where the plans here are cached.
_INSERT_FUNCTION = (
    "CREATE FUNCTION compactstore_insert_indexed(p_sid bigint, p_pos bigint[], p_seq bigint[], p_kind text[], "
    "p_key text[], p_len int4[], p_width int4, p_leaves bytea, p_bodies bytea, p_level bigint[], p_idx bigint[], "
    "p_hashes bytea, p_size bigint, p_root bytea, p_prev bigint, p_seal bytea, p_seqs bytea, "
    "p_ix_pos bigint[], p_ix_rel text[], p_ix_key text[], p_ix_num bigint[], p_ix_text text[]) "
    "RETURNS bigint[] LANGUAGE plpgsql VOLATILE AS $$ "
    "DECLARE seqs bigint[]; BEGIN "
    # One index row (a binding, an opened call) takes the short way.
    f"IF cardinality(p_ix_pos) = 1 THEN INSERT INTO {queries.TABLE} (session_id, pos, rel, key, num, text) "
    "VALUES (p_sid, p_ix_pos[1], p_ix_rel[1], p_ix_key[1], p_ix_num[1], p_ix_text[1]); "
    f"ELSIF cardinality(p_ix_pos) > 1 THEN INSERT INTO {queries.TABLE} (session_id, pos, rel, key, num, text) "
    "SELECT p_sid, x.pos, x.rel, x.key, x.num, x.text "
    "FROM unnest(p_ix_pos, p_ix_rel, p_ix_key, p_ix_num, p_ix_text) AS x(pos, rel, key, num, text); END IF; "
    # One event, the common append, takes the short way: no unnest, window or slicing.
    "IF cardinality(p_pos) = 1 THEN "
    "INSERT INTO events (seq, session_id, pos, kind, idem_key, leaf, body) "
    "VALUES (p_seq[1], p_sid, p_pos[1], p_kind[1], p_key[1], "
    "p_leaves, CASE WHEN p_len[1] >= 0 THEN p_bodies END) RETURNING ARRAY[seq] INTO seqs; "
    "ELSE "
    "WITH u AS (SELECT u.pos, u.seq, u.kind, u.idem_key, u.len, u.i, "
    "sum(greatest(u.len, 0)) OVER (ORDER BY u.i) - greatest(u.len, 0) AS start "
    "FROM unnest(p_pos, p_seq, p_kind, p_key, p_len) WITH ORDINALITY AS u(pos, seq, kind, idem_key, len, i)), "
    "e AS (INSERT INTO events AS ev (seq, session_id, pos, kind, idem_key, leaf, body) "
    "SELECT u.seq, p_sid, u.pos, u.kind, u.idem_key, substring(p_leaves FROM (p_width * (u.i - 1) + 1)::int4 FOR p_width), "
    "CASE WHEN u.len >= 0 THEN substring(p_bodies FROM (u.start + 1)::int4 FOR u.len) END "
    "FROM u RETURNING ev.pos, ev.seq) "
    "SELECT array_agg(e.seq ORDER BY e.pos) INTO seqs FROM e; "
    "END IF; "
    "IF cardinality(p_level) > 0 THEN INSERT INTO subtrees (session_id, level, idx, hash) "
    "SELECT p_sid, t.level, t.idx, substring(p_hashes FROM (p_width * (t.i - 1) + 1)::int4 FOR p_width) "
    "FROM unnest(p_level, p_idx) WITH ORDINALITY AS t(level, idx, i); END IF; "
    "INSERT INTO heads (session_id, size, root, prev, seal, seqs) VALUES (p_sid, p_size, p_root, p_prev, p_seal, p_seqs); "
    "RETURN seqs; END $$"
)

#: An append in one round trip: lock the session, check that its latest head is still the
#: one the writer built on (the one this backend committed last), and insert. A head that
#: moved raises SQLSTATE CSH01 and nothing is written: the store builds the append again
#: under the lock (see :class:`compactstore.errors.StaleHead`). The sizes alone decide:
#: heads are unique per size, and a session's size only grows.
_APPEND_FUNCTION = (
    "CREATE FUNCTION compactstore_append(p_expect bigint, p_sid bigint, p_pos bigint[], p_seq bigint[], p_kind text[], "
    "p_key text[], p_len int4[], p_width int4, p_leaves bytea, p_bodies bytea, p_level bigint[], p_idx bigint[], "
    "p_hashes bytea, p_size bigint, p_root bytea, p_prev bigint, p_seal bytea, p_seqs bytea, "
    "p_ix_pos bigint[], p_ix_rel text[], p_ix_key text[], p_ix_num bigint[], p_ix_text text[], p_drawn boolean) "
    "RETURNS bigint[] LANGUAGE plpgsql VOLATILE AS $$ DECLARE got bigint; BEGIN "
    f"PERFORM pg_advisory_xact_lock({_LOCK_SESSION}, {_fold_sql('p_sid')}); "
    "SELECT h.size INTO got FROM heads h WHERE h.session_id = p_sid ORDER BY h.size DESC LIMIT 1; "
    "IF coalesce(got, 0) <> p_expect THEN "
    "RAISE EXCEPTION 'compactstore: the head moved on' USING ERRCODE = 'CSH01'; END IF; "
    # Seqs the writer expected rather than drew: drawn here, they must be those.
    "IF NOT p_drawn AND p_seq <> ARRAY(SELECT nextval('events_seq') FROM generate_series(1, cardinality(p_seq))) THEN "
    "RAISE EXCEPTION 'compactstore: another writer drew seqs' USING ERRCODE = 'CSQ01'; END IF; "
    "RETURN compactstore_insert_indexed(p_sid, p_pos, p_seq, p_kind, p_key, p_len, p_width, p_leaves, p_bodies, "
    "p_level, p_idx, p_hashes, p_size, p_root, p_prev, p_seal, p_seqs, p_ix_pos, p_ix_rel, p_ix_key, p_ix_num, p_ix_text); "
    "END $$"
)

#: The functions the backend calls, created with the schema.
_FUNCTIONS = (_OPEN_FUNCTION, _INSERT_FUNCTION, _APPEND_FUNCTION)


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


#: SQLSTATEs of a lock or serialization timeout, where retrying may succeed, and what each means here.
_RETRYABLE = {
    "40001": "lost a race with another writer",  # serialization_failure
    "40P01": "deadlocked with another writer",  # deadlock_detected
    "55P03": "timed out waiting for another writer",  # lock_not_available: lock_timeout
}
_QUERY_CANCELED = "57014"  # statement_timeout, or a cancel request
_UNIQUE_VIOLATION = "23505"
_RESTRICT_VIOLATION = "23001"  # raised by the append-only triggers
#: Raised by ``compactstore_append`` when the head moved (see :class:`compactstore.errors.StaleHead`).
_HEAD_MOVED = "CSH01"
#: Raised by ``compactstore_append`` when the seqs it draws are not those the writer expected.
_SEQS_MOVED = "CSQ01"


def _error(exc: BaseException, doing: str, *, waits: bool = False) -> CompactStoreError:
    """Return the compactstore error for a driver error raised while ``doing``, by its SQLSTATE.

    ``waits``: the statement waits for a session's lock, so a cancelled statement (a
    statement timeout struck while it waited) is a lock timeout too.
    """
    state = getattr(exc, "sqlstate", None)
    if state in _RETRYABLE:
        return LockTimeout(f"PostgreSQL: {doing}: {_RETRYABLE[state]} ({exc})")
    if state == _QUERY_CANCELED and waits:
        return LockTimeout(f"PostgreSQL: {doing}: cancelled while waiting for another writer ({exc})")
    if state == _UNIQUE_VIOLATION:
        return ConflictError(f"PostgreSQL: {doing}: another writer got there first ({exc})")
    hint = "the log tables are append-only: only a redaction may erase a body" if state == _RESTRICT_VIOLATION else None
    return CompactStoreError(f"PostgreSQL: {doing}: {type(exc).__name__}: {exc}", hint=hint)


def _text(value: str, field: str) -> str:
    """Refuse text PostgreSQL cannot store (NUL characters) before it reaches the server."""
    if "\x00" in value:
        raise InvalidEvent(field, "must not contain NUL characters (PostgreSQL text cannot hold them)")
    return value


class PostgresBackend(Reads):
    """A store in one PostgreSQL database, reached through a pool of connections.

    The reads of the index, of events at given positions and of subtree roots come from
    :class:`~compactstore.backends.queries.Reads`, through :meth:`_all`.
    """

    gapless_seq = False

    def __init__(self, url: str, *, durable: bool = False, min_size: int = 1, max_size: int = 4,
                 create: bool = True) -> None:
        """Connect to ``url``, creating the schema in an empty database.

        Args:
            url: a ``postgresql://`` (or ``postgres://``) URL, in libpq's syntax.
            durable: force ``synchronous_commit = on`` for this store's transactions
                (an acknowledged append then survives a server crash and power loss),
                whatever the server's default; otherwise the server's setting holds.
            min_size: connections the pool keeps open.
            max_size: connections the pool opens at most.
            create: create the schema in a database (or schema) that has none;
                otherwise refuse it, creating nothing.

        Raises:
            CompactStoreError: the server cannot be reached, or its encoding is not UTF8.
            NotAStore: the database holds no store and ``create`` is false.
        """
        super().__init__(self._all, queries.POSTGRES)
        self._where = redact_url(url)
        self._gate = Gate(self._where)
        self._durable = durable
        #: session name -> (id, head) of the append this backend committed last, for speculation
        self._last: dict[str, tuple[int, HeadRow]] = {}
        #: The seq after the last one this backend's appends drew, expected to be the next
        #: (see :meth:`_expected_seq`); appends left before expecting again, and misses in a row.
        self._next_seq: int | None = None
        self._skip = 0
        self._misses = 0
        #: The writers' cursors of each pooled connection (see :func:`_cursors`).
        self._cursors: dict[psycopg.Connection[tuple[Any, ...]], _Cursors] = {}
        try:
            with psycopg.connect(url, autocommit=True, client_encoding="UTF8") as conn:
                encoding = conn.info.parameter_status("server_encoding")
                if encoding != "UTF8":
                    raise CompactStoreError(
                        f"PostgreSQL store {self._where}: server encoding is {encoding}, want UTF8",
                        hint="create the database with ENCODING 'UTF8'",
                    )
                if not _ensure_schema(conn, create):
                    raise NotAStore(self._where, "the database holds no compactstore schema",
                                    hint="open it with create=True to make a store there")
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
        # READ COMMITTED for every transaction, the implicit one of a one-statement append
        # among them: its function reads the head with a snapshot newer than the lock.
        conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'; SET default_transaction_isolation = 'read committed'"
                     + ("; SET synchronous_commit = on" if self._durable else ""))

    def close(self) -> None:
        # The pool is closed only once no call is in flight: one closed under a running
        # call would leave that call with a driver error instead of its answer.
        if self._gate.close():
            self._pool.close()
            self._cursors.clear()

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Read one state of the database until the context ends: one REPEATABLE READ, READ ONLY transaction.

        The calling thread's (or task's) reads go to one connection of the pool, held for
        the context, whose transaction sees the database as of its first statement.
        Other threads of this handle read and write through the pool as before, and no
        writer waits for the context; :meth:`close` does.

        Raises:
            StoreClosed: :meth:`close` has been called.
        """
        if _pinned(self) is not None:  # nested: the outer transaction holds the state already
            yield
            return
        self._gate.enter()
        try:
            try:
                conn = self._pool.getconn()
            except psycopg.Error as exc:
                raise _error(exc, "begin a read transaction") from exc
            try:
                try:
                    # The pool's connections are in autocommit: BEGIN opens the transaction.
                    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                except psycopg.Error as exc:
                    raise _error(exc, "begin a read transaction") from exc
                pin = _Pin(conn)
                token = _PINNED.set({**_PINNED.get(), self: pin})
                try:
                    yield
                finally:
                    pin.open = False  # for every copy of the context a task or thread took inside
                    _PINNED.reset(token)
            finally:
                _rollback(conn)  # read only: nothing to commit
                self._pool.putconn(conn)
        finally:
            self._gate.leave()

    def _run(self, doing: str, fn: Callable[[psycopg.Cursor[tuple[Any, ...]]], _T]) -> _T:
        self._gate.enter()
        try:
            pin = _pinned(self)
            if pin is not None:  # inside snapshot(): its transaction's connection
                with pin.conn.cursor(binary=True) as cur:
                    return fn(cur)
            with self._pool.connection() as conn, conn.cursor(binary=True) as cur:
                return fn(cur)
        except psycopg.Error as exc:
            raise _error(exc, doing) from exc
        finally:
            self._gate.leave()

    def _all(self, sql: str, args: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        def go(cur: psycopg.Cursor[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
            cur.execute(sql, args)
            return cur.fetchall()

        return self._run("query", go)

    def meta(self) -> dict[str, str]:
        return {str(n): str(v) for n, v in self._all("SELECT name, value FROM meta")}

    def init_meta(self, values: dict[str, str], *, create: bool = True) -> dict[str, str]:
        if not create:
            return identified(self.meta(), self._where)

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

    def upgrade(self, to: str, derive: Callable[[], Sequence[tuple[int, Sequence[IndexRow]]]], *, commit: bool) -> None:
        self._gate.enter()
        try:
            with self._pool.connection() as conn:
                try:
                    with conn.transaction() as tx, conn.cursor() as cur:
                        # Writers wait for the upgrade; readers do not. The schema lock keeps
                        # out a first opener's creation, which this transaction is not.
                        cur.execute("SELECT pg_advisory_xact_lock(%s, 0)", (_LOCK_SCHEMA,))
                        cur.execute(f"LOCK TABLE {', '.join(LOG_TABLES)}, {queries.TABLE} IN EXCLUSIVE MODE")
                        cur.execute("SELECT value FROM meta WHERE name = 'schema_version'")
                        found = cur.fetchone()
                        if found is None or str(found[0]) != str(int(to) - 1):
                            raise ConflictError(f"PostgreSQL store {self._where}: the store is at schema "
                                                f"{found and found[0]!r}, not {int(to) - 1}: another migration ran first")
                        for sql in UPGRADES[to]:
                            cur.execute(sql)
                        # The derivation reads through this transaction's connection, as a snapshot's reads do.
                        pin = _Pin(conn)
                        token = _PINNED.set({**_PINNED.get(), self: pin})
                        try:
                            derived = derive()
                        finally:
                            pin.open = False
                            _PINNED.reset(token)
                        for sid, rows in derived:
                            for i in range(0, len(rows), queries.INSERT_ROWS):
                                chunk = rows[i : i + queries.INSERT_ROWS]
                                cur.execute(queries.POSTGRES.insert_index(len(chunk)), [v for r in chunk for v in (sid, *r)])
                        # meta is append-only: its trigger steps aside for this one change, in this transaction.
                        cur.execute("ALTER TABLE meta DISABLE TRIGGER meta_no_update")
                        cur.execute("UPDATE meta SET value = %s WHERE name = 'schema_version'", (to,))
                        cur.execute("ALTER TABLE meta ENABLE TRIGGER meta_no_update")
                        if not commit:
                            raise psycopg.Rollback(tx)
                except psycopg.Error as exc:
                    raise _error(exc, f"upgrade the schema to {to}") from exc
        finally:
            self._gate.leave()
        self._last.clear()

    def reclaim(self) -> int:
        def go(cur: psycopg.Cursor[tuple[Any, ...]]) -> int:
            cur.execute("SELECT pg_total_relation_size('events')")
            row = cur.fetchone()
            before = int(row[0]) if row else 0
            # Outside a transaction (the pool's connections are in autocommit): what autovacuum
            # would do, now, and the space of the erased bodies' TOAST freed for reuse.
            cur.execute(f"VACUUM events, {queries.TABLE}")
            cur.execute("SELECT pg_total_relation_size('events')")
            row = cur.fetchone()
            return max(0, before - (int(row[0]) if row else 0))

        return self._run("reclaim space (VACUUM)", go)

    def sessions(self) -> list[tuple[int, str]]:
        return [(int(i), str(n)) for i, n in self._all("SELECT id, name FROM sessions ORDER BY name")]

    def session_id(self, name: str) -> int | None:
        got = self._all("SELECT id FROM sessions WHERE name = %s", (name,))
        return int(got[0][0]) if got else None

    @contextmanager
    def writer(self, name: str, *, speculate: bool = False) -> Iterator[_PGWriter]:
        if _pinned(self) is not None:
            # Its commit would be one the snapshot's reads do not see: refused, as on SQLite.
            raise CompactStoreError(f"PostgreSQL: {self._where}: cannot write inside a snapshot of the store",
                                    hint="write after the snapshot's context ends")
        self._gate.enter()
        try:
            yield from self._writing(name, speculate)
        finally:
            self._gate.leave()

    def _writing(self, name: str, speculate: bool) -> Iterator[_PGWriter]:
        """Run the body of :meth:`writer`, inside the gate."""
        last = self._last.pop(name, None) if speculate else None
        pool = self._pool
        try:
            # getconn and putconn, not the pool's connection() context: the writer commits
            # and rolls back itself, so that context's own commit would only cost time.
            conn = pool.getconn()
            try:
                cursors = self._cursors.get(conn)
                if cursors is None:
                    # A connection new to the writers: forget those the pool has closed
                    # (the cursors hold their connection, so nothing else would).
                    for old in list(self._cursors):
                        if old.closed:
                            self._cursors.pop(old, None)
                    cursors = self._cursors[conn] = _cursors(conn)
                # Speculating, the writer starts from the head this backend committed
                # last, with no round trip; it locks and checks before any statement.
                w = (_PGWriter(*cursors, last[0], last[1], speculative=name, expect_seq=self._expected_seq()) if last
                     else _PGWriter(*cursors, *_begin(conn, cursors[0], name)))
                try:
                    yield w
                except StaleHead:
                    if w.missed:
                        self._missed()
                    raise
                if not w.committed:
                    w.flush()
                    conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
            finally:
                pool.putconn(conn)
        except psycopg.Error as exc:
            raise _error(exc, f"append to session {name!r}", waits=True) from exc
        if w.written is not None:
            self._last[name] = (w.session_id, w.written)
            self._next_seq = w.seq_after
            if w.expected:
                self._misses = 0

    def _expected_seq(self) -> int | None:
        """Return the seq a speculating append may expect to draw next, or None to draw it first.

        With one process appending, the next value of the sequence is the one after this
        backend's last, and the append costs one round trip (``compactstore_append`` draws
        and compares). Where other writers draw too the expectation mostly fails, and a
        failed one costs the append a retry: after each miss in a row, twice as many
        appends (up to 64) draw first, in a round trip of their own, before expecting again.
        """
        if self._skip:
            self._skip -= 1
            return None
        return self._next_seq

    def _missed(self) -> None:
        self._misses += 1
        self._skip = min(64, 2 ** self._misses)
        self._next_seq = None

    def row(self, session_id: int, pos: int) -> Row | None:
        got = self._all(f"SELECT {_ROW} FROM events WHERE session_id = %s AND pos = %s", (session_id, pos))
        return Row(*got[0]) if got else None

    def rows(self, session_id: int, start: int, stop: int | None, chunk: int) -> Iterator[Row]:
        sql = f"SELECT {_ROW} FROM events WHERE session_id = %s AND pos >= %s AND pos < %s ORDER BY pos LIMIT %s"
        return keyset(lambda a, b, n: self._all(sql, (session_id, a, b, n)), start, stop, chunk)

    def head(self, session_id: int) -> HeadRow | None:
        got = self._all(
            "SELECT size, root, prev, seal, seqs FROM heads WHERE session_id = %s ORDER BY size DESC LIMIT 1", (session_id,)
        )
        return HeadRow(*got[0]) if got else None

    def hashes(self, session_id: int, coords: Sequence[tuple[int, int]]) -> list[bytes]:
        return self._run("read subtree roots", lambda cur: _hashes(cur, session_id, coords))

    def bodies(
        self, session_id: int, start: int, stop: int, each: Callable[[list[bytes | None]], object] | None = None
    ) -> list[bytes | None]:
        got = self._all(
            "SELECT body FROM events WHERE session_id = %s AND pos >= %s AND pos < %s ORDER BY pos",
            (session_id, start, stop),
        )
        if each is None:
            return [None if b is None else bytes(b) for (b,) in got]
        # The rows arrive whole; handed on in batches, each is hashed while its bytes are in cache.
        out: list[bytes | None] = []
        for i in range(0, len(got), BODY_BATCH):
            batch = [None if b is None else bytes(b) for (b,) in got[i : i + BODY_BATCH]]
            out += batch
            each(batch)
        return out

    def leaves(self, session_id: int, start: int, stop: int) -> list[bytes]:
        got = self._all(
            "SELECT leaf FROM events WHERE session_id = %s AND pos >= %s AND pos < %s ORDER BY pos",
            (session_id, start, stop),
        )
        return [bytes(b) for (b,) in got]

    def heads(self, session_id: int, after: int, limit: int) -> list[HeadRow]:
        got = self._all(
            "SELECT size, root, prev, seal, seqs FROM heads WHERE session_id = %s AND size > %s ORDER BY size LIMIT %s",
            (session_id, after, limit),
        )
        return [HeadRow(*r) for r in got]

    def integrity(self) -> list[str]:
        """Return nothing: PostgreSQL checks its own pages and indexes (data checksums, amcheck)."""
        return []

    def redactions(self, session_id: int) -> dict[int, int]:
        got = self._all("SELECT r.pos, r.by FROM redactions r LEFT JOIN events e ON e.session_id = r.session_id "
                        "AND e.pos = r.pos WHERE r.session_id = %s AND e.kind IS DISTINCT FROM 'dropped'", (session_id,))
        return {int(p): int(b) for p, b in got}

    def erasures(self, session_id: int) -> dict[int, int]:
        got = self._all("SELECT pos, by FROM redactions WHERE session_id = %s", (session_id,))
        return {int(p): int(b) for p, b in got}

    def orphans(self) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        for table in ("events", "subtrees", "heads", "redactions"):
            got = self._all(
                f"SELECT DISTINCT session_id FROM {table} t "
                "WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = t.session_id) ORDER BY session_id"
            )
            out.extend((table, int(sid)) for (sid,) in got)
        return out

    def seq_bounds(self) -> tuple[int, int, int]:
        n, lo, hi = self._all("SELECT count(*), coalesce(min(seq), 0), coalesce(max(seq), 0) FROM events")[0]
        return int(n), int(lo), int(hi)


def _ensure_schema(conn: psycopg.Connection[tuple[Any, ...]], create: bool = True) -> bool:
    """Create the schema in an empty database, under a lock (a store's version is checked by the store).

    Returns whether the schema is there now (false only when it was missing and ``create`` false).
    """
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s, 0)", (_LOCK_SCHEMA,))
        cur.execute("SELECT to_regclass('meta') IS NOT NULL")
        row = cur.fetchone()
        if not (row and row[0]):
            if not create:
                return False
            # One round trip, one transaction.
            cur.execute(";\n".join((*_SCHEMA, *_FUNCTIONS, *queries.POSTGRES_SCHEMA)))
    return True


def _hashes(cur: psycopg.Cursor[tuple[Any, ...]], session_id: int, coords: Sequence[tuple[int, int]]) -> list[bytes]:
    """Return the subtree roots at ``coords`` in one round trip; raise naming a missing one."""
    if not coords:
        return []
    cur.execute(
        "SELECT c.level, c.idx, CASE WHEN c.level = 0 THEN e.leaf ELSE t.hash END "
        "FROM unnest(%s::bigint[], %s::bigint[]) WITH ORDINALITY AS c(level, idx, ord) "
        "LEFT JOIN events e ON c.level = 0 AND e.session_id = %s AND e.pos = c.idx "
        "LEFT JOIN subtrees t ON c.level > 0 AND t.session_id = %s AND t.level = c.level AND t.idx = c.idx "
        "ORDER BY c.ord",
        ([lv for lv, _ in coords], [i for _, i in coords], session_id, session_id),
    )
    out: list[bytes] = []
    for level, idx, h in cur.fetchall():
        if h is None:
            raise IntegrityError(f"subtree ({level}, {idx}) is missing", pos=int(idx) << int(level))
        out.append(bytes(h))
    return out


#: The kinds of the events whose erasures follow their insert in the same transaction.
_ERASING_KINDS = frozenset({"redaction", "retention"})

#: The SQL types of ``compactstore_insert_indexed``'s arguments, in order.
_INSERT_TYPES = ("bigint", "bigint[]", "bigint[]", "text[]", "text[]", "int4[]", "int4", "bytea", "bytea",
                 "bigint[]", "bigint[]", "bytea", "bigint", "bytea", "bigint", "bytea", "bytea",
                 "bigint[]", "text[]", "text[]", "bigint[]", "text[]")
#: The call of ``compactstore_append`` a writer sends alone, prepared: arrays as text (one
#: literal each, see :func:`_array`), the rest in binary (integers as int8, see :func:`_cursors`).
_APPEND_CALL = "SELECT compactstore_append(%b::bigint, " + ", ".join(
    f"%t::{t}" if t.endswith("[]") else f"%b::{t}" for t in _INSERT_TYPES) + ", %b::boolean)"
#: The draw of an append's seqs, prepared: a statement of its own, as the seal this
#: process computes covers them. Sorted, as the order of an array's elements is not promised.
_DRAW = "SELECT array(SELECT nextval('events_seq') AS q FROM generate_series(1, %b::bigint) ORDER BY q)"
#: The draw of one seq, the common append's: no subquery, sort or array to build.
_DRAW_ONE = "SELECT nextval('events_seq')"
#: The insert of index rows a writer spells out when a statement must see them before its insert.
_INDEX_INSERT = f"INSERT INTO {queries.TABLE} (session_id, pos, rel, key, num, text) VALUES "
#: Up to this many bytes of bodies an insert is written inline, in the message that
#: commits it; beyond, its arguments travel in binary and COMMIT follows on its own
#: (one round trip more, against a server that would otherwise read the bytes as text).
INLINE_BYTES = 64 * 1024


def _insert_args(
    session_id: int, rows: Sequence[Row], subtrees: Sequence[tuple[int, int, bytes]], head: HeadRow,
    index: Sequence[IndexRow] = (),
) -> tuple[object, ...]:
    """Return the arguments of ``compactstore_insert_indexed``, arrays as array literals.

    Every leaf and subtree root must have the width of the first.
    """
    if len(rows) == 1 and not subtrees and not index:  # the common append, spelled out (the same values)
        r = rows[0]
        body = r.body
        return (session_id, f"{{{int(r.pos)}}}", f"{{{int(r.seq)}}}", _array([r.kind]),
                "{NULL}" if r.idem_key is None else _array([_text(r.idem_key, "idempotency_key")]),
                "{-1}" if body is None else f"{{{len(body)}}}", len(r.leaf), r.leaf, b"" if body is None else body,
                "{}", "{}", b"", head.size, head.root, head.prev, head.seal, head.seqs, "{}", "{}", "{}", "{}", "{}")
    width = len(rows[0].leaf) if rows else 32
    if any(len(r.leaf) != width for r in rows) or any(len(h) != width for _, _, h in subtrees):
        raise IntegrityError(f"hashes of different widths in one insert (want {width} bytes each)")
    return (
        session_id,
        _array([r.pos for r in rows]),
        _array([r.seq for r in rows]),
        _array([r.kind for r in rows]),
        _array([None if r.idem_key is None else _text(r.idem_key, "idempotency_key") for r in rows]),
        _array([-1 if r.body is None else len(r.body) for r in rows]),
        width,
        b"".join(r.leaf for r in rows),
        b"".join(r.body for r in rows if r.body is not None),
        _array([lv for lv, _, _ in subtrees]),
        _array([i for _, i, _ in subtrees]),
        b"".join(h for _, _, h in subtrees),
        head.size,
        head.root,
        head.prev,
        head.seal,
        head.seqs,
        _array([r[0] for r in index]),
        _array([_plain_text(r[1]) for r in index]),
        _array([_plain_text(r[2]) for r in index]),
        _array([r[3] for r in index]),
        _array([_plain_text(r[4]) for r in index]),
    )


def _plain_text(text: str) -> str:
    """Return ``text``, refusing NUL characters: a query is a C string, a NUL would cut it short."""
    if "\x00" in text:
        raise CompactStoreError("PostgreSQL text cannot hold NUL characters")
    return text


def _quote(text: str) -> str:
    """Return ``text`` as an escape-string literal, read the same whatever ``standard_conforming_strings`` says."""
    return "E'" + _plain_text(text).replace("\\", "\\\\").replace("'", "''") + "'"


def _array(values: Sequence[int] | Sequence[str | None]) -> str:
    """Return ``values`` in the array literal syntax: integers as they are, text double-quoted.

    Written by hand because the driver builds arrays a Python step per element, where
    one join does it here; the server parses the text in one pass.
    """
    if values and isinstance(values[0], int):
        return "{" + ",".join(map(str, values)) + "}"
    return "{" + ",".join(
        "NULL" if v is None else '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values
    ) + "}"


def _inline(value: object, kind: str) -> str:
    """Return an argument of ``compactstore_insert_indexed`` as an SQL literal of type ``kind``."""
    if isinstance(value, bytes):
        return f"E'\\\\x{value.hex()}'::bytea"
    if isinstance(value, int):
        return f"{int(value)}::{kind}"
    assert isinstance(value, str)
    return f"{_quote(value)}::{kind}"


def _placeholder(value: object, kind: str) -> str:
    """Return the placeholder of an argument of ``compactstore_insert_indexed``: arrays as text, the rest in binary."""
    return f"%t::{kind}" if isinstance(value, str) else f"%b::{kind}"


class _Unread:
    """The head was not read under the lock yet."""


_UNREAD = _Unread()


def _seqs(rows: Sequence[Row], got: tuple[Any, ...] | None) -> list[int]:
    """Return the seqs of ``rows`` from the insert's answer (the seqs in position order)."""
    if got is None or got[0] is None or len(got[0]) != len(rows):
        raise IntegrityError(f"inserted {len(rows)} events, got {got and got[0] and len(got[0])} seqs back")
    if len(rows) == 1:
        return [int(got[0][0])]
    by_pos = dict(zip(sorted(r.pos for r in rows), got[0]))
    return [int(by_pos[r.pos]) for r in rows]


#: A connection's text cursor (literal SQL, the simple query protocol) and binary cursor (parameters).
_Cursors = tuple[psycopg.Cursor[tuple[Any, ...]], psycopg.Cursor[tuple[Any, ...]]]


def _cursors(conn: psycopg.Connection[tuple[Any, ...]]) -> _Cursors:
    """Return the cursors the writers on ``conn`` share, one writer at a time (as the connection is).

    Made once per connection, not per append, where making two cost about as much as
    building the append's arguments. The binary cursor sends every integer as int8 (the
    columns' type): the driver would pick int2, int4 or int8 by value, and each set of
    types is a statement of its own to prepare.
    """
    binary = conn.cursor(binary=True)
    binary.adapters.register_dumper(int, Int8BinaryDumper)
    return conn.cursor(), binary


def _begin(
    conn: psycopg.Connection[tuple[Any, ...]], text: psycopg.Cursor[tuple[Any, ...]], name: str
) -> tuple[int, HeadRow | None]:
    """Begin the transaction holding session ``name``'s lock; return its id and latest head.

    One round trip: the simple query protocol (which alone carries several statements in
    one message) sends BEGIN and the call of ``compactstore_open`` together. READ
    COMMITTED is named because the head must be read with a snapshot newer than the lock.
    """
    with _unprepared(conn):
        text.execute(
            "BEGIN ISOLATION LEVEL READ COMMITTED; "
            f"SELECT sid, head_size, head_root, head_prev, head_seal, head_seqs FROM compactstore_open({_quote(name)})"
        )
        text.nextset()
        got = text.fetchone()
    if got is None:
        raise ConflictError(f"session {name!r} was neither found nor created", session=name)
    sid, size, root, prev, seal, seqs = got
    return int(sid), None if size is None else HeadRow(int(size), bytes(root), int(prev), bytes(seal), bytes(seqs))


@contextmanager
def _unprepared(conn: psycopg.Connection[tuple[Any, ...]]) -> Iterator[None]:
    """Keep statements written with inline values out of the driver's prepared-statement cache.

    Each such statement is new text, so it would never be prepared, but the cache would
    still hash it and keep the last hundred (whole batches of bodies) as keys.
    """
    threshold, conn.prepare_threshold = conn.prepare_threshold, None
    try:
        yield
    finally:
        conn.prepare_threshold = threshold


def _rollback(conn: psycopg.Connection[tuple[Any, ...]]) -> None:
    """Roll back the open transaction of ``conn``, if any; a broken connection is left to the pool."""
    if conn.closed or conn.broken or conn.info.transaction_status == pq.TransactionStatus.IDLE:
        return
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error:
        pass  # the pool discards a connection it cannot reset


class _PGWriter:
    __slots__ = ("_cur", "_deferred", "_expect", "_expect_seq", "_head", "_index", "_reads", "_spec", "_text",
                 "committed", "expected", "missed", "seq_after", "session_id", "written")

    def __init__(self, text: psycopg.Cursor[tuple[Any, ...]], binary: psycopg.Cursor[tuple[Any, ...]],
                 session_id: int, head: HeadRow | None | _Unread, *, speculative: str | None = None,
                 expect_seq: int | None = None) -> None:
        #: For messages of literal SQL (the simple query protocol); parameters go through _cur.
        self._text = text
        self._cur = binary
        self._head = head
        self.session_id = session_id
        #: The session's name while the writer builds on a remembered head without the lock.
        self._spec = speculative
        #: The size of that head (head() hands the head over only once).
        self._expect = head.size if isinstance(head, HeadRow) else 0
        #: The head insert() wrote, once its transaction committed, and the seq after its events'.
        self.written: HeadRow | None = None
        self.seq_after: int | None = None
        #: The seq a speculating writer expects to draw next (None: draw first); whether
        #: next_seqs() gave expected seqs, and whether the server drew others.
        self._expect_seq = expect_seq
        self.expected = False
        self.missed = False
        #: Whether insert() has already committed the transaction.
        self.committed = False
        #: Index inserts as literal SQL, sent with the next statement instead of a round trip each.
        self._deferred: list[str] = []
        #: Index rows not sent yet: arguments of the insert's call, or literal SQL if another statement comes first.
        self._index: list[IndexRow] = []
        #: The shared reads, run in this transaction once what it holds back is sent.
        self._reads = Reads(lambda sql, args: self._do("read in the write transaction", sql, args), queries.POSTGRES)

    def _spell_index(self) -> None:
        """Turn the index rows held as values into a deferred literal INSERT (another statement must see them)."""
        if self._index:
            rows, self._index = self._index, []
            self._deferred.append(_INDEX_INSERT + ", ".join(
                f"({self.session_id}, {int(p)}, {_quote(r)}, {_quote(k)}, {int(n)}, {_quote(t)})"
                for p, r, k, n, t in rows))

    def flush(self) -> None:
        """Send the deferred index inserts now (before any other statement reads or commits)."""
        self._spell_index()
        self._send_deferred()

    def confirm(self) -> None:
        """Take the session's lock now and check the remembered head is the latest (speculating only).

        Raises:
            StaleHead: another writer appended since; nothing was written.
        """
        if self._spec is None:
            return
        name, self._spec, expect = self._spec, None, self._expect
        sid, head = _begin(self._text.connection, self._text, name)
        got = head.size if head is not None else 0
        if sid != self.session_id or got != expect:
            raise StaleHead(f"session {name!r} moved on to size {got} from {expect}", session=name)

    def _send_deferred(self) -> None:
        """Send the index inserts deferred as literal SQL."""
        self.confirm()
        if self._deferred:
            statements, self._deferred = self._deferred, []
            try:
                with _unprepared(self._text.connection):
                    self._text.execute("; ".join(statements))
            except psycopg.Error as exc:
                raise _error(exc, "write the structural index") from exc

    def _open(self) -> None:
        """Refuse to run a statement once insert() has committed: it would run outside the transaction."""
        if self.committed:
            raise CompactStoreError(
                "PostgreSQL: insert() committed the append; nothing may run in its writer after it",
                hint="only a redaction's or a retention's erase() may follow insert() (see Writer.insert)",
            )

    def _do(self, doing: str, sql: str, args: Sequence[object] | Mapping[str, object], fetch: bool = True) -> list[tuple[Any, ...]]:
        self._open()
        self.confirm()
        self.flush()
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
            "SELECT size, root, prev, seal, seqs FROM heads WHERE session_id = %s ORDER BY size DESC LIMIT 1",
            (self.session_id,),
        )
        return HeadRow(*got[0]) if got else None

    def hashes(self, coords: Sequence[tuple[int, int]]) -> list[bytes]:
        self._open()
        self.confirm()
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

    def next_seqs(self, count: int) -> Sequence[int]:
        # Not confirmed first: a speculating writer draws outside the lock (the numbers
        # need none), and its one statement locks and checks.
        self._open()
        if self._spec is not None and self._expect_seq is not None:
            # Drawn and compared by the insert's statement (or by _check_expected before another).
            self.expected = True
            return range(self._expect_seq, self._expect_seq + count)
        return self._draw(count)

    def _draw(self, count: int) -> list[int]:
        try:
            if count == 1:
                self._cur.execute(_DRAW_ONE, prepare=True)
                one = self._cur.fetchone()
                got = None if one is None else ([one[0]],)
            else:
                self._cur.execute(_DRAW, (count,), prepare=True)
                got = self._cur.fetchone()
        except psycopg.Error as exc:
            raise _error(exc, "draw sequence numbers") from exc
        if got is None or len(got[0]) != count:
            raise IntegrityError(f"drew {count} sequence numbers, got {got and len(got[0])}")
        return [int(q) for q in got[0]]

    def insert(self, rows: Sequence[Row], subtrees: Sequence[tuple[int, int, bytes]], head: HeadRow) -> list[int]:
        # Unless an erasure follows, nothing more is written in this transaction (the
        # protocol's promise), so the insert may commit.
        self._open()
        rows = list(rows)  # read below column by column: each row made once
        final = not any(r.kind in _ERASING_KINDS for r in rows)
        conn, text = self._text.connection, self._text
        index, self._index = self._index, []
        args = _insert_args(self.session_id, rows, subtrees, head, index)
        if self._spec is not None and final and not self._deferred:
            return self._append(rows, head, args)
        inline = sum(len(r.body or b"") for r in rows) <= INLINE_BYTES
        self.confirm()
        if self.expected and list(self._draw(len(rows))) != [r.seq for r in rows]:
            self.missed = True
            raise StaleHead("another writer drew sequence numbers since this backend's last append")
        try:
            if inline:
                # One message, so one round trip: the simple query protocol carries
                # several statements, but no parameters.
                call = ", ".join(_inline(v, t) for v, t in zip(args, _INSERT_TYPES))
                before, self._deferred = self._deferred, []
                with _unprepared(conn):
                    text.execute("".join(f"{sql}; " for sql in before)
                                 + f"SELECT compactstore_insert_indexed({call}){'; COMMIT' if final else ''}")
                    for _ in before:  # past the index inserts' results to the call's
                        text.nextset()
                    got = text.fetchone()
            else:
                self._send_deferred()
                marks = ", ".join(_placeholder(v, t) for v, t in zip(args, _INSERT_TYPES))
                self._cur.execute(f"SELECT compactstore_insert_indexed({marks})", args)
                got = self._cur.fetchone()
                if final:
                    conn.execute("COMMIT")
        except psycopg.Error as exc:
            raise _error(exc, "insert events, subtree roots and the head") from exc
        self.committed = final
        if final:
            self.written = head
            self.seq_after = rows[-1].seq + 1
        return _seqs(rows, got)

    def _append(self, rows: Sequence[Row], head: HeadRow, args: Sequence[object]) -> list[int]:
        """Lock, check the remembered head, insert and commit: one statement, one round trip.

        The call is the only statement of its transaction, so it runs in the implicit
        transaction the server commits when the statement ends (the pool's connections are
        in autocommit, at READ COMMITTED): no BEGIN or COMMIT to parse. It is prepared
        (parsed and planned once per connection) and its arguments travel in binary, where
        a call spelled out as text was parsed, analysed and planned on every append.
        """
        expect = self._expect
        try:
            self._cur.execute(_APPEND_CALL, (expect, *args, not self.expected), prepare=True)
            got = self._cur.fetchone()
        except psycopg.Error as exc:
            if getattr(exc, "sqlstate", None) == _HEAD_MOVED:
                raise StaleHead(f"session {self._spec!r} moved on from size {expect}", session=self._spec) from exc
            if getattr(exc, "sqlstate", None) == _SEQS_MOVED:
                self.missed = True
                raise StaleHead(f"another writer drew sequence numbers; session {self._spec!r} is unchanged",
                                session=self._spec) from exc
            raise _error(exc, "append events, subtree roots and the head", waits=True) from exc
        self._spec = None
        self.committed = True
        self.written = head
        self.seq_after = rows[-1].seq + 1
        return _seqs(rows, got)

    def index_rows(self, rels: Sequence[str], lo: int, hi: int) -> list[IndexRow]:
        return self._reads.index_rows(self.session_id, rels, lo, hi)

    def index_rows_at(self, rel: str, positions: Sequence[int]) -> list[IndexRow]:
        return self._reads.index_rows_at(self.session_id, rel, positions)

    def latest_binding(self, key: str, before: int) -> IndexRow | None:
        return self._reads.latest_binding(self.session_id, key, before)

    def body(self, pos: int) -> bytes | None:
        return self._reads.body(self.session_id, pos)

    def insert_index(self, rows: Sequence[IndexRow]) -> None:
        """Hold ``rows`` back: they travel as arguments of the insert's call, or as literal SQL before another statement.

        An append costs no round trip and no statement of its own for its index rows.
        """
        self._open()
        self._index.extend(rows)

    def note_erased(self, positions: Sequence[int], by: int) -> None:
        self._do(
            "record erasures",
            "INSERT INTO redactions (session_id, pos, by) SELECT %s, p, %s FROM unnest(%s::bigint[]) AS p",
            (self.session_id, by, list(positions)),
            fetch=False,
        )

    def erase(self, positions: Sequence[int], by: int, *, kind: str = "redacted") -> None:
        sid, positions = self.session_id, list(positions)
        self._do(
            "record erasures",
            "INSERT INTO redactions (session_id, pos, by) SELECT %s, p, %s FROM unnest(%s::bigint[]) AS p",
            (sid, by, positions),
            fetch=False,
        )
        self._do(
            "erase bodies",
            "UPDATE events SET body = NULL, kind = %s, idem_key = NULL "
            "WHERE session_id = %s AND pos = ANY(%s::bigint[])",
            (kind, sid, positions),
            fetch=False,
        )
        if kind != "redacted":  # a dropped body's facts stay: what it was is known, only its bytes go
            return
        self._do(
            "erase the negative facts' texts",
            f"UPDATE {queries.TABLE} SET text = '' WHERE session_id = %s AND pos = ANY(%s::bigint[]) "
            "AND rel = 'negative' AND text <> ''",
            (sid, positions),
            fetch=False,
        )


_: type[Backend] = PostgresBackend
_w: type[Writer] = _PGWriter
