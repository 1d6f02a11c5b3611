"""The store's contract: append, read, heads, proofs, idempotency, keys, bad input."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import compactstore as cs
from compactstore import merkle


def _turns(n: int, prefix: str = "t") -> list[cs.Event]:
    return [cs.Turn("user" if i % 2 else "assistant", f"{prefix}{i}") for i in range(n)]


def test_append_assigns_gapless_positions_and_returns_the_stored_record(store: cs.Store) -> None:
    """Appends get positions 0, 1, 2... and the record's leaf is H(0x00 || body)."""
    s = store.session("run-1")
    records = [s.append(e) for e in _turns(5)]
    assert [r.pos for r in records] == [0, 1, 2, 3, 4]
    assert [r.seq for r in records] == sorted(r.seq for r in records)
    for r in records:
        assert r.leaf == merkle.leaf_hash(r.body)
        assert r.session == "run-1" and r.kind == "turn"
        assert s.read(r.pos) == r
    assert s.size == 5
    assert list(s.scan()) == records
    assert list(s.scan(1, 3)) == records[1:3]


def test_the_timestamp_is_inside_the_body_and_comes_from_the_injected_clock(open_store) -> None:  # type: ignore[no-untyped-def]
    """The clock stamps events without ts, and the stamp is part of the hashed bytes."""
    store = open_store(clock=cs.events.tick_clock(start=1_000_000, step=5))
    s = store.session("a")
    r0, r1 = s.extend([cs.Turn("user", "x"), cs.Turn("user", "x", ts=42)])
    assert r0.event.ts == 1_000_000 and b'"ts":1000000' in r0.body
    assert r1.event.ts == 42


