"""The backend contract, written once: every verb of the protocol on every backend, and no SQL across it.

The ``backend`` fixture runs each test on a SQLite file and on a PostgreSQL schema (skipped
when no server is available), after writing the same history through the public API.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

import compactstore as cs
from compactstore import events as ev
from compactstore import index, merkle
from compactstore.backends import SCHEMA_VERSION, Backend, HeadRow, Row, Rows, Writer, open_backend
from compactstore.backends.protocol import BODY_BATCH
from compactstore.errors import LockTimeout
from compactstore.seal import seq_runs
from compactstore.structure import IndexRow

#: The history every test reads: a failed call, a binding rebound (so the first is
#: superseded), an obligation, an open call, enough turns for stored subtree roots at
#: level 4, and a keyed event.
SCRIPT: list[cs.Event] = [
    cs.Turn("user", "Make the migration reversible."),  # 0
    cs.ToolCall("c1", "run_sql", {"sql": "dry run"}),  # 1
    cs.ToolResult("c1", "ERROR: lock timeout", ok=False, status="failed"),  # 2: negative
    cs.Binding(key="rollback", value="v1"),  # 3: negative once rebound at 5
    cs.Obligation(name="finish", needs=["rollback"]),  # 4
    cs.Binding(key="rollback", value="v2"),  # 5
    cs.ToolCall("c2", "run_sql", {"sql": "BEGIN"}),  # 6: left open
    *(cs.Turn("assistant", f"step {i}") for i in range(7, 20)),  # 7..19
]
KEYED = 19  # SCRIPT's position appended with idempotency key "k"


class _Rollback(Exception):
    """Raised inside a writer to leave it without committing."""


@pytest.fixture
def backend(store: cs.Store) -> Backend:
    """Return the backend of a store holding SCRIPT in session "s" (with a summary node) and a redaction in "other"."""
    s = store.session("s")
    s.extend(SCRIPT, idempotency_keys=[None] * KEYED + ["k"])
    s.compact(0, 8, on_risk="preserve")  # pos 20: a summary node
    s.append(cs.Turn("user", "after the compaction"))  # 21
    other = store.session("other")
    other.extend([cs.Turn("user", f"o{i}") for i in range(3)])
    other.redact([1], "forget")  # pos 3 erases pos 1
    return store.backend


def _sid(backend: Backend, name: str = "s") -> int:
    sid = backend.session_id(name)
    assert sid is not None
    return sid


def _records(store: cs.Store, name: str = "s") -> list[cs.Record]:
    return list(store.session(name).scan())


def _index(backend: Backend) -> list[IndexRow]:
    """Return the whole index of session "s" as its log gives it."""
    sid = _sid(backend)
    head = backend.head(sid)
    assert head is not None
    return index.derive(backend, sid, head.size)


# --- the log -----------------------------------------------------------------------


def test_meta_holds_the_schema_version_and_is_written_once(backend: Backend) -> None:
    """meta() returns the stored values; init_meta() on a store that has them writes nothing."""
    meta = backend.meta()
    assert meta["schema_version"] == SCHEMA_VERSION
    assert backend.init_meta({"hash": "other"}) == meta == backend.meta()


def test_sessions_are_listed_by_name_with_their_ids(backend: Backend) -> None:
    """sessions() lists (id, name) by name; session_id() finds each, and None for a name never written."""
    assert [name for _, name in backend.sessions()] == ["other", "s"]
    assert {backend.session_id(name) for _, name in backend.sessions()} == {i for i, _ in backend.sessions()}
    assert backend.session_id("missing") is None


def test_row_returns_one_stored_event(store: cs.Store, backend: Backend) -> None:
    """row() returns the event at a position as stored, and None past the end."""
    sid, rec = _sid(backend), _records(store)[KEYED]
    assert backend.row(sid, KEYED) == Row(rec.seq, sid, KEYED, rec.kind, "k", rec.leaf, rec.body)
    assert backend.row(sid, 999) is None


def test_rows_pages_through_a_range_in_position_order(store: cs.Store, backend: Backend) -> None:
    """rows() yields every event of a range, page by page, in position order."""
    sid, recs = _sid(backend), _records(store)
    got = list(backend.rows(sid, 2, None, 3))
    assert [(r.pos, r.seq, r.leaf, r.body) for r in got] == [(r.pos, r.seq, r.leaf, r.body) for r in recs[2:]]
    assert [r.pos for r in backend.rows(sid, 4, 9, 2)] == [4, 5, 6, 7, 8]


def test_bodies_returns_a_span_of_bodies(store: cs.Store, backend: Backend) -> None:
    """bodies() returns the bodies of [start, stop) in order, None where redacted."""
    assert backend.bodies(_sid(backend), 2, 6) == [r.body for r in _records(store)[2:6]]
    assert backend.bodies(_sid(backend, "other"), 0, 3)[1] is None


def test_bodies_hands_each_batch_on_in_order_as_it_reads(store: cs.Store, backend: Backend) -> None:
    """bodies(each=...) returns the same span and calls ``each`` with consecutive batches of at
    most BODY_BATCH bodies that together are that span; what ``each`` raises ends the read."""
    s, sid = store.session("s"), _sid(backend)
    s.extend([cs.Turn("user", f"turn {i}") for i in range(2 * BODY_BATCH)])
    want = [r.body for r in s.scan(1, s.size)]
    batches: list[list[bytes | None]] = []
    assert backend.bodies(sid, 1, s.size, batches.append) == want
    assert [b for batch in batches for b in batch] == want
    assert len(batches) > 2 and all(0 < len(batch) <= BODY_BATCH for batch in batches)
    assert backend.bodies(_sid(backend, "other"), 0, 3, batches.append)[1] is None

    def refuse(batch: list[bytes | None]) -> None:
        raise TypeError("refused")

    with pytest.raises(TypeError, match="refused"):
        backend.bodies(sid, 1, s.size, refuse)
    assert backend.bodies(sid, 1, s.size) == want  # the backend is usable after


def test_rows_at_returns_the_events_at_given_positions(store: cs.Store, backend: Backend) -> None:
    """rows_at() returns Rows at the positions asked for, by position, skipping those not stored."""
    sid = _sid(backend)
    got = backend.rows_at(sid, [1, 5, KEYED, 999])
    assert all(isinstance(r, Row) for r in got)
    assert got == [backend.row(sid, p) for p in (1, 5, KEYED)]


def test_body_returns_one_body(store: cs.Store, backend: Backend) -> None:
    """body() returns the body at a position, None when redacted or missing."""
    assert backend.body(_sid(backend), 3) == _records(store)[3].body
    assert backend.body(_sid(backend, "other"), 1) is None
    assert backend.body(_sid(backend), 999) is None


def test_leaves_returns_a_span_of_leaf_hashes(store: cs.Store, backend: Backend) -> None:
    """leaves() returns the leaf hashes of [start, stop) in order, redacted positions included, none past the end."""
    recs = _records(store)
    assert backend.leaves(_sid(backend), 2, 6) == [r.leaf for r in recs[2:6]]
    assert len(backend.leaves(_sid(backend, "other"), 0, 3)) == 3  # a redacted body keeps its leaf
    assert backend.leaves(_sid(backend), len(recs) - 1, len(recs) + 5) == [recs[-1].leaf]
    assert backend.leaves(_sid(backend), 5, 5) == []


def test_node_bodies_returns_the_summary_nodes(store: cs.Store, backend: Backend) -> None:
    """node_bodies() returns (pos, body) of the events of kind node in a range, and nothing else."""
    sid, recs = _sid(backend), _records(store)
    assert backend.node_bodies(sid, 0, 30) == [(20, recs[20].body)]
    assert isinstance(ev.decode(recs[20].body), ev.Summary)
    assert backend.node_bodies(sid, 0, 20) == []


def test_derived_positions_lists_nodes_spills_markers_and_attempts(store: cs.Store, backend: Backend) -> None:
    """derived_positions() returns, in order, the positions of derived events in a range, and no others."""
    sid = _sid(backend)
    derived = [r.pos for r in _records(store) if r.kind in ("node", "spill", "marker", "attempt")]
    assert derived and backend.derived_positions(sid, 0, 100) == derived
    assert backend.derived_positions(sid, 0, derived[0]) == []
    s = store.session("s")
    marker = s.mark_raw().pos
    assert backend.derived_positions(sid, derived[-1] + 1, marker + 1) == [marker]
    assert backend.derived_positions(_sid(backend, "other"), 0, 100) == []


def test_seq_bounds_counts_every_event(backend: Backend) -> None:
    """seq_bounds() returns the count, least and greatest sequence number of all events."""
    count, lo, hi = backend.seq_bounds()
    assert count == 22 + 4
    if backend.gapless_seq:
        assert (lo, hi) == (1, count)
    else:
        assert lo < hi


def test_redactions_maps_erased_positions_to_their_redaction(store: cs.Store, backend: Backend) -> None:
    """redactions() maps each erased position to its redaction event; the erased row keeps its leaf."""
    sid = _sid(backend, "other")
    assert backend.redactions(sid) == {1: 3}
    assert backend.redactions(_sid(backend)) == {}
    erased = backend.row(sid, 1)
    assert erased is not None and (erased.kind, erased.idem_key, erased.body) == ("redacted", None, None)


def test_integrity_and_orphans_find_nothing_in_a_sound_store(backend: Backend) -> None:
    """integrity(), orphans() and index_orphans() are empty for a store written through the API."""
    assert backend.integrity() == []
    assert backend.orphans() == []
    assert backend.index_orphans() == []


# --- heads and subtree roots --------------------------------------------------------


def test_head_and_heads_return_the_stored_tree_heads(store: cs.Store, backend: Backend) -> None:
    """head() is the latest stored head; heads() pages through them by size."""
    sid, s = _sid(backend), store.session("s")
    head = backend.head(sid)
    assert head is not None and (head.size, head.root) == (s.size, s.head().root)
    heads = backend.heads(sid, 0, 1000)
    assert [h.size for h in heads] == sorted({h.size for h in heads}) and heads[-1] == head
    assert backend.heads(sid, heads[0].size, 1) == heads[1:2]
    assert backend.head(999) is None


def test_hashes_returns_leaves_and_stored_subtree_roots(store: cs.Store, backend: Backend) -> None:
    """hashes() returns the roots at (level, idx), leaves at level 0; a missing one is an IntegrityError."""
    sid, leaves = _sid(backend), [r.leaf for r in _records(store)]
    assert backend.hashes(sid, [(0, 3), (4, 0), (0, 0)]) == [leaves[3], merkle.root_of_leaves(leaves[:16]), leaves[0]]
    with pytest.raises(cs.IntegrityError):
        backend.hashes(sid, [(4, 1)])


def test_subtree_range_returns_one_level_of_stored_roots(store: cs.Store, backend: Backend) -> None:
    """subtree_range() returns (idx, hash) at one level in an index range; level 0 is the leaves."""
    sid, leaves = _sid(backend), [r.leaf for r in _records(store)]
    assert backend.subtree_range(sid, 4, 0, 10) == [(0, merkle.root_of_leaves(leaves[:16]))]
    assert backend.subtree_range(sid, 0, 14, 17) == [(14, leaves[14]), (15, leaves[15]), (16, leaves[16])]
    assert backend.subtree_range(sid, 8, 0, 10) == []


def test_subtree_counts_counts_stored_roots_per_level(backend: Backend) -> None:
    """subtree_counts() returns the number of stored subtree roots per level (the leaves are not among them)."""
    assert backend.subtree_counts(_sid(backend)) == {4: 1}


# --- the structural index -----------------------------------------------------------


def test_index_rows_returns_rows_of_given_kinds_in_a_range(backend: Backend) -> None:
    """index_rows() returns the rows of the kinds asked for at positions [lo, hi), by position."""
    want = [r for r in _index(backend) if r.rel in ("negative", "binding") and 2 <= r.pos < 6]
    got = backend.index_rows(_sid(backend), ("negative", "binding"), 2, 6)
    assert got == sorted(want, key=lambda r: (r.pos, r.num)) and {r.pos for r in got} == {2, 3, 5}


def test_index_rows_at_returns_rows_of_one_kind_at_given_positions(backend: Backend) -> None:
    """index_rows_at() returns the rows of one kind at the positions asked for, by position."""
    got = backend.index_rows_at(_sid(backend), "binding", [3, 4, 5])
    assert got == [r for r in _index(backend) if r.rel == "binding" and r.pos in (3, 4, 5)]
    assert [(r.pos, r.key) for r in got] == [(3, "rollback"), (5, "rollback")]


def test_negatives_caused_returns_earlier_rows_made_negative_in_a_range(backend: Backend) -> None:
    """negatives_caused() returns the negative rows before the range that an event in it made negative."""
    sid = _sid(backend)
    got = backend.negatives_caused(sid, 5, 6)
    assert [(r.pos, r.rel, r.num) for r in got] == [(3, "negative", 5)]
    assert backend.negatives_caused(sid, 2, 3) == []  # pos 2 made itself negative: not before the range


def test_latest_binding_returns_the_last_binding_of_a_key_before_a_position(backend: Backend) -> None:
    """latest_binding() returns the binding row of the key's last binding before the position, or None."""
    sid = _sid(backend)
    latest = backend.latest_binding(sid, "rollback", 30)
    assert latest is not None and latest.pos == 5
    earlier = backend.latest_binding(sid, "rollback", 5)
    assert earlier is not None and earlier.pos == 3
    assert backend.latest_binding(sid, "rollback", 3) is None


