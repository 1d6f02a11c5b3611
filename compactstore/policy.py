"""The compaction policy: when a session's raw tail is compacted, its digest grown and a marker emitted.

A :class:`CompactionPolicy` says what is due; :meth:`compactstore.Session.maintain`
(and ``await Session.amaintain``) applies it, one step at a time, each through the
gate and the store's one commit. What is due is read from the log every time
(:func:`due`), never from state kept in memory, so a maintenance that stopped partway
(a crash, a refusal) is finished by running it again, and nothing is done twice.

The steps, in order:

1. **Compact** the raw tail after the last L1 node, ``every`` raw events at a time, or
   all of it once its size reaches ``threshold`` (80%) of ``budget``, early enough that
   the compaction runs before the window is full.
2. **Roll up** the session digest once ``roll_up_every`` L1 nodes follow it:
   ``Session.roll_up([digest, *l1_nodes])`` writes a new digest over their union.
3. **Mark** the node that ends last, unless a marker pointing at a node was emitted
   after the newest node.

The summarizer protocol: a callable from the records of what is summarized (the raw
events of the span for an L1 node, derived events left out; the child nodes for a
roll-up, in log order) to the summary text, at most ``summary_limit`` characters
(:class:`compactstore.errors.SummaryTooLongError` otherwise, and nothing is written).
``maintain`` takes a plain function; ``amaintain`` also takes an ``async def`` one (a
language-model call). None means the deterministic, bounded
:func:`compactstore.summarize.extractive`.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Union

import msgspec

from . import events as ev
from .compaction import OnRisk
from .errors import InvalidArgument, SummaryTooLongError, shown
from .events import Record
from .summarize import Summarizer, extractive, raw
from .view import SessionView

AsyncSummarizer = Callable[[Sequence[Record]], Awaitable[str]]
"""An ``async def`` summarizer: the records of what is summarized to the summary text."""

Measure = Callable[[Record], int]
"""The size of a raw event against the budget (characters of its body by default, or tokens)."""


def body_size(record: Record) -> int:
    """Return the size of a record's canonical body, in bytes: the default :data:`Measure`."""
    return len(record.body)


def _count(name: str, value: object, low: int) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
        raise InvalidArgument(name, f"want None or an int >= {low}, got {shown(value)}")


