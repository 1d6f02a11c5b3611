"""The LangGraph checkpointer: LangGraph's own conformance suite, a graph run end to end, deletion as redaction."""

from __future__ import annotations

import asyncio
import contextlib
import io
import operator
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("langgraph.checkpoint.conformance", reason="the test extra (langgraph) is not installed")

from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402
from langgraph.checkpoint.serde.types import ERROR  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import Command, interrupt  # noqa: E402

import compactstore as cs  # noqa: E402
from compactstore import merkle  # noqa: E402
from compactstore.adapters.langgraph import CompactStoreSaver  # noqa: E402
from compactstore.adapters.langgraph_index import ThreadIndex  # noqa: E402


def _backend(target: str) -> str:
    return "postgres" if "://" in target else "sqlite"


def test_langgraph_conformance_suite_passes_in_full(target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """LangGraph's published suite passes every capability, base and extended, on each backend."""
    from langgraph.checkpoint.conformance import checkpointer_test, validate

    name = f"CompactStoreSaver on {_backend(target)}"

    @checkpointer_test(name=name)
    async def factory() -> Any:
        store = cs.open(target)
        try:
            yield CompactStoreSaver(store)
        finally:
            store.close()

    report = asyncio.run(validate(factory))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        report.print_report()
    results = report.results.values()
    passed, failed = sum(r.tests_passed for r in results), sum(r.tests_failed for r in results)
    detected = [r for r in results if r.detected]
    summary = (f"langgraph-checkpoint-conformance 0.0.2, {name}: level {report.conformance_level()}, "
               f"{sum(r.passed is True for r in detected)}/{len(detected)} capabilities, "
               f"{passed} tests passed and {failed} failed")
    text = out.getvalue() + summary + "\n" + "".join(f"  {f}\n" for r in results for f in r.failures)
    (tmp_path / "conformance.txt").write_text(text, encoding="utf-8")
    with capsys.disabled():
        print("\n" + text)
    assert report.passed_all_base(), text
    assert report.conformance_level() == "FULL", text


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    approved: bool


class Review(TypedDict):
    approved: bool


def _review(state: Review) -> dict[str, Any]:
    return {"approved": interrupt({"question": "apply migration 003?"}) == "yes"}


def graph(saver: CompactStoreSaver) -> Any:
    """Return plan -> review (a subgraph that interrupts for approval) -> act, compiled on ``saver``."""
    review = StateGraph(Review)
    review.add_node("ask", _review)
    review.add_edge(START, "ask")
    review.add_edge("ask", END)
    builder = StateGraph(State)
    builder.add_node("plan", lambda s: {"log": ["plan"]})
    builder.add_node("review", review.compile())
    builder.add_node("act", lambda s: {"log": ["act" if s["approved"] else "skip"]})
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "review")
    builder.add_edge("review", "act")
    builder.add_edge("act", END)
    return builder.compile(checkpointer=saver)


def test_a_graph_with_an_interrupt_runs_end_to_end_and_its_history_proves_consistent(store: cs.Store) -> None:
    """Run, pause at the interrupt, resume; then verify() is clean and the two checkpoints are consistent."""
    saver = CompactStoreSaver(store)
    app = graph(saver)
    config = {"configurable": {"thread_id": "migration-7"}}
    paused = app.invoke({"log": [], "approved": False}, config)
    assert paused["__interrupt__"][0].value == {"question": "apply migration 003?"}
    assert app.get_state(config).next == ("review",)
    at_pause = saver.record(config)
    assert at_pause is not None and at_pause.kind == "graph_state"

    done = app.invoke(Command(resume="yes"), config)
    assert done == {"log": ["plan", "act"], "approved": True}
    at_end = saver.record(config)
    assert at_end is not None and at_end.pos > at_pause.pos

    session = saver.session("migration-7")
    assert {r.event.ns for r in session.scan() if isinstance(r.event, cs.events.GraphState)} > {""}  # the subgraph's too
    old, new = session.head(at_pause.pos + 1), session.head(at_end.pos + 1)
    proof = session.consistency_proof(old.size, new.size)
    assert merkle.verify_consistency(old.size, new.size, old.root, new.root, proof)
    assert not merkle.verify_consistency(old.size, new.size, old.root, merkle.leaf_hash(b"forged"), proof)
    report = store.verify()
    assert report.ok and report.events == session.size, report.problems

    # The log is the source of truth: a new saver over the same store reads the same thread.
    again = graph(CompactStoreSaver(store))
    assert again.get_state(config).values == done
    steps = [s.metadata["step"] for s in again.get_state_history(config)]
    assert steps == sorted(steps, reverse=True) and len(steps) >= 4


