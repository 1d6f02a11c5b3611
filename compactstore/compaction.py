"""Summary nodes: build compactions and roll-ups, and audit what compaction lost.

A compaction replaces raw positions ``[start, stop)`` of a session by an L1 summary
node; a roll-up replaces contiguous L1 nodes by an L2 node, or grows the session
digest: the current digest and the L1 nodes after it become a new L2 over their union
that supersedes it. Nodes are events, so the
tree covers them, and each carries the span root and content digest of the raw events
it replaced.

The functions here build the events to append from what they read through a
:class:`compactstore.view.SessionView`; they never write. The store appends them with
a compare-and-append at the size they were built at, and applies the rules
(:mod:`compactstore.rules`) to each again as it commits, whichever way a node arrives.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import Literal

import msgspec

from . import events as ev
from . import rules
from .errors import CompactionInvariantError, InvalidArgument, shown
from .events import Excerpt, Fact, Item, LossClass, Record, SpillRef, as_list
from .facts import Facts
from .structure import build
from .summarize import Summarizer, extractive, raw
from .view import SessionView, logged_position

OnRisk = Literal["refuse", "preserve", "spill"]


class Auto(enum.Enum):
    """The type of :data:`AUTO`."""

    AUTO = "AUTO"

    def __repr__(self) -> str:
        return "AUTO"


AUTO = Auto.AUTO
"""Let the store fill negative facts and unresolved items from the log's structure."""


class Node(msgspec.Struct, frozen=True):
    """A summary node as stored at position ``pos`` of its session.

    Attributes:
        tier: 1 over raw events, 2 over contiguous tier-1 nodes.
        start, stop: the raw positions ``[start, stop)`` it covers.
        span_root: the tree's root of that span when the node was written.
        loss: its loss class.
        children: positions of the tier-1 nodes an L2 node rolls up.
        negative_facts, unresolved, kept, spills: what it retains.
        resolved: the items opened before its span and closed inside it.
        content_digest: the content digest of the span's bodies when the node was
            written, or None (a span with a redacted body).
        lost: the loss manifest (:func:`compactstore.rules.lost`): each literal of its
            span the node neither keeps nor states verbatim in its summary text, by
            position, field path, kind and binding key. Read from the log by the
            session that returns the node (``Session.node``, ``nodes``, ``compact``,
            ``roll_up``); None in a node made from a bare record, which cannot know it.
    """

    session: str
    pos: int
    tier: int
    start: int
    stop: int
    span_root: bytes
    summary: str
    loss: LossClass
    children: list[int]
    negative_facts: list[Fact]
    unresolved: list[Item]
    kept: list[Excerpt]
    spills: list[SpillRef]
    contract: str | None
    leaf: bytes
    content_digest: bytes | None = None
    resolved: list[Item] = []
    lost: list[ev.Lost] | None = None

    @classmethod
    def from_record(cls, record: Record) -> Node:
        """Return the node stored in ``record``.

        Raises:
            InvalidArgument: the record is not a summary node.
        """
        s = record.event
        if not isinstance(s, ev.Summary):
            raise InvalidArgument("node", f"pos {record.pos} is a {record.kind!r} event, not a summary node")
        digest = None
        if s.content_digest is not None:
            try:
                digest = bytes.fromhex(s.content_digest)
            except ValueError:
                digest = None
        return cls(
            record.session, record.pos, s.tier, s.start, s.stop, bytes.fromhex(s.span_root), s.summary, s.loss,
            list(s.children), list(s.negative_facts), list(s.unresolved), list(s.kept), list(s.spills),
            s.contract, record.leaf, digest, list(s.resolved),
        )


class Finding(msgspec.Struct, frozen=True):
    """A binding destroyed by compaction and needed afterwards: the loss shows only at the step that needs it.

    Attributes:
        node: position of the lossy node whose span swallowed the binding.
        key, binding_pos: the binding and where it was bound.
        needed_at: the first step after the node that needed it.
        steps_later: how many positions after the node that step came.
        via: what needed it (an obligation, or an event's ``uses``).
    """

    node: int
    key: str
    binding_pos: int
    needed_at: int
    steps_later: int
    via: str


# --- arguments ---------------------------------------------------------------------


