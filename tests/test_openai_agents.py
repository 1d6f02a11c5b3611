"""The OpenAI Agents SDK session, side by side with the SDK's own SQLiteSession on the same calls."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

pytest.importorskip("agents", reason="the test extra (openai-agents) is not installed")

from agents import Agent, RunConfig, Runner, SQLiteSession, function_tool  # noqa: E402
from agents.items import ModelResponse  # noqa: E402
from agents.memory import Session, SessionSettings  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.usage import Usage  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText  # noqa: E402

import compactstore as cs  # noqa: E402
from compactstore.adapters.openai_agents import CompactStoreSession  # noqa: E402

Item = dict[str, Any]
LIMITS = [None, 0, 1, 2, 3, 5, 100, -1]


def items(n: int, start: int = 0) -> list[Item]:
    """Return ``n`` items of the kinds a run produces: messages, a tool call and its output."""
    out: list[Item] = []
    for i in range(start, start + n):
        kind = i % 4
        if kind == 0:
            out.append({"role": "user", "content": f"question {i}"})
        elif kind == 1:
            out.append({"type": "function_call", "call_id": f"c{i}", "name": "lookup", "arguments": f'{{"q": {i}}}'})
        elif kind == 2:
            out.append({"type": "function_call_output", "call_id": f"c{i - 1}", "output": f"result {i}"})
        else:
            out.append({"role": "assistant", "type": "message", "content": [{"type": "output_text", "text": f"answer {i}",
                                                                           "annotations": []}]})
    return out


class Pair:
    """The same calls on a CompactStoreSession and an SQLiteSession; each call asserts equal results."""

    def __init__(self, store: cs.Store, session_id: str = "chat", **kwargs: Any) -> None:
        self.ours = CompactStoreSession(session_id, store, **kwargs)
        self.theirs = SQLiteSession(session_id, **kwargs)

    def close(self) -> None:
        self.theirs.close()

    async def same(self, call: Callable[[Any], Awaitable[Any]]) -> Any:
        a, b = await call(self.ours), await call(self.theirs)
        assert a == b
        return a

    async def add(self, batch: list[Item]) -> None:
        await self.same(lambda s: s.add_items(batch))

    async def check(self) -> None:
        for limit in LIMITS:
            await self.same(lambda s: s.get_items(limit))


def test_it_is_an_sdk_session(store: cs.Store) -> None:
    """The SDK's runtime-checkable Session protocol accepts it."""
    assert isinstance(CompactStoreSession("s", store), Session)


def test_the_same_calls_give_the_same_results_as_sqlite_session(store: cs.Store) -> None:
    """Adding, reading with every kind of limit, popping and clearing match SQLiteSession call for call."""

    async def run() -> None:
        pair = Pair(store)
        try:
            await pair.check()
            assert await pair.same(lambda s: s.pop_item()) is None
            await pair.add(items(3))
            await pair.add([])
            await pair.add(items(6, start=3))
            await pair.check()
            for _ in range(4):
                assert await pair.same(lambda s: s.pop_item()) is not None
            await pair.check()
            await pair.add(items(2, start=20))
            await pair.check()
            await pair.same(lambda s: s.clear_session())
            await pair.check()
            assert await pair.same(lambda s: s.pop_item()) is None
            await pair.add(items(3, start=30))
            await pair.check()
        finally:
            pair.close()

    asyncio.run(run())
    assert store.verify().ok


def test_session_settings_limit_is_the_default_as_in_sqlite_session(store: cs.Store) -> None:
    """With session_settings(limit=2), get_items() returns the latest two; an explicit limit wins."""

    async def run() -> None:
        pair = Pair(store, session_settings=SessionSettings(limit=2))
        try:
            await pair.add(items(5))
            assert len(await pair.same(lambda s: s.get_items())) == 2
            assert len(await pair.same(lambda s: s.get_items(4))) == 4
        finally:
            pair.close()

    asyncio.run(run())


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 4)),
        st.tuples(st.just("get"), st.sampled_from(LIMITS)),
        st.tuples(st.just("pop"), st.none()),
        st.tuples(st.just("clear"), st.none()),
    ),
    max_size=25,
)


@given(ops)
@settings(max_examples=40, deadline=None)
def test_random_call_sequences_match_sqlite_session(script: list[tuple[str, Any]]) -> None:
    """Any sequence of adds, reads, pops and clears gives SQLiteSession's results at every step."""

    async def run(store: cs.Store) -> None:
        pair = Pair(store)
        n = 0
        try:
            for op, arg in script:
                if op == "add":
                    await pair.add(items(arg, start=n))
                    n += arg
                elif op == "get":
                    await pair.same(lambda s: s.get_items(arg))
                elif op == "pop":
                    await pair.same(lambda s: s.pop_item())
                else:
                    await pair.same(lambda s: s.clear_session())
            await pair.check()
        finally:
            pair.close()

    with cs.open(":memory:") as store:
        asyncio.run(run(store))
        assert store.verify().ok


