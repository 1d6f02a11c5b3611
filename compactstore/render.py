"""Render a resumed context as model input: OpenAI Responses input items, or chat messages.

A context (:attr:`compactstore.Resolution.context`) is raw events and summary nodes in
log order. What this module writes is what the OpenAI Chat Completions, OpenAI
Responses and Anthropic Messages APIs accept:

- **System content only at the start.** Raw ``system`` or ``developer`` turns that come
  before any other message stay where they are, as they were. Everything else that is
  not conversation goes into **one note** right after them, a ``system`` (chat) or
  ``developer`` (Responses) message: each summary node (its tier, span, loss class,
  summary, and what it retains: the negative facts, the items it lists as
  ``UNRESOLVED`` or resolved, the literals it keeps verbatim, the spills by handle),
  then the raw events that are no conversation, each with its position: bindings,
  obligations, handles, open tool calls, a system turn logged later in the
  conversation. Nothing system-like comes after the first conversation message.
- **A user message first.** When the conversation after the note does not start with a
  user message (a summary took it in, or there is none), a short user message,
  :data:`CONTINUED` (:data:`STARTS` when there is no note), goes first: Anthropic refuses
  a conversation that starts otherwise, and a model needs a turn to answer.
- **Every tool result with the call that made it.** A call whose result is in the
  context is written with its result right after it (consecutive calls share one
  assistant message in chat). A call with no result in the context is still open: it is
  a line of the note (``UNRESOLVED tool call``), since every API refuses a call without
  its output. A result whose call is not in the context (its call was redacted, so
  nothing can be paired with it) is never written as a note in its place: it is left
  out, and the note names its position, whose ``pos:N`` handle the recall tool fetches.
- Messages with no text (an empty turn) are left out; redacted events too, their
  content is gone. A context with nothing else to say renders as no messages.

**Bounded notes.** Every list a note prints is capped by construction (the constants
below); what is counted instead of quoted names the handle that fetches it, in the
grammar of :mod:`compactstore.recall`: ``spill:N``, ``pos:N``, ``span:A-B``,
``facts:A-B``, ``binding:KEY``. A literal an open obligation needs that a summary
spilled (:class:`Needed`, read by :func:`compactstore.resolver.needed`) is stated
verbatim when its canonical JSON is at most :data:`NEEDED_VERBATIM` characters, else by
its handle, and the note names the recall tool (:data:`RECALL_TOOL`).

Tool call ids pass through as logged: Anthropic wants them to match
``[A-Za-z0-9_-]+``, which the frameworks' own ids do.

Rendering is pure and deterministic: the same context gives the same items, byte for
byte once encoded. Nothing here imports a framework; the shapes are checked against
the OpenAI Agents SDK and langchain_core in the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, cast

import msgspec

from . import events as ev
from .errors import InvalidArgument, shown
from .events import JSON, LossClass
from .rules import DIGEST_FACTS

Format = Literal["openai-responses", "chat"]
#: The formats :func:`messages` writes.
FORMATS: tuple[Format, ...] = ("openai-responses", "chat")

Message = dict[str, JSON]

#: The roles a message keeps as they were logged; any other is written as a user message naming it.
ROLES = frozenset({"user", "assistant", "system", "developer"})
#: Roles whose content is system content: only at the start of the input.
SYSTEM_ROLES = frozenset({"system", "developer"})

#: The name under which the adapters give a model the recall tool (:mod:`compactstore.recall`).
RECALL_TOOL = "recall"

#: The user message that opens the conversation after a note when it would not start with one.
CONTINUED = "(The conversation so far is summarized above; it continues below.)"
#: The same, when there is no note above.
STARTS = "(The conversation continues below.)"

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


class Needed(msgspec.Struct, frozen=True):
    """A literal an open obligation needs, which a summary of the context spilled to the store.

    Attributes:
        obligation: the open obligation's name.
        key: the binding key it needs.
        handle: the spill's handle (``spill:N``).
        value: the exact value, as :meth:`compactstore.Session.spilled` returned it.
    """

    obligation: str
    key: str
    handle: str
    value: JSON


# --- bounds ------------------------------------------------------------------------------

#: A node's newest negative facts are written one a line with their text. The earlier ones
#: are grouped by status and text, the newest groups first, up to a fixed number of lines;
#: the rest are counted by status with the span of their positions and the ``facts:A-B``
#: handle that fetches them. So a digest's note stays bounded however long the session
#: grows, while every fact stays in the node and in the log at its position.
FACTS_IN_FULL = 40
#: Lines for the earlier facts' groups; the groups past them are counted, not listed.
EARLIER_GROUPS = 24
#: Positions written per group: its newest ones.
GROUP_POSITIONS = 4
#: Characters of a fact's text written into a note; the rest is cut with "…".
FACT_EXCERPT = 160
#: Characters of a group's shared text.
GROUP_EXCERPT = 100
#: Characters of a node's contract.
CONTRACT_EXCERPT = 400
#: Characters of a node's summary text.
SUMMARY_EXCERPT = 4000
#: Items listed per kind of list in a node (``UNRESOLVED``, resolved, kept): the newest;
#: the earlier ones are counted with the ``span:A-B`` handle of their positions.
ITEMS_LISTED = 20
#: Spilled keys listed per node (each by its latest handle): the newest.
SPILLS_LISTED = 20
#: Earlier handles written per spilled key: its newest ones.
SPILL_HANDLES = 4
#: Characters of a literal (a value as canonical JSON) written into a note.
VALUE_EXCERPT = 200
#: Characters of other text a note quotes from an event (a handle's detail, a system turn).
TEXT_EXCERPT = 400
#: Characters of a name (a key, a call id, an obligation) written into a note.
NAME_EXCERPT = 120
#: Lines for the raw events that are no conversation: the newest; the earlier ones are
#: counted with the ``span:A-B`` handle of their positions.
LOGGED_LINES = 40
#: A needed literal whose canonical JSON is at most this long is stated verbatim;
#: a longer one by its handle alone.
NEEDED_VERBATIM = 200
#: Needed literals listed; the rest are counted.
NEEDED_LINES = 20


def messages(context: Sequence[Entry], format: Format, *,  # noqa: A002 - the documented name
             needed: Sequence[Needed] = ()) -> list[Message]:
    """Return ``context`` as model input in ``format`` (``"openai-responses"`` or ``"chat"``).

    ``"openai-responses"``: OpenAI Responses API input items (``{"role", "content"}``
    messages, ``function_call`` and ``function_call_output`` items); an event that an
    adapter stored with its original item (``meta["item"]``) goes in as that item.
    ``"chat"``: chat-completions messages (``system``, ``user``, ``assistant`` with
    ``tool_calls``, ``tool``), which LangChain's ``convert_to_messages`` reads.
    The module's docstring says where each entry goes and why.

    ``needed``: the literals open obligations need that the context's summaries spilled
    (:attr:`compactstore.Resolution.needed` holds them, read through the verified reads); the note
    states each, verbatim while short.

    Raises:
        InvalidArgument: ``format`` is not one of :data:`FORMATS`.
    """
    if format not in FORMATS:
        raise InvalidArgument("format", f"want one of {list(FORMATS)}, got {shown(format)}")
    responses = format == "openai-responses"
    # The raw event of each entry, None for a summary node.
    events = [e if isinstance(e := getattr(x, "event", None), ev.Event) else None for x in context]
    calls, results = _pairs(events)
    lead: list[Message] = []  # raw system turns before any conversation
    talk: list[Message] = []  # the conversation
    summaries: list[str] = []
    logged: list[tuple[int, str]] = []  # (pos, line) of the raw events that are no conversation
    done: set[int] = set()
    for i, event in enumerate(events):
        if i in done:
            continue
        if event is None:
            summaries.append(_summary_text(cast(SummaryEntry, context[i])))
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
            talk.extend(_responses_pairs(pairs) if responses else _chat_pairs(pairs))
        elif isinstance(event, ev.ToolResult) and event.call_id in calls:
            continue  # written right after its call
        elif isinstance(event, ev.ERASED):
            continue
        elif isinstance(event, ev.Turn):
            message = _turn(event, responses)
            if _blank(message):
                continue
            if event.role in SYSTEM_ROLES and talk:
                pos = context[i].pos
                logged.append((pos, f"{event.role} turn: {_cut(_status(event) + event.content, TEXT_EXCERPT, pos)}"))
            else:
                (lead if event.role in SYSTEM_ROLES else talk).append(message)
        else:
            logged.append((context[i].pos, _logged(context[i].pos, event)))
    note = _note_text(summaries, logged, needed)
    if note:
        lead.append({"role": "developer" if responses else "system", "content": note})
    if (lead or talk) and not (talk and talk[0].get("role") == "user"):
        talk.insert(0, {"role": "user", "content": CONTINUED if note else STARTS})
    return [*lead, *talk]


# --- pairing ---------------------------------------------------------------------------


def _paired_call(event: ev.Event | None, results: dict[str, int]) -> bool:
    return isinstance(event, ev.ToolCall) and event.call_id in results


def _pairs(events: Sequence[ev.Event | None]) -> tuple[dict[str, int], dict[str, int]]:
    """Return the paired calls and results of a context: call id to index, for each side.

    A call is paired with the first result of its id after it; a second call or result
    of the same id stays unpaired, so no id is used twice in what is written.
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


