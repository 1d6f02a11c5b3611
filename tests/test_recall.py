"""Recalling by handle what model input names without quoting it: each kind, paging, hostile handles, the needed literals."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compactstore as cs
from compactstore import recall, render

LONG = {"files": [f"migrations/{i:03}_down.sql" for i in range(20)]}


def migration(store: cs.Store, name: str = "run") -> tuple[cs.Session, cs.Node]:
    """Return a session whose compacted span spilled a short and a long literal an open obligation needs."""
    s = store.session(name)
    s.append(cs.Turn("user", "Make the users.email migration reversible."))  # 0
    s.append(cs.ToolCall("c1", "run_sql", {"sql": "ALTER TABLE users"}))  # 1
    s.append(cs.ToolResult("c1", "ERROR: lock timeout on users", ok=False, status="failed"))  # 2
    s.bind("rollback", "migrations/003_down.sql")  # 3
    s.bind("manifest", LONG)  # 4
    s.oblige("finish-migration", needs=["rollback", "manifest"])  # 5
    node = s.compact(0, 6, on_risk="spill")  # spills at 6 and 7, the node at 8
    s.mark(node)
    s.append(cs.Turn("user", "Go on."))
    return s, node


def certified_by(s: cs.Session) -> str:
    """Return what a recall says it was held to: the sealed head's size and root."""
    head = s.sealed_head()
    return f"the sealed head of size {head.size}, root {head.root.hex()}"


def test_each_kind_of_handle_returns_what_it_names_and_what_was_certified(store: cs.Store) -> None:
    """spill, pos, span, facts and binding handles each return the exact value and name the sealed head it was proven in."""
    s, node = migration(store)
    handles = {r.key: r.handle for r in node.spills}
    at = certified_by(s)
    got = recall.recall(s, handles["manifest"])
    assert got.startswith(f"{handles['manifest']} = {cs.events.encode_json(LONG)}\n") and at in got
    assert "checked against its digest" in got and "binding 'manifest' bound at pos 4" in got
    got = recall.recall(s, "pos:2")
    assert got.startswith(f"pos:2, proven in {at}:\npos 2 tool_result [failed]: ") and '"ERROR: lock timeout on users"' in got
    got = recall.recall(s, f"span:0-{s.size}")
    assert f"each held to {at}" in got
    assert [int(p) for p in re.findall(r"^pos (\d+) ", got, re.M)] == [0, 1, 2, 3, 4, 5, s.size - 1]  # derived ones left out
    got = recall.recall(s, "facts:0-9")
    assert "- pos 2 failed: result c1 failed: ERROR: lock timeout on users (pos:2 gives it whole)" in got and at in got
    assert recall.recall(s, "binding:rollback").startswith('binding:rollback = "migrations/003_down.sql"\n')
    assert "no binding of this key" in recall.recall(s, "binding:nothing")
    assert recall.recall(s, "  pos:0\n") == recall.recall(s, "pos:0")  # surrounding whitespace is ignored


def test_a_span_is_paged_and_ends_with_the_handle_of_the_rest(store: cs.Store) -> None:
    """At most SPAN_EVENTS events, or about SPAN_CHARACTERS characters, per call; following the handles reads every raw event once."""
    s = store.session("long")
    s.extend([cs.Turn("user", f"step {i}" + "x" * (900 if i % 7 == 0 else 0)) for i in range(60)])
    s.mark(s.compact(0, 30))  # derived events inside the range
    s.extend([cs.Turn("user", "after")])
    handle: str | None = f"span:0-{s.size}"
    seen: list[int] = []
    while handle is not None:
        got = recall.recall(s, handle)
        page = [int(p) for p in re.findall(r"^pos (\d+) ", got, re.M)]
        assert 1 <= len(page) <= recall.SPAN_EVENTS
        assert sum(len(line) for line in got.splitlines()[1:-1]) < recall.SPAN_CHARACTERS + 2000
        seen += page
        more = re.search(r"\(more: (span:\d+-\d+)\)$", got)
        handle = more.group(1) if more else None
    raw = [r.pos for r in s.scan() if r.kind not in cs.events.DERIVED_KINDS]
    assert seen == raw


