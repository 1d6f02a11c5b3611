"""An OpenAI Agents SDK session whose items are events in a compactstore session.

    from agents import Agent, Runner
    from compactstore.adapters.openai_agents import CompactStoreSession

    result = await Runner.run(agent, "hi", session=CompactStoreSession("chat-42", "agent.db"))

How a session maps onto the log:

- SDK session ``session_id`` is the compactstore session ``"openai-agents:" +
  session_id`` (``"openai-agents:#" +`` the hex BLAKE3 of the id when that is not a
  valid session name, or the id starts with ``#``).
- Every item is one event, read as the SDK reads it (:data:`CALLS` is the SDK's own
  pairing of calls and outputs). An item that calls a tool (a function, custom, computer,
  local shell, shell, apply_patch, tool search or program call, or a hosted MCP approval
  request) is a ``ToolCall`` whose ``call_id`` its output item (the approval response for
  a request), a ``ToolResult`` holding the ``output``, closes; every other item is a
  ``Turn`` whose ``role`` is the item's role (or its type) and whose ``content`` is its
  text. The rest of the item is kept in ``meta["item"]`` (after the JSON round trip
  ``SQLiteSession`` gives it too), so it comes back exactly. Compaction sees which
  calls are still open, and markers and resume work on a conversation as on any
  session.
- An output that reports a failure (:func:`tool_failed`) is a failed result (``ok=False``,
  ``status="failed"``), and a hosted tool call (web or file search, code interpreter,
  image generation, an MCP call or tool listing) that failed a failed ``Turn``: negative
  facts that every summary of them must retain. The SDK marks few failures in the item
  itself (a ``status``, an ``error``, a shell command's exit code); a function tool's
  error it writes as text only (its ``failure_error_function``, by default "An error
  occurred while running the tool. Please try again.", its timeout and tool-not-found
  messages), which :func:`tool_failed` recognises. A session whose tools write their own
  error texts passes a ``tool_failed`` that knows them (a custom tool's error reaches the
  session as the exception's bare message).
- An output that reports a declined approval (:func:`tool_rejected`) is a rejected result
  (``ok=False``, ``status="rejected"``), a negative fact too: an MCP approval response
  with ``approve: false``, and a function, custom, shell or apply_patch output carrying the
  SDK's rejection text, by default :data:`DEFAULT_REJECTION` ("Tool execution was not
  approved."). A run given its own ``rejection_message`` passes a matching
  ``tool_rejected`` (:func:`output_text` reads the text wherever the SDK writes it); a
  shell or apply_patch rejection with another text is still a failed result.
- ``pop_item`` and ``clear_session`` redact: the items read as gone, the tree still
  verifies, and ``Store.verify`` counts the erased positions.

``get_items``, ``add_items``, ``pop_item`` and ``clear_session`` behave as the SDK's
``SQLiteSession`` does (the same limits, ``session_settings`` included, and order); they
run the store's calls in a worker thread.

With a compaction policy (``CompactStoreSession(..., compaction=cs.CompactionPolicy())``):

- after each ``add_items`` the session runs :meth:`compactstore.Session.maintain`
  (``amaintain``, awaiting the summarizer, when it is ``async def``);
- once a marker certifies, ``get_items`` returns the certified context of
  :meth:`compactstore.Session.context` as Responses input items
  (``Resolution.as_messages("openai-responses")``): a developer note per summary node,
  then every item after the span the summaries cover, each once and as it was stored
  (a tool output whose call a summary swallowed goes in as a note). ``limit`` keeps the
  last ``limit`` of those, notes included. Until a marker certifies, or when none does
  any more, it returns the stored items as without a policy;
- ``pop_item`` withdraws the latest item without redacting it: it appends an event that
  supersedes the item, so the item reads as gone and later summaries list it as
  superseded, while markers still certify (a redacted position is unknown to the
  rules, so no marker could ever cover it). An item a summary had already taken in
  stays in that summary's text;
- ``clear_session`` redacts as without a policy; the cleared positions are then
  unknown to the rules, so no later marker certifies over them and ``get_items``
  returns stored items from then on: start a new ``session_id`` to compact again.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from agents.memory.session_settings import SessionSettings, coerce_session_settings, resolve_session_limit
from agents.tool import DEFAULT_APPROVAL_REJECTION_MESSAGE, FunctionTool, default_tool_error_function, function_tool

from .. import events as ev
from .. import recall, render
from ..errors import InvalidArgument, InvalidEvent, InvalidType, ReconstructionUnsoundError
from ..policy import CompactionPolicy, Maintenance
from ..resolver import RawItem
from ..store import Record, Session, Store
from ..witness import Witness
from .tail import RETRIES, StoreUser, Tail, read_many, reading, session_name

__all__ = ["CompactStoreSession", "PREFIX", "POPPED", "output_text", "tool_failed", "tool_rejected"]

#: Every SDK session's compactstore session name starts with this.
PREFIX = "openai-agents:"
#: Item types that call a tool, with the type of the item that carries the call's output: the
#: SDK's own pairing (of its runner's check for calls without output, and of its tool invocations).
CALLS = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "computer_call": "computer_call_output",
    "local_shell_call": "local_shell_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "tool_search_call": "tool_search_output",
    "program": "program_output",
    "mcp_approval_request": "mcp_approval_response",
}
OUTPUTS = frozenset(CALLS.values())
#: The field naming the call, on a call or an output whose field is not ``call_id``.
CALL_ID_FIELD = {"mcp_approval_request": "id", "mcp_approval_response": "approval_request_id"}
#: Hosted tool calls: one item holds the call and its outcome (its ``status``, its ``error``).
HOSTED = frozenset({"file_search_call", "web_search_call", "code_interpreter_call", "image_generation_call",
                    "mcp_call", "mcp_list_tools"})
#: Statuses with which an output or a hosted call reports a run that did not complete.
FAILED_STATUSES = frozenset({"failed", "incomplete"})
#: Item fields an event may carry in its own field rather than in ``meta["item"]``.
MOVABLE = frozenset({"content", "output"})
#: Fields that say what a tool item did, in the order a turn's text shows them.
TEXT_FIELDS = ("server_label", "name", "arguments", "queries", "action", "code", "output", "error", "reason")
#: Characters of a tool item's text a turn carries (the item itself is kept whole).
TEXT_LIMIT = 2000

#: ``meta`` key of the event with which ``pop_item`` withdraws an item under a compaction policy.
POPPED = "openai-agents:popped"
#: The text the SDK's default ``failure_error_function`` writes as a failed tool's output.
DEFAULT_TOOL_ERROR = default_tool_error_function(None, RuntimeError())  # type: ignore[arg-type]
#: The text the SDK writes as the output of a tool call whose approval was rejected.
DEFAULT_REJECTION: str = DEFAULT_APPROVAL_REJECTION_MESSAGE
#: The SDK's default timeout output (``default_tool_timeout_error_message``).
_TIMEOUT = re.compile(r"Tool '.*' timed out after [0-9.e+-]+ seconds\.", re.DOTALL)
#: The SDK's default output for a call of a tool the agent does not have.
_NOT_FOUND = re.compile(r"Tool '.*' not found\.", re.DOTALL)
#: How the SDK wraps an error text it writes for a tool called by a program (``function_tool_error_output``).
_WRAPPED_ERROR = '{"error":'

Item = dict[str, Any]


def output_text(item: Item) -> str | None:
    """Return the text a tool output item carries where the SDK writes an error or a rejection.

    A string ``output``, unwrapped from the ``{"error": text}`` the SDK writes for a tool
    that a program called; for a shell output of one command with no ``stdout``, that
    command's ``stderr``; else None.
    """
    output = item.get("output")
    if isinstance(output, str):
        if output.startswith(_WRAPPED_ERROR):
            try:
                wrapped = json.loads(output)
            except ValueError:
                return output
            error = wrapped.get("error") if isinstance(wrapped, dict) and len(wrapped) == 1 else None
            if isinstance(error, str):
                return error
        return output
    if isinstance(output, list) and len(output) == 1 and isinstance(output[0], dict):
        entry = output[0]
        stderr = entry.get("stderr")
        if not entry.get("stdout") and isinstance(stderr, str):
            return stderr
    return None


def tool_failed(item: Item) -> bool:
    """Return whether a tool output or a hosted tool call reports a failure, as the SDK writes one.

    True for an item whose ``status`` is ``"failed"`` or ``"incomplete"``; a hosted call
    with an ``error``; a shell output with a command that timed out or exited non-zero
    (the SDK writes a failed executor as exit code 1); and an output whose text
    (:func:`output_text`) starts with the SDK's default tool error
    (:data:`DEFAULT_TOOL_ERROR`) or is its default timeout or tool-not-found message.
    """
    if item.get("status") in FAILED_STATUSES:
        return True
    kind = item.get("type")
    if kind in HOSTED:
        return bool(item.get("error"))
    if kind == "shell_call_output":
        output = item.get("output")
        return isinstance(output, list) and any(map(_command_failed, output))
    text = output_text(item) if kind in OUTPUTS else None
    return text is not None and (text.startswith(DEFAULT_TOOL_ERROR) or _TIMEOUT.fullmatch(text) is not None
                                 or _NOT_FOUND.fullmatch(text) is not None)


def tool_rejected(item: Item) -> bool:
    """Return whether an item reports a declined approval, as the SDK writes one.

    True for an MCP approval response that does not approve, and for a tool output whose
    text (:func:`output_text`) is the SDK's default rejection message
    (:data:`DEFAULT_REJECTION`), as it writes a declined function, custom, shell or
    apply_patch call.
    """
    kind = item.get("type")
    if kind == "mcp_approval_response":
        return item.get("approve") is not True
    return kind in OUTPUTS and output_text(item) == DEFAULT_REJECTION


def _command_failed(entry: object) -> bool:
    """Return whether one command of a shell output timed out or exited non-zero, read as the SDK normalizes it."""
    if not isinstance(entry, dict):
        return False
    outcome = entry.get("outcome")
    if isinstance(outcome, dict):
        return outcome.get("type") == "timeout" or _nonzero(outcome.get("exit_code", entry.get("exit_code")))
    return entry.get("status") == "timeout" or outcome == "failure" or _nonzero(entry.get("exit_code"))


def _nonzero(code: object) -> bool:
    return isinstance(code, int) and not isinstance(code, bool) and code != 0


class _Items(Tail):
    """The live item positions of one session, in order."""

    def __init__(self, session: Session, *, verify: bool = True) -> None:
        super().__init__(session, verify=verify)
        self.items: list[int] = []
        #: positions withdrawn by ``pop_item`` under a policy, and the events withdrawing them
        self.hidden: set[int] = set()
        #: whether a marker pointing at a summary node was ever appended (and not redacted)
        self.marked: set[int] = set()

    def apply(self, record: Record) -> None:
        event = record.event
        meta = event.meta
        if isinstance(event, ev.RecoveryMarker) and event.node is not None:
            self.marked.add(record.pos)
        elif isinstance(meta, dict) and POPPED in meta and event.supersedes is not None:
            self.hidden.update((record.pos, event.supersedes))
            self.items = [p for p in self.items if p != event.supersedes]
        elif isinstance(meta, dict) and "item" in meta:
            self.items.append(record.pos)

    def forget(self, positions: Sequence[int]) -> None:
        gone = set(positions)
        if gone:
            self.items = [p for p in self.items if p not in gone]
            self.marked.difference_update(gone)


def event_of(item: Item, failed: Callable[[Item], bool] = tool_failed,
             rejected: Callable[[Item], bool] = tool_rejected) -> ev.Event:
    """Return the event that stores ``item``: a tool call, its result, or a turn.

    The item goes into ``meta["item"]``, less a field the event carries itself (a turn's
    text ``content``, a result's ``output``), which ``meta["moved"]`` names; so nothing
    is stored twice, and :func:`item_of` puts the item back together exactly. An output
    or a hosted tool call for which ``rejected`` is true is rejected (a result with
    ``ok=False``, ``status="rejected"``); else one for which ``failed`` is true is failed
    (``status="failed"``).
    """
    return _event_of(item, owned=False, failed=failed, rejected=rejected)


def _event_of(item: Item, *, owned: bool, failed: Callable[[Item], bool] = tool_failed,
              rejected: Callable[[Item], bool] = tool_rejected) -> ev.Event:
    """Return :func:`event_of` of ``item``; ``owned``: no one else holds it, so it may go into the event as it is."""
    kind = item.get("type")
    if kind in CALLS or kind in OUTPUTS:
        call_id = item.get(CALL_ID_FIELD.get(kind, "call_id"))
        if isinstance(call_id, str) and call_id:
            if kind in CALLS:
                name = item.get("name")
                return ev.ToolCall(call_id=call_id, name=name if isinstance(name, str) and name else str(kind),
                                   meta={"item": item})
            # Decided before ``_moved`` may take the output out of the item.
            status = _outcome(item, failed, rejected)
            ok = status is None
            if "output" in item:
                return ev.ToolResult(call_id=call_id, output=item["output"], ok=ok, status=status,
                                     meta=_moved(item, "output", owned))
            # An approval response holds no output: its reason is the text a summary shows.
            reason = item.get("reason") if kind == "mcp_approval_response" else None
            return ev.ToolResult(call_id=call_id, output=reason if isinstance(reason, str) else None, ok=ok,
                                 status=status, meta={"item": item})
    status = _outcome(item, failed, rejected) if kind in HOSTED else None
    role = item.get("role")
    role = role if isinstance(role, str) and role else kind if isinstance(kind, str) and kind else "item"
    content = item.get("content")
    if isinstance(content, str):
        return ev.Turn(role=role, content=content, status=status, meta=_moved(item, "content", owned))
    return ev.Turn(role=role, content=_text(item), status=status, meta={"item": item})


def _outcome(item: Item, failed: Callable[[Item], bool], rejected: Callable[[Item], bool]) -> ev.Status | None:
    """Return the negative status an output or a hosted call reports: a rejection before a failure (the SDK
    marks a declined apply_patch call failed too), else None."""
    return "rejected" if rejected(item) else "failed" if failed(item) else None


def item_of(event: ev.Event) -> Item | None:
    """Return the item ``event`` stores (None when it stores none, or was redacted)."""
    meta = event.meta
    item = meta.get("item") if isinstance(meta, dict) else None
    if not isinstance(item, dict):
        return None
    moved = meta.get("moved") if isinstance(meta, dict) else None
    if not moved:
        return item
    out = dict(item)
    for name in moved:
        if name in MOVABLE:
            out[name] = getattr(event, name)
    return out


def _moved(item: Item, name: str, owned: bool) -> dict[str, Any]:
    if owned:  # a private copy: drop the field rather than copy the rest
        del item[name]
        return {"item": item, "moved": [name]}
    return {"item": {k: v for k, v in item.items() if k != name}, "moved": [name]}


def _text(item: Item) -> str:
    """Return what an item says as text: a message's or a reasoning's parts, else the fields of a tool item."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else item.get("summary")
    if isinstance(parts, list):
        texts = []
        for part in parts:
            if isinstance(part, dict):
                text = part.get("text") or part.get("refusal")
                texts.append(text if isinstance(text, str) else f"[{part.get('type', 'part')}]")
        return "\n".join(texts)
    lines = []
    for name in TEXT_FIELDS:
        value = item.get(name)
        if value not in (None, "", [], {}):
            shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=repr)
            lines.append(f"{name}: {shown}")
    text = "\n".join(lines)
    return text if len(text) <= TEXT_LIMIT else text[: TEXT_LIMIT - 1] + "…"


