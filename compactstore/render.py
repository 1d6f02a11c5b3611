"""Render a resumed context as model input: OpenAI Responses input items, or chat messages.

A context (:attr:`compactstore.Resolution.context`) is raw events and summary nodes in
log order. Raw events go in as the messages they were: a turn as a message of its
role, a tool call and its result as a call and its output. A summary node goes in as
a system (chat) or developer (Responses) note that states its tier, span and loss
class, its summary, and what it retains: the negative facts, the items it lists as
``UNRESOLVED`` or resolved, the literals it keeps verbatim and the spills by handle.

Model APIs refuse a tool call without its output and an output without its call, and
chat completions want the outputs right after the call. So a call whose result is in
the context is written with its result right after it (consecutive calls share one
assistant message); a call or a result whose partner is not in the context (a call
still open, or one a summary node swallowed) goes in as a note naming it. Structural
events (bindings, obligations, handles, framework state) go in as notes too, each
with its position; redacted events are left out, their content is gone.

Rendering is pure and deterministic: the same context gives the same items, byte for
byte once encoded. Nothing here imports a framework; the shapes are checked against
the OpenAI Agents SDK and langchain_core in the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, cast

from . import events as ev
from .errors import InvalidArgument, shown
from .events import JSON, LossClass

Format = Literal["openai-responses", "chat"]
#: The formats :func:`messages` writes.
FORMATS: tuple[Format, ...] = ("openai-responses", "chat")

Message = dict[str, JSON]

#: The roles a message keeps as they were logged; any other is written as a user message naming it.
ROLES = frozenset({"user", "assistant", "system", "developer"})

#: What each loss class tells the model it may do with a summary.
LOSS_NOTES = {
    LossClass.LOSSLESS: "every literal of the span is kept verbatim below",
    LossClass.LOSSY_LITERAL: "literals may be missing or inexact: re-read the log before acting on one",
    LossClass.LOSSY_GIST: "the gist only: literals are not in it, re-read the log before acting on one",
}


class RawEntry(Protocol):
    """A raw event of a context (:class:`compactstore.resolver.RawItem`)."""

    @property
    def pos(self) -> int: ...

    @property
    def event(self) -> ev.Event: ...


class SummaryEntry(Protocol):
    """A summary node of a context (:class:`compactstore.resolver.SummaryItem`)."""

    @property
    def pos(self) -> int: ...

    @property
    def tier(self) -> int: ...

    @property
    def start(self) -> int: ...

    @property
    def stop(self) -> int: ...

    @property
    def summary(self) -> str: ...

    @property
    def loss(self) -> LossClass: ...

    @property
    def negative_facts(self) -> list[ev.Fact]: ...

    @property
    def unresolved(self) -> list[ev.Item]: ...

    @property
    def resolved(self) -> list[ev.Item]: ...

    @property
    def kept(self) -> list[ev.Excerpt]: ...

    @property
    def spills(self) -> list[ev.SpillRef]: ...

    @property
    def contract(self) -> str | None: ...


Entry = RawEntry | SummaryEntry


def messages(context: Sequence[Entry], format: Format) -> list[Message]:  # noqa: A002 - the documented name
    """Return ``context`` as model input in ``format`` (``"openai-responses"`` or ``"chat"``).

    ``"openai-responses"``: OpenAI Responses API input items (``{"role", "content"}``
    messages, ``function_call`` and ``function_call_output`` items); an event that an
    adapter stored with its original item (``meta["item"]``) goes in as that item.
    ``"chat"``: chat-completions messages (``system``, ``user``, ``assistant`` with
    ``tool_calls``, ``tool``), which LangChain's ``convert_to_messages`` reads.

    Raises:
        InvalidArgument: ``format`` is not one of :data:`FORMATS`.
    """
    if format not in FORMATS:
        raise InvalidArgument("format", f"want one of {list(FORMATS)}, got {shown(format)}")
    responses = format == "openai-responses"
    note_role = "developer" if responses else "system"
    # The raw event of each entry, None for a summary node.
    events = [e if isinstance(e := getattr(x, "event", None), ev.Event) else None for x in context]
    calls, results = _pairs(events)
    out: list[Message] = []
    done: set[int] = set()
    for i, event in enumerate(events):
        if i in done:
            continue
        if event is None:
            out.append(_note(note_role, _summary_text(cast(SummaryEntry, context[i]))))
        elif isinstance(event, ev.ToolCall) and event.call_id in results:
            # This call and the paired calls right after it, each followed by its result.
            run = [i]
            while run[-1] + 1 < len(events) and _paired_call(events[run[-1] + 1], results):
                run.append(run[-1] + 1)
            pairs = []
            for j in run:
                call = events[j]
                assert isinstance(call, ev.ToolCall)
                result = events[results[call.call_id]]
                assert isinstance(result, ev.ToolResult)
                pairs.append((call, result))
                done.update((j, results[call.call_id]))
            out.extend(_responses_pairs(pairs) if responses else _chat_pairs(pairs))
        elif not (isinstance(event, ev.ToolResult) and event.call_id in calls):  # a paired result follows its call
            message = _raw(context[i].pos, event, responses, note_role)
            if message is not None:
                out.append(message)
    return out


# --- pairing ---------------------------------------------------------------------------


def _paired_call(event: ev.Event | None, results: dict[str, int]) -> bool:
    return isinstance(event, ev.ToolCall) and event.call_id in results


def _pairs(events: Sequence[ev.Event | None]) -> tuple[dict[str, int], dict[str, int]]:
    """Return the paired calls and results of a context: call id to index, for each side.

    A call is paired with the first result of its id after it; a second call or result
    of the same id stays unpaired.
    """
    open_calls: dict[str, int] = {}
    calls: dict[str, int] = {}
    results: dict[str, int] = {}
    for i, event in enumerate(events):
        if isinstance(event, ev.ToolCall) and event.call_id not in calls and event.call_id not in open_calls:
            open_calls[event.call_id] = i
        elif isinstance(event, ev.ToolResult) and event.call_id in open_calls and event.call_id not in results:
            calls[event.call_id] = open_calls.pop(event.call_id)
            results[event.call_id] = i
    return calls, results


# --- raw events ------------------------------------------------------------------------


def _status(event: ev.Event) -> str:
    """Return a prefix naming a negative status, so that a failure or rejection reads as one."""
    return f"[{event.status}] " if event.status not in (None, "ok") else ""


def _output(result: ev.ToolResult) -> str:
    out = result.output if isinstance(result.output, str) else ev.encode_json(result.output)
    failed = "" if result.ok or result.status not in (None, "ok") else "[failed] "
    return _status(result) + failed + out


def _arguments(call: ev.ToolCall) -> str:
    item = _item(call)
    arguments = item.get("arguments") if item is not None else None
    return arguments if isinstance(arguments, str) else ev.encode_json(call.args)


def _item(event: ev.Event) -> Message | None:
    """Return the original item an adapter stored with ``event`` (``meta["item"]``), fields it moved put back."""
    meta = event.meta
    item = meta.get("item") if meta is not None else None
    if not isinstance(item, dict):
        return None
    moved = meta.get("moved") if meta is not None else None
    out = dict(item)
    for name in moved if isinstance(moved, list) else ():
        if name in ("content", "output") and hasattr(event, name):
            out[name] = getattr(event, name)
    return out


def _responses_pairs(pairs: list[tuple[ev.ToolCall, ev.ToolResult]]) -> list[Message]:
    out: list[Message] = []
    for call, result in pairs:
        call_item, result_item = _item(call), _item(result)
        out.append(call_item if call_item is not None else {
            "type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": _arguments(call),
        })
        out.append(result_item if result_item is not None else {
            "type": "function_call_output", "call_id": result.call_id, "output": _output(result),
        })
    return out


def _chat_pairs(pairs: list[tuple[ev.ToolCall, ev.ToolResult]]) -> list[Message]:
    tool_calls: list[JSON] = []
    answers: list[Message] = []
    for call, result in pairs:
        tool_calls.append({
            "id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": _arguments(call)},
        })
        answers.append({"role": "tool", "tool_call_id": result.call_id, "content": _output(result)})
    return [{"role": "assistant", "content": None, "tool_calls": tool_calls}, *answers]


def _note(role: str, text: str) -> Message:
    return {"role": role, "content": text}


def _raw(pos: int, event: ev.Event, responses: bool, note_role: str) -> Message | None:
    """Return the message of a raw event that is not a paired tool call or result (None: left out)."""
    if isinstance(event, ev.Redacted):
        return None
    item = _item(event) if responses else None
    if isinstance(event, ev.Turn):
        if item is not None:
            return item
        if event.role in ROLES:
            return {"role": event.role, "content": _status(event) + event.content}
        return {"role": "user", "content": f"({event.role}) {_status(event)}{event.content}"}
    if isinstance(event, ev.ToolCall):
        return _note(note_role, f"[pos {pos}] {_status(event)}UNRESOLVED tool call {event.call_id} "
                                f"{event.name}({_arguments(event)}): no result is logged in this context")
    if isinstance(event, ev.ToolResult):
        return _note(note_role, f"[pos {pos}] result of tool call {event.call_id} (its call is summarized above): "
                                f"{_output(event)}")
    return _note(note_role, f"[pos {pos}] {_status(event)}{_structural(event)}")


def _structural(event: ev.Event) -> str:
    """Return what a structural event says, its literals whole."""
    if isinstance(event, ev.Binding):
        how = f" (regenerable: {event.how or 'yes'})" if event.regenerable else " (not regenerable)"
        return f"binding {event.key} = {ev.encode_json(event.value)}{how}"
    if isinstance(event, ev.Obligation):
        return f"obligation {event.name} opened; it needs {ev.encode_json(list(event.needs))}"
    if isinstance(event, ev.Fulfilment):
        return f"obligation {event.name} fulfilled"
    if isinstance(event, ev.HandleOpened):
        return f"{event.resource} handle {event.handle} opened: {event.detail}".rstrip(": ")
    if isinstance(event, ev.HandleClosed):
        return f"handle {event.handle} closed"
    if isinstance(event, ev.GraphState):
        return f"graph state {event.id}: {ev.encode_json(event.value)}"
    if isinstance(event, ev.Write):
        return f"write to {event.channel} by task {event.task}: {ev.encode_json(event.value)}"
    return f"{event.kind} event"


# --- summary nodes ---------------------------------------------------------------------


def _summary_text(node: SummaryEntry) -> str:
    """Return the note a summary node goes in as: what it covers, its loss class, its text, what it retains."""
    lines = [
        f"[summary L{node.tier} of events [{node.start}, {node.stop}), node at pos {node.pos}; "
        f"loss class {node.loss.value}: {LOSS_NOTES.get(node.loss, LOSS_NOTES[LossClass.LOSSY_LITERAL])}]",
        node.summary,
    ]
    if node.negative_facts:
        lines.append("Negative facts (failed, rejected or superseded; do not redo them):")
        lines += _fact_lines(node.negative_facts)
    if node.unresolved:
        lines.append("UNRESOLVED (still open at the end of the span):")
        lines += [f"- UNRESOLVED {i.kind} {i.id} (pos {i.pos})" for i in node.unresolved]
    if node.resolved:
        lines.append("Resolved in the span (opened before it; do not redo them):")
        lines += [f"- {i.kind} {i.id} (pos {i.pos})" for i in node.resolved]
    if node.kept:
        lines.append("Kept verbatim:")
        lines += [f"- pos {e.pos} {e.path} = {ev.encode_json(e.value)}" for e in node.kept]
    if node.spills:
        lines.append("Spilled to the store (fetch by handle):")
        lines += _spill_lines(node.spills)
    if node.contract:
        lines.append(f"Contract: {_cut(node.contract, CONTRACT_EXCERPT)}")
    return "\n".join(lines)


#: A node's newest negative facts are written one a line with their text. The earlier ones
#: are grouped by status and text, the newest groups first, up to a fixed number of lines;
#: the rest are counted by status with the span of their positions. So a digest's note
#: stays bounded however long the session grows, while every fact stays in the node
#: (``SummaryItem.negative_facts``) and in the log at its position.
FACTS_IN_FULL = 40
#: Lines for the earlier facts' groups; the groups past them are counted, not listed.
EARLIER_GROUPS = 24
#: Positions written per group: its newest ones.
GROUP_POSITIONS = 4
#: Characters of a fact's text or of a contract written into a note; the rest is cut with "…".
FACT_EXCERPT = 160
#: Characters of a group's shared text.
GROUP_EXCERPT = 100
CONTRACT_EXCERPT = 400


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _fact_lines(facts: Sequence[ev.Fact]) -> list[str]:
    """Return the note's lines for ``facts``: the newest in full, the earlier ones grouped and bounded."""
    earlier, newest = facts[: max(0, len(facts) - FACTS_IN_FULL)], facts[-FACTS_IN_FULL:]
    # Facts of one status and one text are one thing not to redo; a group is dated by its newest fact.
    groups: dict[tuple[str, str], list[int]] = {}
    for f in earlier:
        groups.setdefault((f.status, _cut(f.text, GROUP_EXCERPT)), []).append(f.pos)
    ordered = sorted(groups.items(), key=lambda g: g[1][-1], reverse=True)
    lines = []
    for (status, text), positions in ordered[:EARLIER_GROUPS]:
        shown = ", ".join(map(str, reversed(positions[-GROUP_POSITIONS:])))
        more = f" and {len(positions) - GROUP_POSITIONS} earlier" if len(positions) > GROUP_POSITIONS else ""
        times = f" ×{len(positions)}" if len(positions) > 1 else ""
        said = f": {text}" if text else ""
        lines.append(f"- earlier {status}{times}{said} (pos {shown}{more})")
    rest: dict[str, list[int]] = {}
    for (status, _), positions in ordered[EARLIER_GROUPS:]:
        rest.setdefault(status, []).extend(positions)
    for status, positions in sorted(rest.items()):
        lines.append(f"- {len(positions)} more earlier {status} facts, between pos {min(positions)} and {max(positions)}: "
                     "the node lists each, and the log holds each at its position")
    lines += [f"- pos {f.pos} {f.status}: {_cut(f.text, FACT_EXCERPT)}".rstrip(": ") for f in newest]
    return lines


#: Earlier handles written per spilled key: its newest ones.
SPILL_HANDLES = 4


def _spill_lines(spills: Sequence[ev.SpillRef]) -> list[str]:
    """Return the note's lines for ``spills``: each key's latest spill in full, its newest earlier ones by handle."""
    latest: dict[str, ev.SpillRef] = {}
    earlier: dict[str, list[str]] = {}
    for r in spills:
        if r.key in latest:
            earlier.setdefault(r.key, []).append(latest[r.key].handle)
        latest[r.key] = r
    lines = [f"- earlier values of {key}: {', '.join(reversed(handles[-SPILL_HANDLES:]))}"
             + (f" and {len(handles) - SPILL_HANDLES} earlier" if len(handles) > SPILL_HANDLES else "")
             for key, handles in sorted(earlier.items())]
    return lines + [f"- {r.key} (bound at pos {r.source}): {r.handle}" for r in latest.values()]
