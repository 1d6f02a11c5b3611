"""The embedded default: one SQLite file in WAL mode, append-only enforced by triggers.

Writers take the database's write lock up front (``BEGIN IMMEDIATE``) and wait for it
up to a busy timeout, so several processes can append to one file and positions stay
gapless: the position is read and written under the same lock.
"""

from __future__ import annotations

import operator
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import repeat
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal


from ..errors import CompactStoreError, ConflictError, IntegrityError, LockTimeout, NotAStore, StaleHead, StoreClosed
from ..structure import IndexRow
from .protocol import BODY_BATCH, SCHEMA_VERSION, HeadRow, Row, Rows, caller, identified, keyset
from . import queries
from .queries import Reads

if TYPE_CHECKING:
    from .protocol import Backend, Writer

BUSY_TIMEOUT_MS = 60_000
#: How long the checkpoint after an erasure waits for other connections' reads and writes.
CHECKPOINT_WAIT_MS = 1_000
LOG_TABLES = ("meta", "sessions", "events", "subtrees", "heads", "redactions")


def _append_only(table: str, op: str) -> str:
    """Return the trigger that refuses ``op`` (UPDATE or DELETE) on a log table."""
    # One change is allowed: erasing the body of a position already recorded as erased (by
    # a redaction, or dropped by retention; the event at ``by`` says which, and the reads hold it).
    allowed = (
        " WHEN NOT (NEW.body IS NULL AND OLD.body IS NOT NULL AND NEW.seq = OLD.seq"
        " AND NEW.session_id = OLD.session_id AND NEW.pos = OLD.pos AND NEW.kind IN ('redacted', 'dropped')"
        " AND NEW.idem_key IS NULL AND NEW.leaf = OLD.leaf AND EXISTS (SELECT 1 FROM redactions r"
        " WHERE r.session_id = OLD.session_id AND r.pos = OLD.pos))"
        if (table, op) == ("events", "UPDATE")
        else ""
    )
    return (
        f"CREATE TRIGGER {table}_no_{op.lower()} BEFORE {op} ON {table}{allowed} "
        f"BEGIN SELECT RAISE(ABORT, 'compactstore: {table} is append-only'); END"
    )


#: A head follows the head it extends: a writer that built on a head no longer stored (the
#: file replaced by an older copy under an open handle) writes nothing.
_HEAD_FOLLOWS = (
    "CREATE TRIGGER heads_follow BEFORE INSERT ON heads WHEN NEW.prev > 0 AND NOT EXISTS "
    "(SELECT 1 FROM heads h WHERE h.session_id = NEW.session_id AND h.size = NEW.prev) "
    "BEGIN SELECT RAISE(ABORT, 'compactstore: a head must follow the head it extends'); END"
)


# The tables as sqlite-utils writes them (the text SQLite keeps is the same as in stores
# made before): written out here, since importing sqlite-utils imports numpy where it is
# installed, and with it a BLAS thread pool, in every process that opens a store.
_TABLES = (
    'CREATE TABLE "meta" (\n   "name" TEXT PRIMARY KEY,\n   "value" TEXT NOT NULL\n) STRICT',
    'CREATE TABLE "sessions" (\n   "id" INTEGER PRIMARY KEY,\n   "name" TEXT NOT NULL\n) STRICT',
    'CREATE UNIQUE INDEX "idx_sessions_name"\n    ON "sessions" ("name")',
    'CREATE TABLE "events" (\n   "seq" INTEGER PRIMARY KEY,\n   "session_id" INTEGER NOT NULL,\n'
    '   "pos" INTEGER NOT NULL,\n   "kind" TEXT NOT NULL,\n   "idem_key" TEXT,\n   "leaf" BLOB NOT NULL,\n'
    '   "body" BLOB\n) STRICT',
    'CREATE UNIQUE INDEX "idx_events_session_id_pos"\n    ON "events" ("session_id", "pos")',
    "CREATE UNIQUE INDEX idx_events_idem ON events(session_id, idem_key) WHERE idem_key IS NOT NULL",
    # WITHOUT ROWID: a row lives in its primary key's B-tree only, so a commit writes one
    # page of heads (and of subtrees) where a rowid table writes a table page and an index page.
    'CREATE TABLE "subtrees" (\n   "session_id" INTEGER,\n   "level" INTEGER,\n   "idx" INTEGER,\n'
    '   "hash" BLOB NOT NULL,\n   PRIMARY KEY ("session_id", "level", "idx")\n) STRICT, WITHOUT ROWID',
    'CREATE TABLE "heads" (\n   "session_id" INTEGER,\n   "size" INTEGER,\n   "root" BLOB NOT NULL,\n'
    '   "prev" INTEGER NOT NULL,\n   "seal" BLOB NOT NULL,\n   "seqs" BLOB NOT NULL,\n'
    '   PRIMARY KEY ("session_id", "size")\n) STRICT, WITHOUT ROWID',
    'CREATE TABLE "redactions" (\n   "session_id" INTEGER,\n   "pos" INTEGER,\n   "by" INTEGER NOT NULL,\n'
    '   PRIMARY KEY ("session_id", "pos")\n) STRICT',
)