def _turn(event: ev.Turn, responses: bool) -> Message:
    """Return the message of a turn: its stored item (Responses), or a message of its role."""
    item = _item(event) if responses else None
    if item is not None:
        return item
    if event.role in ROLES:
        return {"role": event.role, "content": _status(event) + event.content}
    return {"role": "user", "content": f"({event.role}) {_status(event)}{event.content}"}


def _blank(message: Message) -> bool:
    """Return whether ``message`` is a message whose content holds no text and no other part."""
    if "role" not in message or message.get("type", "message") != "message":
        return False
    content = message.get("content")
    if isinstance(content, str):
        return not content.strip()
    if isinstance(content, list):
        return all(isinstance(p, dict) and isinstance(p.get("text"), str) and not p["text"].strip() for p in content)
    return content is None


def _logged(pos: int, event: ev.Event) -> str:
    """Return the note's line for a raw event that is no conversation, its literals cut to a bound."""
    if isinstance(event, ev.ToolCall):
        return (f"{_status(event)}UNRESOLVED tool call {_cut(event.call_id, NAME_EXCERPT)} "
                f"{_cut(event.name, NAME_EXCERPT)}({_cut(_arguments(event), VALUE_EXCERPT, pos)}): "
                "no result is logged in this context")
    if isinstance(event, ev.ToolResult):
        return (f"{_status(event)}result of tool call {_cut(event.call_id, NAME_EXCERPT)}, whose call is not in this "
                f"context: not quoted here; recall pos:{pos} fetches it")
    return _status(event) + _structural(pos, event)


