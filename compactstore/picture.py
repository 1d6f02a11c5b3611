"""The picture of a session: what ``compactstore show`` draws, as plain data.

One pass over the session gives every position's kind, text and structural role
(negative fact, item still open, binding); the summary nodes with the raw spans they
cover, whether their span roots still match the log and whether a marker emitted now
would certify them; the markers with what a resume from each gives now; and the
audit's findings. Renderers only draw it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Literal

import msgspec

from . import events as ev
from . import merkle, render
from .compaction import Finding, Node
from .errors import IntegrityError
from .facts import FullFacts
from .markers import Marker
from .resolver import RawItem, SummaryItem
from .rules import check_marker, lost
from .structure import build, text_of

if TYPE_CHECKING:
    from .store import Session

MarkerState = Literal["certified", "fallback", "broken"]


class Cell(msgspec.Struct, frozen=True):
    """One position of the log.

    Attributes:
        kind: the event's kind (``redacted`` for an erased body).
        role: a turn's role (user, assistant, ...), else None.
        negative: ``failed``, ``rejected`` or ``superseded`` for a negative fact.
        open: a tool call, handle or obligation opened here and still open at the end.
        binding: ``regenerable`` or ``non-regenerable`` for a binding.
        derived: a node, spill, marker, attempt or redaction rather than a raw event.
    """

    pos: int
    kind: str
    text: str
    role: str | None = None
    negative: str | None = None
    open: bool = False
    binding: str | None = None
    derived: bool = False


class Bar(msgspec.Struct, frozen=True):
    """A summary node over the raw span ``[start, stop)`` it covers.

    Attributes:
        anchored: its span root is the root the log gives for that span now.
        violations: why a marker emitted now would be refused (empty: it would certify).
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
    violations: list[str]
    #: the items opened before its span and closed inside it
    resolved: list[ev.Item] = []
    #: its loss manifest: each literal of its span it neither keeps nor states (:func:`compactstore.rules.lost`)
    lost: list[ev.Lost] = []


class Pin(msgspec.Struct, frozen=True):
    """A marker and what resuming from it gives now.

    Attributes:
        state: ``certified``, ``fallback``, or ``broken`` when its checkpoint does not verify.
        reasons: why (each failed condition, for a fallback; the error, when broken).
    """

    pos: int
    node: int | None
    size: int
    root: str
    conditions: list[str]
    state: MarkerState
    reasons: list[str]
    digest: str | None
    #: the nodes it resolves to, its node first, when more than one
    cover: list[int] = []


class Span(msgspec.Struct, frozen=True):
    """A span ``[start, stop)`` of the resumed context and where it comes from: a node (its position), or raw (-1)."""

    start: int
    stop: int
    node: int


class Loaded(msgspec.Struct, frozen=True):
    """What a resumed agent loads now (:meth:`Session.context`) against the raw log, both rendered as model input.

    Attributes:
        marker: the marker it resolves from (-1: none certifies, the raw log).
        spans: the cover: each span of the log and the node it comes from, or raw.
        items, characters: of the context, as OpenAI Responses input encoded as JSON.
        raw_items, raw_characters: of the raw log (derived events left out), the same way.
    """

    marker: int
    mode: str
    spans: list[Span]
    items: int
    characters: int
    raw_items: int
    raw_characters: int


class Picture(msgspec.Struct, frozen=True):
    """A session drawn as data: positions, nodes over spans, markers, findings, and the context loaded now."""

    session: str
    size: int
    root: str
    cells: list[Cell]
    nodes: list[Bar]
    markers: list[Pin]
    findings: list[Finding]
    open_items: list[ev.Item]
    loaded: Loaded | None = None


def _characters(messages: list[render.Message]) -> int:
    return len(json.dumps(messages, ensure_ascii=False))