@dataclass(frozen=True, kw_only=True)
class CompactionPolicy:
    """When :meth:`Session.maintain` compacts, grows the session digest and emits a marker.

    Attributes:
        every: compact every this many raw events after the last L1 node (None: never by count).
        budget: compact the whole raw tail once its size reaches ``threshold`` of this
            (None: never by size); sizes are ``measure``'s.
        threshold: the fraction of ``budget`` that triggers a compaction (0.8).
        roll_up_every: grow the session digest once this many L1 nodes follow it (None: never).
        summarizer: the records summarized to the summary text; plain for ``maintain``,
            plain or ``async def`` for ``amaintain``; None for the extractive one.
        on_risk: what a compaction does when the gate finds a needed non-regenerable
            binding in its span: ``"spill"`` it to the store (the default, so that an
            unattended policy never stalls), ``"preserve"`` it verbatim, or ``"refuse"``
            (the compaction is reported as refused and tried again next time).
        measure: the size of a raw event (default :func:`body_size`).
        summary_limit: the most characters a summary may have; a summarizer that
            returns more raises :class:`~compactstore.errors.SummaryTooLongError` and
            nothing is written. It bounds what a resumed agent reads: at most the raw
            tail (under ``every`` raw events, or ``budget``) plus one note per node of
            the cover (the digest and at most ``roll_up_every`` L1 nodes), each its
            summary and capped lists.
        retain_last: after a marker is emitted, drop the raw bodies its cover stands for
            (:meth:`Session.retain`), keeping those of the newest this many positions; None
            (the default) keeps every body. :meth:`Store.reclaim` gives the space back.

    Raises:
        InvalidArgument: naming the field, for a bad value or when neither ``every`` nor
            ``budget`` is set.
    """

    every: int | None = 40
    budget: int | None = None
    threshold: float = 0.8
    roll_up_every: int | None = 5
    summarizer: Union[Summarizer, AsyncSummarizer, None] = None  # noqa: UP007 - a runtime alias
    on_risk: OnRisk = "spill"
    measure: Measure | None = None
    summary_limit: int = 2000
    retain_last: int | None = None

    def __post_init__(self) -> None:
        _count("every", self.every, 1)
        _count("retain_last", self.retain_last, 0)
        _count("summary_limit", self.summary_limit, 1)
        if self.summary_limit is None:
            raise InvalidArgument("summary_limit", "want an int >= 1, got None")
        _count("budget", self.budget, 1)
        _count("roll_up_every", self.roll_up_every, 1)
        if self.every is None and self.budget is None:
            raise InvalidArgument("every", "neither every nor budget is set: nothing would ever be compacted")
        t = self.threshold
        if not isinstance(t, int | float) or isinstance(t, bool) or not 0 < t <= 1:
            raise InvalidArgument("threshold", f"want a fraction in (0, 1], got {shown(t)}")
        if self.summarizer is not None and not callable(self.summarizer):
            raise InvalidArgument("summarizer", f"want a callable, got {type(self.summarizer).__name__}")
        if self.on_risk not in ("refuse", "preserve", "spill"):
            raise InvalidArgument("on_risk", f'want "refuse", "preserve" or "spill", got {shown(self.on_risk)}')
        if self.measure is not None and not callable(self.measure):
            raise InvalidArgument("measure", f"want a callable, got {type(self.measure).__name__}")

    @property
    def is_async(self) -> bool:
        """Return whether the summarizer is an ``async def`` function (or object with one as ``__call__``)."""
        s = self.summarizer
        return s is not None and (inspect.iscoroutinefunction(s) or inspect.iscoroutinefunction(getattr(s, "__call__", None)))


# --- the steps -------------------------------------------------------------------------


class Compact(msgspec.Struct, frozen=True, tag="compact"):
    """Compact raw positions ``[start, stop)`` into an L1 node."""

    start: int
    stop: int


class RollUp(msgspec.Struct, frozen=True, tag="roll_up"):
    """Write a new session digest over ``nodes``: the current digest (if any), then the L1 nodes after it."""

    nodes: list[int]


class Mark(msgspec.Struct, frozen=True, tag="mark"):
    """Emit a marker pointing at ``node``: the node that ends last (the newest digest when nothing follows it)."""

    node: int


Step = Compact | RollUp | Mark


class Maintenance(msgspec.Struct, frozen=True):
    """What one :meth:`Session.maintain` call did.

    Attributes:
        compacted: positions of the L1 nodes written.
        rolled_up: positions of the session digests written.
        marker: position of the marker emitted, or None.
        refused: each due step that was refused, with why (the gate, a marker condition).
        retained: position of the retention logged (``retain_last``), or None.
    """

    compacted: list[int] = []
    rolled_up: list[int] = []
    marker: int | None = None
    refused: list[str] = []
    retained: int | None = None