def test_items_are_turns_and_tool_calls_that_compaction_and_resume_understand(store: cs.Store) -> None:
    """A call without its output is listed as unresolved; a marker over the items resumes certified."""
    session = CompactStoreSession("agent", store)
    asyncio.run(session.add_items(items(6)))
    log = session.log
    assert [r.kind for r in log.scan()] == ["turn", "tool_call", "tool_result", "turn", "turn", "tool_call"]
    first = log.read(0).event
    assert isinstance(first, cs.Turn) and (first.role, first.content) == ("user", "question 0")
    node = log.compact(0, log.size)
    assert [(i.kind, i.id) for i in node.unresolved] == [("tool_call", "c5")]
    resumed = log.resume(log.mark(node))
    assert resumed.mode == "certified", resumed.reasons
    asyncio.run(session.add_items([{"type": "function_call_output", "call_id": "c5", "output": "late"}]))
    assert len(asyncio.run(session.get_items())) == 7


def test_pop_and_clear_redact_and_the_store_still_verifies(store: cs.Store) -> None:
    """Removed items read as gone and verify() counts them as redacted, summaries included."""
    session = CompactStoreSession("private", store)
    asyncio.run(session.add_items([{"role": "user", "content": "my card is 4242"}, *items(3, start=1)]))
    popped = asyncio.run(session.pop_item())
    assert popped == items(1, start=3)[0]
    assert session.log.read(3).event == cs.events.Redacted(by=4)
    session.log.compact(0, 3)
    asyncio.run(session.clear_session())
    assert asyncio.run(session.get_items()) == []
    assert all(r.kind in ("redacted", "redaction") for r in session.log.scan())
    report = store.verify()
    assert report.ok and report.redacted == 5
    # A second session object over the same store sees the same (the log is the source of truth).
    assert asyncio.run(CompactStoreSession("private", store).get_items()) == []


def test_items_that_are_not_json_are_refused_and_nothing_is_written(store: cs.Store) -> None:
    """NaN (which SQLiteSession would store as a bare NaN token) is refused, naming the field."""
    session = CompactStoreSession("s", store)
    with pytest.raises(cs.InvalidEvent) as info:
        asyncio.run(session.add_items([{"role": "user", "content": "ok"}, {"role": "user", "content": float("nan")}]))
    assert "meta.item.content" in info.value.field
    assert session.log.size == 0


_anything = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.tuples(children, children),
        st.dictionaries(st.text(max_size=4) | st.integers() | st.booleans() | st.none(), children, max_size=3),
    ),
    max_leaves=10,
)


@given(_anything)
@settings(max_examples=300, deadline=None)
def test_items_are_taken_exactly_as_sqlite_session_s_json_round_trip_gives_them(value: Any) -> None:
    """The direct copy of a plain item equals json.loads(json.dumps(item)), NaN, tuples and int keys included."""
    import json
    import math

    from compactstore.adapters.openai_agents import _round_trip

    want = json.loads(json.dumps(value))
    got = _round_trip(value)
    same = json.dumps(got) == json.dumps(want)
    assert same or (isinstance(want, float) and math.isnan(want) and math.isnan(got))
    assert type(got) is type(want)


def test_an_item_changed_after_add_items_is_stored_as_it_was() -> None:
    """The item is copied before add_items hands over to its worker thread, as SQLiteSession serializes it then."""
    with cs.open(":memory:") as store:
        session = CompactStoreSession("s", store)
        item: Item = {"role": "assistant", "type": "message", "content": [{"type": "output_text", "text": "a"}]}

        async def run() -> list[Item]:
            pending = asyncio.ensure_future(session.add_items([item]))
            await asyncio.sleep(0)  # add_items runs up to its worker thread
            item["content"][0]["text"] = "changed"
            await pending
            return await session.get_items()

        assert asyncio.run(run())[0]["content"][0]["text"] == "a"


@function_tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


