"""What only the PostgreSQL backend has: its schema, triggers, locks, errors and lazy import."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import pytest

import compactstore as cs

pytest.importorskip("psycopg")

import psycopg  # noqa: E402

from compactstore.backends import SCHEMA_VERSION  # noqa: E402
from compactstore.backends.queries import TABLE as INDEX_TABLE  # noqa: E402
from compactstore.backends.postgres import (  # noqa: E402
    _LOCK_SESSION,
    INLINE_BYTES,
    LOG_TABLES,
    PostgresBackend,
    _fold_sql,
    redact_url,
)


def _turns(n: int, prefix: str = "t") -> list[cs.Event]:
    return [cs.Turn("user", f"{prefix}{i}") for i in range(n)]


@pytest.fixture
def owner(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    """Return a plain psycopg connection to the test's store, as its owner."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


def test_schema_is_created_with_its_version_and_triggers(pg_url: str, owner: psycopg.Connection[Any]) -> None:
    """Opening an empty database creates the log tables and the structural index, records the schema version and arms the triggers."""
    with cs.open(pg_url) as st:
        st.session("s").extend(_turns(2))
    tables = {r[0] for r in owner.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}
    assert tables == {*LOG_TABLES, INDEX_TABLE}
    assert owner.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone() == (SCHEMA_VERSION,)
    triggers = {r[0] for r in owner.execute("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")}
    assert triggers == {f"{t}_no_{op}" for t in (*LOG_TABLES, INDEX_TABLE) for op in ("update", "delete", "truncate")} | {
        "heads_follow"}
    types = dict(
        owner.execute(
            "SELECT table_name || '.' || column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = 'events'"
        ).fetchall()
    )
    assert types == {
        "events.seq": "bigint", "events.session_id": "bigint", "events.pos": "bigint", "events.kind": "text",
        "events.idem_key": "text", "events.leaf": "bytea", "events.body": "bytea",
    }


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE events SET body = '\\x00'",
        "DELETE FROM events",
        "TRUNCATE events",
        "UPDATE heads SET root = '\\x00'",
        "DELETE FROM heads",
        "TRUNCATE heads CASCADE",
        "DELETE FROM subtrees",
        "UPDATE subtrees SET hash = '\\x00'",
        "TRUNCATE subtrees",
        "UPDATE sessions SET name = 'x'",
        "DELETE FROM sessions",
        "TRUNCATE sessions",
        "UPDATE meta SET value = 'x'",
        "DELETE FROM meta",
        "TRUNCATE meta",
        "UPDATE redactions SET by = 0",
        "DELETE FROM redactions",
        "TRUNCATE redactions",
        "UPDATE events SET body = NULL WHERE pos = 2",  # erasing needs a recorded redaction
        "UPDATE events SET kind = 'x' WHERE pos = 1",  # a redacted row stays as it is
    ],
)
def test_log_tables_reject_update_delete_and_truncate(pg_url: str, owner: psycopg.Connection[Any], sql: str) -> None:
    """The database itself refuses to rewrite, remove or truncate log rows."""
    with cs.open(pg_url) as st:
        st.session("s").extend(_turns(40))  # enough for stored subtree roots
        st.session("s").redact([1], "so that redactions has a row")
    assert owner.execute("SELECT count(*) FROM subtrees").fetchone() != (0,)
    with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
        owner.execute(sql)


def test_many_first_openers_create_the_schema_once(pg_url: str) -> None:
    """Openers racing on a fresh database (each on its own connection) all succeed, leaving one schema and one meta."""
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            barrier.wait(timeout=30)
            cs.open(pg_url, key=b"k").close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    with cs.open(pg_url, key=b"k") as st:
        assert st.backend.meta()["schema_version"] == SCHEMA_VERSION
        st.session("s").append(cs.Turn("user", "x"))
        assert st.verify().ok


def test_a_newer_schema_is_refused(pg_url: str, owner: psycopg.Connection[Any]) -> None:
    """A database written by a newer library is refused, not misread."""
    cs.open(pg_url).close()
    owner.execute("ALTER TABLE meta DISABLE TRIGGER meta_no_update")
    owner.execute("UPDATE meta SET value = '999' WHERE name = 'schema_version'")
    with pytest.raises(cs.CompactStoreError, match="of schema '999', which this release neither reads"):
        cs.open(pg_url)


