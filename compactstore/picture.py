"""The picture of a session: what ``compactstore show`` draws, as plain data.

The picture is bounded however long the session. The last :data:`TAIL` positions are
drawn one by one (kind, text, structural role); the positions before them are counted
in at most :data:`BINS` ranges from the structural index (negative facts, and those a
node of the cover dropped, items still open, non-regenerable bindings, derived events,
markers). The newest summary nodes are drawn one by one, back to where the cover holds
every older one; the derived events before them are counted. The newest :data:`MARKERS`
markers are drawn one by one, the older ones counted. Every list a node or a reason
carries is cut to its newest entries.

What it reads: the head, the index's negative, binding and open rows, the positions of
derived events and of markers, the tail's events, the nodes drawn one by one and their
spans (up to :data:`READ_SPAN` positions each), and the context a resumed agent loads
now (:meth:`Session.context`), with why each newer marker does not give it. The audit
and the raw log's size in characters read every event, and are reported for a session
of at most :data:`WHOLE` events. Renderers only draw the picture.
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Literal, TypeVar

import msgspec

from . import events as ev
from . import render
from .compaction import Finding
from .errors import CompactStoreError, IntegrityError
from .facts import Facts
from .index import Index
from .markers import Marker
from .resolver import RawItem, Resolution, SummaryItem
from .rules import CONDITIONS, check_marker, cover_gate, lost
from .structure import IndexRow, split_item, text_of

if TYPE_CHECKING:
    from .store import Session

MarkerState = Literal["certified", "fallback", "broken"]

#: Positions drawn one by one at the end of the log.
TAIL = 200
#: Counted ranges the positions before the tail are drawn in, at most.
BINS = 400
#: Summary nodes drawn one by one at least, the newest ones (more when the cover needs them, up to four times as many).
NODES = 8
#: Markers drawn one by one, the newest ones.
MARKERS = 6
#: Entries of each of a node's lists (negative facts, open and closed items, kept literals, spills) kept, newest first.
LISTED = 20
#: Reasons kept of each list of reasons; the rest are counted in a last line.
REASONS = 5
#: Spans of the context's cover kept, the newest ones.
SPANS = 8
#: Items still open kept, the newest ones.
OPEN = 20
#: A node drawn one by one is checked and its loss manifest read when its span is at most this long.
READ_SPAN = 2_000
#: The audit and the raw log's characters are reported for a session of at most this many events.
WHOLE = 4_000
#: Characters of a node's summary text kept.
SUMMARY = 2_000


class Cell(msgspec.Struct, frozen=True):
    """One position of the log, drawn one by one.

    Attributes:
        kind: the event's kind (``redacted`` for an erased body).
        role: a turn's role (user, assistant, ...), else None.
        negative: ``failed``, ``rejected`` or ``superseded`` for a negative fact.
        open: a tool call, handle or obligation opened here and still open at the end.
        binding: ``regenerable`` or ``non-regenerable`` for a binding.
        derived: a node, spill, marker, attempt or redaction rather than a raw event.
        kept_by, dropped_by: the nodes drawn one by one whose span holds this negative
            fact, and which retain it or not.
        listed_by: the nodes drawn one by one that list this open item as UNRESOLVED.
    """

    pos: int
    kind: str
    text: str
    role: str | None = None
    negative: str | None = None
    open: bool = False
    binding: str | None = None
    derived: bool = False
    kept_by: list[int] = []
    dropped_by: list[int] = []
    listed_by: list[int] = []


class Bin(msgspec.Struct, frozen=True):
    """Positions ``[start, stop)`` before the tail, drawn together: what they hold, counted from the index.

    Attributes:
        negative: negative facts among them.
        dropped: those of them in the span of a node of the cover that does not retain them.
        open: items opened among them and still open at the end.
        bindings: non-regenerable bindings among them.
        derived: summary nodes, spills and attempts among them; markers: markers among them.
        redacted: positions whose bodies a redaction erased.
    """

    start: int
    stop: int
    negative: int = 0
    dropped: int = 0
    open: int = 0
    bindings: int = 0
    derived: int = 0
    markers: int = 0
    redacted: int = 0


class Totals(msgspec.Struct, frozen=True):
    """How many entries each list of a node holds; its :class:`Bar` keeps the newest :data:`LISTED`."""

    negative_facts: int = 0
    unresolved: int = 0
    resolved: int = 0
    kept: int = 0
    spills: int = 0


class Bar(msgspec.Struct, frozen=True):
    """A summary node over the raw span ``[start, stop)`` it covers, drawn one by one.

    Attributes:
        anchored: its span root is the root the log gives for that span now.
        violations: why a marker emitted now would be refused (empty: it would certify);
            None when its span is longer than :data:`READ_SPAN` and was not read.
        rolled_up_by: the digest that rolls it up, or None when it is in the cover now.
        lost: its loss manifest (:func:`compactstore.rules.lost`); None when not read.
    """

    pos: int
    tier: int
    start: int
    stop: int
    loss: str
    summary: str
    children: list[int]
    negative_facts: list[ev.Fact]
    unresolved: list[ev.Item]
    kept: list[ev.Excerpt]
    spills: list[ev.SpillRef]
    contract: str | None
    anchored: bool
    violations: list[str] | None
    #: the items opened before its span and closed inside it
    resolved: list[ev.Item] = []
    lost: list[ev.Lost] | None = []
    rolled_up_by: int | None = None
    totals: Totals = Totals()


class NodeRange(msgspec.Struct, frozen=True):
    """The derived events before the nodes drawn one by one, markers apart: summary nodes and their spills, counted.

    Attributes:
        count: how many, from the positions of derived events (nodes, spills and attempts alike).
        first, last: the positions of the first and the last of them.
        rolled_up: every node among them is rolled up: the spans of the nodes of the cover
            drawn one by one hold every position before the first of those.
    """

    count: int
    first: int
    last: int
    rolled_up: bool


class Pin(msgspec.Struct, frozen=True):
    """A marker drawn one by one, and what resuming from it gives now.

    Attributes:
        state: what a resume from it gives at its checkpoint: ``certified``,
            ``fallback``, ``broken`` when its checkpoint does not verify; None when it
            was not resumed, as a newer marker gives the context now.
        reasons: why (each failed condition, for a fallback; the error, when broken).
        gives: the context a resumed agent loads now comes from it.
        stale: why it does not give the context now although it resumes certified at its
            checkpoint: what an obligation opened since needs of its cover that the cover
            dropped.
    """

    pos: int
    node: int | None
    size: int
    root: str
    conditions: list[str]
    state: MarkerState | None
    reasons: list[str]
    digest: str | None
    #: the nodes it resolves to, its node first, when more than one
    cover: list[int] = []
    gives: bool = False
    stale: list[str] = []

    @property
    def claimed(self) -> bool:
        """Return whether it was certified at emission: it points at a node and records every condition."""
        return self.node is not None and tuple(self.conditions) == CONDITIONS


class MarkerRange(msgspec.Struct, frozen=True):
    """The markers older than those drawn one by one, counted: positions ``first`` to ``last``; the picture resumes none."""

    count: int
    first: int
    last: int


class Span(msgspec.Struct, frozen=True):
    """A span ``[start, stop)`` of the resumed context and where it comes from: a node (its position), or raw (-1)."""

    start: int
    stop: int
    node: int


class Loaded(msgspec.Struct, frozen=True):
    """What a resumed agent loads now (:meth:`Session.context`) against the raw log, both rendered as model input.

    Attributes:
        marker: the marker it resolves from (-1: none certifies, the raw log).
        spans: the cover: each span of the log and the node it comes from, or raw (the
            newest :data:`SPANS`; ``earlier`` counts the others).
        items, characters: of the context, as OpenAI Responses input encoded as JSON.
        raw_items, raw_characters: of the raw log (derived events left out), the same
            way; the characters are None when not counted (more than :data:`WHOLE` events).
        reasons: why, as the resolution gives them (the first :data:`REASONS`).
    """

    marker: int
    mode: str
    spans: list[Span]
    items: int
    characters: int
    raw_items: int
    raw_characters: int | None
    reasons: list[str] = []
    earlier: int = 0


class Picture(msgspec.Struct, frozen=True):
    """A session drawn as data: positions, nodes over spans, markers, findings, and the context loaded now.

    Attributes:
        tail: the first position drawn one by one; ``cells`` hold ``[tail, size)`` and
            ``bins`` count ``[0, tail)``.
        findings: the audit's; None when not run (more than :data:`WHOLE` events).
        open_items: the newest :data:`OPEN` items still open; ``open_total`` counts them all.
        negatives: the negative facts of the whole log.
        context_error: why the context now could not be read, when it could not.
    """

    session: str
    size: int
    root: str
    cells: list[Cell]
    nodes: list[Bar]
    markers: list[Pin]
    findings: list[Finding] | None
    open_items: list[ev.Item]
    loaded: Loaded | None = None
    tail: int = 0
    bins: list[Bin] = []
    node_ranges: list[NodeRange] = []
    marker_ranges: list[MarkerRange] = []
    open_total: int = 0
    negatives: int = 0
    context_error: str | None = None

    @property
    def marker_total(self) -> int:
        """Return how many markers the session holds."""
        return len(self.markers) + sum(r.count for r in self.marker_ranges)


def capped(reasons: Sequence[str], most: int = REASONS) -> list[str]:
    """Return the first ``most`` of ``reasons``, and a last line counting the others."""
    if len(reasons) <= most:
        return list(reasons)
    return [*reasons[:most], f"and {len(reasons) - most} more"]


def _characters(messages: list[render.Message]) -> int:
    return len(json.dumps(messages, ensure_ascii=False))


def _spans(r: Resolution) -> list[Span]:
    spans, at = [], 0
    for item in r.context:
        if isinstance(item, SummaryItem):
            if at < item.start:
                spans.append(Span(at, item.start, -1))
            spans.append(Span(item.start, item.stop, item.pos))
            at = item.stop
    if at < r.size:
        spans.append(Span(at, r.size, -1))
    return spans


def loaded(session: Session, r: Resolution, raw_items: int) -> Loaded:
    """Return what the context ``r`` (from :meth:`Session.context`) loads, in items and characters, against the raw log.

    ``raw_items`` counts the raw log's items. Its characters are counted by reading every
    event only for a session of at most :data:`WHOLE` events (or read off ``r`` when it
    falls back to the raw log, which is then the context).
    """
    spans = _spans(r)
    characters = _characters(r.as_messages("openai-responses"))
    raw_characters: int | None = None
    if r.marker < 0:
        raw_characters = characters
    elif r.size <= WHOLE:
        raw = [RawItem(x.pos, x.event) for x in session.scan(0, r.size, verify=False) if x.kind not in ev.DERIVED_KINDS]
        raw_characters = _characters(render.messages(raw, "openai-responses"))
    return Loaded(r.marker, r.mode, spans[-SPANS:], len(r.context), characters, raw_items, raw_characters,
                  capped(r.reasons), max(len(spans) - SPANS, 0))


def _item(pos: int, name: str) -> ev.Item:
    kind, ident = split_item(name)
    return ev.Item(pos, kind, ident)  # type: ignore[arg-type]


def _bins(stop: int) -> list[tuple[int, int]]:
    """Return the ranges ``[0, stop)`` is counted in: at most :data:`BINS`, each at least one position."""
    n = min(BINS, stop)
    return [(i * stop // n, (i + 1) * stop // n) for i in range(n)]


class _Counts:
    """Counts per bin, filled position by position."""

    def __init__(self, ranges: list[tuple[int, int]]) -> None:
        self.ranges = ranges
        self.starts = [a for a, _ in ranges]
        self.counts: list[Counter[str]] = [Counter() for _ in ranges]

    def add(self, what: str, positions: Iterable[int]) -> None:
        stop = self.ranges[-1][1] if self.ranges else 0
        for p in positions:
            if 0 <= p < stop:
                self.counts[bisect_right(self.starts, p) - 1][what] += 1

    def bins(self) -> list[Bin]:
        return [Bin(a, b, **c) for (a, b), c in zip(self.ranges, self.counts)]


def _dropped(negative: dict[int, IndexRow], cover: Sequence[ev.Summary]) -> list[int]:
    """Return the negative facts in the span of a node of ``cover`` that the node does not retain.

    Only a position negative before the node's stop counts: what became negative later
    (a value re-bound after the span) was not one when the node was written.
    """
    positions = sorted(negative)
    out = []
    for n in cover:
        kept = {x.pos for x in n.negative_facts}
        inside = positions[bisect_left(positions, n.start): bisect_left(positions, n.stop)]
        out += [q for q in inside if negative[q].num < n.stop and q not in kept]
    return out


_Positioned = TypeVar("_Positioned", ev.Fact, ev.Item, ev.Excerpt)


def _newest(entries: Sequence[_Positioned]) -> list[_Positioned]:
    """Return the :data:`LISTED` entries of a node's list at the latest positions, by position."""
    return sorted(entries, key=lambda x: x.pos)[-LISTED:]


