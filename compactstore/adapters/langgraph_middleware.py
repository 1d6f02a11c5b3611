"""A LangChain ``create_agent`` middleware that feeds the model a thread's compacted context.

``CompactStoreSaver.middleware()`` returns one; this module imports ``langchain`` (v1),
which only that method needs, so the checkpointer itself works without it:

    agent = create_agent(model, tools, middleware=[saver.middleware()], checkpointer=saver)

Before each model call, :class:`ContextMiddleware` records the request's messages in
the thread's session and replaces them by the thread's compacted context
(:meth:`CompactStoreSaver.context_messages`); the system content that context starts
with (the note: summaries, what was logged outside them, the literals open obligations
need) is joined to the end of the agent's own system message, so the model gets one
system message, then a conversation that starts with a user message. The agent's state
keeps every message. It registers the recall tool the note names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import AnyMessage, SystemMessage
from langchain_core.tools import BaseTool
from langgraph.config import get_config

__all__ = ["ContextMiddleware", "ContextSource"]


class ContextSource(Protocol):
    """What gives a thread's model input: :class:`compactstore.adapters.langgraph.CompactStoreSaver`."""

    def context_messages(self, thread_id: str, messages: Sequence[Any] = ()) -> list[Any]:
        """Return the thread's model input, ``messages`` recorded first."""
        ...

    async def acontext_messages(self, thread_id: str, messages: Sequence[Any] = ()) -> list[Any]:
        """Async :meth:`context_messages`."""
        ...


class ContextMiddleware(AgentMiddleware):
    """Feeds a ``create_agent`` model the compacted context of the run's thread, through a ``CompactStoreSaver``.

    Args:
        saver: the ``CompactStoreSaver`` whose store holds the thread (the agent's checkpointer, usually).
        thread_id: the thread; None takes the run config's ``thread_id``.
        tools: tools to register with the agent (the saver's recall tool).
    """

    def __init__(self, saver: ContextSource, thread_id: str | None = None, tools: Sequence[BaseTool] = ()) -> None:
        self.saver = saver
        self.thread_id = thread_id
        self.tools = list(tools)

    @property
    def name(self) -> str:
        """Return the middleware's name in the agent's graph."""
        return "CompactStoreContext"

    def wrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]) -> Any:
        """Call the model with the thread's compacted context in place of the request's messages."""
        context = self.saver.context_messages(self._thread(), request.messages)
        return handler(_with(request, context))

    async def awrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]],
    ) -> Any:
        """Async :meth:`wrap_model_call`: the store is read in a worker thread."""
        context = await self.saver.acontext_messages(self._thread(), request.messages)
        return await handler(_with(request, context))

    def _thread(self) -> str:
        if self.thread_id is not None:
            return self.thread_id
        return str(get_config()["configurable"]["thread_id"])


def _with(request: ModelRequest, context: list[AnyMessage]) -> ModelRequest:
    """Return ``request`` with ``context``'s conversation as its messages, its leading system content joined to the system message."""
    n = 0
    while n < len(context) and isinstance(context[n], SystemMessage):
        n += 1
    if n == 0:
        return request.override(messages=context)
    given = [*([request.system_message] if request.system_message is not None else []), *context[:n]]
    if all(isinstance(m.content, str) for m in given):
        system = SystemMessage(content="\n\n".join(str(m.content) for m in given))
    else:
        blocks: list[str | dict[str, Any]] = []
        for m in given:
            blocks += [{"type": "text", "text": m.content}] if isinstance(m.content, str) else list(m.content)
        system = SystemMessage(content=blocks)
    return request.override(messages=context[n:], system_message=system)