def test_a_graph_goes_through_the_same_states_as_on_sqlite_saver(store: cs.Store, tmp_path: Path) -> None:
    """The same run on LangGraph's SqliteSaver and on this saver: the same states, steps and pending tasks."""
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(str(tmp_path / "langgraph.sqlite"), check_same_thread=False)
    try:
        histories = []
        for saver in (SqliteSaver(conn), CompactStoreSaver(store)):
            app = graph(saver)
            config = {"configurable": {"thread_id": "side-by-side"}}
            app.invoke({"log": [], "approved": False}, config)
            app.invoke(Command(resume="no"), config)
            app.invoke({"log": ["again"]}, config)
            histories.append([(s.values, s.next, s.metadata["source"], s.metadata["step"], len(s.tasks))
                              for s in app.get_state_history(config)])
        assert histories[0] == histories[1] and len(histories[0]) >= 8
    finally:
        conn.close()


def test_a_thread_compacts_marks_and_resumes_like_any_session(store: cs.Store) -> None:
    """The events of a graph run are raw events: compaction, a marker and a certified resume work on them."""
    saver = CompactStoreSaver(store)
    app = graph(saver)
    config = {"configurable": {"thread_id": "t"}}
    app.invoke({"log": [], "approved": False}, config)
    session = saver.session("t")
    paused = session.size
    node = session.compact(0, paused)
    marker = session.mark(node)
    app.invoke(Command(resume="no"), config)
    assert app.get_state(config).values["log"] == ["plan", "skip"]
    resumed = session.resume(marker)
    assert resumed.mode == "certified", resumed.reasons
    assert store.verify().ok


def test_an_async_graph_run_matches_the_sync_one(store: cs.Store) -> None:
    """ainvoke goes through the async methods and ends in the same state."""
    app = graph(CompactStoreSaver(store))
    config = {"configurable": {"thread_id": "async"}}

    async def run() -> Any:
        await app.ainvoke({"log": [], "approved": False}, config)
        return await app.ainvoke(Command(resume="yes"), config)

    assert asyncio.run(run()) == {"log": ["plan", "act"], "approved": True}
    assert store.verify().ok


def _put(saver: CompactStoreSaver, thread: str, values: dict[str, Any], versions: dict[str, Any],
         new: dict[str, Any], parent: dict[str, Any] | None = None, **metadata: Any) -> dict[str, Any]:
    cp = empty_checkpoint()
    cp["channel_values"], cp["channel_versions"] = values, versions
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    return saver.put(config, cp, {"source": "loop", "step": len(metadata), **metadata}, new)


def test_delete_thread_redacts_and_the_store_still_verifies(store: cs.Store) -> None:
    """The thread reads as gone, every body is erased, and verify() counts them as redacted."""
    saver = CompactStoreSaver(store)
    c1 = _put(saver, "gone", {"secret": "4242"}, {"secret": 1}, {"secret": 1})
    saver.put_writes(c1, [("secret", "4343")], "task-1")
    _put(saver, "kept", {"x": 1}, {"x": 1}, {"x": 1})
    size = saver.session("gone").size
    saver.delete_thread("gone")
    assert saver.get_tuple({"configurable": {"thread_id": "gone", "checkpoint_ns": ""}}) is None
    assert list(saver.list({"configurable": {"thread_id": "gone"}})) == []
    assert [r.kind for r in saver.session("gone").scan()] == ["redacted"] * size + ["redaction"]
    report = store.verify()
    assert report.ok and report.redacted == size
    assert saver.get_tuple({"configurable": {"thread_id": "kept", "checkpoint_ns": ""}}) is not None
    # The thread can be used again afterwards: the erased idempotency keys are free.
    again = _put(saver, "gone", {"secret": "new"}, {"secret": 1}, {"secret": 1})
    saver.put_writes(again, [("secret", "4343")], "task-1")
    got = saver.get_tuple(again)
    assert got is not None and got.checkpoint["channel_values"] == {"secret": "new"} and len(got.pending_writes or []) == 1


