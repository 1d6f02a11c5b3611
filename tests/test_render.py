"""A resumed context as model input: OpenAI Responses items and chat messages, as the SDK and LangChain read them."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("agents", reason="the test extra (openai-agents) is not installed")
pytest.importorskip("langchain_core", reason="the test extra (langgraph) is not installed")

from agents.models.chatcmpl_converter import Converter  # noqa: E402
from langchain_core.messages import AIMessage, SystemMessage, ToolMessage, convert_to_messages  # noqa: E402
from openai.types.responses import ResponseInputItemParam  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

import compactstore as cs  # noqa: E402
import provider  # noqa: E402
from compactstore.adapters.openai_agents import event_of  # noqa: E402

RESPONSES_ITEM = TypeAdapter(ResponseInputItemParam)


def session_with_history(store: cs.Store) -> tuple[cs.Session, cs.Node]:
    """Return a session whose first span holds a failure, a rejection and a call left open, compacted into one node."""
    s = store.session("render")
    s.append(cs.Turn("user", "Make the users.email migration reversible."))  # 0
    s.append(cs.ToolCall("c1", "run_sql", {"sql": "ALTER TABLE users ADD email2 text"}))  # 1
    s.append(cs.ToolResult("c1", "ERROR: lock timeout on users", ok=False, status="failed"))  # 2
    s.append(cs.Turn("assistant", "Backfill in place?"))  # 3
    s.append(cs.Turn("user", "No, do not backfill in place.", status="rejected"))  # 4
    s.append(cs.ToolCall("c2", "dry_run", {"plan": "shadow table"}))  # 5: answered after the node
    node = s.compact(0, 6)
    s.append(cs.ToolResult("c2", {"rows": 3}))  # 7: its call is in the summary
    s.append(cs.ToolCall("c3", "ls", {"path": "migrations"}))  # 8
    s.append(cs.ToolCall("c4", "cat", {"path": "003_down.sql"}))  # 9
    s.append(cs.ToolResult("c3", ["003_up.sql", "003_down.sql"]))  # 10
    s.append(cs.ToolResult("c4", "DROP COLUMN email2;"))  # 11
    s.bind("rollback", "migrations/003_down.sql")  # 12
    s.append(cs.Turn("user", "Go ahead."))  # 13
    s.append(cs.ToolCall("c5", "migrate", {"step": 1}))  # 14: still open
    return s, node


def check_responses(items: list[dict[str, Any]]) -> None:
    """Assert that the OpenAI types, the Agents SDK's converter and every provider take ``items`` as Responses input."""
    for item in items:
        RESPONSES_ITEM.validate_python(item)
    provider.check(Converter.items_to_messages(items), "chat")  # type: ignore[arg-type]
    provider.check(items, "openai-responses")


def check_chat(messages: list[dict[str, Any]]) -> list[Any]:
    """Assert that every provider takes ``messages`` as chat input, and return them as LangChain reads them."""
    provider.check(messages, "chat")
    read = convert_to_messages(messages)
    provider.check_langchain(read)
    return read