def _bar(f: Facts | str, session: Session, pos: int, n: ev.Summary, rolled_up_by: int | None) -> Bar:
    """Return the node ``n`` at ``pos`` drawn one by one: its verdict and loss manifest read when its span is short.

    ``f``: the session's facts now, or why they do not read.
    """
    try:
        anchored = n.stop <= pos and session.span_root(n.start, n.stop).hex() == n.span_root
    except CompactStoreError:
        anchored = False
    violations: list[str] | None = None
    manifest: list[ev.Lost] | None = None
    if isinstance(f, str):
        violations = [f]
    elif n.stop - n.start <= READ_SPAN:
        try:
            violations = capped([str(v) for v in check_marker(f, pos)[0]])
            f.read(range(n.start, min(n.stop, pos)))  # the manifest reads every event of the span: one query
            manifest = lost(f, n, pos)
        except IntegrityError as exc:
            violations = [f"the log does not read: {exc}"]
    summary = n.summary if len(n.summary) <= SUMMARY else n.summary[: SUMMARY - 1] + "…"
    totals = Totals(len(n.negative_facts), len(n.unresolved), len(n.resolved), len(n.kept), len(n.spills))
    return Bar(
        pos, n.tier, n.start, n.stop, n.loss.value, summary, list(n.children), _newest(n.negative_facts),
        _newest(n.unresolved), _newest(n.kept), sorted(n.spills, key=lambda r: r.source)[-LISTED:], n.contract,
        anchored, violations, _newest(n.resolved), manifest, rolled_up_by, totals,
    )


