"""The Agents SDK's recall tool: a model run by the SDK's Runner reaches a spilled literal its compacted input names by handle."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

pytest.importorskip("agents", reason="the test extra (openai-agents) is not installed")

from agents import Agent, FunctionTool, RunConfig, Runner  # noqa: E402
from agents.items import ModelResponse  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402
from agents.usage import Usage  # noqa: E402
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText  # noqa: E402

import compactstore as cs  # noqa: E402
import provider  # noqa: E402
from compactstore import render  # noqa: E402
from compactstore.adapters.openai_agents import CompactStoreSession  # noqa: E402

LONG = {"files": [f"migrations/{i:03}_down.sql" for i in range(20)]}
TOLD = re.compile(rf"call the {render.RECALL_TOOL} tool with (spill:\d+)")


class Recalling(Model):
    """A model without a network: recalls the handle its note tells it to, once, else answers; records its inputs."""

    def __init__(self) -> None:
        self.inputs: list[list[Any]] = []
        self.recalled: list[str] = []

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any, tools: Any,  # noqa: A002
                           output_schema: Any, handoffs: Any, tracing: Any, **kwargs: Any) -> ModelResponse:
        items = list(input) if isinstance(input, list) else [{"role": "user", "content": input}]
        self.inputs.append(items)
        provider.check(items, "openai-responses")
        told = next((m for i in items if i.get("role") == "developer" and (m := TOLD.search(str(i["content"])))), None)
        last = items[-1]
        if told is not None and told.group(1) not in self.recalled and last.get("type") != "function_call_output":
            self.recalled.append(told.group(1))
            out: list[Any] = [ResponseFunctionToolCall(
                id="f", type="function_call", call_id=f"call-{len(self.inputs)}", name=render.RECALL_TOOL,
                arguments=f'{{"handle": "{told.group(1)}"}}')]
        else:
            said = last.get("output") or last.get("content")
            out = [ResponseOutputMessage(id="m", type="message", role="assistant", status="completed",
                                         content=[ResponseOutputText(type="output_text", text=f"ok: {said}"[:80],
                                                                     annotations=[])])]
        return ModelResponse(output=out, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def test_a_runner_model_recalls_a_spilled_literal_through_the_session_s_recall_tool(target: str) -> None:
    """The note names the long literal by handle (the short one verbatim); the model calls recall and reads it whole."""
    config = RunConfig(tracing_disabled=True)
    model = Recalling()

    async def run() -> list[Any]:
        with CompactStoreSession("recall", target, compaction=cs.CompactionPolicy(every=6, roll_up_every=None,
                                                                                  summarizer=lambda r: "work")) as s:
            agent = Agent(name="migrator", instructions="Migrate.", tools=[s.recall_tool()], model=model)
            await Runner.run(agent, "Start.", session=s, run_config=config)
            s.log.bind("manifest", LONG)
            s.log.bind("rollback", "migrations/003_down.sql")
            s.log.oblige("ship", ["manifest", "rollback"])
            for q in range(6):
                await Runner.run(agent, f"question {q}", session=s, run_config=config)
            return list(s.log.scan())

    records = asyncio.run(run())
    assert model.recalled
    note = next(str(i["content"]) for items in model.inputs for i in items
                if i.get("role") == "developer" and TOLD.search(str(i["content"])))
    assert '- ship needs rollback = "migrations/003_down.sql" (spill:' in note
    (output,) = [r.event for r in records if isinstance(r.event, cs.ToolResult)]
    assert str(output.output).startswith(f"{model.recalled[0]} = {cs.events.encode_json(LONG)}\n") and output.ok


def test_the_recall_tool_is_a_function_tool_that_answers_a_bad_handle_with_its_refusal(store: cs.Store) -> None:
    """session.recall_tool() is a FunctionTool named recall taking one handle; a malformed handle comes back as text."""
    session = CompactStoreSession("t", store)
    session.log.append(cs.Turn("user", "hi"))
    tool = session.recall_tool()
    assert isinstance(tool, FunctionTool) and tool.name == render.RECALL_TOOL
    assert list(tool.params_json_schema["properties"]) == ["handle"]

    async def call(handle: str) -> Any:
        arguments = f'{{"handle": "{handle}"}}'
        context = ToolContext(context=None, tool_name=tool.name, tool_call_id="r1", tool_arguments=arguments)
        return await tool.on_invoke_tool(context, arguments)

    assert asyncio.run(call("pos:0")).startswith("pos:0, proven in the sealed head of size 1")
    assert asyncio.run(call("pos:-1")).startswith("refused: invalid handle: ")
    assert session.log.size == 1