def test_facts_are_paged_and_every_fact_of_the_range_is_fetched(store: cs.Store) -> None:
    """facts:A-B returns at most FACTS_PER_CALL facts, then the handle of the rest; together they are the log's negative facts in [A, B)."""
    s = store.session("failures")
    s.extend([cs.ToolResult(f"c{i}", f"ERROR {i}", ok=False, status="failed") if i % 2 else cs.Turn("user", f"try {i}")
              for i in range(200)])
    handle: str | None = "facts:10-190"
    seen: list[int] = []
    while handle is not None:
        got = recall.recall(s, handle)
        page = [int(p) for p in re.findall(r"^- pos (\d+) failed: ", got, re.M)]
        assert len(page) <= recall.FACTS_PER_CALL
        seen += page
        more = re.search(r"\(more: (facts:\d+-\d+)\)$", got)
        handle = more.group(1) if more else None
    assert seen == list(range(11, 190, 2))


HOSTILE = [
    "spill:²", "pos:٣", "pos:" + "9" * 5000, "pos:" + "9" * 30, "pos:9223372036854775808", "pos:-1", "span:-1-3",
    "span:5-5", "span:9-3", "facts:1-", "pos:1\x00", "pos: 1", "POS:1", "spill:", "binding:", "binding:3:value",
    "", " ", "recall(pos:1)", "pos:1.0", "pos:0x1", "span:1-2-3",
]


@pytest.mark.parametrize("handle", [*HOSTILE, None, 5, b"pos:1", ["pos:1"]])
def test_hostile_handles_are_refused_naming_handle_and_nothing_is_written(store: cs.Store, handle: object) -> None:
    """Unicode digits, huge or negative numbers, empty ranges and other malformed handles raise InvalidArgument naming handle."""
    s, _ = migration(store)
    size = s.size
    with pytest.raises(cs.InvalidArgument) as exc:
        recall.recall(s, handle)  # type: ignore[arg-type]
    assert exc.value.field == "handle" and type(exc.value) is cs.InvalidArgument
    assert s.size == size


def test_handles_past_the_log_or_of_the_wrong_kind_are_refused_naming_handle(store: cs.Store) -> None:
    """A position past the sealed head, a spill handle naming no spill, and an empty session are refused naming handle."""
    s, _ = migration(store)
    for handle in (f"pos:{s.size}", f"span:{s.size}-{s.size + 5}", "spill:2", "pos:9223372036854775807"):
        with pytest.raises(cs.InvalidArgument) as exc:
            recall.recall(s, handle)
        assert exc.value.field == "handle", handle
    with pytest.raises(cs.InvalidArgument) as exc:
        recall.recall(store.session("empty"), "pos:0")
    assert exc.value.field == "handle"


@given(handle=st.one_of(st.text(max_size=40), st.from_regex(r"(spill|pos|span|facts|binding):[0-9\-a-z²٣ ]{0,12}")))
@settings(max_examples=300, deadline=None)
def test_any_text_is_recalled_or_refused_naming_handle(handle: str) -> None:
    """Whatever text a model sends, recall returns text or refuses it with InvalidArgument naming handle, never anything else."""
    with cs.open(":memory:") as store:
        s = store.session("any")
        s.extend([cs.Turn("user", "hi"), cs.ToolResult("c1", "no", ok=False, status="failed")])
        try:
            assert isinstance(recall.recall(s, handle), str)
        except cs.InvalidArgument as exc:
            assert exc.field == "handle"


def test_a_redacted_spill_is_refused_as_unsound(store: cs.Store) -> None:
    """Recalling a spill whose binding was redacted (and the spill with it) raises ReconstructionUnsoundError."""
    s, node = migration(store)
    s.redact([3], "the rollback path was a secret")
    handle = next(r.handle for r in node.spills if r.key == "rollback")
    with pytest.raises(cs.ReconstructionUnsoundError):
        recall.recall(s, handle)
    assert "redacted" in recall.recall(s, "pos:3")


def test_needed_reads_the_literals_open_obligations_need_and_the_note_states_the_short_ones(store: cs.Store) -> None:
    """The short spilled literal is in the note verbatim beside its handle; the long one by its handle, naming the recall tool."""
    s, node = migration(store)
    got = s.context()
    needed = got.needed
    handles = {r.key: r.handle for r in node.spills}
    assert {(n.key, n.handle, cs.events.encode_json(n.value)) for n in needed} == {
        ("rollback", handles["rollback"], '"migrations/003_down.sql"'),
        ("manifest", handles["manifest"], cs.events.encode_json(LONG))}
    note = str(got.as_messages("chat")[0]["content"])
    assert note == str(render.messages(got.context, "chat", needed=needed)[0]["content"])
    assert f'- finish-migration needs rollback = "migrations/003_down.sql" ({handles["rollback"]})' in note
    assert f"call the {render.RECALL_TOOL} tool with {handles['manifest']}" in note
    assert cs.events.encode_json(LONG) not in note
    s.fulfil("finish-migration")
    assert s.context().needed == []  # nothing open needs them any more