def _structural(pos: int, event: ev.Event) -> str:
    """Return what a structural event says, each literal cut to a bound with the handle that fetches it whole."""
    if isinstance(event, ev.Binding):
        how = f" (regenerable: {_cut(event.how or 'yes', TEXT_EXCERPT)})" if event.regenerable else " (not regenerable)"
        return f"binding {_cut(event.key, NAME_EXCERPT)} = {_value(event.value, pos)}{how}"
    if isinstance(event, ev.Obligation):
        needs = ev.encode_json(list(event.needs))
        return f"obligation {_cut(event.name, NAME_EXCERPT)} opened; it needs {_cut(needs, VALUE_EXCERPT, pos)}"
    if isinstance(event, ev.Fulfilment):
        return f"obligation {_cut(event.name, NAME_EXCERPT)} fulfilled"
    if isinstance(event, ev.HandleOpened):
        detail = f": {_cut(event.detail, TEXT_EXCERPT, pos)}" if event.detail else ""
        return f"{event.resource} handle {_cut(event.handle, NAME_EXCERPT)} opened{detail}"
    if isinstance(event, ev.HandleClosed):
        return f"handle {_cut(event.handle, NAME_EXCERPT)} closed"
    if isinstance(event, ev.GraphState):
        return f"graph state {_cut(event.id, NAME_EXCERPT)}: {_value(event.value, pos)}"
    if isinstance(event, ev.Write):
        return f"write to {_cut(event.channel, NAME_EXCERPT)} by task {_cut(event.task, NAME_EXCERPT)}: {_value(event.value, pos)}"
    return f"{event.kind} event"


def _cut(text: str, n: int, pos: int | None = None) -> str:
    """Return ``text`` cut to ``n`` characters with "…", naming ``pos:N`` as what fetches it whole."""
    if len(text) <= n:
        return text
    return text[: n - 1] + "…" + (f" (cut; recall pos:{pos})" if pos is not None else "")


def _value(value: JSON, pos: int) -> str:
    return _cut(ev.encode_json(value), VALUE_EXCERPT, pos)