def _schema(db: sqlite3.Connection) -> None:
    for sql in _TABLES:
        db.execute(sql)
    for table in LOG_TABLES:
        for op in ("UPDATE", "DELETE"):
            db.execute(_append_only(table, op))
    db.execute(_HEAD_FOLLOWS)
    # A readable view for people browsing the file with sqlite-utils or Datasette.
    db.execute(
        "CREATE VIEW events_readable AS SELECT e.seq, s.name AS session, e.pos, e.kind, "
        "e.idem_key, hex(e.leaf) AS leaf, CAST(e.body AS TEXT) AS body "
        "FROM events e JOIN sessions s ON s.id = e.session_id"
    )
    for sql in queries.SQLITE_SCHEMA:
        db.execute(sql)


#: What each schema version adds to the one before: statements run in the upgrade's transaction.
UPGRADES: dict[str, tuple[str, ...]] = {"6": (_HEAD_FOLLOWS, "DROP TRIGGER events_no_update", _append_only("events", "UPDATE"))}


def _layout_problems(conn: sqlite3.Connection) -> list[str]:
    """Return how the file's tables and triggers differ from the log's (columns and names), read by sqlite-utils."""
    import sqlite_utils  # only a migration reads the layout this way: opening a store never imports it

    db = sqlite_utils.Database(conn, recursive_triggers=False, execute_plugins=False)
    want = sqlite3.connect(":memory:")
    try:
        for sql in _TABLES:
            want.execute(sql)
        model = sqlite_utils.Database(want, recursive_triggers=False, execute_plugins=False)
        problems = []
        for table in model.table_names():
            if not db[table].exists():
                problems.append(f"table {table} is missing")
            elif db[table].columns_dict != model[table].columns_dict:
                problems.append(f"table {table} has columns {db[table].columns_dict}, want {model[table].columns_dict}")
        triggers = {t.name for t in db.triggers}
        problems += [f"trigger {table}_no_{op.lower()} is missing" for table in LOG_TABLES for op in ("UPDATE", "DELETE")
                     if f"{table}_no_{op.lower()}" not in triggers]
        return problems
    finally:
        want.close()


class _DryRun(Exception):
    """Rolls a dry run's upgrade back, once every step of it has run."""