class CompactStoreSession(StoreUser):
    """An OpenAI Agents SDK ``Session`` kept as a tamper-evident compactstore session.

    Args:
        session_id: the SDK's session id.
        store: an open :class:`compactstore.Store`, or a target to open (a SQLite path,
            ``":memory:"`` or a ``postgresql://`` URL); a store opened here is closed by
            :meth:`close`.
        session_settings: the default ``limit`` of :meth:`get_items`: a ``SessionSettings``, or a
            dict of its fields, as every SDK session takes it.
        prefix: the start of the compactstore session's name.
        compaction: a policy the session maintains after each :meth:`add_items`; from
            the first certifying marker on, :meth:`get_items` returns the compacted
            context (see the module's docstring).
        tool_failed: which outputs and hosted tool calls report a failure (default :func:`tool_failed`).
        tool_rejected: which outputs report a declined approval (default :func:`tool_rejected`).
        witness: for a store opened here, as :func:`compactstore.open` takes it.
        verify: hold every row ``get_items`` reads to the session's latest sealed head (see
            :meth:`compactstore.Session.scan`). ``False`` saves a head read and a seal check
            per call and the proof of rows not read before, and gives up noticing an item
            rewritten with its leaf, copied from another session, or cut off with the tail.
        reclaim: after :meth:`clear_session`, give the erased items' space back to the
            file system (:meth:`compactstore.Store.reclaim`). ``CompactionPolicy(retain_last=N)``
            drops the items a certified summary stands for.

    Raises:
        InvalidType: ``session_settings`` is neither a ``SessionSettings``, a dict nor None,
            or the dict has a key ``SessionSettings`` does not (a ``TypeError`` with the
            SDK's message, "Unknown session settings: ..."); ``compaction`` is not a policy.
        InvalidArgument: a ``session_settings`` field holds a value ``SessionSettings`` refuses.
    """

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str,
        store: Store | str,
        *,
        session_settings: SessionSettings | dict[str, object] | None = None,
        prefix: str = PREFIX,
        compaction: CompactionPolicy | None = None,
        tool_failed: Callable[[Item], bool] = tool_failed,
        tool_rejected: Callable[[Item], bool] = tool_rejected,
        witness: str | os.PathLike[str] | Witness | None = None,
        verify: bool = True,
        reclaim: bool = True,
    ) -> None:
        if compaction is not None and not isinstance(compaction, CompactionPolicy):
            raise InvalidType("compaction", f"want a CompactionPolicy or None, got {type(compaction).__name__}")
        self.session_id = session_id
        self.session_settings = _settings(session_settings)
        self.compaction = compaction
        #: whether clear_session gives the erased items' space back (Store.reclaim)
        self.reclaim = ev.as_flag("reclaim", reclaim)
        self.tool_failed = tool_failed
        self.tool_rejected = tool_rejected
        #: what the latest maintenance after :meth:`add_items` did (None before the first)
        self.maintenance: Maintenance | None = None
        self._use(store, witness)
        #: the compactstore session holding the items: compact, mark and resume it like any other
        self.log: Session = self.store.session(session_name(prefix, str(session_id)))
        #: whether ``get_items`` holds every row it reads to the latest sealed head
        self.verify = ev.as_flag("verify", verify)
        self._items = _Items(self.log, verify=self.verify)

    async def get_items(self, limit: int | None = None) -> list[Item]:
        """Return the session's items, oldest first: all of them, or the latest ``limit``.

        ``limit`` None falls back to ``session_settings.limit``; 0 gives none and a
        negative limit all, as in ``SQLiteSession``. Under a compaction policy, once a
        marker certifies, the items are the compacted context: a developer note per
        summary, then the items after what the summaries cover.
        """
        return await asyncio.to_thread(self._get, resolve_session_limit(limit, self.session_settings))

    def _get(self, limit: int | None) -> list[Item]:
        index = self._items
        with index.lock, reading(self.log, self.verify):  # one head check for every read of the call
            if self.compaction is not None:
                index.refresh()
                if index.marked:
                    compacted = self._compacted()
                    if compacted is not None:
                        return compacted if limit is None or limit < 0 else compacted[-limit:] if limit else []
            for _ in range(RETRIES):
                index.refresh()
                positions = index.items if limit is None or limit < 0 else index.items[-limit:] if limit else []
                records = read_many(self.log, positions, verify=self.verify)
                items = [_item_of(records.get(p)) for p in positions]
                if all(i is not None for i in items):
                    return [i for i in items if i is not None]
            # Still racing another process's redactions: return what is there.
            return [i for i in items if i is not None]

    def _compacted(self) -> list[Item] | None:
        """Return the certified context as Responses input items, or None when no marker certifies."""
        got = self.log.context()
        if got.mode != "certified":
            return None
        hidden = self._items.hidden
        # The context holds each raw event after the cover once; what pop_item withdrew is left out.
        entries = [x for x in got.context if not (isinstance(x, RawItem) and x.pos in hidden)]
        return [dict(m) for m in render.messages(entries, "openai-responses", needed=got.needed)]

    def recall_tool(self) -> FunctionTool:
        """Return the recall tool as an Agents SDK function tool: :func:`compactstore.recall.recall` on this session.

        Named :data:`compactstore.render.RECALL_TOOL`, it takes one ``handle`` (``spill:N``,
        ``pos:N``, ``span:A-B``, ``facts:A-B``, ``binding:KEY``) and returns the text
        :func:`~compactstore.recall.recall` writes, read in a worker thread:
        ``Agent(..., tools=[session.recall_tool()])``. A handle refused (malformed, out of
        range, or a redacted value) comes back to the model as ``refused: ...``; a failed
        integrity check raises and ends the run.
        """
        log = self.log

        async def fetch(handle: str) -> str:
            try:
                return await asyncio.to_thread(recall.recall, log, handle)
            except (InvalidArgument, ReconstructionUnsoundError) as exc:
                return f"refused: {exc}"

        return function_tool(fetch, name_override=render.RECALL_TOOL, description_override=recall.DESCRIPTION,
                             use_docstring_info=False, failure_error_function=None)

    async def add_items(self, items: list[Item]) -> None:
        """Append ``items`` in one transaction, in order; then do what the compaction policy says is due.

        Raises:
            InvalidEvent: an item is not JSON (or holds NaN); nothing is written.
            InvalidArgument: the policy's summarizer failed to give text (the items are written).
        """
        if not items:
            return
        # What SQLiteSession's JSON round trip gives, taken now (as it does) so that the
        # caller changing an item later changes nothing stored.
        failed, rejected = self.tool_failed, self.tool_rejected
        events = [_event_of(_round_trip(item), owned=True, failed=failed, rejected=rejected) for item in items]
        await asyncio.to_thread(self._add, events)
        policy = self.compaction
        if policy is not None:
            if policy.is_async:
                self.maintenance = await self.log.amaintain(policy)
            else:
                self.maintenance = await asyncio.to_thread(self.log.maintain, policy)

    def _add(self, events: list[ev.Event]) -> None:
        with self._items.lock:
            self._items.own(self.log.extend(events))

    async def pop_item(self) -> Item | None:
        """Redact the latest item and return it; None when the session has no items.

        Under a compaction policy the item is withdrawn instead: an event that
        supersedes it is appended, and the item reads as gone (see the module's docstring).
        """
        return await asyncio.to_thread(self._pop)

    def _pop(self) -> Item | None:
        index = self._items
        with index.lock:
            for _ in range(RETRIES):
                index.refresh()
                if not index.items:
                    return None
                pos = index.items[-1]
                item = _item_of(self.log.read(pos))
                if item is None:
                    continue
                if self.compaction is not None:
                    withdrawal = ev.Turn(role="pop_item", content=f"item at pos {pos} withdrawn",
                                         supersedes=pos, meta={POPPED: pos})
                    if index.commit([withdrawal]) is None:
                        continue  # another writer appended since the refresh: decide again
                    return item
                try:
                    index.own([self.log.redact([pos], "openai-agents pop_item")])
                except InvalidEvent:
                    continue  # another process popped it first
                return item
        return None

    async def clear_session(self) -> None:
        """Redact every item of the session, and the summaries and markers made from them."""
        await asyncio.to_thread(self._clear)

    def _clear(self) -> None:
        index = self._items
        with index.lock:
            index.refresh()
            index.erase(set(index.live), "openai-agents clear_session")
        if self.reclaim:
            self.store.reclaim()