def _covered(nodes: Sequence[tuple[int, ev.Summary]]) -> int:
    """Return how far from position 0 the spans of ``nodes`` that no other of them rolls up reach without a gap."""
    rolled = {c for _, n in nodes if n.tier >= 2 for c in n.children}
    reach = 0
    for start, stop in sorted((n.start, n.stop) for p, n in nodes if p not in rolled):
        if start > reach:
            break
        reach = max(reach, stop)
    return reach


def _newest_nodes(session: Session, candidates: Sequence[int]) -> tuple[list[tuple[int, ev.Summary]], int]:
    """Return the newest summary nodes among the derived positions ``candidates``, by position, and how many were read.

    Read newest first: at least :data:`NODES` nodes, and on until the spans of those no
    later one rolls up reach, from 0, the position of the last read. Every node before it
    then lies in those spans, and admission keeps the spans of unrolled nodes apart: it
    is rolled up. Stops after ``4 * NODES`` nodes or ``16 * NODES`` reads whatever the
    reach (a log with a raw stretch before its first node never reaches).
    """
    got: list[tuple[int, ev.Summary]] = []
    read = 0
    for pos in reversed(candidates):
        event = session.read(pos, verify=False).event
        read += 1
        if isinstance(event, ev.Summary):
            got.append((pos, event))
            if len(got) >= 4 * NODES or len(got) >= NODES and _covered(got) >= pos:
                break
        if read >= 16 * NODES:
            break
    return sorted(got, key=lambda pn: pn[0]), read


