"""The LangGraph memory loop: a thread's conversation as structured events, compaction after puts, the compacted context fed back."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph.prebuilt", reason="the test extra (langgraph) is not installed")

from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode, create_react_agent  # noqa: E402
from langgraph.types import Command, interrupt  # noqa: E402

import compactstore as cs  # noqa: E402
import provider  # noqa: E402
from compactstore import events as ev  # noqa: E402
from compactstore.adapters.langgraph import CompactStoreSaver  # noqa: E402
from compactstore.adapters.langgraph_messages import MESSAGE  # noqa: E402

#: create_react_agent moved to the langchain package (create_agent) in LangGraph 1.0; it still works, with this
#: warning, and the pre-model hook is tested with it. create_agent with the middleware is in test_langgraph_agent.py.
OLD_AGENT = "ignore:create_react_agent has been moved:langgraph.warnings.LangGraphDeprecatedSinceV10"


@tool
def flaky(n: int) -> int:
    """Fail for every third step, else echo ``n``."""
    if n % 3 == 0:
        raise RuntimeError(f"step {n} failed: lock timeout on users")
    return n


class Looping(BaseChatModel):
    """A chat model without a network: calls ``flaky`` once per question, then answers; records every input."""

    inputs: list[list[BaseMessage]] = []
    calls: int = 0

    @property
    def _llm_type(self) -> str:
        return "looping"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        self.inputs.append(list(messages))
        provider.check_langchain(messages)
        last = messages[-1]
        if isinstance(last, ToolMessage):
            out = AIMessage(content=f"done: {last.content}")
        else:
            self.calls += 1
            n = self.calls
            out = AIMessage(content="", tool_calls=[{"name": "flaky", "args": {"n": n}, "id": f"call-{n}"}])
        return ChatResult(generations=[ChatGeneration(message=out)])


def agent(saver: CompactStoreSaver, model: Looping) -> Any:
    """Return a ReAct agent over ``flaky`` whose model is fed the thread's compacted context."""
    return create_react_agent(model, ToolNode([flaky], handle_tool_errors=True),
                              pre_model_hook=saver.context_hook(), checkpointer=saver)


def _conversation(session: cs.Session) -> list[ev.Event]:
    return [r.event for r in session.scan() if r.event.meta and MESSAGE in r.event.meta]


@pytest.mark.filterwarnings(OLD_AGENT)
def test_messages_tool_calls_and_tool_errors_are_recorded_once_beside_the_checkpoints(store: cs.Store) -> None:
    """Each message is a turn, tool call or result, a tool error a failed result, recorded once however often it is put."""
    saver = CompactStoreSaver(store)
    app = agent(saver, Looping())
    config = {"configurable": {"thread_id": "t"}}
    for q in range(4):
        app.invoke({"messages": [HumanMessage(f"question {q}")]}, config)
    session = saver.session("t")
    said = _conversation(session)
    kinds = [(type(e).__name__, getattr(e, "role", None)) for e in said]
    assert kinds == [("Turn", "user"), ("ToolCall", None), ("ToolResult", None), ("Turn", "assistant")] * 4
    results = [e for e in said if isinstance(e, ev.ToolResult)]
    assert [(r.call_id, r.ok, r.status) for r in results] == [
        ("call-1", True, None), ("call-2", True, None), ("call-3", False, "failed"), ("call-4", True, None)]
    assert "lock timeout on users" in str(results[2].output)
    state = app.get_state(config).values["messages"]
    assert len({e.meta[MESSAGE] for e in said}) == len(state) == 16
    # Recording the thread's messages again, or replaying a checkpoint, records nothing twice.
    size = session.size
    assert saver.record_messages("t", state) == []
    assert CompactStoreSaver(store).record_messages("t", state) == []  # another saver, reading the log afresh
    assert session.size == size
    # Replaying from an earlier checkpoint records only the messages the replay made anew.
    earlier = list(app.get_state_history(config))[3].config
    app.invoke(None, earlier)
    again = _conversation(session)
    assert len(again) > len(said) and len({(e.meta[MESSAGE], e.kind) for e in again}) == len(again)
    assert {m.id for m in app.get_state(config).values["messages"]} <= {e.meta[MESSAGE] for e in again}
    assert store.verify().ok