# --- the note --------------------------------------------------------------------------


def _note_text(summaries: list[str], logged: list[tuple[int, str]], needed: Sequence[Needed]) -> str:
    """Return the one note: each summary's section, the raw events that are no conversation, the needed literals."""
    sections = list(summaries)
    if logged:
        lines = ["Logged outside the summaries, not part of the conversation below:"]
        earlier, newest = logged[: max(0, len(logged) - LOGGED_LINES)], logged[-LOGGED_LINES:]
        if earlier:
            first, last = earlier[0][0], earlier[-1][0]
            lines.append(f"- {len(earlier)} earlier entries between pos {first} and {last} are not listed: "
                         f"recall span:{first}-{last + 1}")
        lines += [f"- [pos {pos}] {line}" for pos, line in newest]
        sections.append("\n".join(lines))
    if needed:
        sections.append(_needed_text(needed))
    if not sections:
        return ""
    sections.append(f"A handle above (spill:N, pos:N, span:A-B, facts:A-B, binding:KEY) names what this note does "
                    f"not quote: call the {RECALL_TOOL} tool with it to fetch it from the log, verified.")
    return "\n\n".join(sections)


def _needed_text(needed: Sequence[Needed]) -> str:
    """Return the note's section on the literals open obligations need: verbatim while short, else by handle."""
    lines = ["Literals that open obligations need (a summary spilled them to the store):"]
    for n in needed[:NEEDED_LINES]:
        text = ev.encode_json(n.value)
        who = f"- {_cut(n.obligation, NAME_EXCERPT)} needs {_cut(n.key, NAME_EXCERPT)}"
        if len(text) <= NEEDED_VERBATIM:
            lines.append(f"{who} = {text} ({n.handle})")
        else:
            lines.append(f"{who}: {len(text)} characters, not quoted; call the {RECALL_TOOL} tool with {n.handle} "
                         "to fetch it")
    rest = needed[NEEDED_LINES:]
    if rest:
        handles = ", ".join(sorted({n.handle for n in rest}, key=_handle_pos)[:SPILL_HANDLES])
        more = len({n.handle for n in rest})
        lines.append(f"- {len(rest)} more needed literals, in {more} spills ({handles}"
                     f"{', …' if more > SPILL_HANDLES else ''}): the {RECALL_TOOL} tool fetches each by its handle; "
                     "binding:KEY fetches a key's value")
    return "\n".join(lines)


def _handle_pos(handle: str) -> int:
    digits = handle.partition(":")[2]
    return int(digits) if digits.isdecimal() and len(digits) <= 19 else -1


def _summary_text(node: SummaryEntry) -> str:
    """Return a summary node's section of the note: what it covers, its loss class, its text, what it retains."""
    lines = [
        f"[summary L{node.tier} of events [{node.start}, {node.stop}), node at pos {node.pos}; "
        f"loss class {node.loss.value}: {LOSS_NOTES.get(node.loss, LOSS_NOTES[LossClass.LOSSY_LITERAL])}]",
        _cut(node.summary, SUMMARY_EXCERPT, node.pos),
    ]
    if node.negative_facts:
        lines.append("Negative facts (failed, rejected or superseded; do not redo them):")
        lines += _fact_lines(node.negative_facts)
    first = listed_from(node)
    if node.start < first:
        # A digest lists its newest facts; the nodes it rolls up keep the earlier ones.
        lines.append(f"- earlier negative facts of [{node.start}, {first}) not listed here are kept by the nodes this "
                     f"digest rolls up: recall facts:{node.start}-{first}")
    if node.unresolved:
        lines.append("UNRESOLVED (still open at the end of the span):")
        lines += _item_lines(node.unresolved, "UNRESOLVED ")
    if node.resolved:
        lines.append("Resolved in the span (opened before it; do not redo them):")
        lines += _item_lines(node.resolved, "")
    if node.kept:
        lines.append("Kept verbatim:")
        lines += _kept_lines(node.kept)
    if node.spills:
        lines.append("Spilled to the store (fetch by handle):")
        lines += _spill_lines(node.spills)
    if node.contract:
        lines.append(f"Contract: {_cut(node.contract, CONTRACT_EXCERPT, node.pos)}")
    return "\n".join(lines)


