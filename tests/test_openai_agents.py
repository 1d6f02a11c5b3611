"""The OpenAI Agents SDK session: beside the SDK's SQLiteSession on the same calls, and on every item kind the SDK defines."""

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


def test_a_nul_in_an_item_is_refused_alike(store: cs.Store) -> None:
    """An item holding a NUL character is refused as the store refuses it on every backend, naming the field; nothing is written."""
    session = CompactStoreSession("s", store)
    with pytest.raises(cs.InvalidEvent) as info:
        asyncio.run(session.add_items([{"role": "user", "content": "ok"}, {"role": "user", "content": "a\x00b"}]))
    assert info.value.field.endswith("content") and "NUL" in info.value.reason
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


# --- every item kind the SDK defines, read as the SDK reads it --------------------------

from agents.items import TResponseInputItem  # noqa: E402

from compactstore.adapters import openai_agents as oa  # noqa: E402

#: Item types that neither call a tool nor report on one: messages, reasoning, compaction
#: markers, references and configuration. Everything else the union defines is a call, an
#: output or a hosted call, so a type the SDK adds fails the classification test below.
PLAIN = frozenset({"message", "reasoning", "compaction", "compaction_trigger", "item_reference", "additional_tools",
                   "configuration_update"})
#: Statuses the SDK's item schemas define for a run that is under way or done.
UNDER_WAY_OR_DONE = frozenset({"in_progress", "completed", "searching", "generating", "interpreting", "calling"})


def _unwrapped(tp: Any) -> Any:
    from typing import get_args, get_origin

    import typing_extensions as te

    while get_origin(tp) in (te.Required, te.NotRequired):
        tp = get_args(tp)[0]
    return tp


def _literals(tp: Any) -> list[Any]:
    """Return the values a ``Literal`` (or a union holding Literals) annotation allows."""
    import types
    from typing import Literal, Union, get_args, get_origin

    tp = _unwrapped(tp)
    if get_origin(tp) is Literal:
        return list(get_args(tp))
    if get_origin(tp) in (Union, types.UnionType):
        return [v for a in get_args(tp) for v in _literals(a)]
    return []


def _members() -> list[tuple[str, type]]:
    """Return ``(type, TypedDict)`` of every member of the SDK's input item union."""
    from typing import get_args, get_type_hints

    out = []
    for member in get_args(TResponseInputItem):
        for kind in _literals(get_type_hints(member, include_extras=True)["type"]):
            out.append((kind, member))
    return out


def test_every_item_type_of_the_sdk_s_union_is_a_call_an_output_a_hosted_call_or_plain() -> None:
    """Each ``type`` of TResponseInputItem is classified once; calls and outputs pair as the SDK pairs them."""
    from agents._tool_invocation import _TOOL_OUTPUT_TYPES
    from agents.run_internal.items import _TOOL_CALL_TO_OUTPUT_TYPE

    kinds = {kind for kind, _ in _members()}
    classes = [set(oa.CALLS), set(oa.OUTPUTS), set(oa.HOSTED), set(PLAIN)]
    assert set().union(*classes) == kinds
    assert sum(map(len, classes)) == len(kinds)  # no type in two classes
    sdk_pairs = {**_TOOL_CALL_TO_OUTPUT_TYPE, **{call: out for out, call in _TOOL_OUTPUT_TYPES.items()}}
    assert oa.CALLS == sdk_pairs


def test_calls_and_outputs_are_keyed_by_the_field_the_sdk_reads() -> None:
    """The id of each call and output is the one the SDK's tool-invocation identity reads from it."""
    from agents._tool_invocation import _TOOL_INVOCATION_TYPES, tool_invocation_call_id, tool_output_identity

    for call, output in oa.CALLS.items():
        key, out_key = oa.CALL_ID_FIELD.get(call, "call_id"), oa.CALL_ID_FIELD.get(output, "call_id")
        if call in _TOOL_INVOCATION_TYPES:
            assert tool_invocation_call_id({"type": call, key: "k"}) == (call, "k")
            assert tool_output_identity({"type": output, out_key: "k"}) == (call, "k")
        stored_call, stored_output = oa.event_of({"type": call, key: "k"}), oa.event_of({"type": output, out_key: "k"})
        assert isinstance(stored_call, cs.ToolCall) and stored_call.call_id == "k"
        assert isinstance(stored_output, cs.ToolResult) and stored_output.call_id == "k"


