"""A LangGraph checkpointer whose checkpoints and pending writes are events in compactstore.

    from compactstore.adapters.langgraph import CompactStoreSaver

    graph = builder.compile(checkpointer=CompactStoreSaver("agent.db"))

How a thread maps onto the log:

- A LangGraph thread is one compactstore session, named ``"langgraph:" + thread_id``;
  when that is not a valid session name (an empty id, one longer than the 512
  characters a name allows, one with a control character) or the id starts with
  ``#``, the name is ``"langgraph:#" +`` the hex BLAKE3 of the id. Every namespace of
  the thread (its subgraphs) lives in that session, so one Merkle tree covers the
  whole thread and :meth:`CompactStoreSaver.session` gives it.
- ``put`` appends a ``checkpoint`` event: ``id``, ``ns``, ``parent``; ``meta`` is the
  checkpoint metadata as plain JSON (metadata that JSON cannot carry exactly goes into
  ``value`` encoded instead); ``value`` holds the thread id, the checkpoint without its
  channel values (plain JSON, like metadata) and in ``blobs`` the value of each channel
  in ``new_versions``, as ``[version, value]`` when it is plain JSON and the serializer
  the default one, else ``[version, type, base64]`` of ``serde.dumps_typed``. A channel
  whose version did not change is read from the earlier event that stored that version.
  A list that extends the list this process last stored for the channel (a message
  history, typically) stores only the elements appended, and ``deltas`` names the
  earlier events whose parts, joined in order, precede them; after ``MAX_CHAIN`` parts
  the list is stored whole again, so one read costs a bounded number of rows.
- ``put_writes`` appends one ``write`` event per (task, idx) not written yet, all in
  one transaction: the saver decides what is new from its index of the log, under the
  session's write lock and only if no other writer appended since it last read, so a
  retried call writes nothing and the store looks up no idempotency key. A regular
  write to a (task, idx) already written is ignored; a special one (error, interrupt,
  resume, scheduled) replaces it with an event that ``supersedes`` it.
- Deleting (``delete_thread``, ``prune``, ``delete_for_runs``) is redaction: bodies
  are erased, leaves stay, the tree still verifies and ``Store.verify`` counts them as
  redacted. A kept checkpoint that read a channel value (or part of one) from an
  erased event is first appended again with that value whole inside.

The log is the source of truth. Per thread the saver keeps a small index of it (which
position holds which checkpoint, write and channel version), read once and then kept
current by reading only what was appended since, by any process: reading the latest
checkpoint costs a few rows however long the thread.

The async methods run the sync ones in a worker thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import random
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from blake3 import blake3
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .. import events as ev
from ..errors import ConflictError, IntegrityError
from ..events import encode_json
from ..store import Record, Session, Store
from .tail import RETRIES, StoreUser, Tail, idempotency_key, read_many, session_name

__all__ = ["CompactStoreSaver", "PREFIX"]

#: Every thread's session name starts with this.
PREFIX = "langgraph:"
STRATEGIES = ("keep_latest", "delete")

#: A value through serde: ``[type, base64 of the bytes]``, as ``serde.dumps_typed`` gave them.
Packed = list[str]
#: A stored channel value or write: ``[value]`` when it is plain JSON and the serializer
#: is the default one (serde would give it back equal), else :data:`Packed`. The length
#: tells them apart, whatever type names a serializer uses.
Stored = list[Any]
#: The int range msgpack (so the default serializer) carries: beyond it serde decides.
_INTS = (-(2**63), 2**64)
#: Events a list channel's value may be spread over (a full one, then appended parts)
#: before a checkpoint stores it whole again: bounds the rows one read costs.
MAX_CHAIN = 32


@dataclass(frozen=True)
class _Tip:
    """The last list value this process stored for one channel: what a later one may extend."""

    #: its length, and the length and BLAKE3 digest of its msgpack elements
    count: int
    nbytes: int
    digest: bytes
    #: the positions whose parts, concatenated, give it (a full value first)
    chain: tuple[int, ...]


def _digests(elements: memoryview, nbytes: int) -> tuple[bytes, bytes]:
    """Return the BLAKE3 digests of the first ``nbytes`` of ``elements`` and of all of them."""
    hasher = blake3(elements[:nbytes])
    prefix = hasher.digest()
    hasher.update(elements[nbytes:])
    return prefix, hasher.digest()


def _extends(thread: _Thread, tip: _Tip, count: int, elements: memoryview, prefix: bytes) -> bool:
    """Return whether a list of ``count`` elements (``elements`` their msgpack) may be stored as appended to ``tip``."""
    # Msgpack elements are self-delimiting: equal leading bytes are equal leading elements.
    return (count > tip.count and len(elements) > tip.nbytes and len(tip.chain) < MAX_CHAIN
            and prefix == tip.digest and all(p in thread.live for p in tip.chain))


def _msgpack_elements(data: bytes) -> memoryview | None:
    """Return the elements of the msgpack array ``data`` (past its header), or None if it is not one."""
    if not data:
        return None
    first = data[0]
    if 0x90 <= first <= 0x9F:
        return memoryview(data)[1:]
    if first == 0xDC:
        return memoryview(data)[3:]
    if first == 0xDD:
        return memoryview(data)[5:]
    return None
#: A checkpoint within a thread: ``(namespace, checkpoint id)``.
Key = tuple[str, str]


@dataclass
class _Namespace:
    """The live checkpoints, writes and channel versions of one namespace of a thread."""

    #: checkpoint ids in ascending order (LangGraph ids sort in the order they were made)
    ids: list[str] = field(default_factory=list)
    #: checkpoint id -> positions of its live events, the current one last
    where: dict[str, list[int]] = field(default_factory=dict)
    #: checkpoint id -> (task id, idx) -> positions of its live write events, the current one last
    writes: dict[str, dict[tuple[str, int], list[int]]] = field(default_factory=dict)
    #: (channel, version as JSON) -> positions of the live events that hold that value
    blobs: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    #: checkpoint id -> run id from its metadata, when it has one
    runs: dict[str, str] = field(default_factory=dict)


class _Thread(Tail):
    """One thread's session and the index of its log."""

    def __init__(self, session: Session, saver: CompactStoreSaver) -> None:
        super().__init__(session)
        self.saver = saver
        self.namespaces: dict[str, _Namespace] = {}
        #: position -> what it holds: ("c", ns, id, blob keys) or ("w", ns, id, (task, idx))
        self.at: dict[int, tuple[Any, ...]] = {}
        #: a thread id read from a checkpoint event (for sessions named by digest)
        self.thread_id: str | None = None
        #: checkpoint position -> the earlier positions its list values are spread over
        self.deps: dict[int, set[int]] = {}
        #: (namespace, channel) -> the list value this process last stored there
        self.tips: dict[tuple[str, str], _Tip] = {}

    def apply(self, record: Record) -> None:
        event, pos = record.event, record.pos
        if isinstance(event, ev.Checkpoint):
            space = self._space(event.ns)
            if event.id not in space.where:
                bisect.insort(space.ids, event.id)
                space.where[event.id] = []
            space.where[event.id].append(pos)
            value = event.value if isinstance(event.value, dict) else {}
            keys = [(ch, encode_json(b[0])) for ch, b in (value.get("blobs") or {}).items()]
            for k in keys:
                space.blobs.setdefault(k, []).append(pos)
            run = self.saver._metadata(event).get("run_id")
            if isinstance(run, str):
                space.runs[event.id] = run
            if isinstance(value.get("thread"), str):
                self.thread_id = value["thread"]
            deltas = value.get("deltas")
            if deltas:
                self.deps[pos] = {p for chain in deltas.values() for p in chain}
            self.at[pos] = ("c", event.ns, event.id, keys)
        elif isinstance(event, ev.Write):
            space = self._space(event.ns)
            wkey = (event.task, event.idx)
            space.writes.setdefault(event.checkpoint, {}).setdefault(wkey, []).append(pos)
            self.at[pos] = ("w", event.ns, event.checkpoint, wkey)

    def _space(self, ns: str) -> _Namespace:
        space = self.namespaces.get(ns)
        if space is None:
            space = self.namespaces[ns] = _Namespace()
        return space

    def forget(self, positions: Sequence[int]) -> None:
        for pos in positions:
            entry = self.at.pop(pos, None)
            if entry is None:
                continue
            space = self.namespaces[entry[1]]
            if entry[0] == "c":
                _, _, cid, keys = entry
                self.deps.pop(pos, None)
                _drop(space.where, cid, pos)
                if cid not in space.where:
                    space.ids.remove(cid)
                    space.runs.pop(cid, None)
                for k in keys:
                    _drop(space.blobs, k, pos)
            else:
                _, _, cid, wkey = entry
                per = space.writes.get(cid, {})
                _drop(per, wkey, pos)
                if not per:
                    space.writes.pop(cid, None)

    def current(self, ns: str, cid: str | None) -> tuple[str, int] | None:
        """Return ``(id, position)`` of checkpoint ``cid`` (the latest when None) in ``ns``."""
        space = self.namespaces.get(ns)
        if space is None or not space.ids:
            return None
        if cid is None:
            cid = space.ids[-1]
        where = space.where.get(cid)
        return (cid, where[-1]) if where else None


