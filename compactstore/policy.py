"""The compaction policy: when a session's raw tail is compacted, its digest grown and a marker emitted.

A :class:`CompactionPolicy` says what is due; :meth:`compactstore.Session.maintain`
(and ``await Session.amaintain``) applies it, one step at a time, each through the
gate and the store's one commit. What is due is read from the log every time
(:func:`due`), never from state kept in memory, so a maintenance that stopped partway
(a crash, a refusal) is finished by running it again, and nothing is done twice.

The steps, in order:

1. **Compact** the raw tail after the last L1 node, ``every`` raw events at a time (seed
   003's runtime compacts every 40 turns), or all of it once its size reaches
   ``threshold`` (80%) of ``budget`` (seed 001: 70 to 85% of a token budget).
2. **Roll up** the session digest once ``roll_up_every`` L1 nodes follow it:
   ``Session.roll_up([digest, *l1_nodes])`` writes a new digest over their union.
3. **Mark** the node that ends last, unless a marker pointing at a node was emitted
   after the newest node.

The summarizer protocol: a callable from the records of what is summarized (the raw
events of the span for an L1 node, the child nodes for a roll-up, in log order) to
the summary text. ``maintain`` takes a plain function; ``amaintain`` also takes an
``async def`` one (a language-model call). None means the deterministic
:func:`compactstore.summarize.extractive`.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Union

import msgspec

from . import events as ev
from .compaction import OnRisk
from .errors import InvalidArgument, shown
from .events import Record
from .summarize import Summarizer, extractive
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

    def __post_init__(self) -> None:
        _count("every", self.every, 1)
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
    """

    compacted: list[int] = []
    rolled_up: list[int] = []
    marker: int | None = None
    refused: list[str] = []


def due(
    view: SessionView, policy: CompactionPolicy, *, compact: bool = True, roll_up: bool = True, mark: bool = True
) -> Step | None:
    """Return the next step ``policy`` wants on the session as its log stands, or None when nothing is due.

    The flags leave a kind of step out (after it was refused in this run). Reads the
    structural index for the nodes and only the raw tail after the last L1 node.
    """
    size = view.size
    nodes = sorted(view.facts(size).nodes(), key=lambda pn: pn[0])
    l1 = sorted(((p, n) for p, n in nodes if n.tier == 1), key=lambda pn: pn[1].start)
    tail = max((n.stop for _, n in l1), default=0)
    if compact and tail < size:
        step = _compaction(view, policy, tail, size)
        if step is not None:
            return step
    digests = [(p, n) for p, n in nodes if n.tier >= 2]
    digest = max(digests, key=lambda pn: (pn[1].stop, pn[0]), default=None)
    if roll_up and policy.roll_up_every is not None:
        # The contiguous L1 nodes after the digest (from the first L1 node when there is none).
        at = digest[1].stop if digest is not None else (l1[0][1].start if l1 else 0)
        chain: list[int] = []
        for p, n in l1:
            if n.start == at:
                chain.append(p)
                at = n.stop
        if len(chain) >= policy.roll_up_every:
            return RollUp(([digest[0]] if digest is not None else []) + chain)
    if mark and nodes:
        # Marked once a marker that points at a node was emitted after the newest node.
        newest = max(p for p, _ in nodes)
        marked = any(isinstance(r.event, ev.RecoveryMarker) and r.event.node is not None
                     for r in view.scan(newest + 1, size))  # fmt: skip
        if not marked:
            return Mark(max(nodes, key=lambda pn: (pn[1].stop, pn[1].tier, pn[0]))[0])
    return None


def _compaction(view: SessionView, policy: CompactionPolicy, start: int, size: int) -> Compact | None:
    """Return the compaction of the raw tail ``[start, size)`` that is due, or None."""
    measure = policy.measure or body_size
    count = total = 0
    for r in view.scan(start, size):
        if r.kind in ev.DERIVED_KINDS:
            continue
        count += 1
        total += measure(r)
        if policy.every is not None and count >= policy.every:
            return Compact(start, r.pos + 1)
    if policy.budget is not None and count and total >= policy.threshold * policy.budget:
        return Compact(start, size)
    return None


def inputs(view: SessionView, step: Compact | RollUp) -> list[Record]:
    """Return the records the summarizer reads for ``step``: the span's events, or the nodes rolled up."""
    if isinstance(step, Compact):
        return view.read_span(step.start, step.stop, records=True).records
    return sorted((view.read(p) for p in step.nodes), key=lambda r: (getattr(r.event, "start", -1), r.pos))


# --- driving a maintenance -------------------------------------------------------------

Run = Generator[list[Record], str, Maintenance]
"""A maintenance in progress: it yields the records it needs summarized and is sent the text."""


def text_of(value: object) -> str:
    """Return a summarizer's result, refusing anything but text (a coroutine: use ``amaintain``).

    Raises:
        InvalidArgument: naming ``summarizer``.
    """
    if inspect.iscoroutine(value):
        value.close()  # never awaited: closed so that it warns of nothing
        raise InvalidArgument("summarizer", "returned a coroutine: an async summarizer needs Session.amaintain")
    if not isinstance(value, str):
        raise InvalidArgument("summarizer", f"must return str, got {type(value).__name__}")
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
            records = run.send(text_of(summarize(records)))
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
    if not isinstance(out, str):
        raise InvalidArgument("summarizer", f"must return str, got {type(out).__name__}")
    return out