def test_every_status_the_sdk_s_schemas_define_is_read_as_a_failure_or_not() -> None:
    """An output or hosted call whose schema status says it failed or did not complete is failed; any other status is not."""
    from typing import get_type_hints

    for kind, member in _members():
        statuses = _literals(get_type_hints(member, include_extras=True).get("status", type(None)))
        assert set(statuses) <= UNDER_WAY_OR_DONE | oa.FAILED_STATUSES, (kind, statuses)
        if kind not in oa.OUTPUTS and kind not in oa.HOSTED:
            continue
        for status in statuses:
            event = oa.event_of({"type": kind, oa.CALL_ID_FIELD.get(kind, "call_id"): "k", "status": status})
            assert event.status == ("failed" if status in oa.FAILED_STATUSES else None), (kind, status)


def test_every_rejection_the_sdk_builds_is_a_rejected_result() -> None:
    """The SDK's own rejection items (function, program-called function, custom, shell, apply_patch, MCP) are rejected results."""
    from agents.run_internal.items import apply_patch_rejection_item, function_rejection_item, shell_rejection_item
    from openai.types.responses import ResponseFunctionToolCall

    from agents.run_internal import items as sdk_items

    # Every rejection builder the SDK has is one of these: a new one fails here until it is read.
    assert {n for n in dir(sdk_items) if n.endswith("_rejection_item")} == {
        "function_rejection_item", "shell_rejection_item", "apply_patch_rejection_item"}
    agent = Agent(name="a")
    call = ResponseFunctionToolCall(type="function_call", call_id="c", name="drop", arguments="{}")
    by_program = ResponseFunctionToolCall(type="function_call", call_id="c", name="drop", arguments="{}",
                                          caller={"type": "program", "caller_id": "p"})
    built = [
        function_rejection_item(agent, call),
        function_rejection_item(agent, by_program, output_json_schema={"type": "object"}),
        shell_rejection_item(agent, "c"),
        apply_patch_rejection_item(agent, "c"),
        apply_patch_rejection_item(agent, "c", output_type="custom_tool_call_output"),
    ]
    items = [_round_tripped(b.to_input_item()) for b in built]
    items += [{"type": "mcp_approval_response", "approval_request_id": "c", "approve": False},
              {"type": "mcp_approval_response", "approval_request_id": "c", "approve": False, "reason": "not on prod"}]
    assert '{"error":' in items[1]["output"]  # the SDK wrapped the program's rejection
    for item in items:
        event = oa.event_of(item)
        assert isinstance(event, cs.ToolResult) and (event.ok, event.status) == (False, "rejected"), item
    approved = oa.event_of({"type": "mcp_approval_response", "approval_request_id": "c", "approve": True})
    assert (approved.ok, approved.status) == (True, None)
    assert oa.event_of(items[-1]).output == "not on prod"  # the reason is the fact's text