class Asking(TypedDict):
    log: Annotated[list[str], operator.add]


def test_an_interrupt_is_an_open_handle_until_the_thread_moves_past_it(store: cs.Store) -> None:
    """Paused at an interrupt, a compaction lists it UNRESOLVED; once resumed its handle is closed."""
    builder = StateGraph(Asking)
    builder.add_node("ask", lambda s: {"log": [str(interrupt({"question": "apply migration 003?"}))]})
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    saver = CompactStoreSaver(store)
    app = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "i"}}
    app.invoke({"log": []}, config)
    session = saver.session("i")
    [opened] = [r for r in session.scan() if isinstance(r.event, ev.HandleOpened)]
    assert opened.event.handle.startswith("interrupt:") and "apply migration 003?" in opened.event.detail
    node = session.compact(0, session.size)
    assert [(i.kind, i.pos) for i in node.unresolved] == [("handle", opened.pos)]
    app.invoke(Command(resume="yes"), config)
    closed = [r.event for r in session.scan() if isinstance(r.event, ev.HandleClosed)]
    assert [c.handle for c in closed] == [opened.event.handle]
    app.invoke(Command(resume="yes"), config)  # nothing pending: nothing more recorded
    assert len([r for r in session.scan() if isinstance(r.event, ev.HandleClosed)]) == 1


POLICY = cs.CompactionPolicy(every=24, roll_up_every=3,
                             summarizer=lambda records: f"{len(records)} records summarized")


@pytest.mark.filterwarnings(OLD_AGENT)
def test_a_react_agent_after_a_restart_is_fed_the_compacted_context(target: str) -> None:
    """After 30 questions and a restart, the model's input is the summary note (loss class, failures) and the raw tail."""
    with CompactStoreSaver(target, compaction=POLICY) as saver:
        app = agent(saver, Looping())
        config = {"configurable": {"thread_id": "loop"}}
        for q in range(30):
            app.invoke({"messages": [HumanMessage(f"question {q}")]}, config)
        assert saver.maintenance is not None and not saver.maintenance.refused
        state = app.get_state(config).values["messages"]
    model = Looping(calls=30)
    with CompactStoreSaver(target, compaction=POLICY) as saver:  # a new process: the store is reopened
        app = agent(saver, model)
        app.invoke({"messages": [HumanMessage("question 30")]}, config)
    first = model.inputs[0]
    notes = [m for m in first if isinstance(m, SystemMessage)]
    assert notes and notes[0].content.startswith("[summary L2") and "loss class LOSSY_GIST" in notes[0].content
    negatives = notes[0].content.split("Negative facts")[1]
    assert "call-3 failed: Error: RuntimeError('step 3 failed: lock timeout on users')" in negatives  # a tool error
    assert first[-1].content == "question 30"
    tail = [m for m in first if not isinstance(m, SystemMessage)]
    assert tail and all(isinstance(m, HumanMessage | AIMessage | ToolMessage) for m in tail)
    assert len(first) < len(state) / 4
    with cs.open(target) as store:
        raw = [r for r in store.session("langgraph:loop").scan() if r.kind not in ev.DERIVED_KINDS]
        assert sum(len(r.body) for r in raw) > 20 * sum(len(str(m.content)) for m in first)
        assert store.verify().ok


def test_an_async_summarizer_is_awaited_after_aput(store: cs.Store) -> None:
    """With an ``async def`` summarizer the policy runs after each aput, through ainvoke."""
    seen: list[int] = []

    async def summarize(records: Sequence[cs.Record]) -> str:
        seen.append(len(records))
        return "summary"

    builder = StateGraph(Asking)
    builder.add_node("step", lambda s: {"log": ["x"]})
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    saver = CompactStoreSaver(store, compaction=cs.CompactionPolicy(every=10, summarizer=summarize))
    app = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "a"}}

    async def run() -> None:
        for _ in range(5):
            await app.ainvoke({"log": []}, config)

    asyncio.run(run())
    assert seen and saver.session("a").context().mode == "certified"
    with pytest.raises(cs.errors.InvalidArgument, match="summarizer"):
        app.invoke({"log": []}, config)