def loss_class(loss: object) -> LossClass:
    """Return ``loss`` as a loss class, or raise InvalidArgument naming ``loss``."""
    try:
        # Looked up by a str only: the enum's own refusal formats the value, which may not format.
        return loss if isinstance(loss, LossClass) else LossClass(loss if type(loss) is str else None)
    except ValueError:
        raise InvalidArgument("loss", f"want one of {[c.value for c in LossClass]}, got {shown(loss)}") from None


def _facts(given: Iterable[Fact | int] | Auto, structural: list[Fact], f: Facts) -> list[Fact]:
    if given is AUTO:
        return structural
    given = list(given)
    negative = f.negatives_at(given)
    out = []
    for x in given:
        found = negative(x) if isinstance(x, int) and not isinstance(x, bool) else None
        if isinstance(x, Fact):
            out.append(x)
        elif found is not None:
            out.append(found)
        else:
            raise InvalidArgument("negative_facts", f"{shown(x)} is neither a Fact nor the position of a negative fact")
    return sorted(set(out), key=lambda x: x.pos)


def _items(given: Iterable[Item | str] | Auto, structural: list[Item], field: str = "unresolved") -> list[Item]:
    if given is AUTO:
        return structural
    by_id = {i.id: i for i in structural}
    out = []
    what = "an open item" if field == "unresolved" else "an item closed in the span"
    for i in given:
        if isinstance(i, Item):
            out.append(i)
        elif isinstance(i, str) and i in by_id:
            out.append(by_id[i])
        else:
            raise InvalidArgument(field, f"{shown(i)} is neither an Item nor the id of {what}")
    return sorted(set(out), key=lambda x: (x.pos, x.kind, x.id))


def _optional_list(field: str, value: object) -> list[object] | Auto:
    return AUTO if value is AUTO else as_list(field, value)


def _node_arguments(
    negative_facts: object, unresolved: object, resolved: object, summary: object, summarizer: object
) -> tuple[list[object] | Auto, list[object] | Auto, list[object] | Auto]:
    """Check the arguments a compaction and a roll-up share; return the three lists (or AUTO)."""
    lists = (_optional_list("negative_facts", negative_facts), _optional_list("unresolved", unresolved),
             _optional_list("resolved", resolved))
    if summary is not None and not isinstance(summary, str):
        raise InvalidArgument("summary", f"must be str, got {type(summary).__name__}")
    if summarizer is not None:
        ev.as_callable("summarizer", summarizer)
    return lists


def _kept(view: SessionView, keep: Iterable[object], f: Facts, stop: int) -> list[Excerpt]:
    out = []
    for k in keep:
        if isinstance(k, str):
            found = f.latest_binding(k, stop)
            if found is None:
                raise InvalidArgument("keep", f"no binding {shown(k)} before pos {stop}")
            out.append(Excerpt(found[0], "value", f.binding(found[0]).value))
        elif isinstance(k, tuple) and len(k) == 2 and isinstance(k[1], str):
            pos, path = ev.as_position("keep", k[0]), k[1]
            if not pos < f.size:
                raise InvalidArgument("keep", f"pos {pos} is not a position of the session")
            out.append(rules.excerpt_of(view.read(pos).event, pos, path))
        else:
            raise InvalidArgument("keep", f"want a binding key or (pos, path), got {shown(k)}")
    return out


def _dedupe(kept: Iterable[Excerpt]) -> list[Excerpt]:
    # Excerpt values may be lists or dicts (unhashable): dedupe by where they come from.
    return sorted({(e.pos, e.path): e for e in kept}.values(), key=lambda e: (e.pos, e.path))


def _summary_text(text: object) -> str:
    if not isinstance(text, str):
        raise InvalidArgument("summarizer", f"must return str, got {type(text).__name__}")
    return text


# --- building ----------------------------------------------------------------------