def test_every_failure_form_the_sdk_writes_is_a_failed_result() -> None:
    """Default, timeout and not-found texts (wrapped for a program too), failed shell commands and hosted errors are failures."""
    from agents.run_internal.items import function_tool_error_output
    from agents.run_internal.turn_resolution import _default_tool_not_found_message
    from agents.tool import default_tool_timeout_error_message
    from openai.types.responses import ResponseFunctionToolCall

    from typing import get_type_hints

    from agents.run_config import ToolErrorFormatterArgs
    from agents.run_context import RunContextWrapper

    # The kinds of tool error the SDK writes a default text for: each is read below (a rejection above).
    kinds = _literals(get_type_hints(ToolErrorFormatterArgs, localns={"RunContextWrapper": RunContextWrapper})["kind"])
    assert set(kinds) == {"approval_rejected", "tool_not_found", "tool_exception"}
    by_program = ResponseFunctionToolCall(type="function_call", call_id="c", name="f", arguments="{}",
                                          caller={"type": "program", "caller_id": "p"})
    texts = [oa.DEFAULT_TOOL_ERROR, oa.DEFAULT_TOOL_ERROR + " Error: boom",
             default_tool_timeout_error_message(tool_name="f", timeout_seconds=2.5),
             _default_tool_not_found_message("nosuch")]
    texts += [function_tool_error_output(by_program, t, output_json_schema={"type": "object"}) for t in texts]
    failed = [{"type": kind, "call_id": "c", "output": t} for t in texts
              for kind in ("function_call_output", "custom_tool_call_output")]
    command = {"stdout": "", "stderr": "no such file"}
    failed += [
        {"type": "shell_call_output", "call_id": "c", "output": [{**command, "outcome": {"type": "exit", "exit_code": 2}}]},
        {"type": "shell_call_output", "call_id": "c", "output": [{**command, "outcome": {"type": "timeout"}}]},
        {"type": "shell_call_output", "call_id": "c", "output": [{**command, "outcome": "failure"}]},
        {"type": "shell_call_output", "call_id": "c",
         "output": [{"stdout": "ok", "outcome": {"type": "exit", "exit_code": 0}}, {**command, "exit_code": 1}]},
        {"type": "apply_patch_call_output", "call_id": "c", "status": "failed", "output": "patch does not apply"},
        {"type": "mcp_call", "id": "m", "name": "q", "arguments": "{}", "server_label": "s", "error": "denied"},
        {"type": "mcp_list_tools", "id": "m", "server_label": "s", "tools": [], "error": "unreachable"},
        {"type": "image_generation_call", "id": "i", "status": "completed", "error": {"code": "moderation"}},
    ]
    for item in failed:
        event = oa.event_of(item)
        assert event.status == "failed", item
        assert not isinstance(event, cs.ToolResult) or not event.ok
    fine = [{"type": "function_call_output", "call_id": "c", "output": "4"},
            {"type": "shell_call_output", "call_id": "c", "output": [{"stdout": "ok", "outcome": {"type": "exit", "exit_code": 0}}]},
            {"type": "mcp_call", "id": "m", "name": "q", "arguments": "{}", "server_label": "s", "output": "rows"},
            {"type": "apply_patch_call_output", "call_id": "c", "status": "completed", "output": "Updated a.txt"}]
    for item in fine:
        assert oa.event_of(item).status is None, item


def _round_tripped(item: Any) -> Item:
    return json.loads(json.dumps(item))


# A Hypothesis strategy for the SDK's input item union, read off its TypedDicts: every type,
# every field, ids drawn from a small set (empty included) so that calls and outputs pair.

_IDS = st.sampled_from(["c1", "c2", ""])
_ID_FIELDS = frozenset({"call_id", "id", "approval_request_id"})
#: Text an item may hold: the store refuses a NUL character (test_a_nul_in_an_item_is_refused_alike).
_TEXT = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
_JSON_SCALARS = st.none() | st.booleans() | st.integers(-3, 3) | st.text(_TEXT, max_size=6)