def _stale(session: Session, f: Facts, cover: Sequence[int]) -> list[str]:
    """Return what an obligation open now needs of the nodes at ``cover`` that they neither keep nor spill."""
    try:
        nodes = [e for c in cover if isinstance(e := session.read(c, verify=False).event, ev.Summary)]
        return capped([f"since its checkpoint, {v}" for v in cover_gate(f, nodes)])
    except CompactStoreError as exc:
        return [f"the log does not read: {exc}"]


def _pin(session: Session, f: Facts | str, pos: int, now: Resolution | None) -> Pin:
    """Return the marker at ``pos``: resumed unless a newer marker gives the context ``now``, and why it does not give it."""
    try:
        m = Marker.from_record(session.read(pos, verify=False))
    except CompactStoreError as exc:
        return Pin(pos, None, 0, "", [], "broken", [str(exc)], None)
    cover = list(m.cover)
    if now is not None and now.marker == pos:
        return Pin(pos, m.node, m.size, m.root.hex(), m.conditions, "certified", capped(now.reasons), None, cover,
                   gives=True)
    if now is not None and now.marker > pos:
        return Pin(pos, m.node, m.size, m.root.hex(), m.conditions, None, [], None, cover)
    try:
        res = session.resume(m)
    except IntegrityError as exc:
        return Pin(pos, m.node, m.size, m.root.hex(), m.conditions, "broken", [str(exc)], None, cover)
    stale: list[str] = []
    if res.mode == "certified" and now is not None:
        # Certified at its checkpoint, passed over now: Session.context() holds its cover to
        # what every obligation opened since needs, and so does the picture, to say what.
        stale = [f] if isinstance(f, str) else _stale(session, f, cover or ([m.node] if m.node is not None else []))
    return Pin(pos, m.node, m.size, m.root.hex(), m.conditions, res.mode, capped(res.reasons), res.digest.hex(),
               cover, stale=stale)


