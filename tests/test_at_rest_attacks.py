"""The at-rest attack table: nine edits of a store's rows, each refused by every read path that would serve them.

Each attack edits the rows of three victim sessions (a plain session, a LangGraph thread,
an OpenAI Agents session) as anyone holding the database can, triggers dropped: it
changes bodies and recomputes their leaves where it forges, but rebuilds no subtree root
and reseals no head (a keyless attacker who rebuilds the whole tree of an unkeyed store
is the limit RELIABILITY.md names). The reads are the store's ``read`` and ``scan``, the
saver's ``get_tuple`` and ``list``, and the session's ``get_items``: each must raise an
``IntegrityError`` instead of serving what the attacker wrote, through a handle that
read the intact store before (its proven prefix cached) and through one opened after.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

pytest.importorskip("langgraph.checkpoint.base", reason="the test extra (langgraph) is not installed")
pytest.importorskip("agents", reason="the test extra (openai-agents) is not installed")

from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402

import compactstore as cs  # noqa: E402
from compactstore import merkle  # noqa: E402
from compactstore.adapters.langgraph import LIST_PAGE, CompactStoreSaver  # noqa: E402
from compactstore.adapters.openai_agents import CompactStoreSession  # noqa: E402
from sqlite_edit import edited as _db  # noqa: E402

KEY = b"at-rest attack key"
TABLES = ("meta", "sessions", "events", "subtrees", "heads", "redactions", "structure_index")
#: victim session -> the session of the same shape its rows are replayed from
PAIRS = {"agent-a": "agent-b", "langgraph:t1": "langgraph:t2", "openai-agents:s1": "openai-agents:s2"}
Snapshot = dict[str, list[tuple[Any, ...]]]




def _sid(run: Callable[..., list[tuple[Any, ...]]], name: str) -> int:
    return int(run("SELECT id FROM sessions WHERE name = ?", name)[0][0])


def _last(run: Callable[..., list[tuple[Any, ...]]], sid: int) -> int:
    return int(run("SELECT max(pos) FROM events WHERE session_id = ?", sid)[0][0])


def _row(run: Callable[..., list[tuple[Any, ...]]], sid: int, pos: int) -> tuple[Any, ...]:
    return run("SELECT kind, leaf, body FROM events WHERE session_id = ? AND pos = ?", sid, pos)[0]


def _put_row(run: Callable[..., list[tuple[Any, ...]]], sid: int, pos: int, row: tuple[Any, ...]) -> None:
    run("UPDATE events SET kind = ?, leaf = ?, body = ? WHERE session_id = ? AND pos = ?", *row, sid, pos)


def _each_victim(edit: Callable[[Callable[..., list[tuple[Any, ...]]], int, int, str], None]) -> Callable[[str, Snapshot], None]:
    """Return an attack applying ``edit(run, victim id, its last position, victim name)`` to every victim."""

    def attack(target: str, snap: Snapshot) -> None:
        with _db(target) as run:
            for name in PAIRS:
                sid = _sid(run, name)
                edit(run, sid, _last(run, sid), name)

    return attack


def _tamper(run: Callable[..., list[tuple[Any, ...]]], sid: int, pos: int, name: str) -> None:
    kind, leaf, body = _row(run, sid, pos)
    _put_row(run, sid, pos, (kind, leaf, bytes(body).replace(b'"', b"'", 1)))  # leaf kept


def _forge(run: Callable[..., list[tuple[Any, ...]]], sid: int, pos: int, name: str) -> None:
    kind, _, body = _row(run, sid, pos)
    event = cs.events.decode(bytes(body))
    _, forged = cs.events.canonical(msgspec.structs.replace(event, ts=(event.ts or 0) + 1))
    _put_row(run, sid, pos, (kind, merkle.leaf_hash(forged), forged))  # a well-formed event, its leaf recomputed


def _truncate(run: Callable[..., list[tuple[Any, ...]]], sid: int, pos: int, name: str) -> None:
    for table in ("events", "structure_index"):
        run(f"DELETE FROM {table} WHERE session_id = ? AND pos >= ?", sid, pos - 1)  # the heads stay


def _delete(run: Callable[..., list[tuple[Any, ...]]], sid: int, pos: int, name: str) -> None:
    run("DELETE FROM events WHERE session_id = ? AND pos = ?", sid, pos)


def _reorder(run: Callable[..., list[tuple[Any, ...]]], sid: int, pos: int, name: str) -> None:
    a, b = _row(run, sid, pos - 1), _row(run, sid, pos)
    _put_row(run, sid, pos - 1, b)
    _put_row(run, sid, pos, a)


def _cross_session(run: Callable[..., list[tuple[Any, ...]]], sid: int, pos: int, name: str) -> None:
    _put_row(run, sid, pos, _row(run, _sid(run, PAIRS[name]), pos))  # the other session's event, leaf and all


def _rollback_replay(run: Callable[..., list[tuple[Any, ...]]], sid: int, pos: int, name: str) -> None:
    run("DELETE FROM heads WHERE session_id = ? AND size > ?", sid, pos - 1)  # an older sealed head is the latest


def _metadata(target: str, snap: Snapshot) -> None:
    """Swap each victim's name with its twin's in the sessions table: every row and seal stays genuine."""
    with _db(target) as run:
        for a, b in PAIRS.items():
            sa, sb = _sid(run, a), _sid(run, b)
            run("UPDATE sessions SET name = ? WHERE id = ?", "swap", sa)
            run("UPDATE sessions SET name = ? WHERE id = ?", a, sb)
            run("UPDATE sessions SET name = ? WHERE id = ?", b, sa)


def _snapshot(target: str) -> Snapshot:
    with _db(target) as run:
        return {t: run(f"SELECT * FROM {t}") for t in TABLES}


def _snapshot_rollback(target: str, snap: Snapshot) -> None:
    with _db(target) as run:
        override = " OVERRIDING SYSTEM VALUE" if target.startswith("postgresql") else ""
        for table, rows in snap.items():
            run(f"DELETE FROM {table}")
            for row in rows:
                run(f"INSERT INTO {table}{override} VALUES ({', '.join(['?'] * len(row))})", *row)


ATTACKS: dict[str, Callable[[str, Snapshot], None]] = {
    "tamper": _each_victim(_tamper), "truncate": _each_victim(_truncate), "delete": _each_victim(_delete),
    "reorder": _each_victim(_reorder), "forge": _each_victim(_forge), "cross-session-replay": _each_victim(_cross_session),
    "rollback-replay": _each_victim(_rollback_replay), "metadata-tamper": _metadata,
    "snapshot-rollback": _snapshot_rollback,
}  # fmt: skip


def _put(saver: CompactStoreSaver, thread: str, step: int) -> None:
    cp = empty_checkpoint()
    cp["channel_values"], cp["channel_versions"] = {"messages": f"{thread} state {step}"}, {"messages": step + 1}
    latest = saver.get_tuple({"configurable": {"thread_id": thread}})
    config: dict[str, Any] = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    if latest is not None:
        config["configurable"]["checkpoint_id"] = latest.config["configurable"]["checkpoint_id"]
    saver.put(config, cp, {"source": "loop", "step": step}, {"messages": step + 1})  # type: ignore[arg-type]


def _write(st: cs.Store, steps: range) -> None:
    saver = CompactStoreSaver(st)
    for i in steps:
        for name in ("agent-a", "agent-b"):
            st.session(name).append(cs.Turn("user", f"{name} says {i}"))
        for thread in ("t1", "t2"):
            _put(saver, thread, i)
        for sid in ("s1", "s2"):
            asyncio.run(CompactStoreSession(sid, st).add_items([{"role": "user", "content": f"{sid} item {i}"}]))


READS: dict[str, Callable[[cs.Store], object]] = {
    "read": lambda st: st.session("agent-a").read(4),  # the last event written
    "scan": lambda st: list(st.session("agent-a").scan()),
    "get_tuple": lambda st: CompactStoreSaver(st).get_tuple({"configurable": {"thread_id": "t1"}}),
    "list": lambda st: list(CompactStoreSaver(st).list({"configurable": {"thread_id": "t1"}})),
    "get_items": lambda st: asyncio.run(CompactStoreSession("s1", st).get_items()),
}  # fmt: skip


@pytest.mark.parametrize("witness", [False, True], ids=["no-witness", "witness"])
@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_every_read_path_refuses_each_at_rest_attack(target: str, tmp_path: Path, attack: str, keyed: bool, witness: bool) -> None:
    """Each attack is an IntegrityError on every read path, through a warm handle and a fresh one; without a witness a snapshot rollback reads on a fresh handle (the limit a witness lifts)."""
    key, held = (KEY if keyed else None), (str(tmp_path / "witness.json") if witness else None)
    with cs.open(target, key=key, clock=cs.events.tick_clock(), witness=held) as st:
        _write(st, range(3))
        snap = _snapshot(target)
        _write(st, range(3, 5))
    with cs.open(target, key=key, witness=held) as st:
        # Readers built over the open handle and used once on the intact store: their caches are warm.
        saver, items = CompactStoreSaver(st), CompactStoreSession("s1", st)
        warm: dict[str, Callable[[], object]] = {
            "read": lambda: READS["read"](st), "scan": lambda: READS["scan"](st),
            "get_tuple": lambda: saver.get_tuple({"configurable": {"thread_id": "t1"}}),
            "list": lambda: list(saver.list({"configurable": {"thread_id": "t1"}})),
            "get_items": lambda: asyncio.run(items.get_items()),
        }  # fmt: skip
        for read in warm.values():
            read()
        ATTACKS[attack](target, snap)
        for name, read in warm.items():
            with pytest.raises(cs.IntegrityError):
                read()
            assert name  # every path raised
    if witness:
        try:
            fresh = cs.open(target, key=key, witness=held)
        except cs.IntegrityError:
            return  # refused on open: nothing is read
    else:
        fresh = cs.open(target, key=key)
    with fresh as st:
        for name, read_fresh in READS.items():
            if attack == "snapshot-rollback" and not witness:
                # An older copy restored whole is a store that verifies: only a witness knows.
                assert st.session("agent-a").size == 3
                st.session("agent-a").read(2) if name == "read" else read_fresh(st)
                continue
            with pytest.raises(cs.IntegrityError):
                read_fresh(st)


@pytest.mark.parametrize("attack", ["tamper", "forge", "reorder", "cross-session-replay", "truncate"])
def test_verify_false_serves_what_the_default_refuses(sqlite_target: str, attack: str) -> None:
    """The opt-out's price: with verify=False a forged, replayed or reordered row is served as it is (a tampered body still is not)."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        _write(st, range(3))
    ATTACKS[attack](sqlite_target, {})
    with cs.open(sqlite_target) as st:
        s = st.session("agent-a")
        with pytest.raises(cs.IntegrityError):
            list(s.scan())
        if attack == "tamper":
            with pytest.raises(cs.IntegrityError):
                list(s.scan(verify=False))
        else:
            list(s.scan(verify=False))
            CompactStoreSaver(st, verify=False).get_tuple({"configurable": {"thread_id": "t1"}})


