"""verify() derives the structural index and checks content digests from its one pass over the rows.

Whether chunks are checked in worker processes or in the calling one, the report must be
what reading the log again for each check gives: the index derived by
:func:`compactstore.index.derive`, the content digests read span by span.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_structure_index import _play, sessions

import compactstore as cs
from sqlite_edit import tamper
from compactstore import events as ev
from compactstore import index, structure, verify
from compactstore.backends.queries import TABLE

_names = itertools.count()
#: Events per block of the structured log; 40 blocks fill two chunks of verify's and part of a third.
_BLOCK = 250


def _block(s: cs.Session, k: int) -> None:
    """Append one block: turns, tool calls and results, bindings, obligations, handles, supersedes."""
    base = s.size
    events: list[ev.Event] = [cs.Turn("user" if i % 2 else "assistant", f"turn {k}-{i}") for i in range(_BLOCK)]
    events[3] = cs.ToolCall(f"c{k}", "run", {"k": k})
    events[40] = cs.ToolResult(f"c{k}", "timeout", ok=k % 3 != 0)
    events[50] = ev.Binding(key=f"key{k % 4}", value=k, regenerable=k % 2 == 0)  # re-bound: supersedes the last
    events[60] = ev.Obligation(name=f"o{k}", needs=[f"key{k % 4}"])
    events[70] = cs.events.HandleOpened(handle=f"h{k}", resource="file")
    events[80] = cs.Turn("user", "fine", status="ok")  # a status in its bytes, yet no index row
    events[120] = cs.Turn("user", "no", status="rejected")
    events[130] = cs.Turn("assistant", "again", supersedes=base + 10)
    if k % 2:
        events[200] = cs.events.HandleClosed(handle=f"h{k - 1}")
        events[210] = ev.Fulfilment(name=f"o{k - 1}")
    s.extend(events)


@pytest.fixture(scope="module")
def structured_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log of many structural events over three chunks of verify's, with summary nodes, and a short session."""
    path = tmp_path_factory.mktemp("structured") / "clean.db"
    with cs.open(str(path), clock=cs.events.tick_clock()) as st_:
        s = st_.session("agents")
        for k in range(36):
            _block(s, k)
            if k in (10, 20, 30):
                s.compact(s.size - 150, s.size - 100, on_risk="preserve", summary="gist")
        st_.session("short").extend([cs.ToolCall(f"x{i}", "run") for i in range(30)])
    return path


_AGENTS = "(SELECT id FROM sessions WHERE name = 'agents')"
#: (what, SQL) against structured_store: one change each.


def _first(table: str, where: str, after: int) -> str:
    """SQL for the first position past ``after`` in the agents session whose row of ``table`` matches ``where``."""
    return f"(SELECT min(pos) FROM {table} WHERE session_id = {_AGENTS} AND pos > {after} AND {where})"


_NEGATIVE = _first(TABLE, "rel = 'negative'", 5000)
_OPEN = _first(TABLE, "rel = 'open'", 8500)
_CALL = _first("events", "kind = 'tool_call'", 4500)
_TURN = _first("events", "kind = 'turn'", 4500)
_NODE = _first("events", "kind = 'node'", 4096)

TAMPERS = [
    ("nothing", ""),
    ("index row changed in the second chunk",
     f"UPDATE {TABLE} SET text = 'x' WHERE rel = 'negative' AND pos = {_NEGATIVE}"),
    ("index row deleted in the third chunk",
     f"DELETE FROM {TABLE} WHERE rel = 'open' AND pos = {_OPEN}"),
    ("snapshot row deleted", f"DELETE FROM {TABLE} WHERE rel = 'open_at' AND pos = 5120"),
    ("size row added past the log", f"INSERT INTO {TABLE} SELECT session_id, 99999, 'size', '', 0, '' "
                                    f"FROM {TABLE} WHERE session_id = {_AGENTS} LIMIT 1"),
    ("structural body unreadable", "UPDATE events SET body = CAST('{' AS BLOB) WHERE session_id = "
                                   f"{_AGENTS} AND pos = {_CALL}"),
    ("plain body unreadable", "UPDATE events SET body = CAST('{' AS BLOB) WHERE session_id = "
                              f"{_AGENTS} AND pos = {_TURN}"),
    ("body changed in a summarised span", "UPDATE events SET body = CAST(replace(CAST(body AS TEXT), 'turn 20-', "
                                          "'turn 29-') AS BLOB) WHERE session_id = "
                                          f"{_AGENTS} AND pos = {_NODE} - 110"),
    ("row deleted", f"DELETE FROM events WHERE pos = 5000 AND session_id = {_AGENTS}"),
    ("row moved below 0", f"UPDATE events SET pos = -5 WHERE pos = 20 AND session_id = {_AGENTS}"),
    ("a whole chunk deleted", f"DELETE FROM events WHERE pos >= 4096 AND pos < 8192 AND session_id = {_AGENTS}"),
]