class Plan:
    """What a policy reads of a session to decide what is due, brought up to date where the log grew.

    It takes the session's events in position order: the summary nodes (the tail the
    L1 nodes reach, the digest, the L1 nodes by start, the newest), whether a marker that
    points at a node follows the newest node, and the raw events after the tail. A new
    plan starts from the nodes and the raw tail only; after that each call reads only
    the events appended since, so a maintenance with nothing due reads a few rows. The
    store keeps one per session and drops it when the session is redacted (an erased
    node or marker no longer says what it said).
    """

    def __init__(self) -> None:
        self.size = 0
        #: the raw positions the L1 nodes reach: the raw tail starts here
        self.tail = 0
        #: start of each L1 node -> (its position, its stop); the first written wins a start
        self.l1: dict[int, tuple[int, int]] = {}
        #: the session digest: (position, start, stop) of the L2 node ending last
        self.digest: tuple[int, int, int] | None = None
        #: the newest node's position, and the node ending last (stop, tier, position)
        self.newest = -1
        self.last: tuple[int, int, int] | None = None
        #: whether a marker pointing at a node was emitted after the newest node
        self.marked = False
        #: the raw events after the tail, in order
        self.raw: list[Record] = []
        self._lock = threading.Lock()

    def advance(self, view: SessionView, size: int) -> None:
        """Take in the events of ``[self.size, size)`` (for a new plan, the nodes and the raw tail only)."""
        if size <= self.size:
            return
        known: set[int] = set()
        start = self.size
        if self.size == 0:
            nodes = view.facts(size).nodes()
            for p, n in nodes:
                self._node(p, n)
            known = {p for p, _ in nodes}
            start = min(self.tail, self.newest + 1) if nodes else 0
        for r in view.scan(start, size, verify=False):
            if r.pos not in known:
                self.take(r)
        self.size = size

    def _node(self, pos: int, n: ev.Summary) -> None:
        if pos > self.newest:
            self.newest, self.marked = pos, False
        self.last = max(self.last or (n.stop, n.tier, pos), (n.stop, n.tier, pos))
        if n.tier == 1:
            self.l1.setdefault(n.start, (pos, n.stop))
            if n.stop > self.tail:
                self.tail = n.stop
                self.raw = [r for r in self.raw if r.pos >= n.stop]
        elif self.digest is None or (n.stop, pos) > (self.digest[2], self.digest[0]):
            self.digest = (pos, n.start, n.stop)

    def take(self, r: Record) -> None:
        """Take in the record at the next position."""
        e = r.event
        if isinstance(e, ev.Summary):
            self._node(r.pos, e)
        elif isinstance(e, ev.RecoveryMarker):
            if e.node is not None and r.pos > self.newest:
                self.marked = True
        elif r.kind not in ev.DERIVED_KINDS and r.pos >= self.tail and (not self.raw or r.pos > self.raw[-1].pos):
            self.raw.append(r)

    def due(self, policy: CompactionPolicy, *, compact: bool = True, roll_up: bool = True, mark: bool = True,
            repair: bool = False) -> Step | None:
        """Return the next step ``policy`` wants at this plan's size, or None.

        ``repair``: a marker was just refused because its cover lost what an obligation
        opened since needs: compact the raw tail whatever its length, then grow the digest
        over the L1 nodes after it whatever their number (a roll-up spills what is needed).
        """
        if repair:
            if self.raw:
                return Compact(self.tail, self.raw[-1].pos + 1)
            at = self.digest[2] if self.digest is not None else (min(self.l1) if self.l1 else None)
            nodes: list[int] = []
            while at is not None and at in self.l1:
                p, at = self.l1[at]
                nodes.append(p)
            return RollUp(([self.digest[0]] if self.digest is not None else []) + nodes) if nodes else None
        if compact and self.raw:
            step = self._compaction(policy)
            if step is not None:
                return step
        if roll_up and policy.roll_up_every is not None and self.l1:
            # The contiguous L1 nodes after the digest (from the first L1 node when there is none).
            at = self.digest[2] if self.digest is not None else min(self.l1)
            chain: list[int] = []
            while at in self.l1:
                p, at = self.l1[at]
                chain.append(p)
            if len(chain) >= policy.roll_up_every:
                return RollUp(([self.digest[0]] if self.digest is not None else []) + chain)
        if mark and self.last is not None and not self.marked:
            return Mark(self.last[2])
        return None

    def _compaction(self, policy: CompactionPolicy) -> Compact | None:
        """Return the compaction of the raw tail that is due, or None."""
        measure = policy.measure or body_size
        count = total = 0
        for r in self.raw:
            count += 1
            total += measure(r)
            if policy.every is not None and count >= policy.every:
                return Compact(self.tail, r.pos + 1)
        if policy.budget is not None and count and total >= policy.threshold * policy.budget:
            return Compact(self.tail, self.size)
        return None