def picture(session: Session) -> Picture:
    """Return the picture of ``session`` at its current size, bounded however long the session.

    Drawn even when the log does not verify (``show --no-verify``): every body read is
    held to its own leaf, each marker's resume says whether its checkpoint holds, and
    what the index says of the positions before the tail is drawn as it is. Every read
    sees one state of the store.
    """
    backend = session.store.backend
    with backend.snapshot(), session.reading():
        head = session.head(verify=False)
        sid = backend.session_id(session.name)
        if sid is None or head.size == 0:
            return Picture(session.name, head.size, head.root.hex(), [], [], [], [], [])
        return _picture(session, head, sid)


def _picture(session: Session, head: ev.TreeHead, sid: int) -> Picture:
    size, backend = head.size, session.store.backend
    tail = max(0, size - TAIL)
    index = Index(backend, sid)
    erased = backend.redactions(sid)
    records = list(session.scan(tail, size, verify=False))
    # Every negative row of the log: those of positions in [0, size), whatever made them negative.
    negative = {r.pos: r for r in backend.index_rows(sid, ("negative",), 0, size) if r.pos not in erased}
    opened = index.open_at(size)
    marker_positions = sorted(backend.latest_markers(sid, size, size))
    try:
        now: Resolution | None = session.context()
        context_error = None
    except IntegrityError as exc:
        now, context_error = None, str(exc)
    try:
        f: Facts | str = session.view.facts(size)
    except IntegrityError as exc:  # a session with redactions reads its facts off every event
        f = f"the log does not read: {exc}"
    markers_at = set(marker_positions)
    derived = [p for p in backend.derived_positions(sid, 0, size) if p not in markers_at]
    nodes, read = _newest_nodes(session, derived)
    by_pos = dict(nodes)
    rolled = {c: p for p, n in nodes if n.tier >= 2 for c in n.children}
    cover = [p for p, _ in nodes if p not in rolled]
    bars = [_bar(f, session, p, n, rolled.get(p)) for p, n in nodes]
    drawn_markers = marker_positions[-MARKERS:]
    pins = [_pin(session, f, p, now) for p in drawn_markers]

    dropped = _dropped(negative, [by_pos[p] for p in cover])
    holders = [(p, n, {x.pos for x in n.negative_facts}) for p, n in nodes]
    cells = []
    for r in records:
        e = r.event
        row = negative.get(r.pos)
        spans = [(p, n, kept) for p, n, kept in holders if n.start <= r.pos < n.stop]
        cells.append(Cell(
            r.pos, r.kind, {"redacted": "redacted", "dropped": f"body dropped by the retention at pos {getattr(e, 'by', '?')}"}.get(
                r.kind) or text_of(e),
            role=e.role if isinstance(e, ev.Turn) else None,
            negative=row.key if row is not None else None,
            open=r.pos in opened,
            binding=("regenerable" if e.regenerable else "non-regenerable") if isinstance(e, ev.Binding) else None,
            derived=r.kind in ev.DERIVED_KINDS or r.kind == "redacted",
            kept_by=[p for p, _, kept in spans if row is not None and r.pos in kept],
            dropped_by=[p for p, n, kept in spans if row is not None and row.num < n.stop and r.pos not in kept],
            listed_by=[p for p, n, _ in spans if any(i.pos == r.pos for i in n.unresolved)],
        ))
    counts = _Counts(_bins(tail))
    counts.add("negative", negative)
    counts.add("dropped", dropped)
    counts.add("open", opened)
    counts.add("bindings", (r.pos for r in index.bindings_in(0, tail) if not r.num))
    counts.add("derived", derived)
    counts.add("markers", marker_positions)
    counts.add("redacted", erased)
    older = derived[: len(derived) - read]
    node_ranges = [NodeRange(len(older), older[0], older[-1], _covered(nodes) >= derived[len(older)])] if older else []
    unresumed = marker_positions[: max(len(marker_positions) - MARKERS, 0)]
    marker_ranges = [MarkerRange(len(unresumed), unresumed[0], unresumed[-1])] if unresumed else []
    open_items = [_item(p, name) for p, name in sorted(opened.items())]
    raw_items = size - len(derived) - len(marker_positions) - len(set(erased.values()))
    findings: list[Finding] | None = None
    if size <= WHOLE:
        try:
            findings = session.audit()
        except IntegrityError:
            findings = []  # an audit of a log that does not verify would rest on what it cannot vouch for
    return Picture(
        session.name, size, head.root.hex(), cells, bars, pins, findings, open_items[-OPEN:],
        loaded(session, now, raw_items) if now is not None else None, tail, counts.bins(), node_ranges, marker_ranges,
        len(open_items), len(negative), context_error,
    )