def test_index_after_streams_the_whole_index_in_order(backend: Backend) -> None:
    """index_after() pages through every row after a (pos, rel, num) cursor."""
    sid, got = _sid(backend), []
    after: tuple[int, str, int] = (-1, "", -1)
    while page := backend.index_after(sid, after, 2):
        got += page
        after = (page[-1].pos, page[-1].rel, page[-1].num)
    assert got == sorted(_index(backend), key=lambda r: (r.pos, r.rel, r.num)) and len(got) > 4


# --- the writer ---------------------------------------------------------------------


def test_a_writer_reads_its_session_inside_its_transaction(store: cs.Store, backend: Backend) -> None:
    """A writer's head, hashes, idempotency lookup, next seqs and index reads agree with the backend's."""
    sid = _sid(backend)
    with pytest.raises(_Rollback), backend.writer("s") as w:
        assert w.session_id == sid
        assert w.head() == backend.head(sid)
        w.confirm()
        assert w.hashes([(4, 0), (0, 1)]) == backend.hashes(sid, [(4, 0), (0, 1)])
        found = w.find_idempotent("k")
        assert found is not None and found.pos == KEYED and w.find_idempotent("nope") is None
        seqs = w.next_seqs(3)
        assert len(seqs) == 3 and seqs[0] > backend.seq_bounds()[2] and list(seqs) == sorted(set(seqs))
        assert w.index_rows(("negative",), 0, 10) == backend.index_rows(sid, ("negative",), 0, 10)
        assert w.index_rows_at("open", [4, 6]) == backend.index_rows_at(sid, "open", [4, 6])
        assert w.latest_binding("rollback", 30) == backend.latest_binding(sid, "rollback", 30)
        assert w.body(3) == backend.body(sid, 3) == _records(store)[3].body
        raise _Rollback