def compaction(
    view: SessionView,
    size: int,
    start: int,
    stop: int,
    *,
    summary: str | None = None,
    summarizer: Summarizer | None = None,
    loss: object = LossClass.LOSSY_GIST,
    negative_facts: Iterable[Fact | int] | Auto = AUTO,
    unresolved: Iterable[Item | str] | Auto = AUTO,
    keep: Iterable[str | tuple[int, str]] | Auto = (),
    on_risk: OnRisk = "refuse",
    resolved: Iterable[Item | str] | Auto = AUTO,
) -> list[ev.Event]:
    """Return the events that compact ``[start, stop)`` at checkpoint ``size``: spills, then the L1 node.

    See :meth:`compactstore.store.Session.compact`. Spill handles name the positions
    the spills take when appended at ``size``. ``keep=AUTO`` keeps every literal of the
    span verbatim (:func:`compactstore.rules.span_literals`); ``loss=AUTO`` makes the node
    LOSSLESS when it keeps every literal, fact and item of its span, else LOSSY_LITERAL.

    Raises:
        InvalidArgument: a bad argument, or a span that is empty, out of range or overlaps an L1 node.
        CompactionInvariantError: the gate refused, or LOSSLESS was claimed and does not hold.
    """
    if on_risk not in ("refuse", "preserve", "spill"):
        raise InvalidArgument("on_risk", f'want "refuse", "preserve" or "spill", got {shown(on_risk)}')
    wanted = None if loss is AUTO else loss_class(loss)
    keep_all = keep is AUTO
    keep = [] if keep is AUTO else as_list("keep", keep)
    negative_facts, unresolved, resolved = _node_arguments(  # type: ignore[assignment]
        negative_facts, unresolved, resolved, summary, summarizer)
    if not 0 <= ev.as_int("start", start) < ev.as_int("stop", stop) <= size:
        raise InvalidArgument("span", f"[{shown(start)}, {shown(stop)}) is not a non-empty span of the session's {size} positions")
    reader = view.reader(size)
    f = view.facts(size, reader=reader)
    found = rules.overlap(f, 1, start, stop, size)
    if found is not None:
        raise found
    facts = _facts(negative_facts, f.negatives_in(start, stop), f)
    items = _items(unresolved, f.unresolved_at(start, stop))
    done = _items(resolved, f.resolved_in(start, stop), "resolved")
    kept = _kept(view, keep, f, stop)
    # The literals are read off the span's events: read it once, here, when they are needed.
    literal = keep_all or wanted in (None, LossClass.LOSSLESS)
    got = view.read_span(start, stop, records=summary is None or literal) if literal else None
    for r in got.records if got is not None and literal else ():
        reader.add(r)
    if keep_all:
        kept += rules.span_literals(f, start, stop)
    at_risk = rules.risks(f, start, stop, {e.pos for e in kept if e.path == "value"})
    spills: list[ev.Spill] = []
    refs: list[SpillRef] = []
    contract = None
    # Under AUTO a node that loses a needed live value cannot be LOSSLESS: the gate runs.
    if at_risk and wanted is not LossClass.LOSSLESS:
        if on_risk == "refuse":
            raise rules.gate_error(at_risk, start, stop)
        needed = sorted({(r.key, r.binding_pos) for r in at_risk})
        names = sorted({r.obligation for r in at_risk})
        if on_risk == "preserve":
            kept += [Excerpt(p, "value", f.binding(p).value) for _, p in needed]
            contract = f"kept verbatim for obligations {names}: {[k for k, _ in needed]}"
        else:
            for i, (k, p) in enumerate(needed):
                value = f.binding(p).value
                d = rules.value_digest(value)
                spills.append(ev.Spill(key=k, value=value, source=p, digest=d))
                refs.append(SpillRef(f"spill:{size + i}", k, p, d))
            contract = f"spilled for obligations {names}: {[k for k, _ in needed]}"
    node = ev.Summary(
        tier=1, start=start, stop=stop, span_root="", summary="", loss=wanted or LossClass.LOSSLESS,
        negative_facts=facts, unresolved=items, resolved=done, kept=_dedupe(kept), spills=refs, contract=contract,
    )
    if literal:
        problems = rules.lossless_problems(f, node)
        if problems and wanted is LossClass.LOSSLESS:
            raise rules.lossless_error(node, problems)
        if problems:
            node = msgspec.structs.replace(node, loss=LossClass.LOSSY_LITERAL)
    if got is None:
        # One read of the span: the summarizer's records, the content digest, each body against its leaf.
        got = view.read_span(start, stop, records=summary is None)
    text = summary if summary is not None else _summary_text((summarizer or extractive)(raw(got.records)))
    return [*spills, _sealed(node, text, got.span_root, got.digest)]