def test_a_certified_context_renders_in_both_formats_as_the_sdk_and_langchain_read_them(store: cs.Store) -> None:
    """The summary goes in as a note naming its loss class, negative facts and UNRESOLVED items; raw events as they were."""
    s, node = session_with_history(store)
    r = s.resume(s.mark(node))
    assert r.mode == "certified"
    items = r.as_messages("openai-responses")
    check_responses(items)
    note = items[0]
    assert note["role"] == "developer" and isinstance(note["content"], str)
    for said in ("loss class LOSSY_GIST", "UNRESOLVED tool_call c2", "pos 2 failed", "pos 4 rejected", "[0, 6)"):
        assert said in note["content"], said
    assert {"type": "function_call", "call_id": "c3", "name": "ls", "arguments": '{"path":"migrations"}'} in items
    assert {"type": "function_call_output", "call_id": "c4", "output": "DROP COLUMN email2;"} in items
    assert {"role": "user", "content": "Go ahead."} in items
    (text,) = [i["content"] for i in items if i.get("role") == "developer"]  # one note, first
    assert isinstance(text, str) and '{"rows":3}' not in text  # a result is never a note
    paired = [i for i in items if i.get("call_id") == "c2"]
    # Its call is summarized, open at the node's stop: the context gives it, read from the log, before the result.
    assert paired == [{"type": "function_call", "call_id": "c2", "name": "dry_run", "arguments": '{"plan":"shadow table"}'},
                      {"type": "function_call_output", "call_id": "c2", "output": '{"rows":3}'}]
    assert "[pos 14] UNRESOLVED tool call c5 migrate" in text  # no result yet
    assert '[pos 12] binding rollback = "migrations/003_down.sql"' in text
    assert items[1] == {"role": "user", "content": cs.render.CONTINUED}  # the user's turn is in the summary

    chat = r.as_messages("chat")
    read = check_chat(chat)
    assert isinstance(read[0], SystemMessage) and "loss class LOSSY_GIST" in read[0].content
    both = next(m for m in read if isinstance(m, AIMessage) and len(m.tool_calls) == 2)
    assert [c["id"] for c in both.tool_calls] == ["c3", "c4"]  # consecutive calls share one message
    assert both.tool_calls[0]["args"] == {"path": "migrations"}
    answers = [m for m in read if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.content) for m in answers] == [("c2", '{"rows":3}'), ("c3", '["003_up.sql","003_down.sql"]'),
                                                              ("c4", "DROP COLUMN email2;")]


def test_a_fallback_context_renders_the_raw_log_with_failures_and_rejections_named(store: cs.Store) -> None:
    """A raw-checkpoint resume renders every raw event: paired calls as calls, statuses named, nothing summarized."""
    s, _ = session_with_history(store)
    r = s.resume(s.mark_raw())
    assert r.mode == "fallback"
    items = r.as_messages("openai-responses")
    check_responses(items)
    assert not any("summary" in str(i.get("content", "")) for i in items)
    assert {"type": "function_call_output", "call_id": "c1", "output": "[failed] ERROR: lock timeout on users"} in items
    assert {"role": "user", "content": "[rejected] No, do not backfill in place."} in items
    assert {"type": "function_call", "call_id": "c2", "name": "dry_run", "arguments": '{"plan":"shadow table"}'} in items
    read = check_chat(r.as_messages("chat"))
    assert sum(isinstance(m, ToolMessage) for m in read) == 4  # c1..c4 answered; c5 open, a note


def test_rendering_is_deterministic_and_refuses_an_unknown_format(store: cs.Store) -> None:
    """The same marker renders to the same bytes each time; an unknown format names the field."""
    s, node = session_with_history(store)
    marker = s.mark(node)
    for fmt in ("openai-responses", "chat"):
        once = json.dumps(s.resume(marker).as_messages(fmt), sort_keys=True)  # type: ignore[arg-type]
        assert once == json.dumps(s.resume(marker).as_messages(fmt), sort_keys=True)  # type: ignore[arg-type]
    with pytest.raises(cs.InvalidArgument) as exc:
        s.resume(marker).as_messages("anthropic")  # type: ignore[arg-type]
    assert exc.value.field == "format"


def test_items_an_adapter_stored_go_back_in_as_the_items_they_were(store: cs.Store) -> None:
    """Events holding an SDK item render as that exact item in the Responses format, and as messages in chat."""
    given = [
        {"role": "user", "content": "What is in migrations/?"},
        {"type": "function_call", "call_id": "fc1", "name": "ls", "arguments": '{"path": "migrations"}', "id": "fc_1"},
        {"type": "function_call_output", "call_id": "fc1", "output": "003_up.sql"},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "One file.", "annotations": []}]},
    ]  # fmt: skip
    s = store.session("sdk")
    s.extend([event_of(i) for i in given])
    r = s.resume(s.mark_raw())
    items = r.as_messages("openai-responses")
    assert items == given
    check_responses(items)
    read = check_chat(r.as_messages("chat"))
    assert read[1].tool_calls[0]["args"] == {"path": "migrations"}
    assert read[-1].content == "One file."