def loaded(session: Session, records: list[ev.Record]) -> Loaded:
    """Return what :meth:`Session.context` loads now against the raw ``records``, in items and characters."""
    r = session.context()
    spans, at = [], 0
    for item in r.context:
        if isinstance(item, SummaryItem):
            if at < item.start:
                spans.append(Span(at, item.start, -1))
            spans.append(Span(item.start, item.stop, item.pos))
            at = item.stop
    if at < r.size:
        spans.append(Span(at, r.size, -1))
    raw = [RawItem(x.pos, x.event) for x in records if x.kind not in ev.DERIVED_KINDS]
    return Loaded(r.marker, r.mode, spans, len(r.context), _characters(r.as_messages("openai-responses")),
                  len(raw), _characters(render.messages(raw, "openai-responses")))


def picture(session: Session) -> Picture:
    """Return the picture of ``session`` at its current size.

    Reads the whole session once, and resumes from each marker (see
    :meth:`Session.resume`): a checkpoint that does not verify shows as ``broken``.
    """
    # Drawn even when the log does not verify (``show --no-verify``): each body is still
    # held to its own leaf, and each marker's resume says whether its checkpoint holds.
    head = session.head(verify=False)
    records = list(session.scan(0, head.size, verify=False))
    events = [r.event for r in records]
    leaves = [r.leaf for r in records]
    structure = build(enumerate(events))
    still_open = {i.pos for i in structure.unresolved_at(0, head.size)}
    cells = []
    for r in records:
        e = r.event
        fact = structure.negatives.get(r.pos)
        cells.append(Cell(
            r.pos, r.kind, text_of(e) if r.kind != "redacted" else "redacted",
            role=e.role if isinstance(e, ev.Turn) else None,
            negative=fact.status if fact else None,
            open=r.pos in still_open,
            binding=("regenerable" if e.regenerable else "non-regenerable") if isinstance(e, ev.Binding) else None,
            derived=r.kind in ev.DERIVED_KINDS or r.kind == "redacted",
        ))
    bars = []
    for r in records:
        if r.kind != "node":
            continue
        n = Node.from_record(r)
        anchored = merkle.span_root_of_leaves(leaves, n.start, n.stop) == n.span_root if n.stop <= n.pos else False
        facts = FullFacts(events, lambda a, b: merkle.span_root_of_leaves(leaves, a, b), structure)
        violations, _ = check_marker(facts, n.pos)
        bars.append(Bar(
            n.pos, n.tier, n.start, n.stop, n.loss.value, n.summary, n.children, n.negative_facts, n.unresolved,
            n.kept, n.spills, n.contract, anchored, [str(v) for v in violations], n.resolved,
            lost(facts, r.event, n.pos) if isinstance(r.event, ev.Summary) else [],
        ))
    pins = []
    for r in records:
        if r.kind != "marker":
            continue
        m = Marker.from_record(r)
        try:
            res = session.resume(m)
        except IntegrityError as exc:
            pins.append(Pin(m.pos, m.node, m.size, m.root.hex(), m.conditions, "broken", [str(exc)], None, m.cover))
            continue
        pins.append(Pin(m.pos, m.node, m.size, m.root.hex(), m.conditions, res.mode, res.reasons, res.digest.hex(),
                        m.cover))
    open_items = structure.unresolved_at(0, head.size)
    try:
        now = loaded(session, records) if head.size else None
    except IntegrityError:
        now = None  # the markers above say why: a log that does not verify loads nothing
    try:
        findings = session.audit()
    except IntegrityError:
        findings = []  # an audit of a log that does not verify would rest on what it cannot vouch for
    return Picture(session.name, head.size, head.root.hex(), cells, bars, pins, findings, open_items, now)


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


def columns(size: int, width: int) -> list[tuple[int, int]]:
    """Return the position range ``[a, b)`` each column of a strip ``width`` wide stands for."""
    if size <= 0:
        return []
    if size <= width:
        return [(p, p + 1) for p in range(size)]
    return [(c * size // width, (c + 1) * size // width) for c in range(width) if (c + 1) * size // width > c * size // width]