def test_writers_to_different_sessions_do_not_block_each_other(pg_url: str) -> None:
    """While one transaction holds session a's lock, b appends at once and a second writer to a waits."""
    with cs.open(pg_url) as one, cs.open(pg_url) as two:
        one.session("a").append(cs.Turn("user", "a0"))
        done: list[float] = []

        def append_a() -> None:
            two.session("a").append(cs.Turn("user", "a-late"))
            done.append(time.monotonic())

        with one.backend.writer("a"):  # holds a's lock, appends nothing
            t0 = time.monotonic()
            two.session("b").append(cs.Turn("user", "b0"))
            assert time.monotonic() - t0 < 5
            waiter = threading.Thread(target=append_a)
            waiter.start()
            time.sleep(0.5)
            assert done == []  # still waiting for a's lock
            released = time.monotonic()
        waiter.join(timeout=30)
        assert done and done[0] >= released
        assert [r.event.content for r in two.session("a").scan()] == ["a0", "a-late"]  # type: ignore[attr-defined]
        assert two.verify().ok


def _fold(session_id: int) -> int:
    """Fold a session id into a signed 32-bit lock key, as the backend's SQL does."""
    folded = session_id & 0xFFFFFFFF
    return folded - (1 << 32) if folded >= 1 << 31 else folded


def test_the_lock_key_folds_session_ids_into_signed_32_bits(owner: psycopg.Connection[Any]) -> None:
    """The SQL fold maps every bigint session id onto the advisory lock's int4 key, wrapping as two's complement."""
    for sid in (1, 2, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 7, 2**62 + 5):
        got = owner.execute(f"SELECT {_fold_sql('id')} FROM (SELECT %s::bigint AS id) t", (sid,)).fetchone()
        assert got == (_fold(sid),)


def test_a_writer_holds_its_sessions_advisory_lock(pg_url: str, owner: psycopg.Connection[Any]) -> None:
    """An open writer holds exactly the advisory lock (session class, folded id) until it commits."""
    held = "SELECT classid::bigint, objid::bigint, objsubid FROM pg_locks WHERE locktype = 'advisory' AND granted"
    with cs.open(pg_url) as st:
        st.session("s").append(cs.Turn("user", "x"))
        with st.backend.writer("s") as w:
            locks = owner.execute(held).fetchall()
            assert [(c, o & 0xFFFFFFFF) for c, o, sub in locks] == [(_LOCK_SESSION, _fold(w.session_id) & 0xFFFFFFFF)]
            assert locks[0][2] == 2  # the two-key form
        assert owner.execute(held).fetchall() == []


def test_driver_errors_become_compactstore_errors(pg_url: str) -> None:
    """An unreachable server or missing database raises CompactStoreError, with the password redacted."""
    missing = urlunsplit(urlsplit(pg_url)._replace(path="/no_such_database_here"))
    with pytest.raises(cs.CompactStoreError) as info:
        cs.open("postgresql://someone:sekrit@127.0.0.1:1/nothing")
    assert isinstance(info.value.__cause__, psycopg.Error)
    assert "sekrit" not in str(info.value) and "***" in str(info.value)
    with pytest.raises(cs.CompactStoreError, match="no_such_database_here") as info:
        cs.open(missing)
    assert isinstance(info.value.__cause__, psycopg.Error)
    assert redact_url("postgresql://u:p@h:5/d?x=1") == "postgresql://u:***@h:5/d?x=1"
    assert redact_url("postgres://h/d") == "postgres://h/d"


def test_errors_inside_an_append_are_wrapped_and_roll_back(pg_url: str, owner: psycopg.Connection[Any]) -> None:
    """A driver failure mid-append surfaces as a compactstore error and writes nothing."""
    with cs.open(pg_url) as st:
        s = st.session("s")
        s.extend(_turns(3))
        owner.execute("ALTER TABLE heads ADD CONSTRAINT no_big CHECK (size < 5)")
        with pytest.raises(cs.CompactStoreError) as info:
            s.extend(_turns(4, "x"))
        assert not isinstance(info.value, psycopg.Error)
        assert isinstance(info.value.__cause__, psycopg.Error)
        assert s.size == 3 and [r.pos for r in s.scan()] == [0, 1, 2]