def due(
    view: SessionView, policy: CompactionPolicy, *, size: int | None = None, plan: Plan | None = None,
    compact: bool = True, roll_up: bool = True, mark: bool = True, repair: bool = False,
) -> Step | None:
    """Return the next step ``policy`` wants on the session at ``size`` (default: now), or None when nothing is due.

    The flags leave a kind of step out (after it was refused in this run); ``repair``: see
    :meth:`Plan.due`. ``plan``: the
    session's plan kept from an earlier call at a size not past ``size`` (it is brought up
    to date); without one, a new plan reads the summary nodes and the raw tail after the
    last L1 node. Bodies are read against their own leaves only: what is due is a plan,
    and each step reads what it builds on through the verified reads, and is admitted by
    the rules, again.
    """
    size = view.size if size is None else size
    if plan is None or plan.size > size:
        plan = Plan()
    with plan._lock:
        plan.advance(view, size)
        return plan.due(policy, compact=compact, roll_up=roll_up, mark=mark, repair=repair)


def inputs(view: SessionView, step: Compact | RollUp) -> list[Record]:
    """Return the records the summarizer reads for ``step``: the span's events, or the nodes rolled up."""
    if isinstance(step, Compact):
        return raw(view.read_span(step.start, step.stop, records=True).records)
    return sorted((view.read(p) for p in step.nodes), key=lambda r: (getattr(r.event, "start", -1), r.pos))


# --- driving a maintenance -------------------------------------------------------------

Run = Generator[list[Record], str, Maintenance]
"""A maintenance in progress: it yields the records it needs summarized and is sent the text."""


def text_of(value: object, limit: int) -> str:
    """Return a summarizer's result, refusing anything but text of at most ``limit`` characters.

    Raises:
        InvalidArgument: naming ``summarizer``: not text (a coroutine: use ``amaintain``).
        SummaryTooLongError: the text is longer than ``limit``.
    """
    if inspect.iscoroutine(value):
        value.close()  # never awaited: closed so that it warns of nothing
        raise InvalidArgument("summarizer", "returned a coroutine: an async summarizer needs Session.amaintain")
    if not isinstance(value, str):
        raise InvalidArgument("summarizer", f"must return str, got {type(value).__name__}")
    if len(value) > limit:
        raise SummaryTooLongError(limit, len(value))
    return value


def drive(run: Run, policy: CompactionPolicy) -> Maintenance:
    """Run a maintenance to its end, calling the policy's summarizer (plain) for each summary it needs.

    Raises:
        InvalidArgument: the summarizer is async, or returns anything but text.
    """
    if policy.is_async:
        raise InvalidArgument("summarizer", "is an async function: use Session.amaintain")
    summarize = policy.summarizer or extractive
    try:
        records = next(run)
        while True:
            records = run.send(text_of(summarize(records), policy.summary_limit))
    except StopIteration as done:
        result: Maintenance = done.value
        return result


def advance(run: Run, text: str | None) -> tuple[list[Record] | None, Maintenance | None]:
    """Return the next records ``run`` needs summarized, or its outcome when it is done.

    A helper for running the store's side of a maintenance in a worker thread: a
    generator's StopIteration cannot cross into a future.
    """
    try:
        return (next(run) if text is None else run.send(text)), None
    except StopIteration as done:
        return None, done.value


async def summary(policy: CompactionPolicy, records: Sequence[Record]) -> str:
    """Return the policy's summary of ``records``, awaiting an async summarizer."""
    out: object = (policy.summarizer or extractive)(records)
    if inspect.isawaitable(out):
        out = await out
    return text_of(out, policy.summary_limit)

