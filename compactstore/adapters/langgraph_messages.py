"""A LangGraph thread's conversation as structured events: messages, tool calls and results, interrupts.

The saver records what a thread said beside its checkpoints, so that the gate,
compaction and markers see it as they see any session:

- a ``HumanMessage`` is a ``Turn`` of role ``user`` (``SystemMessage``: ``system``, a
  ``ChatMessage``: its own role);
- an ``AIMessage`` is a ``Turn`` of role ``assistant`` when it has text or no tool
  calls, and one ``ToolCall`` per tool call it makes, its ``call_id`` the tool call's id;
- a ``ToolMessage`` is the ``ToolResult`` closing its call; one whose ``status`` is
  ``"error"`` (what ``ToolNode`` writes for a tool that raised) is a failed result,
  ``ok=False, status="failed"``, a negative fact every summary must keep;
- an interrupt (``langgraph.types.interrupt``) is an open handle, a ``HandleOpened``
  named ``interrupt:<id>`` whose ``detail`` is the interrupt's value, closed by a
  ``HandleClosed`` once the thread moves past the checkpoint it paused at. Until then
  every summary lists it as ``UNRESOLVED``: a resumed model is told a human's answer is
  still awaited. A handle rather than an obligation, because an interrupt needs no
  binding: it is a question in flight, as an open tool call is.

Each event carries the message id (or interrupt id) in its ``meta``, so a message is
recorded once however often a checkpoint holding it is put again or replayed.
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage

from .. import events as ev

__all__ = ["INTERRUPT", "MESSAGE", "interrupt_closed", "interrupt_opened", "message_events", "message_id"]

#: ``meta`` key of an event recorded from a message: the message's id.
MESSAGE = "langgraph:message"
#: ``meta`` key of a handle event recorded for an interrupt: the interrupt's id.
INTERRUPT = "langgraph:interrupt"


def message_id(message: object) -> str | None:
    """Return the id of a LangChain message, or None when it is no message or has no id."""
    if isinstance(message, BaseMessage) and isinstance(message.id, str) and message.id:
        return message.id
    return None


def message_events(message: BaseMessage) -> list[ev.Event]:
    """Return the events that record ``message`` (see the module's docstring); none for an unknown kind or no id."""
    mid = message_id(message)
    if mid is None:
        return []
    meta: dict[str, ev.JSON] = {MESSAGE: mid}
    text = message.content if isinstance(message.content, str) else str(message.text)
    if isinstance(message, ToolMessage):
        failed = message.status == "error"
        return [ev.ToolResult(call_id=message.tool_call_id, output=text, ok=not failed,
                              status="failed" if failed else None, meta=meta)]
    if isinstance(message, AIMessage):
        out: list[ev.Event] = []
        if text or not message.tool_calls:
            out.append(ev.Turn(role="assistant", content=text, meta=meta))
        for n, call in enumerate(message.tool_calls):
            args = _plain(call.get("args") or {})
            out.append(ev.ToolCall(call_id=call.get("id") or f"{mid}#{n}", name=call["name"],
                                   args=args if isinstance(args, dict) else {"args": args}, meta=meta))
        return out
    if isinstance(message, HumanMessage):
        role = "user"
    elif isinstance(message, SystemMessage):
        role = "system"
    elif isinstance(message, ChatMessage):
        role = message.role
    else:
        role = message.type
    return [ev.Turn(role=role, content=text, meta=meta)]


def interrupt_opened(interrupt_id: str, value: Any, ns: str, checkpoint: str) -> ev.HandleOpened:
    """Return the open handle that records interrupt ``interrupt_id`` asking ``value``.

    ``meta["at"]`` names the namespace and checkpoint the thread paused at: the handle
    is closed when a checkpoint after that one is put.
    """
    detail = value if isinstance(value, str) else json.dumps(_plain(value), ensure_ascii=False, sort_keys=True)
    return ev.HandleOpened(handle=f"interrupt:{interrupt_id}", resource="other", detail=detail,
                           meta={INTERRUPT: interrupt_id, "at": [ns, checkpoint]})


def interrupt_closed(interrupt_id: str) -> ev.HandleClosed:
    """Return the event that closes the handle of interrupt ``interrupt_id``."""
    return ev.HandleClosed(handle=f"interrupt:{interrupt_id}", meta={INTERRUPT: interrupt_id})


def _plain(value: Any) -> ev.JSON:
    """Return ``value`` as plain JSON: anything JSON cannot carry as its text, NaN and infinities included."""
    try:
        out: ev.JSON = json.loads(json.dumps(value, allow_nan=False, default=str))
    except (TypeError, ValueError):
        return str(value)
    return out