def test_same_events_same_clock_give_identical_roots_in_two_stores(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Determinism: identical inputs produce byte-identical bodies, leaves and heads."""
    heads = []
    for name in ("a.db", "b.db"):
        with cs.open(str(tmp_path / name), clock=cs.events.tick_clock()) as st:
            s = st.session("s")
            s.extend(_turns(10))
            s.append(cs.ToolCall("c1", "grep", {"b": [1, 2.5], "a": {"z": None, "y": True}}))
            heads.append(s.head())
    assert heads[0] == heads[1]


def test_extend_is_one_transaction_and_bad_input_writes_nothing(store: cs.Store) -> None:
    """A batch with one bad event fails whole, naming the event and field."""
    s = store.session("s")
    s.append(cs.Turn("user", "first"))
    bad = [cs.Turn("user", "ok"), cs.ToolCall("c1", "run", {"x": float("inf")})]
    with pytest.raises(cs.InvalidEvent) as info:
        s.extend(bad)
    assert info.value.field == "events[1].args.x"
    assert s.size == 1 and store.verify().ok


@pytest.mark.parametrize(
    ("event", "field"),
    [
        (cs.Turn("", "x"), "role"),
        (cs.Turn(5, "x"), "role"),  # type: ignore[arg-type]
        (cs.ToolCall("", "grep"), "call_id"),
        (cs.ToolCall("c", "grep", {1: "x"}), "args"),  # type: ignore[dict-item]
        (cs.ToolResult("c", {"n": float("nan")}), "output.n"),
        (cs.Turn("user", "x", status="maybe"), "status"),  # type: ignore[arg-type]
        (cs.Turn("user", "x", supersedes=-1), "supersedes"),
        (cs.Turn("user", "x", supersedes=7), "supersedes"),
        (cs.Turn("user", "\ud800"), "content"),
    ],
)
def test_invalid_events_name_the_field_and_write_nothing(store: cs.Store, event: cs.Event, field: str) -> None:
    """Every kind of bad input raises InvalidEvent naming the field, and the log is unchanged."""
    s = store.session("s")
    s.append(cs.Turn("user", "first"))
    with pytest.raises(cs.InvalidEvent) as info:
        s.append(event)
    assert info.value.field == field
    assert isinstance(info.value, ValueError)
    assert s.size == 1 and store.sessions() == ["s"]


def test_a_failed_first_append_does_not_create_the_session(store: cs.Store) -> None:
    """A session exists only once an event is in it."""
    with pytest.raises(cs.InvalidEvent):
        store.session("new").append(cs.Turn("user", "x", supersedes=0))
    assert store.sessions() == []


def test_supersedes_names_an_earlier_position(store: cs.Store) -> None:
    """An event may supersede an earlier position of its session, never a later one."""
    s = store.session("s")
    s.extend(_turns(3))
    r = s.append(cs.Turn("user", "corrected", supersedes=1, status="ok"))
    assert r.event.supersedes == 1


def test_idempotent_retry_writes_one_event(store: cs.Store) -> None:
    """A retry with the same key and event returns the first record and writes nothing."""
    s = store.session("s")
    first = s.append(cs.Turn("user", "pay 10"), idempotency_key="req-1")
    again = s.append(cs.Turn("user", "pay 10"), idempotency_key="req-1")
    assert again == first and s.size == 1
    assert first.event.idempotency_key == "req-1"
    # An explicit timestamp equal to the stamped one is the same event too.
    assert s.append(cs.Turn("user", "pay 10", ts=first.event.ts), idempotency_key="req-1") == first
    assert s.size == 1


def test_reused_idempotency_key_with_a_different_event_conflicts(store: cs.Store) -> None:
    """A key reused for a different event raises ConflictError and writes nothing."""
    s = store.session("s")
    s.append(cs.Turn("user", "pay 10"), idempotency_key="req-1")
    with pytest.raises(cs.ConflictError) as info:
        s.append(cs.Turn("user", "pay 99"), idempotency_key="req-1")
    assert info.value.pos == 0
    with pytest.raises(cs.ConflictError):
        s.append(cs.Turn("user", "pay 10", ts=1), idempotency_key="req-1")
    assert s.size == 1
    # Keys are per session.
    assert store.session("other").append(cs.Turn("user", "pay 99"), idempotency_key="req-1").pos == 0


def test_idempotent_batch_mixes_replays_and_new_events(store: cs.Store) -> None:
    """In a batch, keyed events already stored are returned, new ones appended."""
    s = store.session("s")
    a = s.append(cs.Turn("user", "a"), idempotency_key="ka")
    got = s.extend([cs.Turn("user", "a"), cs.Turn("user", "b")], idempotency_keys=["ka", "kb"])
    assert got[0] == a and got[1].pos == 1 and s.size == 2
    with pytest.raises(cs.InvalidArgument):
        s.extend([cs.Turn("user", "c"), cs.Turn("user", "c")], idempotency_keys=["kc", "kc"])


def test_heads_and_span_roots_match_the_pure_functions(store: cs.Store) -> None:
    """Heads at every size and span roots of every span equal the in-memory computation."""
    s = store.session("s")
    for batch in ([1], [3], [1, 1], [7], [2], [20]):
        s.extend(_turns(sum(batch), prefix=f"b{len(batch)}-"))
    bodies = [r.body for r in s.scan()]
    n = len(bodies)
    for size in range(n + 1):
        head = s.head(size)
        assert head.root == merkle.tree_root(bodies[:size]) and head.size == size and head.mac is None
    for a in range(n + 1):
        for b in range(a, n + 1):
            assert s.span_root(a, b) == merkle.span_root(bodies, a, b)


def test_store_proofs_verify_offline(store: cs.Store) -> None:
    """Inclusion and consistency proofs served from stored subtrees verify with no store."""
    s = store.session("s")
    s.extend(_turns(37))
    bodies = [r.body for r in s.scan()]
    for size in (1, 2, 5, 16, 17, 37):
        root = s.head(size).root
        for pos in range(size):
            proof = s.inclusion_proof(pos, size)
            assert proof == merkle.inclusion_proof(bodies[:size], pos)
            assert merkle.verify_inclusion(bodies[pos], pos, size, proof, root)
            assert not merkle.verify_inclusion(bodies[pos] + b" ", pos, size, proof, root)
        for old in range(size + 1):
            proof = s.consistency_proof(old, size)
            assert merkle.verify_consistency(old, size, s.head(old).root, root, proof)
    with pytest.raises(cs.InvalidArgument):
        s.inclusion_proof(37)
    with pytest.raises(cs.InvalidArgument):
        s.consistency_proof(5, 99)


def test_keyed_store_macs_heads_and_refuses_other_keys(target: str) -> None:
    """With a key, heads carry a MAC; a wrong or missing key is refused."""
    with cs.open(target, key=b"secret", clock=cs.events.tick_clock()) as st:
        s = st.session("s")
        s.extend(_turns(4))
        head = s.head()
        assert head.mac is not None and len(head.mac) == 32
        assert st.check_head(head) and st.check_head(s.head(2))
        forged = cs.TreeHead(head.session, head.size, bytes(32), head.mac)
        assert not st.check_head(forged)
        assert st.verify().ok
    with pytest.raises(cs.IntegrityError):
        cs.open(target, key=b"other")
    with cs.open(target) as st:
        with pytest.raises(cs.CompactStoreError):
            st.session("s").append(cs.Turn("user", "x"))
        report = st.verify()
        assert not report.ok and report.problems[0].table == "meta"


def test_keyed_head_recomputed_without_the_key_fails(sqlite_target: str) -> None:
    """An attacker who rewrites a head's seal without the key is caught."""
    from compactstore.seal import seal

    target = sqlite_target
    with cs.open(target, key=b"secret", clock=cs.events.tick_clock()) as st:
        st.session("s").extend(_turns(4))
    conn = sqlite3.connect(target)
    conn.execute("DROP TRIGGER heads_no_update")
    size, root, prev, seqs = conn.execute("SELECT size, root, prev, seqs FROM heads ORDER BY size DESC LIMIT 1").fetchone()
    conn.execute("UPDATE heads SET seal = ? WHERE size = ?", (seal(None, "s", size, root, prev, seqs), size))
    conn.commit()
    conn.close()
    with cs.open(target, key=b"secret") as st:
        report = st.verify()
    assert not report.ok
    assert [(p.table, p.pos) for p in report.problems] == [("heads", 4)]


def test_log_tables_reject_update_and_delete(sqlite_target: str) -> None:
    """The database itself refuses to rewrite or remove log rows."""
    target = sqlite_target
    with cs.open(target) as st:
        st.session("s").extend(_turns(17))  # enough for a stored subtree root (level 4)
    conn = sqlite3.connect(target)
    for sql in (
        "UPDATE events SET body = x'00'",
        "DELETE FROM events",
        "UPDATE heads SET root = x'00'",
        "DELETE FROM subtrees",
        "UPDATE sessions SET name = 'x'",
        "DELETE FROM meta",
    ):
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            conn.execute(sql)
    conn.close()


def test_sessions_are_listed_and_independent(store: cs.Store) -> None:
    """Each session has its own positions and tree."""
    a, b = store.session("a"), store.session("b")
    a.extend(_turns(3))
    b.extend(_turns(3))
    assert store.sessions() == ["a", "b"]
    assert [r.pos for r in b.scan()] == [0, 1, 2]
    for sess in (a, b):
        assert sess.head().root == merkle.tree_root([r.body for r in sess.scan()])
    with pytest.raises(cs.InvalidArgument):
        store.session("")
    with pytest.raises(cs.InvalidArgument):
        store.session("bad\nname")


def test_reopen_continues_the_same_tree(target: str) -> None:
    """A reopened store appends onto the stored frontier and verifies."""
    with cs.open(target, clock=cs.events.tick_clock()) as st:
        st.session("s").extend(_turns(13))
    with cs.open(target, clock=cs.events.tick_clock(start=5)) as st:
        s = st.session("s")
        s.extend(_turns(6))
        bodies = [r.body for r in s.scan()]
        assert s.head().root == merkle.tree_root(bodies)
        assert st.verify().ok


def test_a_second_handle_sees_and_extends_the_first_handles_writes(target: str) -> None:
    """Two open stores on one file interleave appends with consistent trees."""
    with cs.open(target) as one, cs.open(target) as two:
        for i in range(20):
            (one if i % 3 else two).session("s").append(cs.Turn("user", f"m{i}"))
        bodies = [r.body for r in one.session("s").scan()]
        assert len(bodies) == 20
        assert two.session("s").head().root == merkle.tree_root(bodies)
        assert one.verify().ok


def test_verify_with_worker_processes_matches_serial_verify(store: cs.Store) -> None:
    """verify(workers=2) opens the store in worker processes and reports what verify(workers=1) does."""
    s = store.session("s")
    for _ in range(3):
        s.extend(_turns(3000))
    s.redact([5], "x")
    serial, parallel = store.verify(workers=1), store.verify(workers=2)
    assert parallel == serial and serial.ok and serial.events == 9001 and serial.redacted == 1


#: What a process that opens a store, appends, reads and verifies may load besides the
#: standard library: compactstore and its core dependencies (typing_extensions is
#: msgspec's, where installed; _distutils_hack is setuptools' start-up hook).
_CORE = {"compactstore", "msgspec", "blake3", "typing_extensions", "_distutils_hack"}


def test_using_a_store_loads_no_package_beyond_its_core_dependencies(tmp_path: Path) -> None:
    """Nothing else is imported (numpy came in through a schema helper) and no thread is left running."""
    code = (
        "import json, sys, threading\n"
        "import compactstore as cs\n"
        "with cs.open(sys.argv[1]) as store:\n"
        "    s = store.session('a')\n"
        "    s.append(cs.Turn('user', 'x'))\n"
        "    s.extend([cs.Turn('user', 'y'), cs.ToolCall('c1', 'run', {'n': 1})])\n"
        "    assert [s.read(i).pos for i in range(3)] == [0, 1, 2] and store.verify().ok\n"
        "print(json.dumps([sorted({m.split('.')[0] for m in sys.modules}), threading.active_count()]))\n"
    )
    with cs.open(str(tmp_path / "made.db")):
        pass  # a store made here; the child opens it again and makes another
    for db in ("made.db", "new.db"):
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path / db)], capture_output=True, text=True,
                              timeout=120, check=True)
        modules, threads = json.loads(done.stdout)
        third_party = {m for m in modules if m not in sys.stdlib_module_names and not m.startswith("__")}
        assert third_party <= _CORE, third_party - _CORE
        assert threads == 1


