"""LangChain v1's create_agent with the saver's middleware: the compacted context fed as valid input, the recall tool, setup()."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("langchain.agents", reason="the test extra (langchain>=1) is not installed")

from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from langchain.agents import create_agent  # noqa: E402
from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.tools import StructuredTool, ToolException  # noqa: E402

import compactstore as cs  # noqa: E402
import provider  # noqa: E402
import strategies  # noqa: E402
from compactstore import render  # noqa: E402
from compactstore.adapters.langgraph import CompactStoreSaver  # noqa: E402

POLICY = cs.CompactionPolicy(every=24, roll_up_every=3, summarizer=lambda records: f"{len(records)} records summarized")
LONG = {"files": [f"migrations/{i:03}_down.sql" for i in range(20)]}
#: A spill handle the note tells the model to recall.
TOLD = re.compile(rf"call the {render.RECALL_TOOL} tool with (spill:\d+)")


def _flaky(n: int) -> int:
    """Fail for every third step, else echo ``n``."""
    if n % 3 == 0:
        raise ToolException(f"step {n} failed: lock timeout on users")
    return n


flaky = StructuredTool.from_function(_flaky, name="flaky", handle_tool_error=True)


class Agentic(BaseChatModel):
    """A chat model without a network: recalls what its note tells it to, else calls ``flaky`` once per question.

    It records every input it gets, and checks each against the provider rules.
    """

    inputs: list[list[BaseMessage]] = []
    tools: list[str] = []
    calls: int = 0
    recalled: list[str] = []

    @property
    def _llm_type(self) -> str:
        return "agentic"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        self.tools = [getattr(t, "name", "") for t in tools]
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        self.inputs.append(list(messages))
        provider.check_langchain(messages)
        last = messages[-1]
        told = TOLD.search(str(messages[0].content)) if isinstance(messages[0], SystemMessage) else None
        self.calls += 1
        n = self.calls
        if isinstance(last, ToolMessage):
            out = AIMessage(content=f"done: {last.content}")
        elif told is not None and told.group(1) not in self.recalled:
            self.recalled.append(told.group(1))
            out = AIMessage(content="", tool_calls=[{"name": render.RECALL_TOOL, "args": {"handle": told.group(1)},
                                                     "id": f"call-{n}"}])
        else:
            out = AIMessage(content="", tool_calls=[{"name": "flaky", "args": {"n": n}, "id": f"call-{n}"}])
        return ChatResult(generations=[ChatGeneration(message=out)])


def agent(saver: CompactStoreSaver, model: Agentic) -> Any:
    """Return a create_agent agent over ``flaky`` whose model is fed the thread's compacted context."""
    return create_agent(model, [flaky], system_prompt="You migrate databases.", middleware=[saver.middleware()],
                        checkpointer=saver)


CONFIG: Any = {"configurable": {"thread_id": "loop"}}


def test_create_agent_after_a_restart_is_fed_one_system_message_then_the_conversation(target: str) -> None:
    """After 30 questions and a restart, the model gets its prompt and the note as one system message, then valid turns."""
    with CompactStoreSaver(target, compaction=POLICY) as saver:
        app = agent(saver, Agentic())
        for q in range(30):
            app.invoke({"messages": [HumanMessage(f"question {q}")]}, CONFIG)
        state = app.get_state(CONFIG).values["messages"]
    model = Agentic()
    with CompactStoreSaver(target, compaction=POLICY) as saver:  # a new process: the store is reopened
        app = agent(saver, model)
        app.invoke({"messages": [HumanMessage("question 30")]}, CONFIG)
    assert model.tools == [render.RECALL_TOOL, "flaky"] or sorted(model.tools) == sorted([render.RECALL_TOOL, "flaky"])
    first = model.inputs[0]
    system, *rest = first
    assert isinstance(system, SystemMessage) and not any(isinstance(m, SystemMessage) for m in rest)
    assert str(system.content).startswith("You migrate databases.\n\n[summary L2")
    assert "call-3 failed: step 3 failed: lock timeout on users" in str(system.content)
    assert isinstance(rest[0], HumanMessage) and rest[-1].content == "question 30"
    assert len(first) < len(state) / 4
    for later in model.inputs[1:]:
        assert isinstance(later[-1], ToolMessage) and later[-1].tool_call_id == later[-2].tool_calls[0]["id"]  # type: ignore[attr-defined]