def _from_type(tp: Any, depth: int) -> st.SearchStrategy[Any]:
    """Return a strategy for JSON values of annotation ``tp``, nesting at most a few levels."""
    import collections.abc
    import types
    from typing import Literal, Union, get_args, get_origin

    from typing_extensions import is_typeddict

    tp = _unwrapped(tp)
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (Union, types.UnionType):
        return st.one_of([_from_type(a, depth) for a in args])
    if tp is type(None):
        return st.none()
    if tp is str:
        return st.text(_TEXT, max_size=6)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(-3, 3)
    if tp is float:
        return st.floats(-1e3, 1e3)
    if is_typeddict(tp):
        return _from_typeddict(tp, depth + 1)
    if origin in (list, collections.abc.Iterable, collections.abc.Sequence):
        return st.lists(_from_type(args[0], depth + 1), max_size=2) if depth < 4 else st.just([])
    if origin in (dict, collections.abc.Mapping) or tp is dict:
        return st.dictionaries(st.text(_TEXT, max_size=3), _JSON_SCALARS, max_size=2)
    return _JSON_SCALARS


def _from_typeddict(td: Any, depth: int) -> st.SearchStrategy[Item]:
    from typing import get_origin, get_type_hints

    import typing_extensions as te

    required, optional = {}, {}
    for name, hint in get_type_hints(td, include_extras=True).items():
        value = _IDS if name in _ID_FIELDS else _from_type(hint, depth)
        (required if get_origin(hint) is te.Required else optional)[name] = value
    return st.fixed_dictionaries(required, optional=optional if depth < 4 else {})


sdk_items = st.one_of([_from_typeddict(member, 0) for member in dict.fromkeys(m for _, m in _members())])


@given(st.lists(sdk_items, min_size=1, max_size=6))
@settings(max_examples=150, deadline=None)
def test_every_item_of_the_sdk_s_union_round_trips_and_is_the_event_its_type_makes_it(batch: list[Item]) -> None:
    """Any items of the union come back exactly; calls, outputs and turns are stored by type, negatives as facts."""
    with cs.open(":memory:") as store:
        session = CompactStoreSession("u", store)
        asyncio.run(session.add_items(batch))
        assert asyncio.run(session.get_items()) == _round_tripped(batch)
        records = list(session.log.scan())
        for item, record in zip(_round_tripped(batch), records, strict=True):
            kind, event = item.get("type"), record.event
            key = item.get(oa.CALL_ID_FIELD.get(kind, "call_id"))
            if kind in oa.CALLS and key:
                assert isinstance(event, cs.ToolCall) and event.call_id == key
            elif kind in oa.OUTPUTS and key:
                assert isinstance(event, cs.ToolResult) and event.call_id == key and event.ok == (event.status is None)
            else:
                assert isinstance(event, cs.Turn)
            negative = oa.tool_rejected(item) or oa.tool_failed(item)
            assert (event.status is not None) == (negative and (kind in oa.HOSTED or (kind in oa.OUTPUTS and bool(key))))
        node = session.log.compact(0, session.log.size)
        assert [f.pos for f in node.negative_facts] == [r.pos for r in records if r.event.status is not None]
        assert store.verify().ok


# --- real runs: what the SDK writes when a human declines a call, or a tool fails -------------


class _Editor:
    """An apply_patch editor whose updates fail and whose other operations succeed."""

    def update_file(self, operation: Any) -> Any:
        raise RuntimeError("patch does not apply")

    def create_file(self, operation: Any) -> Any:
        from agents.editor import ApplyPatchResult

        return ApplyPatchResult(output=f"Created {operation.path}")

    def delete_file(self, operation: Any) -> Any:
        from agents.editor import ApplyPatchResult

        return ApplyPatchResult(output=f"Deleted {operation.path}")


def _failing_executor(request: Any) -> str:
    raise RuntimeError("executor exploded")


@function_tool(needs_approval=True)
def drop_table(table: str) -> str:
    """Drop a table."""
    return f"dropped {table}"


@function_tool
def broken() -> str:
    """Always fail."""
    raise RuntimeError("broken")