def test_prune_keeps_the_values_the_latest_checkpoint_reads_from_older_events(store: cs.Store) -> None:
    """A channel unchanged since an erased checkpoint is carried into the kept one before erasing."""
    saver = CompactStoreSaver(store)
    c1 = _put(saver, "t", {"a": "a1", "b": "b1"}, {"a": 1, "b": 1}, {"a": 1, "b": 1})
    c2 = _put(saver, "t", {"a": "a2", "b": "b1"}, {"a": 2, "b": 1}, {"a": 2}, parent=c1)
    saver.put_writes(c2, [("a", "pending")], "task")
    saver.prune(["t"], strategy="keep_latest")
    [kept] = list(saver.list({"configurable": {"thread_id": "t"}}))
    assert kept.config["configurable"]["checkpoint_id"] == c2["configurable"]["checkpoint_id"]
    assert kept.checkpoint["channel_values"] == {"a": "a2", "b": "b1"}
    assert kept.pending_writes == [("task", "a", "pending")]
    assert saver.get_tuple(c1) is None
    report = store.verify()
    assert report.ok and report.redacted >= 2
    # A new saver, reading the log from scratch, sees the same.
    fresh = CompactStoreSaver(store).get_tuple(c2)
    assert fresh is not None and fresh.checkpoint["channel_values"] == {"a": "a2", "b": "b1"}
    with pytest.raises(ValueError, match="strategy"):
        saver.prune(["t"], strategy="oldest")


def test_put_writes_is_idempotent_per_task_and_index(store: cs.Store) -> None:
    """A retried call writes nothing; a regular write is kept as first written; a special one is replaced."""
    saver = CompactStoreSaver(store)
    c1 = _put(saver, "t", {}, {}, {})
    saver.put_writes(c1, [("a", 1), ("b", 2)], "task")
    size = saver.session("t").size
    saver.put_writes(c1, [("a", 1), ("b", 2)], "task")
    saver.put_writes(c1, [("a", "changed")], "task")
    assert saver.session("t").size == size
    saver.put_writes(c1, [(ERROR, "first")], "task")
    saver.put_writes(c1, [(ERROR, "second")], "task")
    saver.put_writes(c1, [(ERROR, "second")], "task")
    got = saver.get_tuple(c1)
    assert got is not None and got.pending_writes == [("task", ERROR, "second"), ("task", "a", 1), ("task", "b", 2)]
    last = saver.session("t").read(saver.session("t").size - 1)
    assert isinstance(last.event, cs.events.Write) and last.event.supersedes == size
    # Putting the very same checkpoint again writes nothing; a changed one supersedes it.
    cp = empty_checkpoint()
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    saver.put(config, cp, {"step": 1}, {})
    before = saver.session("t").size
    saver.put(config, cp, {"step": 1}, {})
    assert saver.session("t").size == before
    saver.put(config, cp, {"step": 2}, {})
    assert saver.session("t").size == before + 1
    got = saver.get_tuple({"configurable": {**config["configurable"], "checkpoint_id": cp["id"]}})
    assert got is not None and got.metadata["step"] == 2