def _settings(value: object) -> SessionSettings:
    """Return ``value`` as SDK sessions take ``session_settings``: a SessionSettings, a dict of its fields, or None.

    Raises:
        InvalidType: ``value`` is neither, or the dict has a key SessionSettings does not
            (a ``TypeError``, with the SDK's message).
        InvalidArgument: a field's value is not one SessionSettings takes.
    """
    if value is None:
        return SessionSettings()
    try:
        return coerce_session_settings(value)  # type: ignore[arg-type]
    except TypeError as exc:
        raise InvalidType("session_settings", str(exc)) from exc
    except ValueError as exc:  # pydantic's ValidationError names the field and what it wants
        errors = getattr(exc, "errors", None)
        first = errors()[0] if callable(errors) and errors() else {}
        where = ".".join(map(str, first.get("loc", ())))
        raise InvalidArgument("session_settings" + (f".{where}" if where else ""),
                              str(first.get("msg", exc))) from exc


class _NotPlain(Exception):
    """A value whose JSON round trip is not simply a copy of it."""


def _round_trip(item: Any) -> Any:
    """Return ``json.loads(json.dumps(item))``, as SQLiteSession stores and reads an item.

    Items are almost always plain JSON (dicts with str keys, lists, str, int, bool,
    None, finite floats), whose round trip is a deep copy: made directly, that is
    several times faster. Anything else (tuples, non-str keys, NaN, subclasses) takes
    the round trip itself, so the result and any error are exactly SQLiteSession's.
    """
    try:
        return _copy(item, 0)
    except _NotPlain:
        return json.loads(json.dumps(item))


def _copy(value: Any, depth: int) -> Any:
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if depth > 64:
        raise _NotPlain
    if kind is dict:
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                raise _NotPlain
            t = type(v)
            out[k] = v if t is str or t is int or t is bool or v is None else _copy(v, depth + 1)
        return out
    if kind is list:
        return [v if type(v) is str else _copy(v, depth + 1) for v in value]
    if kind is float and math.isfinite(value):
        return value
    raise _NotPlain


def _item_of(record: Record | None) -> Item | None:
    return item_of(record.event) if record is not None else None