def test_a_verified_scan_of_a_long_session_proves_each_chunk_and_then_compares(sqlite_target: str) -> None:
    """A scan longer than a chunk is proven chunk by chunk; a leaf rewritten past the proven prefix is named by position."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        st.session("long").extend([cs.Turn("user", f"turn {i}") for i in range(5000)])
    with _db(sqlite_target) as run:
        _forge(run, _sid(run, "long"), 4321, "long")
    with cs.open(sqlite_target) as st:
        s = st.session("long")
        assert len(list(s.scan(0, 4000))) == 4000  # the rows before it are proven and cached
        with pytest.raises(cs.IntegrityError) as caught:
            list(s.scan())
        # A forged leaf also breaks its sibling's proof from stored roots: the first of the pair is named.
        assert caught.value.pos in (4320, 4321) and caught.value.session == "long"
        with pytest.raises(cs.IntegrityError, match="pos 4321"):
            s.read(4321)


def _count_head_reads(st: cs.Store, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the latest-head reads ``st`` makes from now on (each still reads the database)."""
    calls: list[int] = []
    head = st.backend.head

    def counted(sid: int) -> Any:
        calls.append(sid)
        return head(sid)

    monkeypatch.setattr(st.backend, "head", counted)
    return calls


def test_one_adapter_call_reads_and_checks_the_head_once(sqlite_target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A verified get_tuple, get_items and list each read the session's latest head once, however many reads the call makes (list: once per page)."""
    with cs.open(sqlite_target, key=KEY, clock=cs.events.tick_clock()) as st:
        _write(st, range(5))
    with cs.open(sqlite_target, key=KEY) as st:
        saver, items = CompactStoreSaver(st), CompactStoreSession("s1", st)
        config: Any = {"configurable": {"thread_id": "t1"}}
        calls = [lambda: saver.get_tuple(config), lambda: list(saver.list(config, limit=1)),
                 lambda: asyncio.run(items.get_items())]  # fmt: skip
        for call in calls:
            call()  # warm: the threads are indexed, the prefix proven
        heads = _count_head_reads(st, monkeypatch)
        for call, once in zip(calls, (1, 1, 1)):
            before = len(heads)
            assert call()
            assert len(heads) - before == once


def test_list_checks_the_head_once_per_page_and_a_head_moved_between_pages_is_caught(sqlite_target: str,
                                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A verified list reads a thread's head once per page of tuples; a rollback of the head made while a page is consumed is refused by the next page."""
    n = LIST_PAGE + 8
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        saver = CompactStoreSaver(st)
        for i in range(n):
            _put(saver, "t1", i)
    with cs.open(sqlite_target) as st:
        saver = CompactStoreSaver(st)
        config: Any = {"configurable": {"thread_id": "t1"}}
        assert len(list(saver.list(config))) == n  # warm
        heads = _count_head_reads(st, monkeypatch)
        assert len(list(saver.list(config))) == n
        assert len(heads) == 2  # two pages, the first also finding the candidates
        listed = saver.list(config)
        assert len([next(listed) for _ in range(LIST_PAGE)]) == LIST_PAGE
        with _db(sqlite_target) as run:
            sid = _sid(run, "langgraph:t1")
            _rollback_replay(run, sid, _last(run, sid), "langgraph:t1")
        with pytest.raises(cs.IntegrityError):
            next(listed)


def test_a_head_changed_within_one_call_is_caught_by_the_next(sqlite_target: str) -> None:
    """Inside reading() the head checked first serves every read; a rollback of the head made meanwhile is refused by the next read after it."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        _write(st, range(5))
    with cs.open(sqlite_target) as st:
        s = st.session("agent-a")
        with s.reading():
            assert s.read(4).pos == 4
            with _db(sqlite_target) as run:
                _rollback_replay(run, _sid(run, "agent-a"), 4, "agent-a")
            assert len(list(s.scan())) == 5  # the call's head, checked before the edit
        with pytest.raises(cs.IntegrityError):
            s.read(4)
        with pytest.raises(cs.IntegrityError), s.reading():
            list(s.scan())


@pytest.mark.parametrize("edit", ["root", "seal"])
def test_a_head_row_edited_in_place_after_it_was_checked_is_refused(sqlite_target: str, edit: str) -> None:
    """A handle skips the seal check only for the very head row it checked: the same size with another root or seal is checked again and refused."""
    with cs.open(sqlite_target, key=KEY, clock=cs.events.tick_clock()) as st:
        _write(st, range(3))
    with cs.open(sqlite_target, key=KEY) as st:
        s = st.session("agent-a")
        assert len(list(s.scan())) == 3  # the head row checked, the prefix proven
        with _db(sqlite_target) as run:
            sid = _sid(run, "agent-a")
            root, seal = run("SELECT root, seal FROM heads WHERE session_id = ? AND size = 3", sid)[0]
            new = (bytes(32), seal) if edit == "root" else (root, bytes(len(seal)))
            run("UPDATE heads SET root = ?, seal = ? WHERE session_id = ? AND size = 3", *new, sid)
        with pytest.raises(cs.IntegrityError):
            s.read(0)
        with pytest.raises(cs.IntegrityError):
            list(s.scan())


def test_a_session_renamed_within_one_call_is_caught_by_the_next(sqlite_target: str) -> None:
    """Inside reading() the session id read with the head serves every read; names swapped meanwhile are refused by the next call."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        _write(st, range(3))
    with cs.open(sqlite_target) as st:
        s = st.session("agent-a")
        with s.reading():
            first = s.read(1).event
            _metadata(sqlite_target, {})
            assert s.read(1).event == first  # the rows of the id the context read
            assert len(list(s.scan())) == 3
        with pytest.raises(cs.IntegrityError):
            s.read(1)


def test_a_poll_at_the_head_reads_no_rows_and_a_context_reads_the_head_again(sqlite_target: str) -> None:
    """A verified scan from the sealed head's size serves nothing past it; inside reading() it reads the head again, so what another handle appended meanwhile is seen."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        _write(st, range(3))
    with _db(sqlite_target) as run:  # a row past the sealed head, no head sealed over it
        sid = _sid(run, "agent-a")
        seq = run("SELECT max(seq) FROM events")[0][0] + 1
        body = cs.events.canonical(cs.Turn("user", "unsealed", ts=1))[1]
        run("INSERT INTO events (seq, session_id, pos, kind, idem_key, leaf, body) VALUES (?, ?, 3, 'turn', NULL, ?, ?)",
            seq, sid, merkle.leaf_hash(body), body)
    with cs.open(sqlite_target) as st, cs.open(sqlite_target) as other:
        s = st.session("agent-a")
        assert list(s.scan(3)) == []
        assert list(s.scan(3, verify=False))[0].event == cs.Turn("user", "unsealed", ts=1)
        with pytest.raises(cs.IntegrityError):
            s.read(3)
        b = st.session("agent-b")
        with b.reading():
            assert len(list(b.scan())) == 3
            assert list(b.scan(3)) == []
            other.session("agent-b").append(cs.Turn("user", "later"))
            assert [r.event.content for r in b.scan(3) if isinstance(r.event, cs.Turn)] == ["later"]


def test_reading_contexts_nest_and_keep_to_their_session(sqlite_target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A nested reading() shares the outer head check; another session's reads inside are checked on their own."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        _write(st, range(3))
        a, b = st.session("agent-a"), st.session("agent-b")
        heads = _count_head_reads(st, monkeypatch)
        with a.reading():
            a.read(0)
            with a.reading():
                list(a.scan())
            b.read(0)
            b.read(1)
            a.read(2)
        assert len(heads) == 3  # agent-a once, agent-b per read
        a.read(0)
        assert len(heads) == 4  # closed: each read reads the head again


@pytest.mark.parametrize("warm", [False, True], ids=["fresh-handle", "proven-prefix"])
def test_prefetch_holds_its_rows_to_the_sealed_head(sqlite_target: str, warm: bool) -> None:
    """An event reader's prefetch refuses a forged row whose body matches its rewritten leaf, before or within the proven prefix."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        _write(st, range(5))
    with cs.open(sqlite_target) as st:
        s = st.session("agent-a")
        if warm:
            assert len(list(s.scan())) == 5
        with _db(sqlite_target) as run:
            _forge(run, _sid(run, "agent-a"), 3, "agent-a")
        with pytest.raises(cs.IntegrityError) as caught:
            s.view.reader(5).prefetch([0, 3])
        assert caught.value.session == "agent-a"
        with pytest.raises(cs.IntegrityError, match="pos 3") as caught:
            s.view.reader(5).prefetch([3])
        assert caught.value.pos == 3
