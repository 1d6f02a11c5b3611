"""The LangGraph saver's thread index against its log: the index a saver keeps through its own
commits (applied as a batch) equals one read from the log, under two writers, special
channels, redactions, replays and any sequence of writes."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("langgraph.checkpoint.conformance", reason="the test extra (langgraph) is not installed")

from langgraph.checkpoint.base import ERROR, INTERRUPT, RESUME, SCHEDULED, empty_checkpoint  # noqa: E402
from langgraph.types import Interrupt  # noqa: E402

import compactstore as cs  # noqa: E402
from compactstore.adapters.langgraph import CompactStoreSaver  # noqa: E402
from compactstore.adapters.langgraph_index import ThreadIndex  # noqa: E402

SPECIAL = [ERROR, INTERRUPT, SCHEDULED, RESUME]


def _state(index: ThreadIndex) -> dict[str, object]:
    return {"size": index.size, "live": index.live, "namespaces": index.namespaces, "at": index.at,
            "said": index.said, "talk": index.talk, "asked": index.asked, "waiting": index.waiting,
            "deps": index.deps, "thread_id": index.thread_id}


def _fresh(saver: CompactStoreSaver, thread_id: str) -> ThreadIndex:
    read = ThreadIndex(saver.session(thread_id), saver._codec)
    read.refresh()
    return read


def _kept(saver: CompactStoreSaver, thread_id: str) -> ThreadIndex:
    kept = saver._thread(thread_id)
    assert kept is not None
    kept.refresh()
    return kept


def _assert_same(saver: CompactStoreSaver, thread_id: str, *, thread_id_too: bool = True) -> None:
    kept, read = _state(_kept(saver, thread_id)), _state(_fresh(saver, thread_id))
    if not thread_id_too:
        kept.pop("thread_id"), read.pop("thread_id")
    assert kept == read


def _cfg(thread: str, ns: str = "", cid: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if cid is not None:
        conf["checkpoint_id"] = cid
    return {"configurable": conf}


def _put(saver: CompactStoreSaver, thread: str, ns: str = "", parent: str | None = None) -> dict[str, Any]:
    ck = empty_checkpoint()
    ck["channel_values"] = {"v": [uuid.uuid4().hex]}
    ck["channel_versions"] = {"v": saver.get_next_version(None, None)}
    return saver.put(_cfg(thread, ns, parent), ck, {"run_id": "r1"}, ck["channel_versions"])


# --- put_writes takes its writes as before -------------------------------------------------


@pytest.mark.parametrize("make", [lambda w: (x for x in w), iter], ids=["generator", "iterator"])
def test_put_writes_given_an_iterator_of_regular_writes_stores_them(tmp_path: Path, make: Any) -> None:
    """Writes given as any iterable are read once: each is stored at its idx."""
    with cs.open(str(tmp_path / "a.db")) as store:
        saver = CompactStoreSaver(store)
        cfg = _put(saver, "t")
        saver.put_writes(cfg, make([("a", 1), ("b", 2)]), "task1")
        assert saver.get_tuple(cfg).pending_writes == [("task1", "a", 1), ("task1", "b", 2)]


def test_put_writes_given_an_iterator_with_a_special_write_keeps_every_write_at_its_idx(tmp_path: Path) -> None:
    """isdisjoint stops at the first special channel: the loop then enumerates the rest from 0, the special lost."""
    with cs.open(str(tmp_path / "a.db")) as store:
        saver = CompactStoreSaver(store)
        cfg = _put(saver, "t")
        saver.put_writes(cfg, iter([("p", 1), (ERROR, "e"), ("q", 2)]), "task1")
        got = saver.get_tuple(cfg).pending_writes
        assert sorted(got, key=repr) == sorted([("task1", ERROR, "e"), ("task1", "p", 1), ("task1", "q", 2)], key=repr)
        idxs = sorted(r.event.idx for r in saver.session("t").scan() if isinstance(r.event, cs.events.Write))
        assert idxs == [-1, 0, 2]


def test_put_writes_given_a_tuple_of_lists_and_duplicate_special_writes(tmp_path: Path) -> None:
    """Writes as a tuple of [channel, value] lists; of two writes to one special channel the last counts."""
    with cs.open(str(tmp_path / "a.db")) as store:
        saver = CompactStoreSaver(store)
        cfg = _put(saver, "t")
        saver.put_writes(cfg, (["a", 1], ["b", {"x": [1, 2]}]), "t1")
        saver.put_writes(cfg, ((ERROR, "first"), ("c", 3), (ERROR, "last")), "t2")
        assert ("t2", ERROR, "last") in saver.get_tuple(cfg).pending_writes
        saver.put_writes(cfg, ((ERROR, "again"),), "t2")  # a special write is replaced
        saver.put_writes(cfg, (("z", 0), ("c", 99)), "t2")  # a regular one at a held idx is kept
        got = saver.get_tuple(cfg).pending_writes
        assert sorted(got, key=repr) == sorted([("t1", "a", 1), ("t1", "b", {"x": [1, 2]}), ("t2", ERROR, "again"),
                                                ("t2", "c", 3), ("t2", "z", 0)], key=repr)
        _assert_same(saver, "t")


# --- the index kept by two writers' commits is the index read from the log ---------------------

_CHANNELS = st.sampled_from(["a", "b", *SPECIAL])
_OP = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 1), st.sampled_from(["", "sub"]), st.integers(0, 5)),
    st.tuples(st.just("writes"), st.integers(0, 1), st.sampled_from(["t1", "t2"]), st.integers(0, 5),
              st.lists(st.tuples(_CHANNELS, st.integers(0, 3)), min_size=1, max_size=5),
              st.sampled_from([list, tuple])),
    st.tuples(st.just("delete"), st.integers(0, 1), st.sampled_from(["t", "u"])),
    st.tuples(st.just("prune"), st.integers(0, 1), st.sampled_from(["keep_latest", "delete"])),
    st.tuples(st.just("copy"), st.integers(0, 1)),
)


def _value(channel: str, n: int) -> Any:
    if channel == INTERRUPT:  # an interrupt asked: recorded as an open handle with its write
        return [Interrupt(value={"q": n}, id=f"i{n}")]
    return {"n": n, "packed": {1, 2} if n == 3 else n}  # a set is not JSON: serde packs it


def _run(savers: list[CompactStoreSaver], ops: list[Any]) -> None:
    configs: list[dict[str, Any]] = []
    for op in ops:
        saver = savers[op[1]]
        if op[0] == "put":
            parent = configs[op[3] % len(configs)]["configurable"]["checkpoint_id"] if configs else None
            configs.append(_put(saver, "t", op[2], parent))
        elif op[0] == "writes":
            if not configs:
                continue
            cfg = configs[op[3] % len(configs)]
            saver.put_writes(cfg, op[5]((ch, _value(ch, n)) for ch, n in op[4]), op[2])
        elif op[0] == "delete":
            saver.delete_thread(op[2])
        elif op[0] == "prune":
            saver.prune(["t", "u"], strategy=op[2])
        else:
            saver.copy_thread("t", "u")
        for s in savers:
            for thread in ("t", "u"):
                _assert_same(s, thread)


@settings(max_examples=int(__import__("os").environ.get("ADV_N", "80")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_OP, max_size=14))
def test_two_savers_on_one_file_keep_the_index_read_from_the_log(tmp_path: Path, ops: list[Any]) -> None:
    """Two handles on one SQLite file interleave puts, writes (special, interrupts, packed), deletes, prunes, copies."""
    path = str(tmp_path / f"two-{uuid.uuid4().hex}.db")
    with cs.open(path) as one, cs.open(path) as two:
        _run([CompactStoreSaver(one), CompactStoreSaver(two)], ops)


def test_a_deleted_thread_keeps_no_thread_id_in_the_index(tmp_path: Path) -> None:
    """An index whose graph states were all redacted names no thread, as one read after delete_thread names none."""
    with cs.open(str(tmp_path / "a.db")) as store:
        saver = CompactStoreSaver(store)
        _put(saver, "t")
        saver.delete_thread("t")
        _assert_same(saver, "t")


def test_own_reads_a_gap_between_a_replayed_record_and_a_fresh_one(tmp_path: Path) -> None:
    """Records [a replay at the index's end, a fresh one after another writer's]: the position between is read too.

    _Copy.flush appends with idempotency keys: when another process copied the first event
    (same key) and then a third appended, the batch's records are [5, 7], and 6 is another's.
    """
    from compactstore.adapters.langgraph_state import StateCodec
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    path = str(tmp_path / "gap.db")
    with cs.open(path) as a, cs.open(path) as b:
        codec = StateCodec(JsonPlusSerializer())
        mine, theirs = a.session("langgraph:t"), b.session("langgraph:t")
        kept = ThreadIndex(mine, codec)
        kept.refresh()

        def write(i: int) -> cs.events.Write:
            return cs.events.Write(checkpoint="c1", task="x", channel="ch", idx=i, value=[i])

        theirs.extend([write(0)], idempotency_keys=["k0"])  # another process's copy of write 0
        theirs.extend([write(5)])  # then a third writer
        kept.own(mine.extend([write(0), write(1)], idempotency_keys=["k0", "k1"]))  # records at [0, 2]
        read = ThreadIndex(mine, codec)
        read.refresh()
        kept.refresh()
        assert _state(kept) == _state(read)