class Scripted(Model):
    """A model without a network: calls ``add(2, 2)`` for a new question, then answers with its result."""

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any, tools: Any,  # noqa: A002
                           output_schema: Any, handoffs: Any, tracing: Any, **kwargs: Any) -> ModelResponse:
        last = input[-1] if isinstance(input, list) else {"role": "user", "content": input}
        if last.get("type") == "function_call_output":
            out: list[Any] = [ResponseOutputMessage(
                id="m", type="message", role="assistant", status="completed",
                content=[ResponseOutputText(type="output_text", text=f"It is {last['output']}.", annotations=[])])]
        else:
            out = [ResponseFunctionToolCall(id="f", type="function_call", call_id=f"call-{len(input)}", name="add",
                                            arguments='{"a": 2, "b": 2}')]
        return ModelResponse(output=out, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def test_an_agent_run_stores_the_same_history_as_with_sqlite_session(store: cs.Store) -> None:
    """Runner.run with a tool call, twice on one session: the same items as SQLiteSession, and a clean verify()."""
    agent = Agent(name="calc", instructions="Add.", tools=[add], model=Scripted())
    config = RunConfig(tracing_disabled=True)

    async def run() -> None:
        pair = Pair(store)
        try:
            for session in (pair.ours, pair.theirs):
                for question in ("What is 2+2?", "And again?"):
                    result = await Runner.run(agent, question, session=session, run_config=config)
                    assert result.final_output == "It is 4."
            await pair.check()
        finally:
            pair.close()

    asyncio.run(run())
    assert store.verify().ok


# --- the memory loop: compaction inside the session ------------------------------------


@function_tool
def flaky(n: int) -> int:
    """Fail for every third step, else echo ``n``."""
    if n % 3 == 0:
        raise RuntimeError(f"step {n} failed")
    return n


class Looping(Model):
    """A model without a network: calls ``flaky`` once per question, then answers; records every input it gets."""

    def __init__(self) -> None:
        self.inputs: list[list[Any]] = []

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any, tools: Any,  # noqa: A002
                           output_schema: Any, handoffs: Any, tracing: Any, **kwargs: Any) -> ModelResponse:
        items = list(input) if isinstance(input, list) else [{"role": "user", "content": input}]
        self.inputs.append(items)
        last = items[-1]
        if last.get("type") == "function_call_output":
            out: list[Any] = [ResponseOutputMessage(
                id="m", type="message", role="assistant", status="completed",
                content=[ResponseOutputText(type="output_text", text=f"done: {last['output']}", annotations=[])])]
        else:
            n = len(self.inputs)
            out = [ResponseFunctionToolCall(id="f", type="function_call", call_id=f"call-{n}", name="flaky",
                                            arguments=f'{{"n": {n}}}')]
        return ModelResponse(output=out, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


POLICY = cs.CompactionPolicy(every=12, roll_up_every=3)


def test_an_agent_run_after_a_restart_is_fed_the_compacted_context(target: str) -> None:
    """After 30 runs and a restart, the model's input is summary notes plus the raw tail, far smaller than the log."""
    config = RunConfig(tracing_disabled=True)

    async def run(model: Looping, questions: range) -> list[Item]:
        agent = Agent(name="loop", instructions="Work.", tools=[flaky], model=model)
        with CompactStoreSession("loop", target, compaction=POLICY) as session:
            for q in questions:
                await Runner.run(agent, f"question {q}", session=session, run_config=config)
            assert session.maintenance is not None and not session.maintenance.refused
            return await session.get_items()

    asyncio.run(run(Looping(), range(30)))
    model = Looping()
    asyncio.run(run(model, range(30, 31)))  # a new process: the store is reopened
    first = model.inputs[0]
    notes = [i for i in first if i.get("role") == "developer"]
    assert notes and notes[0]["content"].startswith("[summary L2")
    negatives = notes[0]["content"].split("Negative facts")[1]
    assert "failed: An error occurred while running the tool" in negatives  # the tool errors, kept as negative facts
    assert first[-1] == {"role": "user", "content": "question 30"}
    with cs.open(target) as store:
        log = store.session("openai-agents:loop")
        raw = [r for r in log.scan(0) if r.kind not in cs.events.DERIVED_KINDS]
        assert len(raw) > 120 and len(first) < len(raw) / 4
        failed = [r for r in raw if isinstance(r.event, cs.ToolResult) and not r.event.ok]
        assert failed and all(r.event.status == "failed" for r in failed)
        assert store.verify().ok


def test_the_compacted_items_hold_every_item_once_and_limit_takes_the_last(store: cs.Store) -> None:
    """Each item after the summaries' cover comes back once, as stored, in order; limit=N is the last N of them."""

    async def run() -> None:
        session = CompactStoreSession("c", store, compaction=cs.CompactionPolicy(every=10, roll_up_every=2))
        stored = items(45)
        for i in range(0, 45, 5):
            await session.add_items(stored[i:i + 5])
        got = await session.get_items()
        notes = [i for i in got if i.get("role") == "developer"]
        tail = [i for i in got if i.get("role") != "developer"]
        assert notes and tail == stored[-len(tail):] and len(tail) < len(stored)
        assert await session.get_items(3) == got[-3:] == stored[-3:]
        assert await session.get_items(0) == []

    asyncio.run(run())


def test_pop_under_a_policy_withdraws_the_item_and_markers_still_certify(store: cs.Store) -> None:
    """pop_item under a policy supersedes the item: gone from get_items, listed as superseded, and markers certify."""

    async def run() -> None:
        session = CompactStoreSession("p", store, compaction=cs.CompactionPolicy(every=10, roll_up_every=2))
        stored = items(45)
        await session.add_items(stored)
        assert await session.pop_item() == stored[-1]
        got = await session.get_items()
        assert got[-1] == stored[-2] and stored[-1] not in got
        await session.add_items(items(20, start=45))
        assert session.log.context().mode == "certified"
        got = await session.get_items()
        assert stored[-1] not in got and got[-1] == items(20, start=45)[-1]
        assert any("superseded" in str(i.get("content")) for i in got if i.get("role") == "developer")

    asyncio.run(run())
    assert store.verify().ok


def test_a_tool_error_is_stored_as_a_failed_result() -> None:
    """The SDK's default error and timeout outputs, and an incomplete output, are failed results; others are ok."""
    from compactstore.adapters.openai_agents import DEFAULT_TOOL_ERROR, event_of

    def result(**fields: Any) -> Any:
        return event_of({"type": "function_call_output", "call_id": "c", **fields})

    for bad in (result(output=DEFAULT_TOOL_ERROR), result(output=DEFAULT_TOOL_ERROR + " Error: boom"),
                result(output="Tool 'f' timed out after 2.5 seconds."), result(output="4", status="incomplete")):
        assert (bad.ok, bad.status) == (False, "failed")
    fine = result(output="4")
    assert (fine.ok, fine.status) == (True, None)
    custom = event_of({"type": "function_call_output", "call_id": "c", "output": "E: x"}, lambda i: True)
    assert custom.status == "failed"


def test_a_rejected_approval_is_stored_as_a_rejected_result_that_summaries_keep(target: str) -> None:
    """The SDK's rejection output is a rejected result, a negative fact a compaction retains; a custom text needs tool_rejected."""
    from agents.tool import DEFAULT_APPROVAL_REJECTION_MESSAGE

    from compactstore.adapters.openai_agents import event_of

    rejected = event_of({"type": "function_call_output", "call_id": "c", "output": DEFAULT_APPROVAL_REJECTION_MESSAGE})
    assert (rejected.ok, rejected.status) == (False, "rejected")
    custom = {"type": "function_call_output", "call_id": "c", "output": "No: not on prod."}
    assert event_of(custom).status is None
    assert event_of(custom, rejected=lambda i: i.get("output", "").startswith("No:")).status == "rejected"

    async def run() -> None:
        with CompactStoreSession("approvals", target, compaction=cs.CompactionPolicy(every=6, roll_up_every=None),
                                 tool_rejected=lambda i: i.get("output") in ("No: not on prod.",
                                                                             DEFAULT_APPROVAL_REJECTION_MESSAGE)) as s:
            await s.add_items([
                {"role": "user", "content": "Drop the old table."},
                {"type": "function_call", "call_id": "p1", "name": "drop_table", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "p1", "output": DEFAULT_APPROVAL_REJECTION_MESSAGE},
                {"type": "function_call", "call_id": "p2", "name": "drop_table", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "p2", "output": "No: not on prod."},
                {"role": "assistant", "content": "Left it."},
            ])
            node = s.log.nodes()[0]
            assert [(f.pos, f.status) for f in node.negative_facts] == [(2, "rejected"), (4, "rejected")]
            fed = json.dumps(await s.get_items())
            assert s.log.context().mode == "certified" and "p1" in fed and "p2" in fed

    asyncio.run(run())


def test_async_with_closes_the_store_it_opened_and_only_that(target: str) -> None:
    """`async with CompactStoreSession(id, target)` closes the store it opened on exit (aclose); one given open stays open."""

    async def run() -> None:
        async with CompactStoreSession("s", target) as owned:
            await owned.add_items(items(2))
        with pytest.raises(cs.StoreClosed):
            await owned.get_items()
        with cs.open(target) as store:
            async with CompactStoreSession("s", store) as borrowed:
                assert len(await borrowed.get_items()) == 2
            assert store.session(borrowed.log.name).size == 2

    asyncio.run(run())