def lanes(p: Picture) -> dict[int, tuple[list[Bar], int]]:
    """Return, per tier, the nodes its lane draws and where the stretch of counted nodes before them ends (0: none).

    A digest rolled up by a later one lies under it and is not drawn. An L1 node rolled
    up over counted positions is drawn with the counted ones, as one stretch up to the
    first L1 node drawn; so are the derived events before the nodes drawn one by one,
    when every node among them is rolled up.
    """
    out: dict[int, tuple[list[Bar], int]] = {}
    for tier in sorted({b.tier for b in p.nodes} | ({1} if p.node_ranges else set())):
        these = [b for b in p.nodes if b.tier == tier]
        if tier > 1:
            out[tier] = ([b for b in these if b.rolled_up_by is None], 0)
            continue
        folded = [b for b in these if b.rolled_up_by is not None and b.start < p.tail]
        drawn = [b for b in these if b not in folded]
        counted = folded or any(r.rolled_up for r in p.node_ranges)
        stop = min((b.start for b in drawn), default=max((b.stop for b in folded), default=0)) if counted else 0
        out[tier] = (drawn, stop)
    return out


def passed_over(p: Picture) -> list[Pin]:
    """Return the markers drawn one by one that were certified at emission and are newer than the one the context comes from.

    Newest first; each says why it does not give the context now (its resume's reasons,
    or what an obligation opened since needs of its cover).
    """
    source = p.loaded.marker if p.loaded is not None else -1
    return [m for m in sorted(p.markers, key=lambda m: -m.pos) if m.claimed and not m.gives and m.pos > source]