def listed_from(node: SummaryEntry) -> int:
    """Return the position from which a node's note lists every negative fact it retains (its start: all of them).

    An L1 node lists every fact it retains. A digest (L2) lists its newest
    :data:`compactstore.rules.DIGEST_FACTS`, after any older ones it lists itself, and
    the nodes it rolls up keep the rest: from the oldest of those newest ones on, its
    list is whole.
    """
    if node.tier != 2:
        return node.start
    newest = sorted(x.pos for x in node.negative_facts)[-DIGEST_FACTS:]
    return newest[0] if len(newest) == DIGEST_FACTS else node.start


def _counted(what: str, positions: Sequence[int]) -> str:
    """Return the line counting ``what`` at ``positions`` (sorted), with the span handle that covers them."""
    first, last = positions[0], positions[-1]
    return f"- {len(positions)} earlier {what} between pos {first} and {last}: recall span:{first}-{last + 1}"


def _item_lines(items: Sequence[ev.Item], prefix: str) -> list[str]:
    earlier, newest = items[: max(0, len(items) - ITEMS_LISTED)], items[-ITEMS_LISTED:]
    lines = [_counted("items", sorted(i.pos for i in earlier))] if earlier else []
    return lines + [f"- {prefix}{i.kind} {_cut(i.id, NAME_EXCERPT)} (pos {i.pos})" for i in newest]


def _kept_lines(kept: Sequence[ev.Excerpt]) -> list[str]:
    earlier, newest = kept[: max(0, len(kept) - ITEMS_LISTED)], kept[-ITEMS_LISTED:]
    lines = [_counted("kept literals", sorted(e.pos for e in earlier))] if earlier else []
    return lines + [f"- pos {e.pos} {_cut(e.path, NAME_EXCERPT)} = {_value(e.value, e.pos)}" for e in newest]


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
        more = ""
        if len(positions) > GROUP_POSITIONS:
            first, last = min(positions), max(positions)
            more = f" and {len(positions) - GROUP_POSITIONS} earlier; recall facts:{first}-{last + 1}"
        times = f" ×{len(positions)}" if len(positions) > 1 else ""
        said = f": {text}" if text else ""
        lines.append(f"- earlier {status}{times}{said} (pos {shown}{more})")
    rest: dict[str, list[int]] = {}
    for (status, _), positions in ordered[EARLIER_GROUPS:]:
        rest.setdefault(status, []).extend(positions)
    for status, positions in sorted(rest.items()):
        first, last = min(positions), max(positions)
        lines.append(f"- {len(positions)} more earlier {status} facts, between pos {first} and {last}: "
                     f"recall facts:{first}-{last + 1}")
    lines += [f"- pos {f.pos} {f.status}: {_cut(f.text, FACT_EXCERPT)}".rstrip(": ") for f in newest]
    return lines


def _spill_lines(spills: Sequence[ev.SpillRef]) -> list[str]:
    """Return the note's lines for ``spills``: each key's latest spill, its newest earlier ones by handle.

    The newest :data:`SPILLS_LISTED` keys are listed; the earlier keys, and a key's earlier
    spills past :data:`SPILL_HANDLES`, are counted with the span of the positions they were
    bound at, whose raw events hold their bindings.
    """
    latest: dict[str, ev.SpillRef] = {}
    earlier: dict[str, list[ev.SpillRef]] = {}
    for r in spills:
        if r.key in latest:
            earlier.setdefault(r.key, []).append(latest.pop(r.key))
        latest[r.key] = r  # (re-)inserted last: the dict keeps the keys in the order of their latest spill
    refs = list(latest.values())
    dropped, listed = refs[: max(0, len(refs) - SPILLS_LISTED)], refs[-SPILLS_LISTED:]
    lines = [_counted("spilled keys, bound", sorted(r.source for r in dropped))] if dropped else []
    for r in listed:
        before = earlier.get(r.key, [])
        said = ""
        if before:
            said = f"; earlier values: {', '.join(e.handle for e in reversed(before[-SPILL_HANDLES:]))}"
            if len(before) > SPILL_HANDLES:
                older = sorted(e.source for e in before[:-SPILL_HANDLES])
                said += (f" and {len(older)} earlier, bound between pos {older[0]} and {older[-1]}: "
                         f"recall span:{older[0]}-{older[-1] + 1}")
        lines.append(f"- {_cut(r.key, NAME_EXCERPT)} (bound at pos {r.source}): {r.handle}{said}")
    return lines