def test_writers_deciding_from_stale_indexes_write_nothing_twice(target: str) -> None:
    """Two stores on one log: each writes without reading first, yet a write or checkpoint another stored is not repeated."""
    with cs.open(target) as store_a, cs.open(target) as store_b:
        a, b = CompactStoreSaver(store_a), CompactStoreSaver(store_b)
        c1 = _put(a, "t", {"n": 1}, {"n": 1}, {"n": 1})
        b.put_writes(c1, [("a", 1)], "task")  # b has read nothing of the thread yet
        size = a.session("t").size
        a.put_writes(c1, [("a", 1)], "task")  # a's index predates b's write
        a.put_writes(c1, [("a", 2)], "task")
        b.put_writes(c1, [("a", 1)], "task")
        assert a.session("t").size == size
        a.put_writes(c1, [("b", 3)], "other")
        b.put_writes(c1, [("c", 4)], "third")  # b's index predates a's write of "other"
        writes = [r.event for r in b.session("t").scan() if isinstance(r.event, cs.events.Write)]
        assert [(w.task, w.value) for w in writes] == [("task", [1]), ("other", [3]), ("third", [4])]
        a.delete_thread("t")
        b.put_writes(c1, [("c", 4)], "third")  # b's index still holds it: b reads the redaction, then writes
        last = b.session("t").read(b.session("t").size - 1).event
        assert isinstance(last, cs.events.Write) and last.task == "third"
        # The same for checkpoints: putting again what the other store put writes nothing.
        c2 = _put(b, "u", {"n": 1}, {"n": 1}, {"n": 1})
        before = b.session("u").size
        cp = a.get_tuple(c2)
        assert cp is not None
        a.put({"configurable": {"thread_id": "u", "checkpoint_ns": ""}}, cp.checkpoint, cp.metadata, {"n": 1})
        assert a.session("u").size == before


def test_plain_values_are_stored_as_json_and_another_serializer_sees_every_value(store: cs.Store) -> None:
    """With the default serializer a plain value is stored as itself; a tuple, or any value under another one, is packed."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    class Wrapping(JsonPlusSerializer):
        """Stands for an encrypting serializer: it must see every value."""

    for saver, plain in ((CompactStoreSaver(store), True), (CompactStoreSaver(store, serde=Wrapping()), False)):
        thread = f"t-{plain}"
        c1 = _put(saver, thread, {"m": [1, "a"]}, {"m": 1}, {"m": 1})
        saver.put_writes(c1, [("m", {"role": "user"}), ("n", (1, 2))], "task")
        checkpoint, *writes = [r.event for r in saver.session(thread).scan()]
        assert isinstance(checkpoint, cs.events.GraphState) and isinstance(writes[0], cs.events.Write)
        assert (checkpoint.value["blobs"]["m"][1:] == [[1, "a"]]) == plain
        assert (writes[0].value == [{"role": "user"}]) == plain
        assert len(writes[1].value) == 2  # a tuple is not JSON: through serde
        got = saver.get_tuple(c1)
        assert got is not None and got.checkpoint["channel_values"] == {"m": [1, "a"]}
        pair = saver.serde.loads_typed(saver.serde.dumps_typed((1, 2)))  # what serde gives back
        assert got.pending_writes == [("task", "m", {"role": "user"}), ("task", "n", pair)]


def test_metadata_json_cannot_carry_goes_through_serde(store: cs.Store) -> None:
    """Non-string keys and NaN in metadata come back as serde returns them; plain metadata stays readable JSON."""
    saver = CompactStoreSaver(store)
    c1 = _put(saver, "t", {}, {}, {}, counts={1: "one"}, score=float("nan"))
    got = saver.get_tuple(c1)
    assert got is not None and got.metadata["counts"] == {1: "one"} and got.metadata["score"] != got.metadata["score"]
    record = saver.record(c1)
    assert record is not None and record.event.meta is None
    c2 = _put(saver, "t", {}, {}, {}, parent=c1, note="plain")
    record = saver.record(c2)
    assert record is not None and record.event.meta == {"source": "loop", "step": 1, "note": "plain"}
    assert [t.metadata.get("note") for t in saver.list(None, filter={"note": "plain"})] == ["plain"]


@pytest.mark.parametrize("thread", ["", "#digest-like", "tab\there", "x" * 600, "ünïcode thread"])
def test_any_thread_id_maps_to_a_valid_session_and_back(store: cs.Store, thread: str) -> None:
    """Ids that are no valid session name are stored under their digest, and listed under their own id."""
    saver = CompactStoreSaver(store)
    c1 = _put(saver, thread, {"v": thread}, {"v": 1}, {"v": 1})
    name = saver.session(thread).name
    assert name.startswith("langgraph:") and len(name) <= 512
    assert (name == "langgraph:" + thread) == (thread == "ünïcode thread")
    got = saver.get_tuple(c1)
    assert got is not None and got.checkpoint["channel_values"] == {"v": thread}
    [listed] = list(CompactStoreSaver(store).list(None))
    assert listed.config["configurable"]["thread_id"] == thread


def test_reading_the_latest_checkpoint_does_not_reread_the_history(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first read, a read of the latest checkpoint costs rows for what is new, not for the whole thread."""
    with cs.open(target) as writer_store, cs.open(target) as reader_store:
        writer, reader = CompactStoreSaver(writer_store), CompactStoreSaver(reader_store)
        config = None
        for i in range(200):
            config = _put(writer, "long", {"n": i}, {"n": i + 1}, {"n": i + 1}, parent=config)
            writer.put_writes(config, [("n", i)], f"task-{i}")
        assert reader.get_tuple({"configurable": {"thread_id": "long", "checkpoint_ns": ""}}) is not None
        rows = count_rows(reader_store, monkeypatch)
        config = _put(writer, "long", {"n": -1}, {"n": 999}, {"n": 999}, parent=config)  # another process's append
        got = reader.get_tuple({"configurable": {"thread_id": "long", "checkpoint_ns": ""}})
        assert got is not None and got.checkpoint["channel_values"] == {"n": -1}
        assert 0 < rows() <= 3, rows()


