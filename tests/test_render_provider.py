"""Model input that every provider accepts: the validator's rules, and rendered contexts held to them over random sessions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("agents", reason="the test extra (openai-agents) is not installed")
pytest.importorskip("langchain_core", reason="the test extra (langgraph) is not installed")

from agents.models.chatcmpl_converter import Converter  # noqa: E402
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from langchain_core.messages import convert_to_messages  # noqa: E402
from openai.types.responses import ResponseInputItemParam  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

import compactstore as cs  # noqa: E402
import provider  # noqa: E402
import strategies  # noqa: E402
from compactstore import recall, render  # noqa: E402
from compactstore.resolver import RawItem, SummaryItem  # noqa: E402

RESPONSES_ITEM = TypeAdapter(ResponseInputItemParam)

USER = {"role": "user", "content": "Migrate."}
CALL = {"role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}]}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "ok"}


def rules_broken(messages: list[dict[str, Any]], format: provider.Format = "chat") -> set[str]:  # noqa: A002
    """Return the names of the rules ``messages`` break."""
    return {v.split(" ", 1)[0] for v in provider.violations(messages, format)}


# --- the validator -------------------------------------------------------------------------


def test_the_validator_accepts_a_plain_exchange_in_both_formats() -> None:
    """A system note, a user turn, a call with its result and an answer break no rule."""
    chat = [{"role": "system", "content": "Note."}, USER, CALL, RESULT, {"role": "assistant", "content": "Done."}]
    assert provider.violations(chat, "chat") == []
    items = [{"role": "developer", "content": "Note."}, USER,
             {"type": "function_call", "call_id": "c1", "name": "run", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "ok"}]
    assert provider.violations(items, "openai-responses") == []


@pytest.mark.parametrize(("broken", "messages"), [
    ("system-first", [USER, {"role": "system", "content": "A note in the middle."}]),
    ("user-first", [{"role": "system", "content": "Note."}, {"role": "assistant", "content": "Hello."}]),
    ("user-first", [{"role": "system", "content": "Only a note."}]),
    ("user-first", []),
    ("text", [USER, {"role": "assistant", "content": "  "}]),
    ("paired", [USER, CALL, {"role": "system", "content": "result of c1: ok"}]),
    ("paired", [USER, CALL]),
    ("paired", [USER, RESULT]),
    ("paired", [USER, CALL, {"role": "user", "content": "And?"}, RESULT]),
    ("paired", [USER, CALL, RESULT, RESULT]),
    ("call-ids", [USER, {**CALL, "tool_calls": [{"id": "c 1", "function": {"name": "run", "arguments": "{}"}}]},
                  {**RESULT, "tool_call_id": "c 1"}]),
    ("call-ids", [USER, CALL, RESULT, CALL, RESULT]),
    ("call-ids", [USER, {**CALL, "tool_calls": [{"id": "c1", "function": {"name": "run", "arguments": "[1]"}}]}, RESULT]),
    ("roles", [USER, {"role": "function", "content": "x"}]),
])  # fmt: skip
def test_the_validator_names_each_rule_a_tampered_input_breaks(broken: str, messages: list[dict[str, Any]]) -> None:
    """Each input breaking one provider rule is reported under that rule's name."""
    assert broken in rules_broken(messages)


