"""``compactstore export --format chat-jsonl``: sessions as chat conversations, one per line, on both backends."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner
from provider import check

import compactstore as cs
from compactstore.cli import main


def _export(target: str, *args: str) -> list[dict[str, Any]]:
    got = CliRunner().invoke(main, ["export", "--store", target, "--format", "chat-jsonl", *args],
                             catch_exceptions=False)
    assert got.exit_code == 0, got.output
    return [json.loads(line) for line in got.output.splitlines()]


def _fill(store: cs.Store) -> None:
    s = store.session("deploy")
    s.extend([cs.Turn("system", "You deploy services."), cs.Turn("user", "deploy 7f3a9c"),
              cs.ToolCall("c1", "deploy", {"sha": "7f3a9c"}), cs.ToolResult("c1", {"error": "E1234"}, ok=False),
              cs.Turn("user", "my card is 4111 1111 1111 1111"), cs.Turn("assistant", "retrying")])
    s.append(cs.ToolCall("c2", "deploy", {"sha": "7f3a9c", "timeout": 600}))
    s.append(cs.ToolResult("c2", "deployed"))
    s.redact([4], "card number")
    s.mark(s.compact(0, 4, summary="asked to deploy 7f3a9c; E1234 on the first try", keep=cs.AUTO))
    s.append(cs.Turn("assistant", "done"))
    store.session("other").extend([cs.Turn("user", "hello"), cs.Turn("assistant", "hi")])


def test_each_session_is_one_line_of_chat_messages_every_provider_takes(target: str) -> None:
    with cs.open(target) as store:
        _fill(store)
    lines = _export(target)
    assert len(lines) == 2 and all(set(line) == {"messages"} for line in lines)
    deploy, other = lines  # sessions by name
    for line in lines:
        check(line["messages"], "chat")
    text = json.dumps(deploy)
    assert "4111" not in text  # the redacted turn is left out
    assert [m["role"] for m in other["messages"]] == ["user", "assistant"]
    calls = [c["id"] for m in deploy["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    answered = [m["tool_call_id"] for m in deploy["messages"] if m["role"] == "tool"]
    assert calls == answered == ["c1", "c2"]
    assert deploy["messages"][-1] == {"role": "assistant", "content": "done"}


def test_the_current_context_is_the_certified_summary_then_the_raw_events_since(target: str) -> None:
    with cs.open(target) as store:
        _fill(store)
        want = store.session("deploy").context().as_messages("chat")
    (line,) = _export(target, "--session", "deploy", "--context")
    assert line["messages"] == json.loads(json.dumps(want))
    check(line["messages"], "chat")
    assert "E1234" in line["messages"][0]["content"]  # the summary's note keeps the negative fact
    assert not any("deploy 7f3a9c" == m.get("content") for m in line["messages"])  # the span is summarized


def test_a_changed_body_is_refused_not_exported(sqlite_target: str) -> None:
    import sqlite3

    with cs.open(sqlite_target) as store:
        _fill(store)
    conn = sqlite3.connect(sqlite_target)
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("UPDATE events SET body = CAST(replace(CAST(body AS TEXT), 'hello', 'HELLO') AS BLOB) WHERE kind = 'turn'")
    conn.commit()
    conn.close()
    got = CliRunner().invoke(main, ["export", "--store", sqlite_target, "--format", "chat-jsonl"])
    assert got.exit_code == 1 and "HELLO" not in got.output


def test_context_goes_with_chat_jsonl_only(sqlite_target: str) -> None:
    with cs.open(sqlite_target) as store:
        _fill(store)
    got = CliRunner().invoke(main, ["export", "--store", sqlite_target, "--context"])
    assert got.exit_code == 2 and "--context goes with --format chat-jsonl" in got.output
