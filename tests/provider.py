"""What the OpenAI Chat Completions, OpenAI Responses and Anthropic Messages APIs accept as input, as one validator.

:func:`violations` checks a list of chat messages (``"chat"``) or Responses input items
(``"openai-responses"``) against the rules all three APIs share, once a framework has
converted them to its provider's shape (LangChain and the Agents SDK move leading
system content into Anthropic's ``system`` field, and tool messages into user turns):

1. ``roles``: a chat message's role is ``system``, ``developer``, ``user``,
   ``assistant`` or ``tool``; a Responses message's one of the first four.
2. ``system-first``: system and developer content only at the start, before any other message.
3. ``user-first``: the first message after it is a user message (Anthropic refuses
   any other), so the input holds a user message.
4. ``text``: a system, developer, user or assistant message has text that is not only
   whitespace, or (an assistant message in chat) tool calls.
5. ``call-ids``: a tool call has a name, an id that no other call of the input has,
   made of ``[A-Za-z0-9_-]`` (Anthropic's pattern), and arguments that are the JSON
   text of an object (Anthropic's ``input`` is one).
6. ``paired``: the calls of one assistant turn are answered right after it, before
   any other message, by exactly one result each; no result without the call before
   it. In Responses input a run of ``function_call`` items is one assistant turn and
   the ``function_call_output`` items right after it its results.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Literal

from langchain_core.messages import BaseMessage, convert_to_openai_messages

Format = Literal["chat", "openai-responses"]

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MESSAGE_ROLES = frozenset({"system", "developer", "user", "assistant"})
SYSTEM = frozenset({"system", "developer"})
CALL_ID = re.compile(r"[A-Za-z0-9_-]+")


def violations(messages: Sequence[dict[str, Any]], format: Format) -> list[str]:  # noqa: A002
    """Return each rule the input breaks, as ``"<rule> at [i]: what"``; empty when a provider accepts it."""
    out: list[str] = []
    if format == "chat":
        chat = list(messages)
        out += [f"roles at [{i}]: role {m.get('role')!r}" for i, m in enumerate(chat) if m.get("role") not in CHAT_ROLES]
    else:
        out += [f"roles at item [{i}]: role {m.get('role')!r}" for i, m in enumerate(messages)
                if m.get("type", "message") == "message" and m.get("role") not in MESSAGE_ROLES]
        chat = _as_turns(messages)  # indices below are of its turns
    if not chat:
        return ["user-first at [0]: the input is empty"]
    first = next((i for i, m in enumerate(chat) if m.get("role") not in SYSTEM), None)
    if first is None:
        out.append(f"user-first at [{len(chat)}]: no message after the system content")
    else:
        if chat[first].get("role") != "user":
            out.append(f"user-first at [{first}]: the first message after the system content is {chat[first].get('role')!r}")
        out += [f"system-first at [{i}]: {m['role']} message after the conversation started"
                for i, m in enumerate(chat[first:], first) if m.get("role") in SYSTEM]
    seen: set[str] = set()
    pending: list[str] = []
    for i, m in enumerate(chat):
        role = m.get("role")
        calls = m.get("tool_calls") or []
        if role == "tool":
            cid = m.get("tool_call_id")
            if cid in pending:
                pending.remove(cid)
            else:
                out.append(f"paired at [{i}]: result for {cid!r}, which the turn before does not call (or answered)")
            if not isinstance(m.get("content"), str | list):
                out.append(f"text at [{i}]: a tool result's content is {type(m.get('content')).__name__}")
            continue
        if pending:
            out.append(f"paired at [{i}]: calls {pending} are not answered before this {role} message")
            pending = []
        if role in MESSAGE_ROLES and not _has_text(m.get("content")) and not (role == "assistant" and calls):
            out.append(f"text at [{i}]: a {role} message without text")
        for c in calls:
            out += _call_problems(i, c, seen)
            pending.append(c.get("id"))
    if pending:
        out.append(f"paired at [{len(chat)}]: calls {pending} are never answered")
    return out


def check(messages: Sequence[dict[str, Any]], format: Format) -> None:  # noqa: A002
    """Assert that a provider accepts ``messages``, listing every rule broken."""
    found = violations(messages, format)
    assert not found, "\n".join(found) + "\n" + json.dumps(list(messages), indent=1, default=str)[:4000]


def check_langchain(messages: Sequence[BaseMessage]) -> None:
    """Assert that a provider accepts LangChain messages, as LangChain writes them for OpenAI's chat API."""
    check(convert_to_openai_messages(list(messages)), "chat")


def _call_problems(i: int, call: dict[str, Any], seen: set[str]) -> list[str]:
    out = []
    cid, fn = call.get("id"), call.get("function") or {}
    if not isinstance(cid, str) or not CALL_ID.fullmatch(cid):
        out.append(f"call-ids at [{i}]: id {cid!r}")
    elif cid in seen:
        out.append(f"call-ids at [{i}]: id {cid!r} used by an earlier call")
    else:
        seen.add(cid)
    if not fn.get("name"):
        out.append(f"call-ids at [{i}]: call {cid!r} has no name")
    try:
        args = json.loads(fn.get("arguments"))
    except (TypeError, ValueError):
        args = None
    if not isinstance(args, dict):
        out.append(f"call-ids at [{i}]: call {cid!r} has arguments {fn.get('arguments')!r}, not a JSON object")
    return out


def _has_text(content: Any) -> bool:
    if isinstance(content, str):
        return bool(content.strip())
    if isinstance(content, list):
        return any(not isinstance(p, dict) or not isinstance(p.get("text"), str) or p["text"].strip() for p in content)
    return False


def _as_turns(items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return Responses input items as chat turns: a run of function calls one assistant turn, each output a tool turn.

    Items of other types (reasoning, and the like) are assistant-side: they open no turn
    of their own and break no run.
    """
    out: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message" or ("role" in item and "type" not in item):
            out.append({"role": item.get("role"), "content": item.get("content")})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            if out and out[-1].get("role") == "assistant" and out[-1].get("tool_calls") and out[-1].get("run"):
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call], "run": True})
        elif kind == "function_call_output":
            if out and out[-1].get("run"):
                out[-1]["run"] = False
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": item.get("output")})
    for m in out:
        m.pop("run", None)
    return out