def roll_up(
    view: SessionView,
    size: int,
    nodes: Sequence[object],
    *,
    summary: str | None = None,
    summarizer: Summarizer | None = None,
    loss: object = None,
    negative_facts: Iterable[Fact | int] | Auto = AUTO,
    unresolved: Iterable[Item | str] | Auto = AUTO,
    resolved: Iterable[Item | str] | Auto = AUTO,
) -> list[ev.Event]:
    """Return the L2 node over contiguous ``nodes`` at checkpoint ``size``, carrying their retained facts.

    ``nodes`` are L1 nodes, or the current session digest followed by the L1 nodes
    after it. See :meth:`compactstore.store.Session.roll_up`.

    Raises:
        InvalidArgument: the nodes are not contiguous L1 nodes (after at most one digest),
            overlap an L2 node, or the digest was already rolled up.
        ForeignReference: a ``Node`` given is another session's, or not the event logged
            at its position (its leaf differs).
        CompactionInvariantError: ``loss`` claims more than the children give.
    """
    negative_facts, unresolved, resolved = _node_arguments(  # type: ignore[assignment]
        negative_facts, unresolved, resolved, summary, summarizer)
    # A Node gives its position only once its session and leaf are this session's.
    positions = [logged_position(view, "nodes", n) if isinstance(n, Node) else n for n in as_list("nodes", nodes)]
    if not positions or not all(isinstance(p, int) and not isinstance(p, bool) and 0 <= p < size for p in positions):
        raise InvalidArgument("nodes", "want one or more L1 nodes (or their positions) of the session")
    records = sorted((view.read(p) for p in positions), key=lambda r: getattr(r.event, "start", -1))
    children = [Node.from_record(r) for r in records]
    for i, c in enumerate(children):
        if c.tier != 1 and not (i == 0 and c.tier == 2 and len(children) > 1):
            raise InvalidArgument(
                "nodes", f"node at pos {c.pos} is L{c.tier}; an L2 rolls up L1 nodes, or the current digest "
                "followed by the L1 nodes after it")
    for a, b in zip(children, children[1:]):
        if a.stop != b.start:
            raise InvalidArgument("nodes", f"nodes at pos {a.pos} and {b.pos} are not contiguous: [{a.start}, {a.stop}) then [{b.start}, {b.stop})")
    start, stop = children[0].start, children[-1].stop
    floor = rules.weakest(c.loss for c in children)
    auto = loss is None or loss is AUTO
    wanted = floor if auto else loss_class(loss)
    if rules.LOSS_ORDER[wanted] < rules.LOSS_ORDER[floor]:
        raise CompactionInvariantError(f"an L2 node cannot be {wanted.value} over children that are {floor.value}")
    reader = view.reader(size)
    f = view.facts(size, reader=reader)
    digest = records[0].event if children[0].tier == 2 else None
    grows = (children[0].pos, digest) if isinstance(digest, ev.Summary) else None
    found = rules.overlap(f, 2, start, stop, size, grows)
    if found is not None:
        raise found
    kept = [e for c in children for e in c.kept]
    spills = [r for c in children for r in c.spills]
    literal = wanted is LossClass.LOSSLESS
    if not literal:
        # A lossy digest carries only the values still live at its stop: an earlier value
        # of a re-bound key keeps nothing the gate or a resumed agent can use, and carrying
        # every value ever kept would grow the digest with the session.
        live = _live(f, {e.pos for e in kept if e.path == "value"} | {r.source for r in spills}, stop)
        kept = [e for e in kept if e.path == "value" and e.pos in live]
        spills = [r for r in spills if r.source in live]
    carried = sorted({f.binding(p).key for p in (*(e.pos for e in kept if e.path == "value"), *(r.source for r in spills))
                      if isinstance(f.event(p), ev.Binding)})
    node = ev.Summary(
        tier=2, start=start, stop=stop, span_root="", summary="", loss=wanted,
        children=[c.pos for c in children],
        # The open items at its stop, as the log gives them (what its children listed, if they were complete).
        unresolved=_items(unresolved, f.unresolved_at(start, stop)),
        # Over the whole span, not the children's lists: an item a later child resolved may
        # have been opened in an earlier one, and is then neither open nor hidden.
        resolved=_items(resolved, f.resolved_in(start, stop), "resolved"),
        kept=_dedupe(kept), spills=sorted(set(spills), key=lambda r: r.handle),
        contract=f"carries the kept and spilled values still live at pos {stop}: {carried}" if carried else None,
    )
    # It retains its children's negative facts: it lists what an L1 child dropped, and the
    # newest of theirs, so that its own body shows a resumed agent the latest failures.
    required = rules.digest_facts(f, node)
    facts = required if negative_facts is AUTO else sorted({*_facts(negative_facts, [], f), *required}, key=lambda x: x.pos)
    node = msgspec.structs.replace(node, negative_facts=facts)
    text = summary if summary is not None else _summary_text((summarizer or extractive)(records))
    if not literal:
        # What an obligation open now needs of the span and no child kept (an obligation
        # opened after its binding was compacted away) is spilled here, from the raw log.
        refs: list[SpillRef] = []
        new: list[ev.Event] = []
        for i, (k, p) in enumerate(sorted({(r.key, r.binding_pos) for r in rules.risks(f, start, stop, rules.kept_positions(node))})):
            value = f.binding(p).value
            d = rules.value_digest(value)
            new.append(ev.Spill(key=k, value=value, source=p, digest=d))
            refs.append(SpillRef(f"spill:{size + i}", k, p, d))
        if refs:
            node = msgspec.structs.replace(node, spills=sorted({*node.spills, *refs}, key=lambda r: r.handle),
                                           contract=f"spilled again for the obligations open at pos {size}: "
                                                    f"{[r.key for r in refs]}" + (f"; {node.contract}" if node.contract else ""))
        return [*new, _sealed(node, text, view.span_root(start, stop), None)]
    got = view.read_span(start, stop, records=True)
    for r in got.records:
        reader.add(r)
    problems = rules.lossless_problems(f, node)
    if problems and not auto:
        raise rules.lossless_error(node, problems)
    if problems:  # the children are LOSSLESS, what this node retains of the span is not
        node = msgspec.structs.replace(node, loss=LossClass.LOSSY_LITERAL)
    return [_sealed(node, text, got.span_root, got.digest)]