_WRITE_AND_DIGEST = """
import hashlib, sys
import compactstore as cs
from compactstore import events as ev, merkle
other = "".join(["oth", "er"])
batch = [cs.Turn("user", "caf\\u00e9 \\"q\\" \\n\\x01", meta={"b": [1, None, True], "a": {"z": -5}}),
         cs.ToolCall("c1", "run", {"x": 1.5, "y": [2**63, -(2**63)], "k": {}}),
         cs.ToolResult("c1", {"rows": ["a", "b"]}, ok=False),
         ev.HandleOpened("h", resource=other), ev.HandleOpened("h", resource="file", detail=""),
         cs.Turn("assistant", "x" * 5000, uses=["k"], supersedes=0)]
with cs.open(sys.argv[1], clock=ev.tick_clock()) as store:
    s = store.session("s")
    s.extend(batch)
    for e in batch:
        s.append(e)
    s.extend(batch[:1])
    bodies = hashlib.sha256(b"".join(s.read(i).body for i in range(s.size))).hexdigest()
    print(ev._NATIVE is not None, merkle.IMPLEMENTATION, bodies, s.head().root.hex(), store.verify().ok)
"""


def test_the_native_and_pure_paths_write_the_same_bytes(tmp_path: Path) -> None:
    """The same events through the native encoder and hashes and through the pure reference give the same bodies and root."""
    runs = []
    for pure in ("0", "1"):
        done = subprocess.run([sys.executable, "-c", _WRITE_AND_DIGEST, str(tmp_path / f"{pure}.db")],
                              capture_output=True, text=True, timeout=120, check=True,
                              env={**os.environ, "COMPACTSTORE_PURE": pure})
        runs.append(done.stdout.split())
    native, pure_run = runs
    if native[:2] != ["True", "native"]:
        pytest.skip("compactstore.native is not built: both runs took the pure path")
    assert pure_run[:2] == ["False", "pure"]
    assert native[2:] == pure_run[2:] and native[4] == "True"


#: Makes ``compactstore.native`` impossible to import, as where the extension was never built.
_NO_EXTENSION = """
import sys
class _NoExtension:
    def find_spec(self, name, path=None, target=None):
        if name == "compactstore.native":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoExtension())
"""


def test_without_the_extension_the_package_works_on_the_pure_path_with_the_same_bytes(tmp_path: Path) -> None:
    """Where the extension cannot be imported, a store is written, read and verified on the pure path, to the same bytes."""
    runs = []
    for name, code in (("native", _WRITE_AND_DIGEST), ("absent", _NO_EXTENSION + _WRITE_AND_DIGEST)):
        env = {k: v for k, v in os.environ.items() if k != "COMPACTSTORE_PURE"}
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path / f"{name}.db")],
                              capture_output=True, text=True, timeout=120, check=True, env=env)
        runs.append(done.stdout.split())
    with_extension, absent = runs
    assert absent[:2] == ["False", "pure"]
    assert absent[2:] == with_extension[2:] and absent[4] == "True"
    done = subprocess.run([sys.executable, "-c", _NO_EXTENSION + "import compactstore._native"],
                          capture_output=True, text=True, timeout=120)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and last.startswith(("ImportError", "ModuleNotFoundError")), last  # its other name too