def count_rows(store: cs.Store, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Count the event rows ``store`` reads from now on; return the counter."""
    seen = [0]
    rows, row = store.backend.rows, store.backend.row

    def counting_rows(*args: Any, **kwargs: Any) -> Iterator[Any]:
        for r in rows(*args, **kwargs):
            seen[0] += 1
            yield r

    def counting_row(*args: Any, **kwargs: Any) -> Any:
        seen[0] += 1
        return row(*args, **kwargs)

    monkeypatch.setattr(store.backend, "rows", counting_rows)
    monkeypatch.setattr(store.backend, "row", counting_row)
    return lambda: seen[0]


def test_copy_thread_copies_history_into_the_target_once(store: cs.Store) -> None:
    """Every checkpoint and write arrives in order; copying again writes nothing."""
    saver = CompactStoreSaver(store)
    c1 = _put(saver, "src", {"a": 1}, {"a": 1}, {"a": 1})
    c2 = _put(saver, "src", {"a": 1, "b": 2}, {"a": 1, "b": 1}, {"b": 1}, parent=c1)
    saver.put_writes(c2, [(ERROR, "boom")], "t")
    saver.put_writes(c2, [(ERROR, "boom again")], "t")
    saver.copy_thread("src", "dst")
    size = saver.session("dst").size
    saver.copy_thread("src", "dst")
    assert saver.session("dst").size == size
    src = list(saver.list({"configurable": {"thread_id": "src"}}))
    dst = list(saver.list({"configurable": {"thread_id": "dst"}}))
    assert [(t.checkpoint, t.metadata, t.pending_writes) for t in src] == [
        (t.checkpoint, t.metadata, t.pending_writes) for t in dst]
    assert dst[0].pending_writes == [("t", ERROR, "boom again")]
    assert all(t.config["configurable"]["thread_id"] == "dst" for t in dst)
    assert store.verify().ok


def _grow(saver: CompactStoreSaver, thread: str, turns: int, **metadata: Any) -> list[dict[str, Any]]:
    """Put one checkpoint per turn whose "messages" channel is the whole list so far, as a graph does."""
    configs, parent = [], None
    for n in range(1, turns + 1):
        messages = [{"role": "user", "content": f"m{i}"} for i in range(n)]
        parent = _put(saver, thread, {"messages": messages, "n": n}, {"messages": n, "n": n},
                      {"messages": n, "n": n}, parent=parent, **metadata)
        configs.append(parent)
    return configs


def _messages(saver: CompactStoreSaver, config: dict[str, Any]) -> list[Any]:
    got = saver.get_tuple(config)
    assert got is not None
    return list(got.checkpoint["channel_values"]["messages"])


def test_a_growing_list_channel_stores_what_was_appended_and_reads_back_whole(store: cs.Store) -> None:
    """Each checkpoint stores only the messages added since the last; every one reads back whole, chains bounded."""
    from compactstore.adapters.langgraph_state import MAX_CHAIN

    turns = MAX_CHAIN * 2 + 5
    configs = _grow(CompactStoreSaver(store), "t", turns)
    events = [r.event for r in store.session("langgraph:t").scan()]
    assert sum(1 for e in events if isinstance(e, cs.events.GraphState) and "deltas" in e.value) >= turns - 4
    assert all(len(e.value.get("deltas", {}).get("messages", [])) < MAX_CHAIN for e in events
               if isinstance(e, cs.events.GraphState))
    fresh = CompactStoreSaver(store)  # reads the log from scratch
    for n, config in enumerate(configs, 1):
        assert _messages(fresh, config) == [{"role": "user", "content": f"m{i}"} for i in range(n)]
    # A list that does not extend the last one is stored whole.
    config = _put(fresh, "t", {"messages": [{"role": "user", "content": "other"}]}, {"messages": turns + 1},
                  {"messages": turns + 1}, parent=configs[-1])
    assert _messages(fresh, config) == [{"role": "user", "content": "other"}]


def test_pruning_copying_and_deleting_runs_keep_list_values_spread_over_earlier_events_whole(store: cs.Store) -> None:
    """The kept checkpoint is stored whole before its parts are erased; a copy reads the same; verify() holds."""
    saver = CompactStoreSaver(store)
    configs = _grow(saver, "p", 10)
    saver.copy_thread("p", "q")
    for config in configs:
        copied = {"configurable": {**config["configurable"], "thread_id": "q"}}
        assert _messages(saver, copied) == _messages(saver, config)
    saver.prune(["p"], strategy="keep_latest")
    assert _messages(CompactStoreSaver(store), configs[-1]) == [{"role": "user", "content": f"m{i}"} for i in range(10)]
    more = _grow(saver, "r", 6, run_id="early")
    later = _put(saver, "r", {"messages": [{"role": "user", "content": f"m{i}"} for i in range(7)]},
                 {"messages": 7}, {"messages": 7}, parent=more[-1], run_id="late")
    saver.delete_for_runs(["early"])
    assert _messages(CompactStoreSaver(store), later) == [{"role": "user", "content": f"m{i}"} for i in range(7)]
    assert store.verify().ok


def test_importing_compactstore_loads_no_framework() -> None:
    """Only the adapter modules import LangGraph or the Agents SDK; the package itself imports neither."""
    import subprocess
    import sys

    code = ("import sys, compactstore, compactstore.adapters; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'langgraph', 'langchain_core', 'agents', 'openai'}))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_the_saver_opens_from_a_conn_string_in_async_with_and_closes(target: str) -> None:
    """from_conn_string gives a saver usable in ``async with``; leaving it closes the store it opened."""
    import asyncio

    async def run() -> None:
        async with CompactStoreSaver.from_conn_string(target) as saver:
            app = graph(saver)
            config = {"configurable": {"thread_id": "t"}}
            await app.ainvoke({"log": [], "approved": False}, config)
            assert (await saver.aget_tuple(config)) is not None
        with pytest.raises(cs.CompactStoreError):
            saver.store.session("x").size  # noqa: B018 - the store is closed
        again = CompactStoreSaver.from_conn_string(target)
        assert again.get_tuple({"configurable": {"thread_id": "t"}}) is not None
        await again.aclose()

    asyncio.run(run())


# --- the thread index follows the log -------------------------------------------------

_STEP = st.one_of(
    # (op, task, idxs, namespace, checkpoint)
    st.tuples(st.just("writes"), st.sampled_from(["t1", "t2", "t3"]), st.lists(st.integers(-3, 4), min_size=1, max_size=6),
              st.sampled_from(["", "sub"]), st.sampled_from(["c1", "c2"])),
    st.tuples(st.just("talk"), st.sampled_from(["m1", "m2", "m3"]), st.just([]), st.just(""), st.just("")),
    st.tuples(st.just("other"), st.sampled_from(["t1", "t4"]), st.lists(st.integers(0, 3), min_size=1, max_size=3),
              st.just(""), st.just("c1")),
    st.tuples(st.just("erase"), st.just(""), st.lists(st.integers(0, 40), min_size=1, max_size=4), st.just(""), st.just("")),
)


def _index_state(index: ThreadIndex) -> dict[str, object]:
    """What an index holds of its log (not what its process stored: tips)."""
    return {"size": index.size, "live": index.live, "namespaces": index.namespaces, "at": index.at,
            "said": index.said, "talk": index.talk, "asked": index.asked, "waiting": index.waiting,
            "deps": index.deps, "thread_id": index.thread_id}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(_STEP, max_size=12))
def test_an_index_kept_by_its_own_commits_is_the_index_read_from_the_log(tmp_path: Path, steps: list[Any]) -> None:
    """Whatever runs of writes, messages, other writers' appends and redactions, the index its commits kept equals one built from the log."""
    from compactstore.adapters.langgraph_messages import MESSAGE
    from compactstore.adapters.langgraph_state import StateCodec
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    with cs.open(str(tmp_path / f"idx-{uuid.uuid4().hex}.db")) as store:
        session, codec = store.session("langgraph:t"), StateCodec(JsonPlusSerializer())
        kept = ThreadIndex(session, codec)
        for op, task, idxs, ns, cid in steps:
            if op == "writes":  # what put_writes commits: a task's new writes, then each special one replaced
                for _ in range(3):  # decided on a stale index, a commit writes nothing: read, decide again
                    held = kept.pending(ns, cid)
                    fresh = [cs.events.Write(checkpoint=cid, task=task, channel="ch", idx=i, ns=ns, value=[i])
                             for i in dict.fromkeys(idxs) if (task, i) not in held]
                    again = [cs.events.Write(checkpoint=cid, task=task, channel="ch", idx=i, ns=ns, value=[i, 1],
                                             supersedes=held[(task, i)][-1])
                             for i in dict.fromkeys(idxs) if i < 0 and (task, i) in held]
                    if all(kept.commit(batch) is not None for batch in (fresh, *[[w] for w in again]) if batch):
                        break
                    kept.refresh()
            elif op == "talk":
                kept.commit([cs.Turn("user", task, meta={MESSAGE: task}), cs.Turn("user", "no id")])
            elif op == "other":  # another writer: the index reads it at its next commit or refresh
                session.extend([cs.events.Write(checkpoint=cid, task=task, channel="ch", idx=i, value=[i]) for i in idxs])
            else:
                kept.erase([p for p in idxs if p < session.size], "test")
        kept.refresh()
        read = ThreadIndex(session, codec)
        read.refresh()
        assert _index_state(kept) == _index_state(read)


@pytest.mark.parametrize("reclaim", [True, False])
def test_delete_thread_gives_the_space_back_unless_told_not_to(tmp_path: Path, reclaim: bool) -> None:
    """A deleted thread's bodies leave the file: the SQLite file shrinks (with reclaim), every tree still verifies."""
    path = str(tmp_path / "saver.db")
    with cs.open(path) as store:
        saver = CompactStoreSaver(store, reclaim=reclaim)
        parent = None
        for i in range(60):
            parent = _put(saver, "big", {"blob": "z" * 4000 + str(i)}, {"blob": i + 1}, {"blob": i + 1}, parent)
        _put(saver, "kept", {"x": 1}, {"x": 1}, {"x": 1})
        store.reclaim()
        before = Path(path).stat().st_size
        saver.delete_thread("big")
        after = Path(path).stat().st_size
        assert (after < before / 2) if reclaim else (after >= before / 2), (before, after)
        assert store.verify().ok
        assert saver.get_tuple({"configurable": {"thread_id": "kept", "checkpoint_ns": ""}}) is not None