def test_a_nul_in_an_idempotency_key_is_refused_before_the_server(pg_url: str) -> None:
    """PostgreSQL text cannot hold NUL: such a key is bad input, and nothing is written."""
    with cs.open(pg_url) as st:
        s = st.session("s")
        with pytest.raises(cs.InvalidEvent) as info:
            s.append(cs.Turn("user", "x"), idempotency_key="a\x00b")
        assert info.value.field == "idempotency_key"
        assert st.sessions() == []
        # Nor in event text, on any backend: it would reach a text column as a negative
        # fact's text the moment the event failed (tests/test_entry_rules.py).
        with pytest.raises(cs.InvalidEvent) as info:
            s.append(cs.Turn("user", "a\x00b"))
        assert info.value.field == "content"


def test_sequence_numbers_are_unique_and_ordered_but_may_have_gaps(pg_url: str) -> None:
    """seq comes from a sequence, drawn by each append: verify does not ask for 1..n, only order within a session."""
    with cs.open(pg_url) as st:
        assert st.backend.gapless_seq is False
        a, b = st.session("a"), st.session("b")
        seqs = [r.seq for r in a.extend(_turns(3))] + [b.append(cs.Turn("user", "b")).seq]
        seqs += [r.seq for r in a.extend(_turns(2, "y"))]
        assert len(set(seqs)) == len(seqs)
        assert [r.seq for r in a.scan()] == sorted(r.seq for r in a.scan())
        assert st.verify().ok


def test_durable_forces_synchronous_commit(pg_url: str) -> None:
    """durable=True sets synchronous_commit=on on the pool's connections."""
    backend = PostgresBackend(pg_url, durable=True)
    try:
        assert backend._all("SHOW synchronous_commit") == [("on",)]
    finally:
        backend.close()


def test_a_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without psycopg, a PostgreSQL URL gives a clear error naming compactstore[postgres]."""
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.delitem(sys.modules, "compactstore.backends.postgres", raising=False)
    with pytest.raises(cs.CompactStoreError, match=r"compactstore\[postgres\]") as info:
        cs.open("postgresql://localhost/x")
    assert info.value.hint == "pip install 'compactstore[postgres]'"


def test_a_sqlite_only_run_never_imports_psycopg(tmp_path: object) -> None:
    """Importing compactstore and using SQLite loads neither psycopg nor psycopg_pool."""
    script = (
        "import sys, compactstore as cs\n"
        "with cs.open(':memory:') as st: st.session('s').append(cs.Turn('user', 'x'))\n"
        "print(sorted(m for m in sys.modules if m.startswith('psycopg')))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_redaction_whose_erasure_fails_writes_nothing(pg_url: str, owner: psycopg.Connection[Any]) -> None:
    """The redaction event and its erasures commit together: when the erasure fails, the event is not stored either."""
    with cs.open(pg_url) as st:
        s = st.session("s")
        s.extend(_turns(3))
        owner.execute("ALTER TABLE redactions ADD CONSTRAINT refuse_all CHECK (pos < 0)")
        with pytest.raises(cs.CompactStoreError) as info:
            s.redact([1], "must not half-happen")
        assert isinstance(info.value.__cause__, psycopg.Error)
        assert s.size == 3
        assert s.read(1).event.content == "t1"  # type: ignore[attr-defined]
        s.append(cs.Turn("user", "after"))  # the connection came back clean
        assert st.verify().ok


@pytest.mark.parametrize("key", ["a,b", "{x}", '"q"', "back\\slash", "NULL", "it's", "E'\\x00'", "ключ ✓", " lead"])
def test_idempotency_keys_with_quotes_braces_and_backslashes_round_trip(
    pg_url: str, owner: psycopg.Connection[Any], key: str
) -> None:
    """Keys written inline in the insert are stored exactly as given and find their event again."""
    with cs.open(pg_url) as st:
        s = st.session("s")
        first = s.extend([cs.Turn("user", "x"), cs.Turn("user", "y")], idempotency_keys=[None, key])[1]
        assert s.append(cs.Turn("user", "y"), idempotency_key=key) == first
        assert owner.execute("SELECT idem_key FROM events WHERE pos = 1").fetchone() == (key,)
        assert owner.execute("SELECT idem_key FROM events WHERE pos = 0").fetchone() == (None,)
        assert s.size == 2


def test_nothing_runs_in_a_writer_after_its_insert_committed(pg_url: str) -> None:
    """An insert without a redaction commits at once, and any later statement in that writer is refused, not run unguarded."""
    from compactstore.backends import HeadRow

    with cs.open(pg_url) as st:
        st.session("s").append(cs.Turn("user", "x"))
        sid = st.backend.session_id("s")
        assert sid is not None
        head = st.backend.head(sid)
        assert head is not None
        with pytest.raises(cs.CompactStoreError, match="nothing may run"):
            with st.backend.writer("s") as w:
                row = st.backend.row(sid, 0)
                assert row is not None
                w.insert([row._replace(pos=1, seq=row.seq + 1)], [], HeadRow(2, head.root, 1, head.seal, head.seqs))
                assert st.backend.head(sid) == HeadRow(2, head.root, 1, head.seal, head.seqs)  # visible: committed
                w.find_idempotent("k")
        assert st.backend.head(sid) == HeadRow(2, head.root, 1, head.seal, head.seqs)  # and not rolled back


def _one_event(st: cs.Store) -> tuple[int, Any, Any]:
    """Append one turn to session "s"; return its id, head and row (for writing past them by hand)."""
    st.session("s").append(cs.Turn("user", "x"))
    sid = st.backend.session_id("s")
    assert sid is not None
    head, row = st.backend.head(sid), st.backend.row(sid, 0)
    assert head is not None and row is not None
    return sid, head, row


@pytest.mark.parametrize("read_first", [False, True])
def test_a_writers_index_rows_reach_the_index_exactly(pg_url: str, owner: psycopg.Connection[Any], read_first: bool) -> None:
    """Index rows travel as arguments of the insert's call, or as literal SQL when a read comes first; either way exactly."""
    from compactstore.backends import HeadRow
    from compactstore.structure import IndexRow

    odd = ["a,b", "{x}", '"q"', "back\\slash", "NULL", "it's", "ключ ✓", ""]
    rows = [IndexRow(5, "binding", k, i, t) for i, (k, t) in enumerate(zip(odd, reversed(odd)))]
    rows.append(IndexRow(5, "open_at", "tool_call/c1", 4, ""))
    with cs.open(pg_url) as st:
        sid, head, row = _one_event(st)
        with st.backend.writer("s") as w:
            w.insert_index(rows)
            if read_first:
                got = w.index_rows(("binding", "open_at"), 5, 6)
                assert sorted(got) == sorted(rows)
            w.insert([row._replace(pos=1, seq=row.seq + 1)], [], HeadRow(2, head.root, 1, head.seal, head.seqs))
    stored = owner.execute(f"SELECT pos, rel, key, num, text FROM {INDEX_TABLE} WHERE pos = 5 ORDER BY rel, num").fetchall()
    assert stored == sorted(rows, key=lambda r: (r[1], r[3]))


