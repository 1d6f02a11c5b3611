"""What the LangGraph saver knows of one thread's log: which position holds which checkpoint, write and channel version.

The log is the source of truth. The index is read once and then kept current by
reading only what was appended since, by any process (see :class:`.tail.Tail`), so
reading the latest checkpoint costs a few rows however long the thread.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .. import events as ev
from ..events import encode_json
from ..store import Record, Session
from .langgraph_messages import INTERRUPT, MESSAGE, message_id
from .langgraph_state import StateCodec, Tip, blob_keys, parts
from .tail import Tail

__all__ = ["Ident", "Key", "Namespace", "ThreadIndex"]

#: A checkpoint within a thread: ``(namespace, checkpoint id)``.
Key = tuple[str, str]
#: What a graph state event (``("c", ns, id)``) or a write event (``("w", ns, checkpoint
#: id, task id, idx)``) stands for: a later event for the same supersedes it.
Ident = tuple[Any, ...]
_NONE: Mapping[Any, Any] = MappingProxyType({})


@dataclass
class Namespace:
    """The live checkpoints, writes and channel versions of one namespace of a thread."""

    #: checkpoint ids in ascending order (LangGraph ids sort in the order they were made)
    ids: list[str] = field(default_factory=list)
    #: checkpoint id -> positions of its live events, the current one last
    where: dict[str, list[int]] = field(default_factory=dict)
    #: checkpoint id -> (task id, idx) -> positions of its live write events, the current one last.
    #: Tuples, not lists: a tuple of ints leaves the cycle collector's care at its first
    #: collection, where a list per write stayed in it and brought on full collections.
    writes: dict[str, dict[tuple[str, int], tuple[int, ...]]] = field(default_factory=dict)
    #: (channel, version as JSON) -> positions of the live events that hold that value
    blobs: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    #: checkpoint id -> run id from its metadata, when it has one
    runs: dict[str, str] = field(default_factory=dict)


class ThreadIndex(Tail):
    """One thread's session and the index of its log.

    Args:
        session: the thread's session.
        codec: reads the run id from metadata JSON could not carry.
    """

    def __init__(self, session: Session, codec: StateCodec, *, verify: bool = True) -> None:
        super().__init__(session, verify=verify)
        self.codec = codec
        self.namespaces: dict[str, Namespace] = {}
        #: position -> what it holds: ("c", ns, id, blob keys) or ("w", ns, id, (task, idx))
        self.at: dict[int, tuple[Any, ...]] = {}
        #: live graph state position -> the thread id it names (for sessions named by digest)
        self.named: dict[int, str] = {}
        #: the thread id the latest live graph state names, or None
        self.thread_id: str | None = None
        #: graph state position -> the earlier positions its list values are spread over
        self.deps: dict[int, set[int]] = {}
        #: namespace -> channel -> the list value this process last stored there
        self.tips: dict[str, dict[str, Tip]] = {}
        #: message id -> positions of the live events recorded from it
        self.said: dict[str, list[int]] = {}
        #: interrupt id -> position of its live open handle, for every interrupt recorded
        self.asked: dict[str, int] = {}
        #: interrupt id -> (namespace, checkpoint id) it paused at, for the interrupts still open
        self.waiting: dict[str, tuple[str, str]] = {}
        #: position -> message or interrupt id recorded there
        self.talk: dict[int, str] = {}

    def apply(self, record: Record) -> None:
        """Index one live graph state or write event."""
        event, pos = record.event, record.pos
        if isinstance(event, ev.GraphState):
            self._apply_state(event, pos)
        elif isinstance(event, ev.Write):
            space = self._space(event.ns)
            wkey = (event.task, event.idx)
            per = space.writes.get(event.checkpoint)
            if per is None:
                per = space.writes[event.checkpoint] = {}
            per[wkey] = per.get(wkey, ()) + (pos,)
            self.at[pos] = ("w", event.ns, event.checkpoint, wkey)
        elif isinstance(event.meta, dict):
            self._apply_talk(event, pos, event.meta)

    def apply_all(self, records: Sequence[Record]) -> None:
        """Index live records at consecutive positions: :meth:`apply` each, writes without a call each.

        A task's writes (``put_writes``) come as a run against one checkpoint: its
        namespace and per-checkpoint map are looked up once per run.
        """
        at, live, space, per, ns, cid = self.at, self.live, None, None, None, None
        for record in records:
            event, pos = record.event, record.pos
            self.size = pos + 1  # read, then applied, as refresh takes it
            live.add(pos)
            if type(event) is not ev.Write:
                self.apply(record)
                ns = None  # the run of writes ends: look the maps up again
                continue
            if ns != event.ns or cid != event.checkpoint or per is None:
                ns, cid = event.ns, event.checkpoint
                space = self._space(ns)
                per = space.writes.get(cid)
                if per is None:
                    per = space.writes[cid] = {}
            wkey = (event.task, event.idx)
            per[wkey] = per.get(wkey, ()) + (pos,)
            at[pos] = ("w", ns, cid, wkey)

    def _apply_talk(self, event: ev.Event, pos: int, meta: dict[str, Any]) -> None:
        """Index an event the saver recorded from a message or an interrupt."""
        mid = meta.get(MESSAGE)
        if isinstance(mid, str):
            self.said.setdefault(mid, []).append(pos)
            self.talk[pos] = mid
            return
        iid = meta.get(INTERRUPT)
        if not isinstance(iid, str):
            return
        if isinstance(event, ev.HandleOpened):
            self.asked[iid] = pos
            self.talk[pos] = iid
            at = meta.get("at")
            if isinstance(at, list) and len(at) == 2:
                self.waiting[iid] = (str(at[0]), str(at[1]))
        elif isinstance(event, ev.HandleClosed):
            self.waiting.pop(iid, None)

    def _apply_state(self, event: ev.GraphState, pos: int) -> None:
        space = self._space(event.ns)
        if event.id not in space.where:
            bisect.insort(space.ids, event.id)
            space.where[event.id] = []
        space.where[event.id].append(pos)
        keys = blob_keys(event.value)
        for k in keys:
            space.blobs.setdefault(k, []).append(pos)
        run = self.codec.metadata(event).get("run_id")
        if isinstance(run, str):
            space.runs[event.id] = run
        thread = event.value.get("thread") if isinstance(event.value, dict) else None
        if isinstance(thread, str):
            self.named[pos] = thread
            self.thread_id = thread  # records are applied in position order: this is the latest
        spread = parts(event.value)
        if spread:
            self.deps[pos] = spread
        self.at[pos] = ("c", event.ns, event.id, keys)

    def _space(self, ns: str) -> Namespace:
        space = self.namespaces.get(ns)
        if space is None:
            space = self.namespaces[ns] = Namespace()
        return space

    def forget(self, positions: Sequence[int]) -> None:
        """Drop the checkpoints and writes at redacted ``positions``."""
        named = len(self.named)
        for pos in positions:
            said = self.talk.pop(pos, None)
            if said is not None:
                _drop(self.said, said, pos)
                if self.asked.get(said) == pos:
                    del self.asked[said]
                    self.waiting.pop(said, None)
            entry = self.at.pop(pos, None)
            if entry is None:
                continue
            space = self.namespaces[entry[1]]
            if entry[0] == "c":
                _, _, cid, keys = entry
                self.deps.pop(pos, None)
                self.named.pop(pos, None)
                _drop(space.where, cid, pos)
                if cid not in space.where:
                    space.ids.remove(cid)
                    space.runs.pop(cid, None)
                for k in keys:
                    _drop(space.blobs, k, pos)
            else:
                _, _, cid, wkey = entry
                per = space.writes.get(cid, {})
                held = per.get(wkey, ())
                if pos in held:
                    rest = tuple(p for p in held if p != pos)
                    if rest:
                        per[wkey] = rest
                    else:
                        del per[wkey]
                if not per:
                    space.writes.pop(cid, None)
            if not (space.ids or space.where or space.writes or space.blobs or space.runs):
                del self.namespaces[entry[1]]  # as if never read: an index read from the log has none
        if len(self.named) != named:  # a state naming the thread went: the latest left names it
            self.thread_id = self.named[max(self.named)] if self.named else None

    # --- questions ---------------------------------------------------------------------

    def current(self, ns: str, cid: str | None) -> tuple[str, int] | None:
        """Return ``(id, position)`` of checkpoint ``cid`` (the latest when None) in ``ns``."""
        space = self.namespaces.get(ns)
        if space is None or not space.ids:
            return None
        if cid is None:
            cid = space.ids[-1]
        where = space.where.get(cid)
        return (cid, where[-1]) if where else None

    def checkpoints(self, ns: str | None = None, below: str | None = None) -> list[Key]:
        """Return the live checkpoints of namespace ``ns`` (of every one when None), by id within each.

        With ``below``, only those whose id sorts below it.
        """
        out = []
        for name, space in self.namespaces.items():
            if ns is None or name == ns:
                stop = bisect.bisect_left(space.ids, below) if below is not None else len(space.ids)
                out += [(name, cid) for cid in space.ids[:stop]]
        return out

    def latest(self) -> set[Key]:
        """Return the latest live checkpoint of each namespace."""
        return {(ns, space.ids[-1]) for ns, space in self.namespaces.items() if space.ids}

    def of_runs(self, runs: Collection[str]) -> set[Key]:
        """Return the live checkpoints whose metadata names one of ``runs``."""
        return {(ns, cid) for ns, space in self.namespaces.items() for cid, run in space.runs.items() if run in runs}

    def holder(self, ident: Ident) -> int | None:
        """Return the position of the live event standing for ``ident``, or None."""
        space = self.namespaces.get(ident[1])
        if space is None:
            return None
        where: Sequence[int] | None
        if ident[0] == "c":
            where = space.where.get(ident[2])
        else:
            where = space.writes.get(ident[2], {}).get((ident[3], ident[4]))
        return where[-1] if where else None

    def pending(self, ns: str, cid: str) -> Mapping[tuple[str, int], Sequence[int]]:
        """Return the live writes pending against checkpoint ``cid`` of ``ns``: (task id, idx) -> positions, the current last."""
        space = self.namespaces.get(ns)
        return _NONE if space is None else space.writes.get(cid, _NONE)

    def writes(self, ns: str, cid: str) -> list[int]:
        """Return the positions of the live writes pending against checkpoint ``cid``, one per (task, idx)."""
        return [where[-1] for where in self.namespaces[ns].writes.get(cid, {}).values()]

    def holders(self, ns: str, pos: int, versions: Mapping[str, Any]) -> dict[str, int]:
        """Return, per channel of ``versions``, the position of an event storing that version's value.

        The checkpoint at ``pos`` when it stores it, else the latest that does; a channel
        no live event stores is left out.
        """
        space = self.namespaces[ns]
        out = {}
        for ch, version in versions.items():
            held = space.blobs.get((ch, encode_json(version)))
            if held:
                out[ch] = pos if pos in held else held[-1]
        return out

    def held_only_in(self, ns: str, versions: Mapping[str, Any], positions: Collection[int]) -> dict[str, int]:
        """Return, per channel of ``versions`` whose value only ``positions`` store, the latest of them."""
        space = self.namespaces[ns]
        out = {}
        for ch, version in versions.items():
            held = space.blobs.get((ch, encode_json(version)), [])
            if held and all(p in positions for p in held):
                out[ch] = held[-1]
        return out

    def endangered(self, ns: str, positions: Collection[int]) -> bool:
        """Return whether some channel value of namespace ``ns`` is stored only at ``positions``."""
        return any(held and all(p in positions for p in held) for held in self.namespaces[ns].blobs.values())

    def reads_from(self, ns: str, cid: str, positions: Collection[int]) -> bool:
        """Return whether checkpoint ``cid`` reads a list part from one of ``positions``."""
        return not self.deps.get(self.namespaces[ns].where[cid][-1], set()).isdisjoint(positions)

    def spread(self, positions: Iterable[int]) -> set[int]:
        """Return the earlier positions the list values of the checkpoints at ``positions`` are spread over."""
        return {p for at in positions for p in self.deps.get(at, ())}

    def positions(self, doomed: Iterable[Key]) -> set[int]:
        """Return the positions of the live events of checkpoints ``doomed`` and of their writes."""
        out: set[int] = set()
        for ns, cid in doomed:
            space = self.namespaces[ns]
            out.update(space.where.get(cid, []))
            for ps in space.writes.get(cid, {}).values():
                out.update(ps)
        return out

    def unsaid(self, messages: Iterable[Any]) -> list[Any]:
        """Return the messages with an id that no live event was recorded from, each once, in order."""
        out, seen = [], set()
        for m in messages:
            mid = message_id(m)
            if mid is not None and mid not in self.said and mid not in seen:
                seen.add(mid)
                out.append(m)
        return out

    def paused_at(self, ns: str, cid: str | None) -> list[str]:
        """Return the ids of the open interrupts that paused namespace ``ns`` at checkpoint ``cid``."""
        return [iid for iid, at in self.waiting.items() if at == (ns, cid)]

    # --- what this process stored ------------------------------------------------------

    def tips_of(self, ns: str) -> Mapping[str, Tip]:
        """Return the list value this process last stored in each channel of namespace ``ns``."""
        return self.tips.get(ns, {})

    def remember(self, ns: str, channels: Iterable[str], tips: Mapping[str, Tip], pos: int) -> None:
        """Record the list values the checkpoint at ``pos`` stored in ``channels`` of ``ns`` (a tip per list)."""
        mine = self.tips.setdefault(ns, {})
        for ch in channels:
            if ch in tips:
                mine[ch] = tips[ch].at(pos)
            else:
                mine.pop(ch, None)


def _drop(index: dict[Any, list[int]], key: Any, pos: int) -> None:
    got = index.get(key)
    if got is not None and pos in got:
        got.remove(pos)
        if not got:
            del index[key]