class SQLiteBackend(Reads):
    """A store in one SQLite file (or ``":memory:"``).

    The reads of the index, of events at given positions and of subtree roots come from
    :class:`~compactstore.backends.queries.Reads`, through :meth:`_all`.
    """

    gapless_seq = True

    def __init__(self, path: str, *, durable: bool = False, create: bool = True) -> None:
        """Open or create the database at ``path``.

        Args:
            path: a file path, or ``":memory:"``.
            durable: ``synchronous=FULL`` (survives power loss) instead of ``NORMAL``
                (survives a process crash).
            create: make a store where there is none: a missing file, a 0-byte file
                or a database without tables. Otherwise those are refused, and a
                missing file is not created.

        Raises:
            NotAStore: no store is there (and ``create`` is false), or the file is
                something else: not a SQLite database, or one holding other tables.
                Nothing in the file is changed.
            IntegrityError: the file is a damaged SQLite database.
        """
        if not create and path != ":memory:" and not os.path.exists(path):
            raise NotAStore(path, "no such file")
        # Every use of the connection holds this lock, close() included: closing a
        # connection under a statement another thread runs crashes the process.
        self._lock = threading.RLock()
        self._closed = False
        self._path = path
        # What this connection committed last, valid while PRAGMA data_version shows no
        # other connection has committed since: each session's latest head and the next
        # seq. A session's id never changes once committed (sessions is append-only).
        self._version: int | None = None
        self._heads: dict[int, HeadRow] = {}
        self._next_seq: int | None = None
        self._sids: dict[str, int] = {}
        #: Depth of the :meth:`snapshot` contexts open on the connection (their thread holds ``_lock``).
        self._snapshots = 0
        #: who opened the snapshot in force (its thread and task): another task may not nest in it
        self._snapshot_owner: tuple[int, object] | None = None
        super().__init__(self._all, queries.SQLITE)
        try:
            self._conn = conn = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
            )
        except sqlite3.Error as exc:
            raise _error(exc, f"open {path!r}") from exc
        #: The cursor a writer runs its statements on: Connection.execute makes a cursor per call.
        self._cursor = conn.cursor()
        #: The same reads inside a writer's transaction, unwrapped: the writer wraps errors as it ends.
        self._in_write = Reads(lambda sql, args: conn.execute(sql, args).fetchall(), queries.SQLITE)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            # Look before writing anything (the switch to WAL writes to the file): what
            # is not a store, or not yet one when it must not be made, is left as it was.
            _refuse_foreign(conn, path, create)
            # A redaction erases a body: its bytes must not stay behind in freed space.
            conn.execute("PRAGMA secure_delete = ON")
            if path != ":memory:":
                _enter_wal(conn)
            conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
            if create:  # under the write lock: of two first openers, one makes the schema
                with self._write():
                    if _refuse_foreign(conn, path, create):
                        _schema(conn)
        except (sqlite3.Error, UnicodeDecodeError) as exc:
            conn.close()
            if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_NOTADB:
                raise NotAStore(path, "the file is not a SQLite database") from exc
            raise _error(exc, f"open {path!r} as a compactstore store") from exc
        except BaseException:
            conn.close()
            raise

    def close(self) -> None:
        # Waits for the call or write transaction in flight (they hold the lock); every
        # later one finds the flag and raises StoreClosed instead of using the connection.
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()

    def _open(self) -> sqlite3.Connection:
        """Return the connection; call holding ``_lock``.

        Raises:
            StoreClosed: :meth:`close` has been called.
        """
        if self._closed:
            raise StoreClosed(self._path)
        if self._snapshots and self._snapshot_owner != caller():
            raise self._not_ours()
        return self._conn

    def _not_ours(self) -> CompactStoreError:
        # The one connection is in another task's read transaction: a read through it would
        # see that task's state, and a statement of another could end it.
        return CompactStoreError(f"SQLite: {self._path}: another task's snapshot is open on this handle",
                                 hint="use another handle, or wait for that snapshot to end")

    def _refuse_in_snapshot(self) -> None:
        """Refuse a write from inside :meth:`snapshot` (call holding ``_lock``).

        Its BEGIN would fail on the open read transaction, and the rollback after the
        failure would end that transaction: the reads after it would see another state.
        """
        if self._snapshots:
            if self._snapshot_owner != caller():
                raise self._not_ours()
            raise CompactStoreError(f"SQLite: {self._path}: cannot write inside a snapshot of the store",
                                    hint="write after the snapshot's context ends")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = self._open()
        self._refuse_in_snapshot()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # SQLite rolled back already (a full disk does that); nothing was committed
            raise

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Read one state of the file until the context ends: one read transaction on the connection.

        Every read of this handle goes through its one connection, so the transaction
        holds the handle's lock throughout: the handle's other threads, writers among
        them, wait until the context ends (for as long as it lasts, past the busy
        timeout too). Other connections keep committing (WAL); this one does not see it.
        A checkpoint cannot pass the transaction's state meanwhile, so the write-ahead
        log grows until the context ends. The snapshot is its opener's (thread and asyncio
        task): another task of the same thread, which the lock does not hold back, is
        refused every read and write through the handle until it ends.

        Raises:
            StoreClosed: :meth:`close` has been called.
            CompactStoreError: another task's snapshot is open on this handle.
        """
        with self._lock:
            conn = self._open()
            if self._snapshots:  # _open refused another task's: this is a nested one of the same caller
                self._snapshots += 1  # nested: the outer transaction holds the state already
                try:
                    yield
                finally:
                    self._snapshots -= 1
                return
            try:
                # Deferred: the state is that of the first read, as another reader's would be.
                conn.execute("BEGIN")
            except sqlite3.Error as exc:
                raise _error(exc, "begin a read transaction") from exc
            self._snapshots, self._snapshot_owner = 1, caller()
            try:
                yield
            finally:
                self._snapshots, self._snapshot_owner = 0, None
                # close() from inside the context (this thread holds the lock) leaves nothing to end.
                if not self._closed and conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")  # nothing was written: ending it so costs nothing
                    except sqlite3.Error:
                        pass  # SQLite ended it already

    def _all(self, sql: str, args: Sequence[object] = ()) -> list[Any]:
        try:
            with self._lock:
                return self._open().execute(sql, args).fetchall()
        except (sqlite3.Error, UnicodeDecodeError) as exc:
            raise _error(exc, "read") from exc

    def integrity(self) -> list[str]:
        """Return what SQLite's own integrity check finds wrong in the file (indexes included)."""
        got = [str(r[0]) for r in self._all("PRAGMA integrity_check")]
        return [] if got == ["ok"] else [f"SQLite integrity check: {g}" for g in got]

    def meta(self) -> dict[str, str]:
        return {str(n): str(v) for n, v in self._all("SELECT name, value FROM meta")}

    def init_meta(self, values: dict[str, str], *, create: bool = True) -> dict[str, str]:
        if not create:
            return identified(self.meta(), self._path)
        try:
            with self._lock, self._write() as conn:  # _write goes through _open
                if not conn.execute("SELECT 1 FROM meta LIMIT 1").fetchone():
                    conn.executemany(
                        "INSERT INTO meta (name, value) VALUES (?, ?)",
                        [("schema_version", SCHEMA_VERSION), *values.items()],
                    )
        except (sqlite3.Error, UnicodeDecodeError) as exc:
            raise _error(exc, "read the meta table") from exc
        return self.meta()

    def upgrade(self, to: str, derive: Callable[[], Sequence[tuple[int, Sequence[IndexRow]]]], *, commit: bool) -> None:
        with self._lock:
            try:
                with self._write() as conn:
                    found = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
                    if found is None or str(found[0]) != str(int(to) - 1):
                        raise ConflictError(f"SQLite: {self._path}: the store is at schema {found and found[0]!r}, "
                                            f"not {int(to) - 1}: another migration ran first")
                    problems = _layout_problems(conn)
                    if problems:
                        raise IntegrityError(f"SQLite: {self._path}: not the layout of schema {int(to) - 1}: {problems[0]}")
                    for sql in UPGRADES[to]:
                        conn.execute(sql)
                    step = queries.INSERT_ROWS
                    for sid, rows in derive():
                        for i in range(0, len(rows), step):
                            chunk = rows[i : i + step]
                            conn.execute(queries.SQLITE.insert_index(len(chunk)), [v for r in chunk for v in (sid, *r)])
                    # meta is append-only: its trigger steps aside for this one change, in this transaction.
                    conn.execute("DROP TRIGGER meta_no_update")
                    conn.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'", (to,))
                    conn.execute(_append_only("meta", "UPDATE"))
                    if not commit:
                        raise _DryRun
            except _DryRun:
                pass
            except (sqlite3.Error, UnicodeDecodeError) as exc:
                raise _error(exc, f"upgrade the schema to {to}") from exc
            self._version = None  # the file changed: what this connection remembers is re-read

    def reclaim(self) -> int:
        with self._lock:
            conn = self._open()
            self._refuse_in_snapshot()
            before = _file_size(self._path)
            try:
                conn.execute("VACUUM")  # rewrites the file from its live rows: freed space leaves it
            except sqlite3.Error as exc:
                raise _error(exc, "reclaim space (VACUUM)") from exc
            _drop_old_pages(conn)
            self._version = None
            return max(0, before - _file_size(self._path))

    def backup(self, dest: str) -> None:
        """Copy the whole store, as of one state, into a new SQLite file at ``dest`` (written whole, then renamed)."""
        part = f"{dest}.part"
        with self._lock:
            out = sqlite3.connect(part)
            try:
                self._open().backup(out)
            except sqlite3.Error as exc:
                raise _error(exc, f"back up to {dest!r}") from exc
            finally:
                out.close()
        os.replace(part, dest)

    def sessions(self) -> list[tuple[int, str]]:
        return [(int(i), str(n)) for i, n in self._all("SELECT id, name FROM sessions ORDER BY name")]

    def session_id(self, name: str) -> int | None:
        got = self._all("SELECT id FROM sessions WHERE name = ?", (name,))
        return int(got[0][0]) if got else None

    def writer(self, name: str, *, speculate: bool = False) -> _SQLiteWriter:
        return _SQLiteWriter(self, name, speculate)

    def _remember(self, version: int, name: str, w: _SQLiteWriter) -> None:
        """Keep what the writer ``w`` just committed, as of ``data_version`` ``version``."""
        self._version = version
        self._sids[name] = w.session_id
        if w.written is not None:
            self._heads[w.session_id] = w.written
            self._next_seq = w.seq_after

    def row(self, session_id: int, pos: int) -> Row | None:
        got = self._all(
            "SELECT seq, session_id, pos, kind, idem_key, leaf, body FROM events WHERE session_id = ? AND pos = ?",
            (session_id, pos),
        )
        return Row(*got[0]) if got else None

    def rows(self, session_id: int, start: int, stop: int | None, chunk: int) -> Iterator[Row]:
        sql = (
            "SELECT seq, session_id, pos, kind, idem_key, leaf, body FROM events "
            "WHERE session_id = ? AND pos >= ? AND pos < ? ORDER BY pos LIMIT ?"
        )
        return keyset(lambda a, b, n: self._all(sql, (session_id, a, b, n)), start, stop, chunk)

    def head(self, session_id: int) -> HeadRow | None:
        got = self._all(
            "SELECT size, root, prev, seal, seqs FROM heads WHERE session_id = ? ORDER BY size DESC LIMIT 1", (session_id,)
        )
        return HeadRow(*got[0]) if got else None

    def hashes(self, session_id: int, coords: Sequence[tuple[int, int]]) -> list[bytes]:
        try:
            with self._lock:
                return _hashes(self._open(), session_id, coords)
        except sqlite3.Error as exc:
            raise _error(exc, "read subtree roots") from exc

    def bodies(
        self, session_id: int, start: int, stop: int, each: Callable[[list[bytes | None]], object] | None = None
    ) -> list[bytes | None]:
        return self._span_column("body", session_id, start, stop, each)

    def leaves(self, session_id: int, start: int, stop: int) -> list[bytes]:
        # The leaf column comes before the body: a long body's overflow pages are not read.
        return self._span_column("leaf", session_id, start, stop)

    def _span_column(
        self, column: Literal["body", "leaf"], session_id: int, start: int, stop: int,
        each: Callable[[list[Any]], object] | None = None,
    ) -> list[Any]:
        """Return ``column`` of the events at positions ``[start, stop)`` in order, in one query.

        ``each`` is called with every batch of ``BODY_BATCH`` values as it is read.
        """
        # Within a session seq follows pos, so the span is one range of the table's own
        # key: read it there rather than seeking the table once per index entry.
        sql = (
            f"SELECT {column} FROM events WHERE +session_id = ?1 AND +pos >= ?2 AND +pos < ?3 "
            "AND seq >= (SELECT seq FROM events WHERE session_id = ?1 AND pos >= ?2 ORDER BY pos LIMIT 1) "
            "AND seq <= (SELECT seq FROM events WHERE session_id = ?1 AND pos < ?3 ORDER BY pos DESC LIMIT 1) "
            "ORDER BY seq"
        )
        args = (session_id, start, stop)
        if each is None:
            return [b for (b,) in self._all(sql, args)]
        out: list[Any] = []
        try:
            with self._lock:
                cur = self._open().execute(sql, args)
                while rows := cur.fetchmany(BODY_BATCH):
                    batch = [b for (b,) in rows]
                    out += batch
                    each(batch)
        except (sqlite3.Error, UnicodeDecodeError) as exc:
            raise _error(exc, "read") from exc
        return out

    def heads(self, session_id: int, after: int, limit: int) -> list[HeadRow]:
        got = self._all(
            "SELECT size, root, prev, seal, seqs FROM heads WHERE session_id = ? AND size > ? ORDER BY size LIMIT ?",
            (session_id, after, limit),
        )
        return [HeadRow(*r) for r in got]

    def redactions(self, session_id: int) -> dict[int, int]:
        got = self._all("SELECT r.pos, r.by FROM redactions r LEFT JOIN events e ON e.session_id = r.session_id "
                        "AND e.pos = r.pos WHERE r.session_id = ? AND e.kind IS NOT 'dropped'", (session_id,))
        return {int(p): int(b) for p, b in got}

    def erasures(self, session_id: int) -> dict[int, int]:
        got = self._all("SELECT pos, by FROM redactions WHERE session_id = ?", (session_id,))
        return {int(p): int(b) for p, b in got}

    def orphans(self) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        for table in ("events", "subtrees", "heads", "redactions"):
            got = self._all(
                f"SELECT DISTINCT session_id FROM {table} WHERE session_id NOT IN (SELECT id FROM sessions)"
            )
            out.extend((table, sid) for (sid,) in got)  # as stored: a damaged file may hold a NULL
        return out

    def seq_bounds(self) -> tuple[int, int, int]:
        n, lo, hi = self._all("SELECT count(*), coalesce(min(seq), 0), coalesce(max(seq), 0) FROM events")[0]
        return int(n), int(lo), int(hi)