def why_not(m: Pin) -> str:
    """Return the first reason a marker does not give the context now."""
    if m.stale:
        return m.stale[0]
    return m.reasons[0] if m.reasons else "it does not resume certified"


#: The glyph of each kind of negative fact, in the terminal and on the page.
NEGATIVE = {"failed": "✗", "rejected": "⊘", "superseded": "↺"}


def lost_name(x: ev.Lost) -> str:
    """Return how a lost literal is drawn: ``pos:path`` and its binding key or event kind (``pos redacted`` alone)."""
    if x.kind == "redacted":
        return f"{x.pos} redacted"
    return f"{x.pos}:{x.path} ({x.key if x.key is not None else x.kind})"


def rank(cell: Cell) -> int:
    """Return how much ``cell`` matters when several positions share one column (higher wins)."""
    if cell.negative:
        return 6
    if cell.open:
        return 5
    if cell.binding == "non-regenerable":
        return 4
    if cell.kind in ("obligation", "binding"):
        return 3
    return 1 if cell.derived else 2


def merged(bins: Sequence[Bin]) -> Bin:
    """Return ``bins`` (consecutive) counted as one."""
    return Bin(bins[0].start, bins[-1].stop, *(sum(getattr(b, k) for b in bins) for k in
                                                ("negative", "dropped", "open", "bindings", "derived", "markers",
                                                 "redacted")))


def columns(p: Picture, width: int) -> list[tuple[int, int]]:
    """Return the position range ``[a, b)`` each column of a strip at most ``width`` columns wide stands for.

    Positions drawn one by one take up to three fifths of the width, a column each
    where they fit; the counted ones before them share the rest, whole bins a column.
    """
    if p.size <= 0 or width <= 0:
        return []
    if not p.bins:
        return _even(0, p.size, width)
    own = min(p.size - p.tail, max(width * 3 // 5, 1))
    rest = max(width - own, 1)
    n = len(p.bins)
    groups = [(j * n // rest, (j + 1) * n // rest) for j in range(min(rest, n))]
    old = [(p.bins[a].start, p.bins[b - 1].stop) for a, b in groups if b > a]
    return old + _even(p.tail, p.size, own)


def _even(start: int, stop: int, width: int) -> list[tuple[int, int]]:
    size = stop - start
    if size <= width:
        return [(start + i, start + i + 1) for i in range(size)]
    return [(start + c * size // width, start + (c + 1) * size // width) for c in range(width)
            if (c + 1) * size // width > c * size // width]


def column(p: Picture, a: int, b: int) -> Cell | Bin:
    """Return what the column over positions ``[a, b)`` (one of :func:`columns`) shows: its weightiest cell, or its bins."""
    if a >= p.tail:
        return max(p.cells[a - p.tail: b - p.tail], key=rank)
    starts = [x.start for x in p.bins]
    return merged(p.bins[bisect_right(starts, a) - 1: bisect_right(starts, b - 1)])