@pytest.mark.parametrize("sql", [sql for _, sql in TAMPERS], ids=[what for what, _ in TAMPERS])
def test_verify_reports_the_index_and_content_digests_as_a_second_read_of_the_log_does(
    structured_store: Path, tmp_path: Path, sql: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Serial and parallel verify agree, read in pages of any size, and their index problems are those of deriving it from the log."""
    path = tmp_path / "s.db"
    shutil.copyfile(structured_store, path)
    if sql:
        tamper(path, sql)
    with cs.open(str(path)) as st_:
        serial, parallel = st_.verify(workers=1), st_.verify(workers=2)
        reference: list[tuple[str | None, int | None, str]] = []
        index.verify_index(st_.backend, st_.backend.sessions(), lambda *p: reference.append(p))
        # Pages of a few rows each: chunks are checked page by page, and the report is the same.
        monkeypatch.setattr(verify, "PAGE_BYTES", 2000)
        paged, paged_parallel = st_.verify(workers=1), st_.verify(workers=2)
    assert parallel == serial == paged == paged_parallel
    assert serial.ok == (not sql)
    assert [(p.session, p.pos, p.what) for p in serial.problems if p.table == TABLE] == reference


def test_a_content_digest_that_does_not_match_is_reported_by_parallel_verify_too(
    structured_store: Path, tmp_path: Path
) -> None:
    """A node whose digest does not match its bodies (written past the append check) is found by the workers."""
    path = tmp_path / "d.db"
    shutil.copyfile(structured_store, path)
    with cs.open(str(path)) as st_:
        node = next(n for n in st_.session("agents").nodes() if n.start > 4096)
    tamper(path, f"UPDATE events SET body = CAST(replace(CAST(body AS TEXT), '\"content_digest\":\"', "
                  f"'\"content_digest\":\"00') AS BLOB) WHERE pos = {node.pos} AND session_id = {_AGENTS}")
    with cs.open(str(path)) as st_:
        serial, parallel = st_.verify(workers=1), st_.verify(workers=2)
    assert parallel == serial and not serial.ok
    assert any(p.pos == node.pos and "content digest of" in p.what for p in serial.problems), serial.problems


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=sessions(), data=st.data())
def test_deriving_from_batches_of_rows_equals_deriving_from_the_log(
    store: cs.Store, monkeypatch: pytest.MonkeyPatch, steps: list[tuple[str, object]], data: st.DataObject
) -> None:
    """Rederivation, fed the rows in batches with only their structural events, gives what derive() gives."""
    monkeypatch.setattr(structure, "SNAPSHOT_EVERY", data.draw(st.sampled_from([2, 3, 4, 512])))
    s = store.session(f"r{next(_names)}")
    _play(s, steps)
    sid = s.view.sid()
    if sid is None or not s.size:
        return
    stop = data.draw(st.integers(1, s.size))
    derived = index.Rederivation(store.backend, sid, stop)
    rows = list(store.backend.rows(sid, 0, None, 1000))
    at = 0
    while at < len(rows):
        batch = rows[at : at + data.draw(st.integers(1, 7))]
        at += len(batch)
        positions = [r.pos for r in batch]
        events = [(r.pos, index.event_of(r.body, r.kind)) for r in batch]
        derived.take(range(positions[0], positions[-1] + 1) if data.draw(st.booleans()) else positions,
                     [(p, e) for p, e in events if e is not None])
    assert derived.rows() == index.derive(store.backend, sid, stop)