def test_a_writer_inserts_events_subtree_roots_a_head_and_index_rows(backend: Backend) -> None:
    """insert_index() then insert() store exactly what they are given, in a new session."""
    body = ev.encode(cs.Turn("user", "hello"))
    leaf = merkle.leaf_hash(body)
    rows = [IndexRow(0, "binding", "k", 0, ""), IndexRow(0, "negative", "failed", 0, "it's {x}")]
    with backend.writer("w") as w:
        assert w.head() is None
        (seq,) = w.next_seqs(1)
        head = HeadRow(1, leaf, 0, b"\x01" * 32, seq_runs([seq]))
        w.insert_index(rows)
        seqs = w.insert([Row(seq, w.session_id, 0, "turn", None, leaf, body)], [], head)
    sid = _sid(backend, "w")
    stored = backend.row(sid, 0)
    assert stored is not None and [stored.seq] == seqs and (stored.leaf, stored.body) == (leaf, body)
    assert backend.head(sid) == head
    assert sorted(backend.index_rows(sid, ("binding", "negative"), 0, 1)) == sorted(rows)


@pytest.mark.parametrize("by", ["list", "Rows"])
def test_a_writer_inserts_many_rows_as_a_list_or_by_column(backend: Backend, by: str) -> None:
    """insert() of several rows stores each as given, keys and all, whether the rows come as a list or as Rows."""
    bodies = [ev.encode(cs.Turn("user", f"t{i}", ts=i)) for i in range(3)]
    leaves = [merkle.leaf_hash(b) for b in bodies]
    keys = [None, "k1", None]
    with backend.writer("many") as w:
        seqs = list(w.next_seqs(3))
        head = HeadRow(3, b"\x02" * 32, 0, b"\x01" * 32, seq_runs(seqs))
        listed = [Row(q, w.session_id, i, "turn", k, leaf, body)
                  for i, (q, k, leaf, body) in enumerate(zip(seqs, keys, leaves, bodies))]
        rows = listed if by == "list" else Rows(seqs, w.session_id, range(3), ["turn"] * 3, keys, leaves, bodies)
        assert w.insert(rows, [], head) == seqs
    sid = _sid(backend, "many")
    assert [backend.row(sid, i) for i in range(3)] == listed
    assert backend.head(sid) == head