def test_a_nul_in_an_index_row_is_refused_before_the_server(pg_url: str) -> None:
    """Text the index cannot store is refused in the writer, and nothing is written."""
    from compactstore.backends import HeadRow
    from compactstore.structure import IndexRow

    with cs.open(pg_url) as st:
        sid, head, row = _one_event(st)
        with pytest.raises(cs.CompactStoreError, match="NUL"):
            with st.backend.writer("s") as w:
                w.insert_index([IndexRow(1, "binding", "a\x00b", 0, "")])
                w.insert([row._replace(pos=1, seq=row.seq + 1)], [], HeadRow(2, head.root, 1, head.seal, head.seqs))
        assert st.session("s").size == 1


def _count_rebuilds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each append the server refused because the head it was built on had moved."""
    from compactstore.log.commit import Writer

    rebuilt: list[str] = []
    commit_with = Writer._commit_with

    def counting(self: Writer, build: Any, speculate: bool) -> Any:
        try:
            return commit_with(self, build, speculate)
        except cs.errors.StaleHead:
            rebuilt.append(self.name)
            raise

    monkeypatch.setattr(Writer, "_commit_with", counting)
    return rebuilt


def test_a_store_appending_alone_is_never_refused_for_a_moved_head(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Appends, batches and a redaction from the one store writing a session: each builds on the head it remembers."""
    rebuilt = _count_rebuilds(monkeypatch)
    with cs.open(pg_url, clock=cs.events.tick_clock()) as st:
        s = st.session("s")
        for i in range(5):
            s.append(cs.Turn("user", f"t{i}"))
        s.extend([cs.Turn("user", "b0"), cs.Turn("user", "b1")])
        s.redact([0], "test")
        s.append(cs.Turn("user", "after"))
        assert s.size == 9 and st.verify().ok
    assert rebuilt == []