def test_responses_items_are_held_to_the_same_rules_as_their_turns() -> None:
    """An output without its call, or a call whose output comes after another message, breaks ``paired`` in Responses input."""
    call = {"type": "function_call", "call_id": "c1", "name": "run", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    assert "paired" in rules_broken([USER, output], "openai-responses")
    assert "paired" in rules_broken([USER, call, {"role": "user", "content": "?"}, output], "openai-responses")
    assert "system-first" in rules_broken([USER, call, output, {"role": "developer", "content": "x"}], "openai-responses")
    assert "roles" in rules_broken([USER, {"role": "tool", "content": "x"}], "openai-responses")


# --- rendered contexts ---------------------------------------------------------------------


def check_rendered(context: list[Any], needed: Sequence[render.Needed] = ()) -> None:
    """Assert that ``context`` renders, in both formats and as the SDK and LangChain read it, as input a provider accepts."""
    for fmt in render.FORMATS:
        out = render.messages(context, fmt, needed=needed)
        if not out:
            # Nothing to say: every entry is redacted, or a turn without text.
            assert all(isinstance(e := getattr(x, "event", None), cs.events.Redacted)
                       or (isinstance(e, cs.Turn) and not e.content.strip() and e.status in (None, "ok"))
                       for x in context)
            continue
        provider.check(out, fmt)
        if fmt == "chat":
            provider.check_langchain(convert_to_messages(out))
        else:
            for item in out:
                RESPONSES_ITEM.validate_python(item)
            provider.check(Converter.items_to_messages(out), "chat")  # type: ignore[arg-type]
    # Every result whose call is before it in the context is written as a result, never as a note.
    calls = set()
    paired = 0
    for x in context:
        e = getattr(x, "event", None)
        if isinstance(e, cs.ToolCall):
            calls.add(e.call_id)
        elif isinstance(e, cs.ToolResult) and e.call_id in calls:
            calls.discard(e.call_id)
            paired += 1
    chat = render.messages(context, "chat", needed=needed)
    assert sum(m["role"] == "tool" for m in chat) == paired


@given(script=strategies.session_scripts(), policy=strategies.policies())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_context_of_a_random_session_renders_as_input_every_provider_accepts(
        script: list[strategies.Step], policy: cs.CompactionPolicy) -> None:
    """Random sessions under random policies: the context now, and each marker's, render as valid input in both formats."""
    with cs.open(":memory:") as store:
        s = store.session("random")
        strategies.play(s, script, policy)
        got = s.context()
        needed = got.needed
        event(f"context {got.mode}, {'with' if needed else 'without'} needed literals")
        check_rendered(list(got.context), needed)
        marker = s.latest_marker()
        if marker is not None:
            again = s.resume(marker)
            check_rendered(list(again.context), again.needed)


def test_a_result_whose_call_was_redacted_is_left_out_and_named_by_position() -> None:
    """No call to pair it with: the result is not a message, and the note names the handle that fetches it."""
    context = [
        RawItem(0, cs.Turn("user", "Run it.")),
        RawItem(1, cs.events.Redacted(by=5)),
        RawItem(2, cs.ToolResult("c1", "secret output", ok=False, status="failed")),
        RawItem(3, cs.Turn("assistant", "It failed.")),
    ]
    for fmt in render.FORMATS:
        out = render.messages(context, fmt)
        provider.check(out, fmt)
        (note,) = [m for m in out if m.get("role") in ("system", "developer")]
        assert "secret output" not in str(out)
        assert "[pos 2] [failed] result of tool call c1" in str(note["content"]) and "recall pos:2" in str(note["content"])


def test_structural_events_and_late_system_turns_go_into_the_one_note_at_the_start() -> None:
    """Bindings, obligations, handles, an open call and a system turn logged mid-conversation join the leading note, with positions."""
    context = [
        RawItem(0, cs.Turn("system", "You migrate databases.")),
        RawItem(1, cs.Turn("user", "Migrate.")),
        RawItem(2, cs.Binding(key="rollback", value="003_down.sql")),
        RawItem(3, cs.Obligation(name="migrate", needs=["rollback"])),
        RawItem(4, cs.Turn("assistant", "On it.")),
        RawItem(5, cs.Turn("system", "Be brief.")),
        RawItem(6, cs.ToolCall("c9", "migrate", {"step": 1})),
    ]
    out = render.messages(context, "chat")
    provider.check(out, "chat")
    assert out[0] == {"role": "system", "content": "You migrate databases."}
    note = str(out[1]["content"])
    assert [m["role"] for m in out[2:]] == ["user", "assistant"]
    for said in ('[pos 2] binding rollback = "003_down.sql" (not regenerable)', "[pos 3] obligation migrate opened",
                 "[pos 5] system turn: Be brief.", "[pos 6] UNRESOLVED tool call c9 migrate"):
        assert said in note, said


def test_a_conversation_that_starts_otherwise_is_opened_by_a_user_message() -> None:
    """After a summary that took in the user's turn, a short user message opens the conversation; none is added when one leads."""
    node = SummaryItem(pos=9, tier=1, start=0, stop=8, span_root="", summary="Asked to migrate.",
                       loss=cs.LossClass.LOSSY_GIST, negative_facts=[], unresolved=[], kept=[], spills=[], contract=None)
    out = render.messages([node, RawItem(10, cs.Turn("assistant", "Migrated."))], "openai-responses")
    assert [m["role"] for m in out] == ["developer", "user", "assistant"]
    assert out[1]["content"] == render.CONTINUED
    plain = render.messages([RawItem(0, cs.Turn("assistant", "Hello.")), RawItem(1, cs.Turn("user", "Hi."))], "chat")
    assert plain[0] == {"role": "user", "content": render.STARTS}
    led = render.messages([node, RawItem(10, cs.Turn("user", "Go on."))], "chat")
    assert [m["role"] for m in led] == ["system", "user"]
    assert render.messages([RawItem(0, cs.events.Redacted(by=1))], "chat") == []


def test_turns_without_text_are_left_out() -> None:
    """An empty or blank turn is no message (providers refuse one); a blank turn with a status keeps its status."""
    context = [RawItem(0, cs.Turn("user", "Hi.")), RawItem(1, cs.Turn("assistant", "")),
               RawItem(2, cs.Turn("assistant", " \n")), RawItem(3, cs.Turn("user", "", status="rejected"))]
    assert render.messages(context, "chat") == [{"role": "user", "content": "Hi."},
                                                {"role": "user", "content": "[rejected] "}]