def _live(f: Facts, positions: Iterable[int], stop: int) -> set[int]:
    """Return those of ``positions`` that hold a binding still the latest of its key before ``stop``."""
    out = set()
    for p in positions:
        event = f.event(p) if 0 <= p < stop else None
        if isinstance(event, ev.Binding):
            found = f.latest_binding(event.key, stop)
            if found is not None and found[0] == p:
                out.add(p)
    return out


def _sealed(node: ev.Summary, text: str, span_root: bytes, digest: bytes | None) -> ev.Summary:
    """Return ``node`` with its summary text, span root and content digest."""
    return msgspec.structs.replace(
        node, summary=text, span_root=span_root.hex(), content_digest=None if digest is None else digest.hex()
    )


# --- after the fact ------------------------------------------------------------------


def audit(view: SessionView) -> list[Finding]:
    """Return every binding whose live value a lossy compaction destroyed and a later step needed.

    The live value is the key's latest binding before the step; it is destroyed when
    every node covering it (written before the step) keeps neither an excerpt nor a
    spill of that position.
    """
    size = view.size
    s = build((r.pos, r.event) for r in view.scan(0, size))
    findings: list[Finding] = []
    seen: set[tuple[int, str]] = set()
    for pos, key, via in sorted(s.needs):
        live = s.latest_binding(key, pos)
        if live is None or live[1].regenerable:
            continue
        # The live value must lie in a lossy span compacted before this step by a node that
        # kept nothing of it. A value of the key bound earlier, raw or kept, is stale and
        # keeps nothing the step can use.
        bpos = live[0]
        covering = [npos for npos, n in s.nodes.items() if npos < pos and n.start <= bpos < n.stop]
        if not covering or any(bpos in rules.kept_positions(s.nodes[npos]) for npos in covering):
            continue
        swallowed_by = min(covering)
        if (swallowed_by, key) not in seen:
            seen.add((swallowed_by, key))
            findings.append(Finding(swallowed_by, key, bpos, pos, pos - swallowed_by, via))
    return findings