def test_a_writer_erases_redacted_bodies(store: cs.Store, backend: Backend) -> None:
    """erase() records the redaction and blanks body, kind and key, keeping seq and leaf."""
    sid, rec = _sid(backend), _records(store)[KEYED]
    with backend.writer("s") as w:
        w.erase([KEYED], 21)  # a redaction's own insert is the store's part, not the backend's
    assert backend.redactions(sid) == {KEYED: 21}
    assert backend.row(sid, KEYED) == Row(rec.seq, sid, KEYED, "redacted", None, rec.leaf, None)


# --- errors -------------------------------------------------------------------------


def test_a_lock_held_past_the_timeout_is_a_lock_timeout(
    target: str, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that waits past the lock timeout for another writer's session lock raises LockTimeout, wrapping the driver error."""
    if target.startswith("postgresql"):
        from compactstore.backends import postgres

        monkeypatch.setattr(postgres, "LOCK_TIMEOUT", "100ms")
    else:
        from compactstore.backends import sqlite

        monkeypatch.setattr(sqlite, "BUSY_TIMEOUT_MS", 100)
    impatient = open_backend(target, durable=False)
    try:
        with backend.writer("s"):
            with pytest.raises(LockTimeout) as info, impatient.writer("s"):
                pass
        assert isinstance(info.value, cs.ConflictError) and info.value.__cause__ is not None
        assert not isinstance(info.value.__cause__, cs.CompactStoreError)
        with impatient.writer("s") as w:  # once the lock is free, the same writer gets it
            assert w.head() == backend.head(w.session_id)
    finally:
        impatient.close()


def test_a_reused_idempotency_key_is_a_conflict_not_a_timeout(store: cs.Store, backend: Backend) -> None:
    """An idempotency key reused for another event raises ConflictError, which is not LockTimeout."""
    with pytest.raises(cs.ConflictError) as info:
        store.session("s").append(cs.Turn("user", "something else"), idempotency_key="k")
    assert not isinstance(info.value, LockTimeout)


# --- no SQL across the protocol -----------------------------------------------------

PACKAGE = Path(cs.__file__).parent
#: A string that starts like an SQL statement, or holds an SQL clause keyword between words.
SQL = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|PRAGMA|WITH|BEGIN|COMMIT|ROLLBACK)\s"
    r"|\s(FROM|JOIN|WHERE|VALUES|GROUP BY|ORDER BY)\s"
)
#: Event types: strings passed to them are an agent's data (a demo's SQL tool call), not statements.
EVENT_TYPES = frozenset(n for n, o in vars(ev).items() if isinstance(o, type) and issubclass(o, msgspec.Struct))
#: Functions outside the backends allowed to hold SQL, each with its reason.
ALLOWED = {
    ("demo.py", "tamper"): "plays an attacker who edits the SQLite file itself, past every API",
}