def test_an_append_built_on_a_head_another_writer_moved_is_built_again(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store appends on the head it committed last in one round trip; when another store moved it, the append
    is built again under the lock: positions stay gapless, a reference to the other's event holds, verify is clean."""
    rebuilt = _count_rebuilds(monkeypatch)
    with cs.open(pg_url, clock=cs.events.tick_clock()) as a, cs.open(pg_url, clock=cs.events.tick_clock()) as b:
        a.session("s").append(cs.Turn("user", "a0"))
        assert a.session("s").append(cs.Turn("user", "a1")).pos == 1  # on the remembered head
        assert b.session("s").append(cs.Turn("user", "b2")).pos == 2
        assert a.session("s").append(cs.Turn("user", "a3")).pos == 3  # stale: built again
        b.session("s").append(cs.Turn("user", "b4"))
        got = a.session("s").append(cs.Turn("user", "not b4", supersedes=4))  # a position only b knew of
        assert got.pos == 5 and got.event.supersedes == 4
        recs = a.session("s").extend([cs.Turn("user", "a6"), cs.Turn("user", "a7")])
        assert [r.pos for r in recs] == [6, 7]
        assert [r.event.content for r in b.session("s").scan()] == ["a0", "a1", "b2", "a3", "b4", "not b4", "a6", "a7"]
        assert a.verify().ok
    assert rebuilt == ["s", "s", "s"]  # a3, b4 and "not b4" were built on a head the other store had moved


def test_a_batch_beyond_the_inline_size_appends_on_the_remembered_head_or_is_built_again(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch whose bodies pass INLINE_BYTES takes the one-statement append too, and is built again on a moved head."""
    rebuilt = _count_rebuilds(monkeypatch)
    big = [cs.Turn("user", f"{i:04d}" + "x" * 2048) for i in range(2 * INLINE_BYTES // 2048)]
    with cs.open(pg_url, clock=cs.events.tick_clock()) as a, cs.open(pg_url, clock=cs.events.tick_clock()) as b:
        a.session("s").append(cs.Turn("user", "a0"))
        assert [r.pos for r in a.session("s").extend(big)] == list(range(1, 1 + len(big)))
        assert rebuilt == []
        b.session("s").append(cs.Turn("user", "b"))
        recs = a.session("s").extend(big)
        assert rebuilt == ["s"]
        assert [r.pos for r in recs] == list(range(2 + len(big), 2 + 2 * len(big)))
        moved = b.session("s").scan(1 + len(big), 3 + len(big))
        assert [r.event.content for r in moved] == ["b", big[0].content]  # type: ignore[attr-defined]
        assert a.verify().ok


def test_pool_connections_run_at_read_committed_whatever_the_servers_default(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-statement append runs in the implicit transaction, at READ COMMITTED even if the default is stricter."""
    parts = urlsplit(pg_url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = " ".join([v for k, v in query if k == "options"] + ["-cdefault_transaction_isolation=serializable"])
    query = [(k, v) for k, v in query if k != "options"] + [("options", options)]
    strict = urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))
    rebuilt = _count_rebuilds(monkeypatch)
    with cs.open(strict, clock=cs.events.tick_clock()) as a, cs.open(strict, clock=cs.events.tick_clock()) as b:
        assert a.backend._all("SHOW transaction_isolation") == [("read committed",)]  # type: ignore[attr-defined]
        for i in range(3):
            a.session("s").append(cs.Turn("user", f"a{i}"))
            b.session("s").append(cs.Turn("user", f"b{i}"))
        assert [r.pos for r in b.session("s").scan()] == list(range(6))
        assert a.verify().ok
    assert rebuilt == ["s"] * 4  # after each store's first, every append was built on a head the other had moved


def test_one_writer_draws_the_seqs_it_expected_and_others_are_refused(pg_url: str) -> None:
    """A lone handle's appends get exactly the seqs after its last, as on SQLite (1..n, no gap); two handles
    drawing in turn miss their expectations, are refused and retried: gaps, but every seq sealed and in order."""
    with cs.open(pg_url) as st:
        s = st.session("a")
        got = [s.append(cs.Turn("user", f"{i}")).seq for i in range(5)] + [r.seq for r in s.extend(_turns(3))]
        assert got == list(range(1, 9))
        with cs.open(pg_url) as other:
            for i in range(4):
                got.append(s.append(cs.Turn("user", f"again {i}")).seq)
                got.append(other.session("b").append(cs.Turn("user", f"b {i}")).seq)
        assert got == sorted(got) and got[-1] > len(got)  # refused draws leave gaps
        assert st.verify().ok