def _drop(index: dict[Any, list[int]], key: Any, pos: int) -> None:
    got = index.get(key)
    if got is not None and pos in got:
        got.remove(pos)
        if not got:
            del index[key]


def _plain(value: object, depth: int = 0, *, msgpack: bool = False) -> bool:
    """Return whether ``value`` survives a JSON round trip exactly (as the store encodes it).

    With ``msgpack``, also whether the default serializer's msgpack round trip gives it
    back equal (ints within 64 bits).
    """
    if depth > 32:
        return False
    kind = type(value)
    if value is None or kind is str or kind is bool:
        return True
    if kind is int:
        return not msgpack or _INTS[0] <= value < _INTS[1]  # type: ignore[operator]
    if kind is float:
        return value == value and value not in (float("inf"), float("-inf"))
    if kind is list:
        for v in value:  # type: ignore[attr-defined]
            # Strings, the usual leaves, without a call each: this runs on every write.
            if type(v) is not str and not _plain(v, depth + 1, msgpack=msgpack):
                return False
        return True
    if kind is dict:
        for k, v in value.items():  # type: ignore[attr-defined]
            if type(k) is not str or (type(v) is not str and not _plain(v, depth + 1, msgpack=msgpack)):
                return False
        return True
    return False


class CompactStoreSaver(StoreUser, BaseCheckpointSaver[str]):
    """A LangGraph checkpointer that keeps every thread as a tamper-evident compactstore session.

    Args:
        store: an open :class:`compactstore.Store`, or a target to open (a SQLite path,
            ``":memory:"`` or a ``postgresql://`` URL); a store opened here is closed by
            :meth:`close`.
        serde: LangGraph's serializer for channel values, writes and checkpoints
            (``JsonPlusSerializer`` by default).
        prefix: the start of every thread's session name.
    """

    def __init__(self, store: Store | str, *, serde: SerializerProtocol | None = None, prefix: str = PREFIX) -> None:
        super().__init__(serde=serde)
        self._use(store)
        self.prefix = prefix
        self._threads: dict[str, _Thread] = {}
        #: thread id -> its entry in ``_threads``
        self._by_id: dict[str, _Thread] = {}
        self._lock = threading.Lock()

    # --- the log ---------------------------------------------------------------------

    def session(self, thread_id: str) -> Session:
        """Return the compactstore session that holds thread ``thread_id``."""
        return self.store.session(session_name(self.prefix, str(thread_id)))

    def record(self, config: RunnableConfig) -> Record | None:
        """Return the event of the checkpoint ``config`` names (the latest when it names none).

        Its position ``pos`` gives the tree head the checkpoint was committed in:
        ``saver.session(thread_id).head(record.pos + 1)``.
        """
        conf = config["configurable"]
        thread = self._thread(str(conf["thread_id"]), create=False)
        if thread is None:
            return None
        with thread.lock:
            thread.refresh()
            found = thread.current(conf.get("checkpoint_ns", ""), get_checkpoint_id(config))
        if found is None:
            return None
        record = thread.session.read(found[1])
        return record if isinstance(record.event, ev.Checkpoint) else None

    def _thread(self, thread_id: str, *, create: bool = True) -> _Thread | None:
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
                thread = self._threads[name] = _Thread(session, self)
            self._by_id[thread_id] = thread
        return thread

    def _all_threads(self) -> list[_Thread]:
        threads = []
        for name in self.store.sessions():
            if name.startswith(self.prefix):
                with self._lock:
                    thread = self._threads.get(name)
                    if thread is None:
                        thread = self._threads[name] = _Thread(self.store.session(name), self)
                threads.append(thread)
        return threads

    def _thread_id(self, thread: _Thread) -> str:
        name = thread.session.name[len(self.prefix) :]
        if not name.startswith("#"):
            return name
        return thread.thread_id if thread.thread_id is not None else name

    def _pack(self, value: Any) -> Packed:
        kind, data = self.serde.dumps_typed(value)
        return [kind, base64.b64encode(data).decode("ascii")]

    def _unpack(self, packed: Packed) -> Any:
        return self.serde.loads_typed((packed[0], base64.b64decode(packed[1])))

    def _store_value(self, value: Any) -> Stored:
        """Return ``value`` as a write or channel value is stored: itself when plain, else packed."""
        # Only with the default serializer, which gives plain JSON back equal: another
        # one (an encrypting one, say) must see every value.
        if type(self.serde) is JsonPlusSerializer and _plain(value, msgpack=True):
            return [value]
        return self._pack(value)

    def _load_value(self, stored: Stored) -> Any:
        """Return the value :meth:`_store_value` stored."""
        return stored[0] if len(stored) == 1 else self._unpack(stored)

    def _snapshot(self, event: ev.Checkpoint) -> dict[str, Any]:
        got = event.value["checkpoint"]
        return dict(got) if isinstance(got, dict) else dict(self._unpack(got))

    def _metadata(self, event: ev.Checkpoint) -> dict[str, Any]:
        value = event.value if isinstance(event.value, dict) else {}
        if "metadata" in value:
            got = self._unpack(value["metadata"])
            return dict(got) if isinstance(got, dict) else {}
        return dict(event.meta or {})

    # --- reading ---------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Return the checkpoint ``config`` names (the thread's latest in its namespace when it names none)."""
        conf = config["configurable"]
        thread_id = conf["thread_id"]
        ns = conf.get("checkpoint_ns", "")
        thread = self._thread(str(thread_id), create=False)
        if thread is None:
            return None
        with thread.lock:
            thread.refresh()
            found = thread.current(ns, get_checkpoint_id(config))
            if found is None:
                return None
            return self._tuple(thread, thread_id, ns, found[0], found[1])

    def _tuple(self, thread: _Thread, thread_id: Any, ns: str, cid: str, pos: int,
               records: dict[int, Record] | None = None) -> CheckpointTuple | None:
        """Build the tuple of checkpoint ``cid`` stored at ``pos`` (call under the thread's lock)."""
        space = thread.namespaces[ns]
        records = records if records is not None else {}
        if pos not in records:
            records.update(read_many(thread.session, [pos]))
        event = records[pos].event
        if not isinstance(event, ev.Checkpoint):  # redacted by another process meanwhile
            return None
        checkpoint = self._snapshot(event)
        versions: ChannelVersions = checkpoint.get("channel_versions", {})
        holders = {}
        for ch, version in versions.items():
            held = space.blobs.get((ch, encode_json(version)))
            if held:
                holders[ch] = pos if pos in held else held[-1]
        writes = space.writes.get(cid, {})
        wanted = [p for p in holders.values() if p not in records] + [w[-1] for w in writes.values()]
        wanted += [p for at in holders.values() for p in thread.deps.get(at, ()) if p not in records]
        records.update(read_many(thread.session, wanted))
        channel_values: dict[str, Any] = {}
        for ch, at in holders.items():
            found, got = self._channel(thread, records, at, ch)
            if found:
                channel_values[ch] = got
        pending = []
        for w in writes.values():
            write = records[w[-1]].event
            if isinstance(write, ev.Write):
                pending.append((writes_sort_key(write.path, write.task, write.idx),
                                (write.task, write.channel, self._load_value(write.value))))
        pending.sort(key=lambda p: p[0])
        conf = {"thread_id": thread_id, "checkpoint_ns": ns}
        return CheckpointTuple(
            config={"configurable": {**conf, "checkpoint_id": cid}},
            checkpoint={**checkpoint, "channel_values": channel_values},  # type: ignore[typeddict-item]
            metadata=self._metadata(event),  # type: ignore[arg-type]
            parent_config={"configurable": {**conf, "checkpoint_id": event.parent}} if event.parent else None,
            pending_writes=[p[1] for p in pending],
        )

    def _channel(self, thread: _Thread, records: dict[int, Record], at: int, ch: str) -> tuple[bool, Any]:
        """Return ``(True, value)`` of channel ``ch`` as the checkpoint at ``at`` stores it, ``(False, None)`` if empty.

        A list value may be spread over a chain of earlier events (a full value, then
        the parts appended to it): they are read (``records`` caches them) and joined.
        """
        holder = records[at].event
        if not isinstance(holder, ev.Checkpoint):
            return False, None
        stored = holder.value["blobs"][ch][1:]
        chain = (holder.value.get("deltas") or {}).get(ch)
        if not chain:
            if len(stored) == 2 and stored[0] == "empty":
                return False, None
            return True, self._load_value(stored)
        missing = [p for p in chain if p not in records]
        if missing:
            records.update(read_many(thread.session, missing))
        out: list[Any] = []
        for p in chain:
            part = records[p].event
            if not isinstance(part, ev.Checkpoint):  # erased under it: the log no longer holds the value
                raise IntegrityError(f"checkpoint at pos {at} of {thread.session.name!r} reads channel {ch!r} "
                                     f"from pos {p}, which is erased", session=thread.session.name, pos=p)
            out.extend(self._load_value(part.value["blobs"][ch][1:]))
        out.extend(self._load_value(stored))
        return True, out

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
        """
        if limit is not None and limit <= 0:
            return
        if config is not None:
            conf = config["configurable"]
            one = self._thread(str(conf["thread_id"]), create=False)
            threads = [(one, conf["thread_id"])] if one is not None else []
            ns_wanted = conf.get("checkpoint_ns")
            cid_wanted = get_checkpoint_id(config)
        else:
            threads = [(t, None) for t in self._all_threads()]
            ns_wanted = cid_wanted = None
        below = get_checkpoint_id(before) if before is not None else None
        candidates: list[tuple[str, int, _Thread, Any, str]] = []
        for n, (thread, thread_id) in enumerate(threads):
            with thread.lock:
                thread.refresh()
                for ns, space in thread.namespaces.items():
                    if ns_wanted is not None and ns != ns_wanted:
                        continue
                    stop = bisect.bisect_left(space.ids, below) if below is not None else len(space.ids)
                    for cid in space.ids[:stop]:
                        if cid_wanted is None or cid == cid_wanted:
                            candidates.append((cid, n, thread, thread_id, ns))
        # Newest first across namespaces and threads, as the stock savers order by id.
        candidates.sort(key=lambda c: (c[0], -c[1]), reverse=True)
        count = 0
        for cid, _, thread, thread_id, ns in candidates:
            with thread.lock:
                found = thread.current(ns, cid)
                if found is None:
                    continue
                records = read_many(thread.session, [found[1]])
                event = records[found[1]].event
                if not isinstance(event, ev.Checkpoint):
                    continue
                if filter and not self._matches(event, filter):
                    continue
                tid = thread_id if thread_id is not None else self._thread_id(thread)
                tup = self._tuple(thread, tid, ns, cid, found[1], records)
            if tup is None:
                continue
            yield tup
            count += 1
            if limit is not None and count >= limit:
                return

    def _matches(self, event: ev.Checkpoint, wanted: dict[str, Any]) -> bool:
        metadata = self._metadata(event)
        return all(metadata.get(k) == v for k, v in wanted.items())

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
        """
        conf = config["configurable"]
        thread_id = conf["thread_id"]
        ns = conf.get("checkpoint_ns", "")
        cid = checkpoint["id"]
        snapshot: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = snapshot.pop("channel_values", {})
        md = get_checkpoint_metadata(config, metadata)
        # The checkpoint's structure (ids, versions, versions seen) as readable JSON, as
        # PostgresSaver keeps it; channel values and writes go through serde unless plain.
        base: dict[str, Any] = {"thread": str(thread_id),
                                "checkpoint": snapshot if _plain(snapshot) else self._pack(snapshot)}
        meta: dict[str, Any] | None = dict(md)
        if not _plain(meta):
            base["metadata"], meta = self._pack(md), None
        lists = {ch: got for ch in new_versions if ch in values
                 if (got := self._elements(values[ch])) is not None}
        full: dict[str, Stored] = {}
        ident = ("c", ns, cid)
        thread = self._thread(str(thread_id))
        assert thread is not None
        with thread.lock:
            # As in put_writes: decided from the index as it stands, refreshed only when the
            # commit finds the log moved on, or before deciding to write nothing.
            fresh = False
            for _ in range(RETRIES):
                old = self._holder(thread, ident)
                blobs: dict[str, list[Any]] = {}
                deltas: dict[str, list[int]] = {}
                tips: dict[str, tuple[int, int, bytes, tuple[int, ...]]] = {}
                for ch, version in new_versions.items():
                    if ch not in values:
                        blobs[ch] = [version, "empty", ""]
                        continue
                    elements = lists.get(ch)
                    if elements is not None:
                        count = len(values[ch])
                        tip = thread.tips.get((ns, ch)) if old is None else None  # a re-put is stored whole
                        prefix, digest = _digests(elements, tip.nbytes if tip is not None else 0)
                        if tip is not None and _extends(thread, tip, count, elements, prefix):
                            # Only what was appended since the value this process stored last.
                            blobs[ch] = [version, *self._store_value(values[ch][tip.count :])]
                            deltas[ch] = list(tip.chain)
                            tips[ch] = (count, len(elements), digest, tip.chain)
                            continue
                        tips[ch] = (count, len(elements), digest, ())
                    if ch not in full:
                        full[ch] = self._store_value(values[ch])
                    blobs[ch] = [version, *full[ch]]
                value = {**base, "blobs": blobs, **({"deltas": deltas} if deltas else {})}
                event = ev.Checkpoint(id=cid, ns=ns, parent=conf.get("checkpoint_id"), value=value, meta=meta)
                if old is not None and self._same(thread.session.read(old).event, event):
                    if fresh:
                        break
                    records = None
                else:
                    records = thread.commit([msgspec.structs.replace(event, supersedes=old)])
                if records is None:
                    # Another writer appended meanwhile, or nothing to write: read what is new, decide again.
                    thread.refresh()
                    fresh = True
                    continue
                at = records[0].pos
                for ch in new_versions:
                    if ch in tips:
                        count, nbytes, digest, chain = tips[ch]
                        thread.tips[(ns, ch)] = _Tip(count, nbytes, digest, (*chain, at))
                    else:
                        thread.tips.pop((ns, ch), None)
                break
            else:
                raise ConflictError(f"gave up writing {ident!r} to {thread.session.name!r} after {RETRIES} conflicts",
                                    session=thread.session.name)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}}

    def _elements(self, value: Any) -> memoryview | None:
        """Return the msgpack of a list value's elements, when it may be stored as an extension of an earlier one.

        Only with the default serializer: its msgpack encodes each element on its own, so
        a list whose element bytes start with an earlier list's holds those elements.
        """
        if type(value) is not list or type(self.serde) is not JsonPlusSerializer:
            return None
        kind, data = self.serde.dumps_typed(value)
        return _msgpack_elements(data) if kind == "msgpack" else None

    def _append_replacing(self, thread: _Thread, event: ev.Checkpoint | ev.Write, ident: tuple[Any, ...]) -> None:
        """Append ``event``, superseding the live event with the same identity; write nothing for an exact repeat."""
        for _ in range(RETRIES):
            thread.refresh()
            old = self._holder(thread, ident)
            if old is not None and self._same(thread.session.read(old).event, event):
                return
            if thread.commit([msgspec.structs.replace(event, supersedes=old)]) is not None:
                return
            # another writer appended meanwhile: read what it wrote, then decide again
        raise ConflictError(f"gave up writing {ident!r} to {thread.session.name!r} after {RETRIES} conflicts",
                            session=thread.session.name)

    @staticmethod
    def _holder(thread: _Thread, ident: tuple[Any, ...]) -> int | None:
        space = thread.namespaces.get(ident[1])
        if space is None:
            return None
        if ident[0] == "c":
            where = space.where.get(ident[2])
        else:
            where = space.writes.get(ident[2], {}).get((ident[3], ident[4]))
        return where[-1] if where else None

    @staticmethod
    def _same(a: ev.Event, b: ev.Event) -> bool:
        def bare(e: ev.Event) -> bytes:
            return ev.encode(msgspec.structs.replace(e, ts=None, idempotency_key=None, supersedes=None))

        return type(a) is type(b) and bare(a) == bare(b)

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
        """
        conf = config["configurable"]
        thread_id, ns, cid = str(conf["thread_id"]), conf.get("checkpoint_ns", ""), str(conf["checkpoint_id"])
        batch: dict[int, tuple[str, Any]] = {}
        for idx, (channel, value) in enumerate(writes):
            i = WRITES_IDX_MAP.get(channel, idx)
            if i < 0 or i not in batch:
                batch[i] = (channel, value)
        if not batch:
            return
        events = {i: ev.Write(checkpoint=cid, task=task_id, channel=channel, idx=i, path=task_path, ns=ns,
                              value=self._store_value(value))
                  for i, (channel, value) in batch.items()}
        thread = self._thread(thread_id)
        assert thread is not None
        with thread.lock:
            # Decide from the index as it stands, without reading the log first: the commit
            # writes only if no other writer appended since (else read what it did and decide
            # again). Writing nothing is decided only on an index just brought up to date.
            fresh = False
            for _ in range(RETRIES):
                new: list[ev.Event] = []
                special = []
                for i, event in events.items():
                    old = self._holder(thread, ("w", ns, cid, task_id, i))
                    if old is None:
                        new.append(event)
                    elif i < 0:
                        special.append(event)
                if (thread.commit(new) is None) if new else not fresh:
                    thread.refresh()
                    fresh = True
                    continue
                for event in special:
                    self._append_replacing(thread, event, ("w", ns, cid, task_id, event.idx))
                return
            raise ConflictError(f"gave up writing the writes of task {task_id!r} after {RETRIES} conflicts",
                                session=thread.session.name)

    # --- deleting and copying ----------------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        """Redact every event of thread ``thread_id``: the thread reads as gone, its tree still verifies."""
        thread = self._thread(str(thread_id), create=False)
        if thread is not None:
            with thread.lock:
                thread.refresh()
                thread.erase(set(thread.live), "langgraph delete_thread")

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Redact the checkpoints whose metadata names one of ``run_ids``, with their writes, in every thread."""
        runs = set(run_ids)
        if not runs:
            return
        for thread in self._all_threads():
            with thread.lock:
                thread.refresh()
                doomed = {(ns, cid) for ns, space in thread.namespaces.items()
                          for cid, run in space.runs.items() if run in runs}
                if doomed:
                    self._remove(thread, doomed, "langgraph delete_for_runs")

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep only the latest checkpoint of each namespace (``keep_latest``) or none (``delete``).

        Raises:
            ValueError: an unknown strategy.
        """
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown prune strategy {strategy!r}; want one of {', '.join(STRATEGIES)}")
        for thread_id in thread_ids:
            thread = self._thread(str(thread_id), create=False)
            if thread is None:
                continue
            with thread.lock:
                thread.refresh()
                doomed = {(ns, cid) for ns, space in thread.namespaces.items()
                          for cid in (space.ids if strategy == "delete" else space.ids[:-1])}
                self._remove(thread, doomed, f"langgraph prune {strategy}")

    def _remove(self, thread: _Thread, doomed: set[Key], reason: str) -> None:
        """Redact checkpoints ``doomed`` and their writes, keeping every value a survivor reads.

        A surviving checkpoint may read a channel value stored only in a doomed event
        (its version did not change since), or store a list value as appended to one in
        a doomed event: it is appended again first, with that value whole inside, and its
        old event joins the doomed ones.
        """
        positions: set[int] = set()
        for ns, cid in doomed:
            space = thread.namespaces[ns]
            positions.update(space.where.get(cid, []))
            for ps in space.writes.get(cid, {}).values():
                positions.update(ps)
        for ns in {ns for ns, _ in doomed}:
            space = thread.namespaces[ns]
            endangered = {k for k, held in space.blobs.items() if held and all(p in positions for p in held)}
            for cid in list(space.ids):
                if (ns, cid) not in doomed and (endangered or thread.deps.get(space.where[cid][-1], set()) & positions):
                    self._rescue(thread, ns, cid, positions)
        thread.erase(positions, reason)

    def _rescue(self, thread: _Thread, ns: str, cid: str, doomed: set[int]) -> None:
        """Append checkpoint ``cid`` again holding whole every value it reads from doomed events."""
        space = thread.namespaces[ns]
        pos = space.where[cid][-1]
        records = {pos: thread.session.read(pos)}
        event = records[pos].event
        if not isinstance(event, ev.Checkpoint):
            return
        versions = self._snapshot(event).get("channel_versions", {})
        blobs = dict(event.value.get("blobs") or {})
        deltas = dict(event.value.get("deltas") or {})
        missing = {}
        for ch, version in versions.items():
            held = space.blobs.get((ch, encode_json(version)), [])
            if ch not in blobs and held and all(p in doomed for p in held):
                missing[ch] = held[-1]
        spread = [ch for ch, chain in deltas.items() if doomed.intersection(chain)]
        if not missing and not spread:
            return
        records.update(read_many(thread.session, missing.values()))
        for ch, at in missing.items():
            holder = records[at].event
            if isinstance(holder, ev.Checkpoint):
                blobs[ch] = self._whole(thread, records, at, ch)
        for ch in spread:
            blobs[ch] = self._whole(thread, records, pos, ch)
            del deltas[ch]
        value = {k: v for k, v in event.value.items() if k != "deltas"}
        value["blobs"] = blobs
        if deltas:
            value["deltas"] = deltas
        again = msgspec.structs.replace(event, value=value, ts=None, idempotency_key=None, supersedes=None)
        record = thread.session.append(msgspec.structs.replace(again, supersedes=pos),
                                       idempotency_key=idempotency_key(("c", ns, cid), pos))
        thread.own([record])
        doomed.add(pos)

    def _whole(self, thread: _Thread, records: dict[int, Record], at: int, ch: str) -> Stored:
        """Return the blob of channel ``ch`` of the checkpoint at ``at``, holding its value whole."""
        event = records[at].event
        assert isinstance(event, ev.Checkpoint)
        blob = event.value["blobs"][ch]
        if ch not in (event.value.get("deltas") or {}):
            return list(blob)
        _, got = self._channel(thread, records, at, ch)
        return [blob[0], *self._store_value(got)]

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
        moved: dict[int, int] = {}
        with dst.lock:
            for i in range(0, len(positions), 512):
                chunk = read_many(src.session, positions[i : i + 512])
                self._copy_chunk(src, dst, [chunk[p] for p in sorted(chunk)], str(target_thread_id), moved)

    def _copy_chunk(self, src: _Thread, dst: _Thread, records: Sequence[Record], thread_id: str,
                    moved: dict[int, int]) -> None:
        """Append ``records`` (a source thread's, in log order) to ``dst``; ``moved`` maps source to target positions."""
        batch: list[ev.Event] = []
        keys: list[str | None] = []
        sources: list[int] = []

        def flush() -> None:
            if batch:
                appended = dst.session.extend(batch, idempotency_keys=keys)
                moved.update(zip(sources, (r.pos for r in appended)))
                dst.own(appended)
                batch.clear()
                keys.clear()
                sources.clear()

        dst.refresh()
        for record in records:
            event = record.event
            if isinstance(event, ev.Checkpoint):
                ident: tuple[Any, ...] = ("c", event.ns, event.id)
                value = {**event.value, "thread": thread_id}
                deltas = value.pop("deltas", None) or {}
                if any(p in sources for chain in deltas.values() for p in chain):
                    flush()  # the parts a list value is spread over must have their target positions first
                kept = {ch: [moved[p] for p in chain] for ch, chain in deltas.items() if all(p in moved for p in chain)}
                if len(kept) < len(deltas):  # a part the target did not take from here: store the value whole
                    own = {record.pos: record}
                    value["blobs"] = {ch: self._whole(src, own, record.pos, ch) if ch in deltas and ch not in kept
                                      else blob for ch, blob in value["blobs"].items()}
                if kept:
                    value["deltas"] = kept
                event = msgspec.structs.replace(event, value=value)
            elif isinstance(event, ev.Write):
                ident = ("w", event.ns, event.checkpoint, event.task, event.idx)
            else:
                continue
            replaced = None
            if event.supersedes is not None:
                if event.supersedes in sources:
                    flush()  # the event it replaces must have its target position first
                replaced = moved.get(event.supersedes)
            if replaced is None and self._holder(dst, ident) is not None:
                continue  # the target already holds it
            batch.append(msgspec.structs.replace(event, supersedes=replaced, idempotency_key=None))
            keys.append(idempotency_key(ident, replaced))
            sources.append(record.pos)
        flush()

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
        """Async :meth:`put`, run in a worker thread."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

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


def _take(it: Iterator[CheckpointTuple], n: int) -> list[CheckpointTuple]:
    out = []
    for tup in it:
        out.append(tup)
        if len(out) == n:
            break
    return out