def _scenarios() -> list[tuple[str, list[Any], Any]]:
    """Return ``(name, tools, model output)``: each makes the SDK write one rejection or failure."""
    from agents import ApplyPatchTool, CustomTool, HostedMCPTool, ShellTool
    from agents.testing import function_call
    from openai.types.responses import ResponseApplyPatchToolCall, ResponseCustomToolCall
    from openai.types.responses.response_output_item import McpApprovalRequest

    def shell(call_id: str) -> Any:
        return {"type": "shell_call", "id": call_id, "call_id": call_id, "status": "in_progress",
                "action": {"type": "exec", "commands": ["rm -rf build"], "timeout_ms": 1000}}

    def patch(call_id: str) -> Any:
        return ResponseApplyPatchToolCall(type="apply_patch_call", id=call_id, call_id=call_id, status="completed",
                                          operation={"type": "update_file", "path": "a.txt", "diff": "-a\n+b\n"})

    custom = CustomTool(name="deploy", description="Deploy.", on_invoke_tool=lambda ctx, text: "deployed",
                        needs_approval=True)
    mcp = HostedMCPTool(tool_config={"type": "mcp", "server_label": "db", "server_url": "http://db.invalid",
                                     "require_approval": "always"},
                        on_approval_request=lambda request: {"approve": False, "reason": "not on prod"})
    return [
        ("shell declined", [ShellTool(executor=_failing_executor, needs_approval=True)], shell("s1")),
        ("apply_patch declined", [ApplyPatchTool(editor=_Editor(), needs_approval=True)], patch("p1")),
        ("function declined", [drop_table], function_call("drop_table", {"table": "users"}, call_id="f1")),
        ("custom declined", [custom], ResponseCustomToolCall(type="custom_tool_call", name="deploy", call_id="u1",
                                                             input="prod")),
        ("MCP declined", [mcp], McpApprovalRequest(id="m1", type="mcp_approval_request", name="drop", arguments="{}",
                                                    server_label="db")),
        ("shell failed", [ShellTool(executor=_failing_executor)], shell("s2")),
        ("apply_patch failed", [ApplyPatchTool(editor=_Editor())], patch("p2")),
        ("function failed", [broken], function_call("broken", {}, call_id="f2")),
        ("tool not found", [broken], function_call("nosuch", {}, call_id="f3")),
    ]


async def _run_declining(session: Any, tools: list[Any], output: Any) -> None:
    """Run an agent whose model makes one call, declining every approval it asks for, then answers."""
    from agents.testing import ScriptedModel, assistant_message

    agent = Agent(name="ops", instructions="Operate.", tools=tools,
                  model=ScriptedModel(steps=[[output], [assistant_message("done")]]))
    config = RunConfig(tracing_disabled=True, tool_not_found_behavior="return_error_to_model")
    result = await Runner.run(agent, "go", session=session, run_config=config)
    while result.interruptions:
        state = result.to_state()
        for interruption in result.interruptions:
            state.reject(interruption)
        result = await Runner.run(agent, state, session=session, run_config=config)
    assert result.final_output == "done"


def test_what_real_runs_write_when_calls_are_declined_or_fail_is_kept_as_negative_facts(target: str) -> None:
    """Declined shell, apply_patch, function, custom and MCP calls are rejected; failed ones failed; a summary lists each with its text."""

    async def run() -> None:
        with cs.open(target) as store:
            pair = Pair(store, "ops")
            try:
                for _, tools, output in _scenarios():
                    for session in (pair.ours, pair.theirs):
                        await _run_declining(session, tools, output)
                await pair.check()  # the items are the SDK's, exactly
            finally:
                pair.close()
            log = pair.ours.log
            results = {e.call_id: e for e in (r.event for r in log.scan()) if isinstance(e, cs.ToolResult)}
            assert {k: (e.ok, e.status) for k, e in results.items()} == {
                **{k: (False, "rejected") for k in ("s1", "p1", "f1", "u1", "m1")},
                **{k: (False, "failed") for k in ("s2", "p2", "f2", "f3")},
            }
            node = log.compact(0, log.size)
            assert {f.pos for f in node.negative_facts} == {r.pos for r in log.scan() if r.event.status is not None}
            log.mark(node)
            with CompactStoreSession("ops", store, compaction=cs.CompactionPolicy()) as compacted:
                note = (await compacted.get_items())[0]
            assert note["role"] == "developer"
            lines = [line for line in note["content"].splitlines() if line.startswith("- pos ")]
            assert len(lines) == 9
            for text in ("Tool execution was not approved.", "not on prod", "executor exploded", "patch does not apply",
                         oa.DEFAULT_TOOL_ERROR, "Tool 'nosuch' not found."):
                assert any(text in line for line in lines), text
            assert store.verify().ok

    asyncio.run(run())