def test_the_model_reaches_a_spilled_literal_through_the_recall_tool(target: str) -> None:
    """A long literal an open obligation needs is named in the note by handle; the model recalls it and reads it whole."""
    with CompactStoreSaver(target, compaction=POLICY) as saver:
        model = Agentic()
        app = agent(saver, model)
        app.invoke({"messages": [HumanMessage("question 0")]}, CONFIG)
        session = saver.session("loop")
        session.bind("manifest", LONG)
        session.bind("rollback", "migrations/003_down.sql")
        session.oblige("ship", ["manifest", "rollback"])
        for q in range(1, 12):
            app.invoke({"messages": [HumanMessage(f"question {q}")]}, CONFIG)
        assert model.recalled, "the note named a handle to recall"
        note = next(str(i[0].content) for i in model.inputs if TOLD.search(str(i[0].content)))
        assert '- ship needs rollback = "migrations/003_down.sql" (spill:' in note  # short: verbatim
        (answer,) = [m for m in app.get_state(CONFIG).values["messages"]
                     if isinstance(m, ToolMessage) and m.name == render.RECALL_TOOL]
        assert answer.content.startswith(f"{model.recalled[0]} = {cs.events.encode_json(LONG)}\n")
        assert "proven in the sealed head of size" in answer.content and answer.status == "success"
        assert saver.store.verify().ok


def test_ainvoke_feeds_the_same_context_through_the_async_path(store: cs.Store) -> None:
    """Under ainvoke the middleware awaits acontext_messages and the recall tool runs async; inputs stay valid."""
    saver = CompactStoreSaver(store, compaction=POLICY)
    model = Agentic()
    app = agent(saver, model)

    async def run() -> None:
        for q in range(20):
            await app.ainvoke({"messages": [HumanMessage(f"question {q}")]}, CONFIG)
        messages = (await app.aget_state(CONFIG)).values["messages"]
        assert await saver.acontext_messages("loop", messages) == saver.context_messages("loop", messages)

    asyncio.run(run())
    assert any(str(i[0].content).startswith("You migrate databases.\n\n[summary") for i in model.inputs)


def test_the_recall_tool_refuses_a_bad_handle_as_an_error_result(store: cs.Store) -> None:
    """A malformed handle comes back to the model as an error ToolMessage naming the handle; nothing is written."""
    saver = CompactStoreSaver(store)
    saver.session("t").append(cs.Turn("user", "hi"))
    tool = saver.recall_tool()
    config: Any = {"configurable": {"thread_id": "t"}}
    call = {"name": render.RECALL_TOOL, "args": {"handle": "pos:²"}, "id": "r1", "type": "tool_call"}
    refused = tool.invoke(call, config)
    assert isinstance(refused, ToolMessage) and refused.status == "error" and "invalid handle" in refused.content
    assert tool.invoke({"handle": "pos:0"}, config).startswith("pos:0, proven in the sealed head of size 1")
    assert saver.recall_tool("t").invoke({"handle": "pos:0"}) == tool.invoke({"handle": "pos:0"}, config)
    assert saver.session("t").size == 1


def test_setup_works_called_as_the_sync_savers_do_and_awaited_as_the_async_ones_do(target: str) -> None:
    """saver.setup() and await saver.setup() both return at once; on a closed store setup raises StoreClosed."""
    saver = CompactStoreSaver.from_conn_string(target)
    saver.setup()

    async def run() -> None:
        await saver.setup()
        await saver.asetup()

    asyncio.run(run())
    saver.close()
    with pytest.raises(cs.StoreClosed):
        saver.setup()


@given(conversation=strategies.langchain_conversations(), policy=strategies.policies())
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_random_conversation_is_fed_back_as_input_every_provider_accepts(
        conversation: list[BaseMessage], policy: cs.CompactionPolicy) -> None:
    """Recorded a piece at a time and compacted in between, a valid conversation always comes back valid."""
    with CompactStoreSaver(":memory:") as saver:
        for stop in range(1, len(conversation) + 1, 3):
            held = conversation[:stop]
            calls = {c["id"] for m in held if isinstance(m, AIMessage) for c in m.tool_calls}
            if calls - {m.tool_call_id for m in held if isinstance(m, ToolMessage)}:
                continue  # the model is never called while a tool round is unanswered
            fed = saver.context_messages("t", held)
            event("certified" if saver.session("t").context().mode == "certified" else "fallback")
            provider.check_langchain(fed)
            saver.session("t").maintain(policy)