def sql_literals(relpath: str, source: str) -> list[tuple[int, str]]:
    """Return (line, text) of the string literals in ``source`` that look like SQL statements."""
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        call = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in EVENT_TYPES
        allowed = isinstance(node, ast.FunctionDef) and (relpath, node.name) in ALLOWED
        if call or allowed:
            skip.update(id(n) for n in ast.walk(node))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
        and SQL.search(node.value)
    ]


def _modules() -> Iterator[Path]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if "backends" not in path.relative_to(PACKAGE).parts:
            yield path


def test_no_verb_of_the_protocol_takes_sql() -> None:
    """No method of Backend or Writer is a *_run, or takes a parameter named sql, statement or query."""
    found = []
    for proto in (Backend, Writer):
        for name, fn in vars(proto).items():
            if name.startswith("_") or not callable(fn):
                continue
            params = set(inspect.signature(fn).parameters)
            if name.endswith("_run") or params & {"sql", "statement", "query"}:
                found.append(f"{proto.__name__}.{name}{inspect.signature(fn)}")
    assert found == []


def test_no_module_outside_the_backends_holds_sql() -> None:
    """No string literal outside compactstore/backends/ looks like an SQL statement (data in events aside)."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {text[:60]!r}"
        for path in _modules()
        for line, text in sql_literals(str(path.relative_to(PACKAGE)), path.read_text())
    ]
    assert found == [], "\n".join(found)


def test_the_sql_scan_finds_a_statement() -> None:
    """The scan finds statements, f-string parts included, and passes prose and event data."""
    source = (
        'a = "SELECT pos FROM events WHERE session_id = ?"\n'
        'b = f"INSERT INTO {t} (x) VALUES (?)"\n'
        'c = "Return the rows from the log, in order."\n'
        'd = ToolCall("c1", "run_sql", {"sql": "DELETE FROM users"})\n'
    )
    assert sorted({line for line, _ in sql_literals("x.py", source)}) == [1, 2]


def test_latest_markers_lists_marker_positions_latest_first(store: cs.Store, backend: Backend) -> None:
    """latest_markers() returns the positions of markers before a position, latest first, at most ``limit``."""
    sid = _sid(backend)
    s = store.session("s")
    before = [r.pos for r in _records(store) if r.kind == "marker"]
    made = [s.mark_raw().pos, s.mark_raw().pos]
    want = sorted(before + made, reverse=True)
    assert backend.latest_markers(sid, made[-1] + 1, 100) == want
    assert backend.latest_markers(sid, made[-1] + 1, 1) == [made[-1]]
    assert backend.latest_markers(sid, made[-1], 100) == want[1:]
    assert backend.latest_markers(sid, 0, 100) == []
    assert backend.latest_markers(_sid(backend, "other"), 10**6, 100) == []