# --- session_settings, taken as every SDK session takes it -------------------------------


def test_session_settings_given_as_a_dict_are_coerced_and_a_run_reads_their_limit(store: cs.Store) -> None:
    """``session_settings={"limit": 1}`` becomes SessionSettings, as in SQLiteSession, and Runner.run uses it."""
    from agents.testing import ScriptedModel, assistant_message

    async def run() -> None:
        pair = Pair(store, session_settings={"limit": 1})
        try:
            assert pair.ours.session_settings == pair.theirs.session_settings == SessionSettings(limit=1)
            models = [ScriptedModel(steps=[[assistant_message("one")], [assistant_message("two")]]) for _ in range(2)]
            for session, model in zip((pair.ours, pair.theirs), models, strict=True):
                agent = Agent(name="a", model=model)
                for question in ("first?", "second?"):
                    await Runner.run(agent, question, session=session, run_config=RunConfig(tracing_disabled=True))
            assert [c.input for c in models[0].calls] == [c.input for c in models[1].calls]
            assert len(models[0].calls[-1].input) == 2  # the last stored item, then the new question
            await pair.check()
        finally:
            pair.close()

    asyncio.run(run())


def test_bad_session_settings_are_refused_naming_the_field_and_nothing_is_written(store: cs.Store) -> None:
    """An unknown key or a non-dict is an InvalidType (a TypeError, with the SDK's text); a bad value names its field."""
    from compactstore.errors import InvalidType

    for bad, text in (({"limitt": 1}, "Unknown session settings: limitt"), (5, "got int")):
        with pytest.raises(InvalidType) as info:
            CompactStoreSession("s", store, session_settings=bad)  # type: ignore[arg-type]
        assert isinstance(info.value, TypeError) and info.value.field == "session_settings" and text in str(info.value)
        with pytest.raises(TypeError, match=text):
            SQLiteSession("s", session_settings=bad)  # type: ignore[arg-type]
    with pytest.raises(cs.InvalidArgument) as value:
        CompactStoreSession("s", store, session_settings={"limit": "many"})
    assert value.value.field == "session_settings.limit"
    with pytest.raises(InvalidType) as policy:
        CompactStoreSession("s", store, compaction="often")  # type: ignore[arg-type]
    assert policy.value.field == "compaction"
    assert store.session("openai-agents:s").size == 0


def test_clear_session_gives_the_space_back_and_retain_last_drops_what_a_summary_stands_for(tmp_path: Any) -> None:
    import os

    path = os.path.join(str(tmp_path), "agents.db")

    async def run() -> tuple[int, int, int, bool]:
        s = CompactStoreSession("a", path, compaction=cs.CompactionPolicy(every=10, retain_last=6))
        for i in range(80):
            await s.add_items([{"role": "user", "content": f"hello {i} " + "x" * 3000},
                               {"role": "assistant", "content": f"hi {i}"}])
        dropped = sum(1 for r in s.log.scan() if r.kind == "dropped")
        items = await s.get_items()
        s.store.reclaim()
        before = os.path.getsize(path)
        await s.clear_session()
        after = os.path.getsize(path)
        ok = s.store.verify().ok and bool(items) and await s.get_items() == []
        s.close()
        return dropped, before, after, ok

    dropped, before, after, ok = asyncio.run(run())
    assert dropped > 100 and ok
    assert after < before, (before, after)
