"""A LangGraph checkpointer that keeps each checkpoint and pending write as an event in compactstore.

    from compactstore.adapters.langgraph import CompactStoreSaver

    graph = builder.compile(checkpointer=CompactStoreSaver("agent.db"))

How a thread maps onto the log:

- A LangGraph thread is one compactstore session, named ``"langgraph:" + thread_id``;
  when that is not a valid session name (an empty id, one longer than the 512
  characters a name allows, one with a control character) or the id starts with
  ``#``, the name is ``"langgraph:#" +`` the hex BLAKE3 of the id. Every namespace of
  the thread (its subgraphs) lives in that session, so one Merkle tree covers the
  whole thread and :meth:`CompactStoreSaver.session` gives it.
- ``put`` appends a ``graph_state`` event (:class:`compactstore.events.GraphState`): ``id``,
  ``ns``, ``parent``; ``meta`` is the checkpoint metadata as plain JSON; ``value``
  holds the rest and only the channel values whose version changed, lists as the
  elements appended since the last one (:mod:`.langgraph_state` says how).
- ``put_writes`` appends one ``write`` event per (task, idx) not written yet, all in
  one transaction: the saver decides what is new from its index of the log, under the
  session's write lock and only if no other writer appended since it last read, so a
  retried call writes nothing and the store looks up no idempotency key. A regular
  write to a (task, idx) already written is ignored; a special one (error, interrupt,
  resume, scheduled) replaces it with an event that ``supersedes`` it.
- Beside them, the thread's conversation is recorded as structured events
  (:mod:`.langgraph_messages`): ``put`` appends, in the checkpoint's commit, a turn,
  tool call or tool result for each message of the ``messages`` channel no event was
  recorded from yet (a tool error is a failed result), and ``put_writes`` an open
  handle for each interrupt, closed by the first checkpoint put after the one it
  paused at. So the gate, compaction and markers see the conversation, and
  :meth:`CompactStoreSaver.context_messages` feeds it back compacted, as input every
  provider accepts: through :meth:`CompactStoreSaver.middleware` for LangChain's
  ``create_agent``, or the pre-model hook :meth:`CompactStoreSaver.context_hook` for
  ``create_react_agent``; :meth:`CompactStoreSaver.recall_tool` lets the model fetch what
  the compacted context names by handle. With ``compaction=cs.CompactionPolicy(...)``
  each put then maintains the thread's session.
- Deleting (``delete_thread``, ``prune``, ``delete_for_runs``) is redaction: bodies
  are erased, leaves stay, the tree still verifies and ``Store.verify`` counts them as
  redacted. A kept checkpoint that read a channel value (or part of one) from an
  erased event is first appended again with that value whole inside. ``delete_thread``
  erases the recorded conversation too; ``prune`` and ``delete_for_runs`` remove
  checkpoints and leave it, and ``copy_thread`` copies checkpoints and writes only (the
  target's next put records the messages its state holds).

The log is the source of truth. Per thread the saver keeps a small index of it
(:mod:`.langgraph_index`), kept current by reading only what was appended since, by
any process: reading the latest checkpoint costs a few rows however long the thread.

The async methods run the sync ones in a worker thread (``asyncio.to_thread``).
``setup()`` is there for code written for the stock savers: the store needs none.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from contextlib import ExitStack
from operator import itemgetter
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import INTERRUPT as INTERRUPT_CHANNEL
from langgraph.types import Interrupt

from .. import events as ev
from .. import recall, render
from ..errors import ConflictError, InvalidArgument, ReconstructionUnsoundError, shown
from ..policy import CompactionPolicy, Maintenance
from ..resolver import RawItem
from ..store import Record, Session, Store
from ..witness import Witness
from .langgraph_index import Ident, Key, ThreadIndex
from .langgraph_messages import MESSAGE as MESSAGE_ID
from .langgraph_messages import interrupt_closed, interrupt_opened, message_events, message_id
from .langgraph_state import ChannelEncoder, Encoded, StateCodec, copied_value, parts, spread_over, with_whole
from .tail import RETRIES, StoreUser, idempotency_key, read_many, reading, session_name

if TYPE_CHECKING:
    from .langgraph_middleware import ContextMiddleware

__all__ = ["CompactStoreSaver", "PREFIX"]

#: Every thread's session name starts with this.
PREFIX = "langgraph:"
#: The channel whose messages the saver records as a conversation, by default.
MESSAGES = "messages"
#: Events of the log that are checkpoint data, not conversation: left out of a model's context.
STATE_KINDS = (ev.GraphState, ev.Write)
STRATEGIES = ("keep_latest", "delete")
#: Records a copy reads from the source thread at a time.
COPY_CHUNK = 512
#: Tuples ``list`` builds under one head check per thread before it yields them.
LIST_PAGE = 32
_CHANNEL = itemgetter(0)

T = TypeVar("T")


class CompactStoreSaver(StoreUser, BaseCheckpointSaver[str]):
    """A LangGraph checkpointer that keeps every thread as a tamper-evident compactstore session.

    Args:
        store: an open :class:`compactstore.Store`, or a target to open (a SQLite path,
            ``":memory:"`` or a ``postgresql://`` URL); a store opened here is closed by
            :meth:`close`.
        serde: LangGraph's serializer for channel values, writes and checkpoints
            (``JsonPlusSerializer`` by default).
        prefix: the start of every thread's session name.
        witness: for a store opened here, as :func:`compactstore.open` takes it.
        compaction: a policy each thread's session is maintained by after every put
            (:meth:`compactstore.Session.maintain`; ``amaintain`` from :meth:`aput`,
            which an ``async def`` summarizer needs: run the graph with ``ainvoke``).
        messages_channel: the channel whose messages are recorded as turns, tool calls,
            tool results (:mod:`.langgraph_messages`); None records none.
        verify: hold every row ``get_tuple`` and ``list`` read to the thread's latest sealed
            head (see :meth:`compactstore.Session.scan`). ``False`` saves a head read and a
            seal check per call and the proof of rows not read before, and gives up noticing
            a checkpoint rewritten with its leaf, copied from another thread, or cut off
            with the tail: only bodies against their own leaves are checked then.
        reclaim: after :meth:`delete_thread`, :meth:`delete_for_runs` and :meth:`prune`,
            give the erased bodies' space back to the file system (:meth:`compactstore.Store.reclaim`:
            on SQLite the file is rewritten). ``CompactionPolicy(retain_last=N)`` drops the
            raw turns a certified summary stands for.
    """

    def __init__(self, store: Store | str, *, serde: SerializerProtocol | None = None, prefix: str = PREFIX,
                 witness: str | os.PathLike[str] | Witness | None = None, verify: bool = True,
                 compaction: CompactionPolicy | None = None, messages_channel: str | None = MESSAGES,
                 reclaim: bool = True) -> None:
        if compaction is not None and not isinstance(compaction, CompactionPolicy):
            raise TypeError(f"compaction: want a CompactionPolicy or None, got {type(compaction).__name__}")
        super().__init__(serde=serde)
        self._use(store, witness)
        self.verify = ev.as_flag("verify", verify)
        self.prefix = prefix
        self.compaction = compaction
        self.messages_channel = messages_channel
        #: whether delete_thread, delete_for_runs and prune give the erased bodies' space back (Store.reclaim)
        self.reclaim = ev.as_flag("reclaim", reclaim)
        #: what the latest maintenance after a put did (None before the first)
        self.maintenance: Maintenance | None = None
        #: session name -> the lock that keeps this saver's async maintainers of it one at a time
        self._maintainers: dict[str, asyncio.Lock] = {}
        self._threads: dict[str, ThreadIndex] = {}
        #: thread id -> its entry in ``_threads``
        self._by_id: dict[str, ThreadIndex] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_conn_string(cls, conn_string: str, *, serde: SerializerProtocol | None = None, prefix: str = PREFIX,
                         compaction: CompactionPolicy | None = None,
                         witness: str | os.PathLike[str] | Witness | None = None) -> CompactStoreSaver:
        """Return a saver over the store at ``conn_string``, which it closes with itself.

        As the stock savers' ``from_conn_string``, it is used in a ``with`` or an
        ``async with`` block: ``async with CompactStoreSaver.from_conn_string("agent.db")
        as saver: ...``; outside one, call :meth:`close` or ``await`` :meth:`aclose`.
        """
        return cls(conn_string, serde=serde, prefix=prefix, compaction=compaction, witness=witness)

    # --- the log ---------------------------------------------------------------------

    def session(self, thread_id: str) -> Session:
        """Return the compactstore session that holds thread ``thread_id``."""
        return self.store.session(session_name(self.prefix, str(thread_id)))

    def record(self, config: RunnableConfig) -> Record | None:
        """Return the graph state event of the checkpoint ``config`` names (the latest when it names none).

        Its position ``pos`` gives the tree head the checkpoint was committed in:
        ``saver.session(thread_id).head(record.pos + 1)``.
        """
        conf = config["configurable"]
        thread = self._thread(str(conf["thread_id"]), create=False)
        if thread is None:
            return None
        with thread.lock, reading(thread.session, self.verify):
            thread.refresh()
            found = thread.current(conf.get("checkpoint_ns", ""), get_checkpoint_id(config))
            if found is None:
                return None
            record = thread.session.read(found[1], verify=self.verify)
        return record if isinstance(record.event, ev.GraphState) else None

    # --- the conversation, as model input -------------------------------------------------

    def record_messages(self, thread_id: str, messages: Sequence[Any]) -> list[Record]:
        """Record the messages of ``messages`` no event was recorded from yet; return the records appended.

        ``put`` records a checkpoint's messages itself; this records those a graph holds
        before its checkpoint is put (LangGraph puts in the background). Idempotent: a
        message id already recorded is skipped, by this or any other process.
        """
        thread = self._thread(str(thread_id))
        assert thread is not None

        def decide() -> tuple[list[ev.Event], None]:
            return [e for m in thread.unsaid(messages) for e in message_events(m)], None

        with thread.lock:
            return _settle(thread, decide, f"the messages of {thread.session.name!r}")[0]

    def context_messages(self, thread_id: str, messages: Sequence[Any] = ()) -> list[Any]:
        """Return the model input for thread ``thread_id``: its compacted context as LangChain messages.

        ``messages`` (the graph's ``messages`` state, when given) are recorded first
        (:meth:`record_messages`). When a marker certifies
        (:meth:`compactstore.Session.context`), the input is what
        :func:`compactstore.render.messages` writes in ``"chat"`` format, read by
        LangChain's ``convert_to_messages``: one system note at the start (each summary
        with its loss class, negative facts and ``UNRESOLVED`` items; the open tool calls,
        bindings and handles logged since; the spilled literals open obligations need,
        verbatim while short), then the conversation after what the summaries cover,
        every tool result right after its call, opened by a user message; checkpoint data
        (graph states, writes) is left out. The current turn is fed whole even where a
        summary took it in: the last human message, and the tool round the model is called
        to read (the last AI message with tool calls and its tool messages), as
        ``messages`` holds them. Messages without an id come last, as given.
        When no marker certifies, it is ``messages`` as given (the thread's own state,
        exact), or without them the recorded conversation whole.
        """
        from langchain_core.messages import SystemMessage, convert_to_messages

        if messages:
            self.record_messages(thread_id, messages)
        session = self.session(thread_id)
        got = session.context()
        if got.mode != "certified" and messages:
            return list(messages)
        # Checkpoints are what the graph resumes from, not what the model is told.
        entries = [x for x in got.context if not (isinstance(x, RawItem) and isinstance(x.event, STATE_KINDS))]
        # The current turn as the graph holds it, where a summary took part of it in.
        raw = Counter(_message_of(x.event) for x in entries if isinstance(x, RawItem))
        missing = [m for unit in _current(messages)
                   if any(raw[message_id(m)] < len(message_events(m)) for m in unit) for m in unit]
        gone = {message_id(m) for m in missing}
        entries = [x for x in entries if not (isinstance(x, RawItem) and _message_of(x.event) in gone)]
        rendered = convert_to_messages(render.messages(entries, "chat", needed=got.needed))
        lead = 0
        while lead < len(rendered) and isinstance(rendered[lead], SystemMessage):
            lead += 1
        talk = rendered[lead:]
        if missing and talk and talk[0].content in (render.CONTINUED, render.STARTS):
            talk = talk[1:]  # the turn's human message opens the conversation instead
        loose = [m for m in messages if message_id(m) is None]
        return [*rendered[:lead], *missing, *talk, *loose]

    async def acontext_messages(self, thread_id: str, messages: Sequence[Any] = ()) -> list[Any]:
        """Async :meth:`context_messages`, run in a worker thread."""
        return await asyncio.to_thread(self.context_messages, thread_id, list(messages))

    def context_hook(self, thread_id: str | None = None) -> Callable[[Any, RunnableConfig], dict[str, Any]]:
        """Return a pre-model hook that feeds a graph's model the thread's compacted context.

        For LangGraph's ``create_react_agent(model, tools, pre_model_hook=saver.context_hook(),
        checkpointer=saver)`` (give it :meth:`recall_tool` among the tools), or called in a
        model node of your own: given the state (its ``messages``) and the run's config, it
        returns ``{"llm_input_messages": saver.context_messages(thread, state["messages"])}``;
        the thread is ``thread_id``, or the config's when None. The graph's state keeps
        every message. With LangChain's ``create_agent``, use :meth:`middleware` instead.
        """
        channel = self.messages_channel or MESSAGES

        def hook(state: Any, config: RunnableConfig) -> dict[str, Any]:
            thread = thread_id if thread_id is not None else str(config["configurable"]["thread_id"])
            held = state.get(channel, []) if isinstance(state, dict) else getattr(state, channel, [])
            return {"llm_input_messages": self.context_messages(thread, list(held))}

        return hook

    def middleware(self, thread_id: str | None = None, *, recall_tool: bool = True) -> ContextMiddleware:
        """Return an ``AgentMiddleware`` that feeds a LangChain ``create_agent`` model the thread's compacted context.

        ``create_agent(model, tools, middleware=[saver.middleware()], checkpointer=saver)``:
        before each model call it replaces the request's messages by
        :meth:`context_messages` (awaited through :meth:`acontext_messages` under
        ``ainvoke``), the note joined to the agent's own system message. With
        ``recall_tool`` it registers :meth:`recall_tool`, which the note names. The
        thread is ``thread_id``, or the run config's when None. Needs ``langchain>=1``.
        """
        from .langgraph_middleware import ContextMiddleware

        return ContextMiddleware(self, thread_id, [self.recall_tool(thread_id)] if recall_tool else [])

    def recall_tool(self, thread_id: str | None = None) -> BaseTool:
        """Return the recall tool as a LangChain tool: :func:`compactstore.recall.recall` on the thread's session.

        A ``StructuredTool`` named :data:`compactstore.render.RECALL_TOOL` taking one
        ``handle`` (``spill:N``, ``pos:N``, ``span:A-B``, ``facts:A-B``, ``binding:KEY``)
        and returning the text :func:`~compactstore.recall.recall` writes; sync and async.
        The thread is ``thread_id``, or the run config's when None. A handle refused
        (malformed, out of range, or a redacted value) is a ``ToolException``, which the
        tool hands back to the model as an error result; a failed integrity check raises.
        """
        from langchain_core.tools import StructuredTool, ToolException

        def fetch(handle: str, config: RunnableConfig) -> str:
            thread = thread_id if thread_id is not None else str(config["configurable"]["thread_id"])
            try:
                return recall.recall(self.session(thread), handle)
            except (InvalidArgument, ReconstructionUnsoundError) as exc:
                raise ToolException(str(exc)) from exc

        async def afetch(handle: str, config: RunnableConfig) -> str:
            return await asyncio.to_thread(fetch, handle, config)

        return StructuredTool.from_function(
            func=fetch, coroutine=afetch, name=render.RECALL_TOOL, description=recall.DESCRIPTION,
            handle_tool_error=True)

    def setup(self) -> _Ready:
        """Make the saver ready, as the stock savers' ``setup`` does; ``await saver.setup()`` works too.

        The store creates its schema when it is opened, so there is nothing left to
        create: this checks that the store is open. It returns an awaitable that is
        already done, so code written for ``PostgresSaver`` (``saver.setup()``) and for
        ``AsyncPostgresSaver`` (``await saver.setup()``) both run unchanged.

        Raises:
            StoreClosed: the store was closed.
        """
        self.store.sessions()
        return _Ready()

    async def asetup(self) -> None:
        """Async :meth:`setup`, run in a worker thread."""
        await asyncio.to_thread(self.setup)

    @property
    def _codec(self) -> StateCodec:
        # Built on each use: ``with_allowlist`` gives a copy of the saver another serde.
        return StateCodec(self.serde)

    def _thread(self, thread_id: str, *, create: bool = True) -> ThreadIndex | None:
        # By id first: every call names its thread, and the name costs a check of the id.
        thread = self._by_id.get(thread_id)
        if thread is not None:
            return thread
        name = session_name(self.prefix, thread_id)
        with self._lock:
            thread = self._threads.get(name)
            if thread is None:
                session = self.store.session(name)
                if not create and session.size == 0:
                    return None
                thread = self._threads[name] = ThreadIndex(session, self._codec, verify=self.verify)
            self._by_id[thread_id] = thread
        return thread

    def _all_threads(self) -> list[ThreadIndex]:
        threads = []
        for name in self.store.sessions():
            if name.startswith(self.prefix):
                with self._lock:
                    thread = self._threads.get(name)
                    if thread is None:
                        thread = self._threads[name] = ThreadIndex(self.store.session(name), self._codec, verify=self.verify)
                threads.append(thread)
        return threads

    def _thread_id(self, thread: ThreadIndex) -> str:
        name = thread.session.name[len(self.prefix) :]
        if not name.startswith("#"):
            return name
        return thread.thread_id if thread.thread_id is not None else name

    # --- reading ---------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Return the checkpoint ``config`` names (the thread's latest in its namespace when it names none)."""
        conf = config["configurable"]
        thread_id = conf["thread_id"]
        ns = conf.get("checkpoint_ns", "")
        thread = self._thread(str(thread_id), create=False)
        if thread is None:
            return None
        with thread.lock, reading(thread.session, self.verify):  # one head check for every read of the call
            thread.refresh()
            found = thread.current(ns, get_checkpoint_id(config))
            if found is None:
                return None
            return self._tuple(thread, thread_id, ns, found[0], found[1])

    def _tuple(self, thread: ThreadIndex, thread_id: Any, ns: str, cid: str, pos: int,
               records: dict[int, Record] | None = None) -> CheckpointTuple | None:
        """Build the tuple of checkpoint ``cid`` stored at ``pos`` (call under the thread's lock)."""
        records = records if records is not None else {}
        if pos not in records:
            records.update(read_many(thread.session, [pos], verify=self.verify))
        event = records[pos].event
        if not isinstance(event, ev.GraphState):  # redacted by another process meanwhile
            return None
        codec = self._codec
        checkpoint = codec.snapshot(event)
        holders = thread.holders(ns, pos, checkpoint.get("channel_versions", {}))
        writes = thread.writes(ns, cid)
        # One read for every row the tuple needs: values, the parts lists are spread over, writes.
        wanted = [p for p in holders.values() if p not in records] + writes
        wanted += [p for p in thread.spread(holders.values()) if p not in records]
        records.update(read_many(thread.session, wanted, verify=self.verify))
        channel_values = codec.channels(thread.session, records, holders)
        pending = _pending(codec, records, writes)
        conf = {"thread_id": thread_id, "checkpoint_ns": ns}
        return CheckpointTuple(
            config={"configurable": {**conf, "checkpoint_id": cid}},
            checkpoint={**checkpoint, "channel_values": channel_values},  # type: ignore[typeddict-item]
            metadata=codec.metadata(event),  # type: ignore[arg-type]
            parent_config={"configurable": {**conf, "checkpoint_id": event.parent}} if event.parent else None,
            pending_writes=pending,
        )

    def _scope(self, config: RunnableConfig | None) -> tuple[list[tuple[ThreadIndex, Any]], str | None, str | None]:
        """Return the ``(thread, thread id or None)`` pairs :meth:`list` looks in, the namespace and the checkpoint id it wants."""
        if config is None:
            return [(t, None) for t in self._all_threads()], None, None
        conf = config["configurable"]
        one = self._thread(str(conf["thread_id"]), create=False)
        threads = [(one, conf["thread_id"])] if one is not None else []
        return threads, conf.get("checkpoint_ns"), get_checkpoint_id(config)

    @staticmethod
    def _candidates(threads: Sequence[tuple[ThreadIndex, Any]], ns_wanted: str | None, cid_wanted: str | None,
                    before: RunnableConfig | None) -> list[tuple[ThreadIndex, Any, str, str]]:
        """Return ``(thread, thread id or None, namespace, checkpoint id)`` of what :meth:`list` may yield, in order."""
        below = get_checkpoint_id(before) if before is not None else None
        found: list[tuple[str, int, ThreadIndex, Any, str]] = []
        for n, (thread, thread_id) in enumerate(threads):
            with thread.lock:
                thread.refresh()
                found += [(cid, n, thread, thread_id, ns) for ns, cid in thread.checkpoints(ns_wanted, below)
                          if cid_wanted is None or cid == cid_wanted]
        # Newest first across namespaces and threads, as the stock savers order by id.
        found.sort(key=lambda c: (c[0], -c[1]), reverse=True)
        return [(thread, thread_id, ns, cid) for cid, _, thread, thread_id, ns in found]

    def _listed(self, thread: ThreadIndex, thread_id: Any, ns: str, cid: str,
                wanted: dict[str, Any] | None) -> CheckpointTuple | None:
        """Return the tuple of checkpoint ``cid`` if it is still live and its metadata matches ``wanted``."""
        with thread.lock:
            found = thread.current(ns, cid)
            if found is None:
                return None
            records = read_many(thread.session, [found[1]], verify=self.verify)
            event = records[found[1]].event
            if not isinstance(event, ev.GraphState):
                return None
            if wanted:
                metadata = self._codec.metadata(event)
                if not all(metadata.get(k) == v for k, v in wanted.items()):
                    return None
            tid = thread_id if thread_id is not None else self._thread_id(thread)
            return self._tuple(thread, tid, ns, cid, found[1], records)

    def _hold(self, held: ExitStack, checked: set[int], thread: ThreadIndex) -> None:
        """Enter ``thread``'s reading context on ``held`` unless ``checked`` says it is entered already."""
        if id(thread) not in checked:
            checked.add(id(thread))
            held.enter_context(reading(thread.session, self.verify))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,  # noqa: A002 - LangGraph's name
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Yield the matching checkpoints, newest (highest id) first.

        ``config`` selects a thread (all threads when None), its ``checkpoint_ns`` a
        namespace (all when absent) and its ``checkpoint_id`` one checkpoint;
        ``filter`` keeps those whose metadata has every given key equal to the given
        value; ``before`` keeps ids below its checkpoint id; ``limit`` caps the count.

        Tuples are built a page (``LIST_PAGE``) at a time, each page under one
        :meth:`Session.reading` context per thread it reads (the first one also finds
        the candidates), and yielded after: a verified list checks a thread's head once
        per page, and a head moved between pages is caught by the next page.
        """
        if limit is not None and limit <= 0:
            return
        threads, ns_wanted, cid_wanted = self._scope(config)
        todo: list[tuple[ThreadIndex, Any, str, str]] | None = None
        left = limit
        while todo is None or todo:
            page: list[CheckpointTuple] = []
            # A generator cannot hold a reading() context across its yields: the page is read, then yielded.
            with ExitStack() as held:
                checked: set[int] = set()
                if todo is None:
                    for thread, _ in threads:
                        self._hold(held, checked, thread)
                    todo = self._candidates(threads, ns_wanted, cid_wanted, before)[::-1]  # popped newest first
                size = LIST_PAGE if left is None else min(LIST_PAGE, left)
                while todo and len(page) < size:
                    thread, thread_id, ns, cid = todo.pop()
                    self._hold(held, checked, thread)
                    tup = self._listed(thread, thread_id, ns, cid, filter)
                    if tup is not None:
                        page.append(tup)
            yield from page
            if left is not None:
                left -= len(page)
                if left <= 0:
                    return

    # --- writing ---------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Append checkpoint ``checkpoint`` (with the channel values ``new_versions`` names) and return its config.

        Putting a checkpoint id again replaces it (the new event supersedes the old);
        putting exactly the same checkpoint again writes nothing.

        Under a compaction policy the thread's session is then maintained.

        Raises:
            ConflictError: other writers kept appending to the thread between every read and commit.
            InvalidArgument: the policy's summarizer is ``async def`` (use :meth:`aput`,
                through ``ainvoke``), or returned anything but text; the checkpoint is written.
        """
        out = self._put(config, checkpoint, metadata, new_versions)
        if self.compaction is not None:
            thread = self._thread(str(config["configurable"]["thread_id"]))
            assert thread is not None
            with thread.lock:  # one maintainer per session in this process
                self.maintenance = thread.session.maintain(self.compaction)
        return out

    def _put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Append the checkpoint and what it adds to the conversation; return its config."""
        conf = config["configurable"]
        thread_id = conf["thread_id"]
        ns = conf.get("checkpoint_ns", "")
        cid = checkpoint["id"]
        snapshot: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = snapshot.pop("channel_values", {})
        codec = self._codec
        head, meta = codec.head(str(thread_id), snapshot, get_checkpoint_metadata(config, metadata))
        encoder = ChannelEncoder(codec, values, new_versions)
        ident = ("c", ns, cid)
        thread = self._thread(str(thread_id))
        assert thread is not None

        def decide() -> tuple[list[ev.Event], Encoded]:
            old = thread.holder(ident)
            # A re-put is stored whole, never as appended to a tip.
            encoded = encoder.encode({} if old is not None else thread.tips_of(ns), thread.live)
            event = ev.GraphState(id=cid, ns=ns, parent=conf.get("checkpoint_id"), value=encoded.value(head), meta=meta)
            if old is not None and _same(thread.session.read(old).event, event):
                return [], encoded
            # What the thread said since, recorded before the checkpoint that holds it.
            talk = _talk(thread, self.messages_channel, ns, event.parent, values, new_versions)
            return [*talk, msgspec.structs.replace(event, supersedes=old)], encoded

        with thread.lock:
            records, encoded = _settle(thread, decide, f"{ident!r} to {thread.session.name!r}")
            if records:
                thread.remember(ns, new_versions, encoded.tips, records[-1].pos)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}}

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Append the writes of task ``task_id`` pending against the checkpoint ``config`` names.

        Idempotent per (task_id, idx): a regular write already stored is kept as it is,
        a special one (error, interrupt, resume, scheduled) is replaced.

        Raises:
            ConflictError: other writers kept appending to the thread between every read and commit.
        """
        conf = config["configurable"]
        thread_id, ns, cid = str(conf["thread_id"]), conf.get("checkpoint_ns", ""), str(conf["checkpoint_id"])
        batch = _by_index(writes)
        if not batch:
            return
        codec = self._codec
        events = {i: ev.Write(checkpoint=cid, task=task_id, channel=channel, idx=i, path=task_path, ns=ns,
                              value=codec.store(value))
                  for i, (channel, value) in batch.items()}
        thread = self._thread(thread_id)
        assert thread is not None

        asked = [(i.id, i.value) for channel, value in batch.values() if channel == INTERRUPT_CHANNEL
                 for i in (value if isinstance(value, list | tuple) else [value]) if isinstance(i, Interrupt)]

        def decide() -> tuple[list[ev.Event], list[ev.Write]]:
            # An interrupt asked here for the first time is an open handle, recorded with its write.
            new: list[ev.Event] = [interrupt_opened(iid, value, ns, cid) for iid, value in dict(asked).items()
                                   if iid not in thread.asked]
            held = thread.pending(ns, cid)
            new += [event for i, event in events.items() if (task_id, i) not in held]
            return new, [event for i, event in events.items() if i < 0 and (task_id, i) in held]

        with thread.lock:
            _, special = _settle(thread, decide, f"the writes of task {task_id!r}")
            for event in special:
                self._append_replacing(thread, event, ("w", ns, cid, task_id, event.idx))

    def _append_replacing(self, thread: ThreadIndex, event: ev.Write, ident: Ident) -> None:
        """Append ``event``, superseding the live event with the same identity; write nothing for an exact repeat."""
        for _ in range(RETRIES):
            thread.refresh()
            old = thread.holder(ident)
            if old is not None and _same(thread.session.read(old).event, event):
                return
            if thread.commit([msgspec.structs.replace(event, supersedes=old)]) is not None:
                return
            # another writer appended meanwhile: read what it wrote, then decide again
        raise ConflictError(f"gave up writing {ident!r} to {thread.session.name!r} after {RETRIES} conflicts",
                            session=thread.session.name)

    # --- deleting ----------------------------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        """Redact every event of thread ``thread_id``: the thread reads as gone, its tree still verifies."""
        thread = self._thread(str(thread_id), create=False)
        if thread is not None:
            with thread.lock:
                thread.refresh()
                thread.erase(set(thread.live), "langgraph delete_thread")
            self._reclaim()

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Redact the checkpoints whose metadata names one of ``run_ids``, with their writes, in every thread."""
        runs = set(run_ids)
        if not runs:
            return
        for thread in self._all_threads():
            with thread.lock:
                thread.refresh()
                doomed = thread.of_runs(runs)
                if doomed:
                    self._remove(thread, doomed, "langgraph delete_for_runs")
        self._reclaim()

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep only the latest checkpoint of each namespace (``keep_latest``) or none (``delete``).

        The pruned checkpoints are redacted (their leaves stay, so every tree verifies) and,
        with ``reclaim`` (the default), their space goes back to the file system. The raw
        turns a certified summary stands for are dropped by the policy's ``retain_last``.

        Raises:
            ValueError: an unknown strategy.
        """
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown prune strategy {shown(strategy)}; want one of {', '.join(STRATEGIES)}")
        for thread_id in thread_ids:
            thread = self._thread(str(thread_id), create=False)
            if thread is None:
                continue
            with thread.lock:
                thread.refresh()
                doomed = set(thread.checkpoints())
                if strategy == "keep_latest":
                    doomed -= thread.latest()
                self._remove(thread, doomed, f"langgraph prune {strategy}")
        self._reclaim()

    def _reclaim(self) -> None:
        """Give the space of what was just erased back to the file system, when the saver is set to."""
        if self.reclaim:
            self.store.reclaim()

    def _remove(self, thread: ThreadIndex, doomed: set[Key], reason: str) -> None:
        """Redact checkpoints ``doomed`` and their writes, keeping every value a survivor reads.

        A surviving checkpoint may read a channel value stored only in a doomed event
        (its version did not change since), or store a list value as appended to one in
        a doomed event: it is appended again first, with that value whole inside, and its
        old event joins the doomed ones.
        """
        positions = thread.positions(doomed)
        for ns in {ns for ns, _ in doomed}:
            endangered = thread.endangered(ns, positions)
            # In id order: a rescued checkpoint's old event is doomed too, and later ones may read from it.
            for key in thread.checkpoints(ns):
                if key not in doomed and (endangered or thread.reads_from(ns, key[1], positions)):
                    self._rescue(thread, key, positions)
        thread.erase(positions, reason)

    def _rescue(self, thread: ThreadIndex, key: Key, doomed: set[int]) -> None:
        """Append checkpoint ``key`` again holding whole every value it reads from ``doomed``; doom its old event."""
        ns, cid = key
        pos = thread.holder(("c", ns, cid))
        assert pos is not None
        records = {pos: thread.session.read(pos)}
        event = records[pos].event
        if not isinstance(event, ev.GraphState):
            return
        codec = self._codec
        stored = event.value.get("blobs") or {}
        versions = codec.snapshot(event).get("channel_versions", {})
        missing = thread.held_only_in(ns, {ch: v for ch, v in versions.items() if ch not in stored}, doomed)
        spread = spread_over(event.value, doomed)
        if not missing and not spread:
            return
        records.update(read_many(thread.session, missing.values()))
        whole = {ch: codec.whole(thread.session, records, at, ch) for ch, at in missing.items()
                 if isinstance(records[at].event, ev.GraphState)}
        whole.update((ch, codec.whole(thread.session, records, pos, ch)) for ch in spread)
        again = msgspec.structs.replace(event, value=with_whole(event.value, whole), ts=None, idempotency_key=None,
                                        supersedes=pos)
        thread.own([thread.session.append(again, idempotency_key=idempotency_key(("c", ns, cid), pos))])
        doomed.add(pos)

    # --- copying -----------------------------------------------------------------------

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Append every live checkpoint and write of one thread to another, in log order.

        Checkpoints and writes the target already holds (same namespace and ids) are
        left as they are, so copying twice writes nothing the second time.
        """
        src = self._thread(str(source_thread_id), create=False)
        if src is None:
            return
        dst = self._thread(str(target_thread_id))
        assert dst is not None
        with src.lock:
            src.refresh()
            positions = sorted(src.at)
        copy = _Copy(self._codec, src, dst, str(target_thread_id))
        with dst.lock:
            for i in range(0, len(positions), COPY_CHUNK):
                chunk = read_many(src.session, positions[i : i + COPY_CHUNK])
                dst.refresh()
                for pos in sorted(chunk):
                    copy.add(chunk[pos])
                copy.flush()

    # --- versions and async --------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Return the version after ``current``: a zero-padded counter and a random tie-breaker.

        The same scheme as LangGraph's own savers, so threads move between them.
        """
        if current is None:
            n = 0
        elif isinstance(current, int):
            n = current
        else:
            n = int(str(current).split(".")[0])
        return f"{n + 1:032}.{random.random():016}"

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async :meth:`get_tuple`, run in a worker thread."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,  # noqa: A002 - LangGraph's name
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async :meth:`list`: pages of tuples are built in a worker thread."""
        it = self.list(config, filter=filter, before=before, limit=limit)
        while True:
            page = await asyncio.to_thread(_take, it, 64)
            for tup in page:
                yield tup
            if len(page) < 64:
                return

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async :meth:`put`, run in a worker thread; an ``async def`` summarizer is awaited on the loop."""
        if self.compaction is None or not self.compaction.is_async:
            return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)
        out = await asyncio.to_thread(self._put, config, checkpoint, metadata, new_versions)
        thread = self._thread(str(config["configurable"]["thread_id"]))
        assert thread is not None
        lock = self._maintainers.setdefault(thread.session.name, asyncio.Lock())
        async with lock:
            self.maintenance = await thread.session.amaintain(self.compaction)
        return out

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        """Async :meth:`put_writes`, run in a worker thread."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async :meth:`delete_thread`, run in a worker thread."""
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async :meth:`delete_for_runs`, run in a worker thread."""
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async :meth:`copy_thread`, run in a worker thread."""
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async :meth:`prune`, run in a worker thread."""
        await asyncio.to_thread(lambda: self.prune(thread_ids, strategy=strategy))



class _Ready:
    """What :meth:`CompactStoreSaver.setup` returns: an awaitable that is already done."""

    def __await__(self) -> Generator[None, None, None]:
        return
        yield  # a generator: awaiting it returns at once


class _Copy:
    """Appends a source thread's records to a target thread in batches, in log order.

    ``moved`` maps each source position copied to its target position, so a copied
    event supersedes, or reads list parts from, the copies of the events it named.
    """

    def __init__(self, codec: StateCodec, src: ThreadIndex, dst: ThreadIndex, thread_id: str) -> None:
        self.codec, self.src, self.dst, self.thread_id = codec, src, dst, thread_id
        self.moved: dict[int, int] = {}
        self.batch: list[ev.Event] = []
        self.keys: list[str | None] = []
        self.sources: list[int] = []

    def add(self, record: Record) -> None:
        """Add the copy of ``record`` to the batch, unless the target already holds it."""
        event = record.event
        ident: Ident
        if isinstance(event, ev.GraphState):
            ident = ("c", event.ns, event.id)
            if not parts(event.value).isdisjoint(self.sources):
                self.flush()  # the parts a list value is spread over must have their target positions first
            event = msgspec.structs.replace(
                event, value=copied_value(self.codec, self.src.session, record, self.thread_id, self.moved))
        elif isinstance(event, ev.Write):
            ident = ("w", event.ns, event.checkpoint, event.task, event.idx)
        else:
            return
        replaced = None
        if event.supersedes is not None:
            if event.supersedes in self.sources:
                self.flush()  # the event it replaces must have its target position first
            replaced = self.moved.get(event.supersedes)
        if replaced is None and self.dst.holder(ident) is not None:
            return  # the target already holds it
        self.batch.append(msgspec.structs.replace(event, supersedes=replaced, idempotency_key=None))
        self.keys.append(idempotency_key(ident, replaced))
        self.sources.append(record.pos)

    def flush(self) -> None:
        """Append the batch in one transaction."""
        if self.batch:
            appended = self.dst.session.extend(self.batch, idempotency_keys=self.keys)
            self.moved.update(zip(self.sources, (r.pos for r in appended)))
            self.dst.own(appended)
            self.batch.clear()
            self.keys.clear()
            self.sources.clear()


def _settle(thread: ThreadIndex, decide: Callable[[], tuple[list[ev.Event], T]], what: str) -> tuple[list[Record], T]:
    """Commit the events ``decide`` returns from ``thread``'s index; return the records and what else it returned.

    ``decide`` runs on the index as it stands, without reading the log first: the commit
    writes only if no other writer appended since (else the index reads what it did and
    ``decide`` runs again). Writing nothing is decided only on an index just brought up
    to date. Call under the thread's lock.

    Raises:
        ConflictError: ``what`` could not be written in :data:`.tail.RETRIES` attempts.
    """
    fresh = False
    for _ in range(RETRIES):
        events, rest = decide()
        if events:
            records = thread.commit(events)
            if records is not None:
                return records, rest
        elif fresh:
            return [], rest
        thread.refresh()
        fresh = True
    raise ConflictError(f"gave up writing {what} after {RETRIES} conflicts", session=thread.session.name)


def _talk(thread: ThreadIndex, channel: str | None, ns: str, parent: str | None, values: dict[str, Any],
          new_versions: ChannelVersions) -> list[ev.Event]:
    """Return the events recording what a checkpoint adds to the conversation (call under the thread's lock).

    The interrupts that paused ``ns`` at ``parent`` are closed: the thread moved past
    them. Each message of ``channel`` (when its version changed) that no
    event was recorded from yet is recorded.
    """
    out: list[ev.Event] = [interrupt_closed(iid) for iid in thread.paused_at(ns, parent)]
    if channel is not None and channel in new_versions:
        messages = values.get(channel)
        if isinstance(messages, list):
            for message in thread.unsaid(messages):
                out += message_events(message)
    return out


def _message_of(event: ev.Event) -> str | None:
    """Return the id of the message an event was recorded from, or None."""
    mid = event.meta.get(MESSAGE_ID) if event.meta is not None else None
    return mid if isinstance(mid, str) else None


def _current(messages: Sequence[Any]) -> list[list[Any]]:
    """Return the current turn's parts a model must read whole: the last human message, and the tool round it awaits.

    The round is the last AI message with tool calls and the tool messages after it, when
    the messages end with those (the model is called to read the results); its calls and
    results go in together or not at all.
    """
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    human = next((i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], HumanMessage)), None)
    if human is None:
        return []
    out = [[messages[human]]]
    if isinstance(messages[-1], ToolMessage):
        call = next((i for i in range(len(messages) - 1, human, -1)
                     if isinstance(messages[i], AIMessage) and messages[i].tool_calls), None)
        if call is not None and all(isinstance(m, ToolMessage) for m in messages[call + 1:]):
            out.append(list(messages[call:]))
    return out


def _pending(codec: StateCodec, records: dict[int, Record], positions: Sequence[int]) -> list[PendingWrite]:
    """Return the writes at ``positions`` (read into ``records``) in LangGraph's order."""
    pending = []
    for p in positions:
        write = records[p].event
        if isinstance(write, ev.Write):
            pending.append((writes_sort_key(write.path, write.task, write.idx),
                            (write.task, write.channel, codec.load(write.value))))
    pending.sort(key=lambda p: p[0])
    return [p[1] for p in pending]


def _same(a: ev.Event, b: ev.Event) -> bool:
    """Return whether two events are equal but for their timestamp, idempotency key and what they supersede."""
    def bare(e: ev.Event) -> bytes:
        return ev.encode(msgspec.structs.replace(e, ts=None, idempotency_key=None, supersedes=None))

    return type(a) is type(b) and bare(a) == bare(b)


def _by_index(writes: Sequence[tuple[str, Any]]) -> dict[int, tuple[str, Any]]:
    """Return the writes by idx: a regular one's position, a special channel's reserved negative idx.

    Of two writes to one special channel the last counts; of two at one regular idx, the first.
    """
    writes = writes if type(writes) is list or type(writes) is tuple else list(writes)  # read once
    if WRITES_IDX_MAP.keys().isdisjoint(map(_CHANNEL, writes)):  # the usual case: regular writes only
        return dict(enumerate(writes))
    batch: dict[int, tuple[str, Any]] = {}
    for idx, (channel, value) in enumerate(writes):
        i = WRITES_IDX_MAP.get(channel, idx)
        if i < 0 or i not in batch:
            batch[i] = (channel, value)
    return batch


def _take(it: Iterator[CheckpointTuple], n: int) -> list[CheckpointTuple]:
    out = []
    for tup in it:
        out.append(tup)
        if len(out) == n:
            break
    return out