def _refuse_foreign(conn: sqlite3.Connection, path: str, create: bool) -> bool:
    """Return whether the database is empty (a store is to be made in it); raise when it is not a store.

    A store is recognised by its ``meta`` table (its version is the store's to check).
    A database holding other tables belongs to someone else: no schema is written into it.

    Raises:
        NotAStore: the database holds other tables, or is empty and ``create`` is false.
    """
    names = [str(n) for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")]
    if "meta" in names:
        return False
    if names:
        shown = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
        raise NotAStore(path, f"the database holds other tables ({shown})",
                        hint="name a new file, or the compactstore store you meant")
    if not create:
        empty = path != ":memory:" and os.path.getsize(path) == 0
        raise NotAStore(path, "the file is empty" if empty else "the database is empty",
                        hint="open it with create=True to make a store there")
    return True


def _file_size(path: str) -> int:
    """Return the bytes the store's file and its write-ahead log take (0 in memory)."""
    if path == ":memory:":
        return 0
    return sum(os.path.getsize(p) for p in (path, f"{path}-wal") if os.path.exists(p))


def _drop_old_pages(conn: sqlite3.Connection) -> None:
    """Copy the write-ahead log into the file and truncate it, so erased bodies leave the disk now.

    Secure delete zeroes them in the pages an erasure writes; the log still holds the
    pages as they were until a checkpoint. Best effort: a reader holding an older
    snapshot (a ``verify()`` of another handle, say) keeps its frames until it ends, and
    the next checkpoint drops them. It waits for such a reader :data:`CHECKPOINT_WAIT_MS`
    at most, not the busy timeout: a redaction does not stall for a long read.
    """
    try:
        conn.execute(f"PRAGMA busy_timeout = {CHECKPOINT_WAIT_MS}")
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    except sqlite3.Error:
        pass  # busy or read-only: the automatic checkpoint gets there later


def _enter_wal(conn: sqlite3.Connection) -> None:
    """Put the file in WAL mode, waiting up to the busy timeout for other openers.

    When several connections open a new file at once, all but one are refused the switch
    to WAL with SQLITE_BUSY at once: SQLite does not call the busy handler there. So the
    wait is ours, with the same deadline as the busy handler's.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


#: Primary result codes (the low byte of an extended one) of a lock held past the busy timeout.
_BUSY = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
#: Primary result codes of a file whose pages are not what SQLite wrote (truncated, overwritten).
_DAMAGED = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
#: Extended result codes of a row whose key is stored already.
_DUPLICATE = frozenset({sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY})
#: Hints by primary result code.
_HINTS = {
    sqlite3.SQLITE_FULL: "free disk space; nothing of the failed write was kept, and everything acknowledged "
    "before is intact",
    sqlite3.SQLITE_READONLY: "the file or its folder is not writable; reads still work",
}


def _error(exc: BaseException, doing: str) -> CompactStoreError:
    """Return the compactstore error for a driver error raised while ``doing``, by its SQLite result code."""
    code = getattr(exc, "sqlite_errorcode", None)  # absent from a UnicodeDecodeError
    if code is None:
        return CompactStoreError(f"SQLite: {doing}: {type(exc).__name__}: {exc}")
    if code & 0xFF in _DAMAGED:
        return IntegrityError(f"SQLite: {doing}: the file is damaged: {exc}",
                              hint="restore the file from a copy: SQLite cannot read all of it")
    if code & 0xFF in _BUSY:
        return LockTimeout(f"SQLite: {doing}: {exc} (another connection held the lock past the busy timeout)")
    if code in _DUPLICATE:
        return ConflictError(f"SQLite: {doing}: a row with the same key is stored already ({exc})")
    hint = _HINTS.get(code & 0xFF)
    if code == sqlite3.SQLITE_CONSTRAINT_TRIGGER:
        hint = "the log tables are append-only: only a redaction may erase a body"
    return CompactStoreError(f"SQLite: {doing}: {type(exc).__name__}: {exc}", hint=hint)


#: ``hashes`` pads its list of runs to a power of two (with runs that match nothing), so
#: that a handful of statement texts serve every call from the connection's statement cache.
_RUNS_MIN = 8
#: At most this many runs per statement: 3 parameters each stays far below SQLite's limit.
_RUNS_MAX = 1024


def _runs(coords: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """Return the distinct coordinates as maximal runs ``(level, lo, hi)`` of consecutive indices."""
    # One pass gathers the runs the coordinates come in (a proof lists each tile's roots
    # in order); then only the runs are sorted, and merged where they touch or overlap.
    found: list[tuple[int, int, int]] = []
    add = found.append
    level = lo = hi = -1
    for lv, idx in coords:
        if idx == hi and lv == level:
            hi += 1
            continue
        if hi >= 0:
            add((level, lo, hi))
        level, lo, hi = lv, idx, idx + 1
    if hi >= 0:
        add((level, lo, hi))
    found.sort()
    out: list[tuple[int, int, int]] = []
    for run in found:
        if out and out[-1][0] == run[0] and out[-1][2] >= run[1]:
            if run[2] > out[-1][2]:
                out[-1] = (run[0], out[-1][1], run[2])
        else:
            out.append(run)
    return out


def _runs_sql(n: int) -> str:
    # Each run is one index range scan: leaves from events, higher levels from subtrees.
    return (
        "WITH r(level, lo, hi) AS (VALUES " + ", ".join(["(?, ?, ?)"] * n) + ") "
        "SELECT 0, e.pos, e.leaf FROM r JOIN events e ON r.level = 0 AND e.session_id = ? "
        "AND e.pos >= r.lo AND e.pos < r.hi "
        "UNION ALL SELECT t.level, t.idx, t.hash FROM r JOIN subtrees t ON r.level > 0 AND t.session_id = ? "
        "AND t.level = r.level AND t.idx >= r.lo AND t.idx < r.hi"
    )


def _hashes(conn: sqlite3.Connection, session_id: int, coords: Sequence[tuple[int, int]]) -> list[bytes]:
    """Return the subtree roots at ``coords`` in one statement; raise naming a missing one.

    A proof's coordinates come in runs of consecutive indices (the tile below a level
    that is not stored), so they are read as ranges rather than one lookup each.
    """
    runs = _runs(coords)
    found: dict[tuple[int, int], bytes] = {}
    for k in range(0, len(runs), _RUNS_MAX):
        part = runs[k : k + _RUNS_MAX]
        n = max(_RUNS_MIN, 1 << (len(part) - 1).bit_length())
        args = [x for run in part for x in run] + [-1, 0, 0] * (n - len(part)) + [session_id, session_id]
        found.update(((level, idx), h) for level, idx, h in conn.execute(_runs_sql(n), args))
    try:
        return [found[c] for c in coords]
    except KeyError:
        level, idx = next(c for c in coords if c not in found)
        raise IntegrityError(f"subtree ({level}, {idx}) is missing", pos=idx << level) from None


_INSERT = "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)"
#: A row's idempotency key.
_KEY = operator.itemgetter(4)
#: A row's other columns.
_SEQ, _SESSION, _POS, _KIND = (operator.itemgetter(i) for i in range(4))
_LEAF, _BODY = operator.itemgetter(5), operator.itemgetter(6)
_INSERT_KEYLESS = "INSERT INTO events (seq, session_id, pos, kind, leaf, body) VALUES (?, ?, ?, ?, ?, ?)"


class _SQLiteWriter:
    """One write transaction on a session, under the database's write lock: a context manager.

    Not a generator-based one: an append of one event pays for entering and leaving it.
    """

    __slots__ = ("_backend", "_name", "_conn", "_cur", "_version", "session_id", "_head", "_seq", "written", "seq_after",
                 "erased", "_speculate", "_unchecked")

    def __init__(self, backend: SQLiteBackend, name: str, speculate: bool = False) -> None:
        self._backend = backend
        self._name = name
        self._speculate = speculate
        #: whether the remembered head and next seq are used without checking data_version
        self._unchecked = False
        self._conn = backend._conn  # used only once __enter__ has checked the store is open
        self._cur = backend._cursor  # the backend's lock, held from __enter__ to __exit__, makes it ours
        #: the head this transaction inserted, and the seq after its events
        self.written: HeadRow | None = None
        self.seq_after: int | None = None
        #: whether the transaction erased bodies (then the write-ahead log is emptied after it)
        self.erased = False

    def __enter__(self) -> _SQLiteWriter:
        backend, conn, cur, name = self._backend, self._conn, self._cur, self._name
        backend._lock.acquire()
        try:
            if backend._closed:
                raise StoreClosed(backend._path)
            backend._refuse_in_snapshot()
            cur.execute("BEGIN IMMEDIATE")
            try:
                sid = backend._sids.get(name)
                # Even a speculating writer asks whether another connection committed since
                # this one last did (one PRAGMA): a file put back from an older copy holds
                # none of the seqs this one would take next, so only the check finds it.
                self._check()
                if sid is None:
                    got = conn.execute("SELECT id FROM sessions WHERE name = ?", (name,)).fetchone()
                    if got is None:
                        sid = conn.execute("INSERT INTO sessions (name) VALUES (?)", (name,)).lastrowid
                        assert sid is not None
                    else:
                        sid = got[0]
                self.session_id = sid
                self._head = backend._heads.get(sid)  # the latest head when known without reading
                self._seq = backend._next_seq
            except BaseException:
                self._rollback()
                raise
        except (sqlite3.Error, UnicodeDecodeError) as exc:
            backend._lock.release()
            raise _error(exc, f"append to session {name!r}") from exc
        except BaseException:
            backend._lock.release()
            raise
        return self

    def _check(self) -> None:
        """Drop what the backend remembers if another connection has committed since this one last did."""
        # Under the write lock: if no other connection has committed since this one last
        # did, what it remembers of that commit is still the latest.
        backend = self._backend
        self._version = version = self._cur.execute("PRAGMA data_version").fetchone()[0]
        if version != backend._version:
            backend._heads.clear()
            backend._next_seq = None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        backend = self._backend
        try:
            if kind is None:
                try:
                    self._cur.execute("COMMIT")
                except BaseException as failed:
                    self._rollback()
                    if isinstance(failed, sqlite3.Error):
                        raise _error(failed, f"append to session {self._name!r}") from failed
                    raise
                # Committed: remember it. (A rollback leaves the remembered state as it was.)
                backend._remember(self._version, self._name, self)
                if self.erased:
                    _drop_old_pages(self._conn)
                return
            self._rollback()
            if self._unchecked and isinstance(exc, sqlite3.IntegrityError):
                # A key taken by a commit of another connection: the remembered head or
                # seq was stale. Nothing was written; the store builds again under a check.
                backend._heads.clear()
                backend._next_seq = None
                raise StaleHead(f"session {self._name!r} moved on under another connection") from exc
            if isinstance(exc, (sqlite3.Error, UnicodeDecodeError)):
                raise _error(exc, f"append to session {self._name!r}") from exc
        finally:
            backend._lock.release()

    def _rollback(self) -> None:
        conn = self._conn
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # SQLite rolled back already (a full disk does that); nothing was committed

    def head(self) -> HeadRow | None:
        if self._head is not None:
            return self._head
        got = self._conn.execute(
            "SELECT size, root, prev, seal, seqs FROM heads WHERE session_id = ? ORDER BY size DESC LIMIT 1", (self.session_id,)
        ).fetchone()
        return HeadRow(*got) if got else None

    def hashes(self, coords: Sequence[tuple[int, int]]) -> list[bytes]:
        return _hashes(self._conn, self.session_id, coords)

    def confirm(self) -> None:
        # The writer holds the lock from the start; a speculating one now checks what it built on.
        if self._unchecked:
            self._unchecked = False
            self._check()
            if self._backend._next_seq is None:
                raise StaleHead(f"session {self._name!r} moved on under another connection")

    def find_idempotent(self, key: str) -> Row | None:
        got = self._conn.execute(
            "SELECT seq, session_id, pos, kind, idem_key, leaf, body FROM events WHERE session_id = ? AND idem_key = ?",
            (self.session_id, key),
        ).fetchone()
        return Row(*got) if got else None

    def next_seqs(self, count: int) -> range:
        first = self._seq
        if first is None:
            # Under the write lock max(seq) + 1 is exactly what SQLite would assign.
            first = int(self._conn.execute("SELECT coalesce(max(seq), 0) + 1 FROM events").fetchone()[0])
        return range(first, first + count)

    def insert(self, rows: Sequence[Row], subtrees: Sequence[tuple[int, int, bytes]], head: HeadRow) -> list[int]:
        cur, sid, blob = self._cur, self.session_id, bytearray
        # Plain tuples, no parameter for an absent key, and blobs as bytearray: sqlite3 binds
        # an int, str or bytearray as it is, and sends a bytes, a None or a tuple subclass
        # through its adapter lookup first (a failed attribute lookup each), which costs
        # more than the copy. The stored bytes are the same.
        # The values column by column through map and zip, which run in C (a comprehension
        # costs a loop of bytecode per row); an absent body (never in the store's own
        # appends) binds as None.
        values: Iterator[tuple[object, ...]]
        if type(rows) is Rows:  # an append's rows, by column (an ABC: isinstance would cost more than the row)
            keys, last, seqs_out = rows.keys, rows.seqs[-1], list(rows.seqs)
            columns: list[Iterable[object]] = [rows.seqs, repeat(sid), rows.positions, rows.kinds]
            if any(keys):  # keys are non-empty strings: only an absent one is falsy
                columns.append(keys)
            values = zip(*columns, map(blob, rows.leaves), map(blob, rows.bodies))
        elif len(rows) == 1:  # one append's row: as it is, without the columns' maps
            r = rows[0]
            keys, last, seqs_out = [r[4]], r[0], [r[0]]
            body = None if r[6] is None else blob(r[6])
            values = iter([(r[0], r[1], r[2], r[3], r[4], blob(r[5]), body) if r[4]
                           else (r[0], r[1], r[2], r[3], blob(r[5]), body)])
        else:
            bodies = list(map(_BODY, rows))
            blobs = map(blob, bodies) if None not in bodies else (None if b is None else blob(b) for b in bodies)
            columns = [map(_SEQ, rows), map(_SESSION, rows), map(_POS, rows), map(_KIND, rows)]
            keys, last, seqs_out = list(map(_KEY, rows)), rows[-1].seq, [r.seq for r in rows]
            if any(keys):
                columns.append(keys)
            values = zip(*columns, map(blob, map(_LEAF, rows)), blobs)
        sql = _INSERT if any(keys) else _INSERT_KEYLESS
        if len(rows) == 1:
            cur.execute(sql, next(values))
        else:
            cur.executemany(sql, values)
        if subtrees:
            cur.executemany(
                "INSERT INTO subtrees (session_id, level, idx, hash) VALUES (?, ?, ?, ?)",
                [(sid, lv, i, blob(h)) for lv, i, h in subtrees],
            )
        size, root, prev, seal, seqs = head
        cur.execute("INSERT INTO heads (session_id, size, root, prev, seal, seqs) VALUES (?, ?, ?, ?, ?, ?)",
                    (sid, size, blob(root), prev, blob(seal), blob(seqs)))
        self._head = self.written = head
        self._seq = self.seq_after = last + 1
        return seqs_out

    def index_rows(self, rels: Sequence[str], lo: int, hi: int) -> list[IndexRow]:
        return self._backend._in_write.index_rows(self.session_id, rels, lo, hi)

    def index_rows_at(self, rel: str, positions: Sequence[int]) -> list[IndexRow]:
        return self._backend._in_write.index_rows_at(self.session_id, rel, positions)

    def latest_binding(self, key: str, before: int) -> IndexRow | None:
        return self._backend._in_write.latest_binding(self.session_id, key, before)

    def body(self, pos: int) -> bytes | None:
        return self._backend._in_write.body(self.session_id, pos)

    def insert_index(self, rows: Sequence[IndexRow]) -> None:
        sid, step = self.session_id, queries.INSERT_ROWS
        for i in range(0, len(rows), step):
            chunk = rows[i : i + step]
            self._conn.execute(queries.SQLITE.insert_index(len(chunk)), [v for r in chunk for v in (sid, *r)])

    def note_erased(self, positions: Sequence[int], by: int) -> None:
        sid = self.session_id
        self._conn.executemany("INSERT INTO redactions (session_id, pos, by) VALUES (?, ?, ?)", [(sid, p, by) for p in positions])

    def erase(self, positions: Sequence[int], by: int, *, kind: str = "redacted") -> None:
        sid = self.session_id
        self._conn.executemany("INSERT INTO redactions (session_id, pos, by) VALUES (?, ?, ?)", [(sid, p, by) for p in positions])
        self._conn.executemany(
            "UPDATE events SET body = NULL, kind = ?, idem_key = NULL WHERE session_id = ? AND pos = ?",
            [(kind, sid, p) for p in positions],
        )
        if kind == "redacted":  # a dropped body's facts stay: what it was is known, only its bytes go
            self._conn.executemany(queries.SQLITE.erase_text, [(sid, p) for p in positions])
        self.erased = True


_: type[Backend] = SQLiteBackend
_w: type[Writer] = _SQLiteWriter
