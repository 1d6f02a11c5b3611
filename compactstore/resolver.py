"""Resume from a marker, and reconstruct from an artifact: certify by digest or refuse.

``resume`` trusts a marker wholesale or not at all. It re-verifies the raw checkpoint
the marker names, then re-runs the emission checks over the same inputs: if they all
hold, the context is the summary tier with its verified excerpts (``certified``);
otherwise it is exactly the raw events up to the checkpoint (``fallback``). It never
patches a summary with raw events: a patched summary is neither the summary that was
certified nor the log, and two resumes could patch it differently.

``reconstruct`` is the boundary between expansion and restoration: tolerant operations
may use a lossy artifact as a prior; restoration operations need a LOSSLESS artifact
whose digest verifies and whose every literal matches the durable source.

``restore_span`` goes back to that durable source: the raw events a summary node
replaced, exactly as logged, certified against the node and the node against the tree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
import threading
from typing import Literal

import msgspec
from blake3 import blake3

from . import events as ev
from . import merkle, render, rules
from .compaction import Node
from .errors import BodyDroppedError, ForeignReference, IntegrityError, InvalidArgument, ReconstructionUnsoundError, shown
from .events import JSON, LossClass
from .facts import Facts, FullFacts, IndexedFacts
from .markers import Marker
from .rules import CONDITIONS
from .view import SessionView, logged_position
from .view import same_session as view_same_session

TOLERANT_OPS = frozenset({"summarize", "plan", "brainstorm", "rank"})
RESTORATION_OPS = frozenset({"authorize", "commit", "emit_authoritative", "retry_idempotent"})
Mode = Literal["certified", "fallback"]

_encoder = msgspec.json.Encoder(order="sorted")


class RawItem(msgspec.Struct, frozen=True, tag="raw", tag_field="item"):
    """A raw event the resumed agent loads as it was logged."""

    pos: int
    event: ev.Event


class SummaryItem(msgspec.Struct, frozen=True, omit_defaults=True, tag="summary", tag_field="item"):
    """A certified summary node the resumed agent loads in place of the span it covers.

    ``resolved``: the items opened before the span (shown raw) and closed inside it.
    ``negative_facts``: the facts the node lists; an L2 node retains its children's
    besides, and lists the newest of them (``facts:START-STOP`` recalls the rest).
    """

    pos: int
    tier: int
    start: int
    stop: int
    span_root: str
    summary: str
    loss: LossClass
    negative_facts: list[ev.Fact]
    unresolved: list[ev.Item]
    kept: list[ev.Excerpt]
    spills: list[ev.SpillRef]
    # Required, so that it is encoded even when None: only an empty ``resolved`` is left
    # out, and a resolution without one keeps its bytes and digest.
    contract: str | None
    resolved: list[ev.Item] = []



ContextItem = RawItem | SummaryItem


class Resolution(msgspec.Struct, frozen=True):
    """The outcome of :meth:`Session.resume`.

    Attributes:
        marker: the position of the marker resolved; -1 for a context no marker
            certifies (:meth:`Session.context` falling back to the raw log).
        mode: ``certified`` (context is the summary tier) or ``fallback`` (raw events).
        context: the items a resumed agent loads, in log order.
        reasons: why the mode was chosen (each failed condition, for a fallback).
        digest: BLAKE3 of the canonical encoding of mode, checkpoint and context: the
            same marker gives the same digest every time, on every backend.
        loss: the loss class of the certified summary tier, its weakest node's (None
            for a fallback, whose context is the raw log).
        restorable: the names of the literals a restoration may take from that tier
            (its kept bindings by key, other excerpts as ``pos:path``): empty unless the
            tier is LOSSLESS and its claim holds against the log.
        needed: the literals the obligations open at ``size`` need that the context's
            summaries spilled, each read from the log, proven in the sealed head and held
            to its digest (:func:`needed`); ``as_messages`` states them. Not in ``digest``:
            they are read from the log the digest covers.
    """

    session: str
    marker: int
    mode: Mode
    size: int
    root: bytes
    context: list[ContextItem]
    reasons: list[str]
    digest: bytes
    loss: LossClass | None = None
    restorable: list[str] = []
    needed: list[render.Needed] = []

    def as_messages(self, format: render.Format) -> list[render.Message]:  # noqa: A002
        """Return the context as model input: OpenAI Responses input items, or ``"chat"`` messages.

        See :func:`compactstore.render.messages`: raw events go in as the messages they
        were, a summary node as a system or developer note stating its loss class, its
        negative facts and its UNRESOLVED items. Deterministic.

        Raises:
            InvalidArgument: an unknown ``format``.
        """
        return render.messages(self.context, format, needed=self.needed)


def _verified_prefix(view: SessionView, marker_pos: int) -> tuple[list[ev.Event], list[bytes]]:
    """Return events and re-computed leaves ``[0, marker_pos]``, checked against the stored tree."""
    events, leaves = [], []
    for r in view.scan(0, marker_pos + 1):
        # A redacted body is gone; its stored leaf is vouched for by the tree below.
        leaf = r.leaf if isinstance(r.event, ev.ERASED) else merkle.leaf_hash(r.body)
        if leaf != r.leaf:
            raise IntegrityError(f"event at pos {r.pos} does not match its leaf", session=view.name, pos=r.pos)
        events.append(r.event)
        leaves.append(leaf)
    if len(leaves) != marker_pos + 1:
        raise IntegrityError(f"positions missing before pos {marker_pos}", session=view.name)
    if merkle.root_of_leaves(leaves) != view.head(marker_pos + 1).root:
        raise IntegrityError(
            f"events [0, {marker_pos + 1}) do not give the stored tree's root", session=view.name, pos=marker_pos
        )
    return events, leaves


def resume(view: SessionView, pos: int, *, rehash: bool = False) -> Resolution:
    """Resume from the marker at ``pos``; see :meth:`compactstore.store.Session.resume`."""
    # The marker is proven in the sealed head first: a keyed store opened without its
    # key, or a marker the sealed tree does not hold, certifies nothing.
    record = view.proven(pos)
    m = Marker.from_record(record)
    if not rehash and m.node is not None and 0 <= m.size <= pos and tuple(m.conditions) == CONDITIONS:
        resolution = _resume_certified(view, record, m)
        if isinstance(resolution, Resolution):
            return _with_needed(view, resolution)
    return _with_needed(view, _resume_full(view, pos, m))


def _with_needed(view: SessionView, got: Resolution) -> Resolution:
    """Return ``got`` with the literals its open obligations need that its summaries spilled (see :func:`needed`)."""
    if got.mode != "certified":
        return got
    return msgspec.structs.replace(got, needed=needed(view, view.facts(got.size), got.context))


def needed(view: SessionView, f: Facts, context: Iterable[ContextItem]) -> list[render.Needed]:
    """Return what each obligation open at ``f.size`` needs of a node of ``context`` that the node spilled.

    For each summary node, each open obligation that needs a non-regenerable binding
    whose live value the node's span holds (:func:`compactstore.rules.risks`) and that
    the node spilled: the spill's value, proven in the sealed head and held to its digest.
    A spill redacted since is left out (its handle stays in the node's note).
    """
    out: dict[tuple[str, str], render.Needed] = {}
    for node in context:
        if not isinstance(node, SummaryItem) or not node.spills:
            continue
        refs = {(r.key, r.source): r for r in node.spills}
        for risk in rules.risks(f, node.start, node.stop):
            ref = refs.get((risk.key, risk.binding_pos))
            at = rules.spill_position(ref.handle) if ref is not None else None
            if ref is None or at is None or (risk.obligation, risk.key) in out:
                continue
            spill = view.proven(at).event
            if not isinstance(spill, ev.Spill) or spill.digest != ref.digest or spill.source != ref.source:
                continue
            source = view.proven(spill.source).event if 0 <= spill.source < at else None
            if rules.spill_problem(spill, source, ref.handle) is None:
                out[(risk.obligation, risk.key)] = render.Needed(risk.obligation, risk.key, ref.handle, spill.value)
    return list(out.values())


def _cover(m: Marker) -> list[int]:
    """Return the positions of the nodes marker ``m`` resolves to (none for a raw-checkpoint marker)."""
    if m.node is None:
        return []
    return list(m.cover) or [m.node]


def _gaps(nodes: list[ev.Summary], size: int) -> list[tuple[int, int]]:
    """Return the raw spans of ``[0, size)`` outside the spans of ``nodes`` (in span order), in order."""
    out, at = [], 0
    for n in nodes:
        out.append((at, n.start))
        at = n.stop
    out.append((at, size))
    return [(a, b) for a, b in out if a < b]


def _resume_certified(view: SessionView, record: ev.Record, m: Marker) -> Resolution | list[str] | None:
    """Resume from a certified marker reading only what the context holds.

    Returns the resolution, the violations when a condition fails (the full path then
    gives the fallback, reasons and all), or None when the full path must decide (the
    session's facts come from a full pass: it has redactions).

    The checkpoint root is the stored tree's at ``m.size`` (O(log n) subtree roots). Every
    body read (the marker, the nodes on the path, their excerpts' and spills' sources,
    the events behind the negative facts the cover retains, and the raw events of the
    context) is re-hashed and held against that root and the stored head after the
    marker; bodies not read are vouched for by the stored tree, and by
    :meth:`Store.verify`, which re-hashes every one.
    """
    pos, size = m.pos, m.size
    cover = _cover(m)
    # Every leaf read is proven at once against the checkpoint root below (_prove_read),
    # before anything read decides the outcome; a violation proves them first too.
    reader = view.reader(size, deferred=True)
    f = view.facts(size, reader=reader)
    if not isinstance(f, IndexedFacts):
        return None
    marker_leaf = merkle.leaf_hash(record.body)
    if marker_leaf != record.leaf:
        raise IntegrityError(f"event at pos {pos} does not match its leaf", session=view.name, pos=pos)
    head = view.head(size)
    _check_checkpoint(view, m, head.root, head.mac)
    reader.prefetch(cover)
    violations, path = rules.check_cover(f, cover)
    if violations:
        # The rules decided on bodies read in batches and not yet proven: prove them before
        # a violation sends the caller to the fallback, so a forged body is an IntegrityError.
        _prove_read(view, reader.leaves, m)
        return [str(v) for v in violations]
    tops = [reader(c) for c in cover]
    nodes = [t for t in tops if isinstance(t, ev.Summary)]
    assert len(nodes) == len(cover)
    reader.prefetch(x.pos for n in nodes for x in n.negative_facts)
    items = [_summary_item(c, n) for c, n in zip(cover, nodes)]
    gaps = _gaps(nodes, size)
    raw: list[ev.Record] = []
    for start, stop in gaps:
        for r in view.scan(start, stop):
            reader.add(r)
            raw.append(r)
    if len(raw) != sum(b - a for a, b in gaps):
        raise IntegrityError(f"positions missing before pos {size}", session=view.name)
    events = {r.pos: r.event for r in raw}
    context = _with_calls(_context(events.get, items, size), reader)
    _prove_read(view, reader.leaves, m)
    if view.root_with({pos: marker_leaf}, pos + 1) != view.head(pos + 1).root:
        raise IntegrityError(f"marker at pos {pos} does not give the stored tree's root", session=view.name, pos=pos)
    reasons = [f"every condition holds and every digest on path {path} matches the log"]
    return _resolution(view, pos, "certified", size, head.root, context, reasons, _tier(f, list(zip(cover, nodes))))


def _prove_read(view: SessionView, leaves: dict[int, bytes], m: Marker) -> None:
    """Raise IntegrityError unless the ``leaves`` read under marker ``m`` give its checkpoint root: one multi-proof for all."""
    if leaves and view.root_with(leaves, m.size) != m.root:
        raise IntegrityError(
            f"events read under marker at pos {m.pos} do not give the stored tree's root at its checkpoint (size {m.size})",
            session=view.name,
            pos=m.pos,
        )


def _check_checkpoint(view: SessionView, m: Marker, root: bytes, mac: bytes | None) -> None:
    """Raise IntegrityError unless the marker names ``root`` and, on a store opened with its key, its MAC ``mac``."""
    if root != m.root:
        raise IntegrityError(
            f"raw checkpoint of marker at pos {m.pos} does not verify: root of [0, {m.size}) is {root.hex()[:16]}…, "
            f"the marker names {m.root.hex()[:16]}…",
            session=view.name,
            pos=m.pos,
        )
    if mac is not None and m.mac != mac:
        raise IntegrityError(f"marker at pos {m.pos}: checkpoint MAC does not verify", session=view.name, pos=m.pos)


def _resume_full(view: SessionView, pos: int, m: Marker) -> Resolution:
    """Resume re-hashing every body up to the marker and re-running the checks over the events."""
    events, leaves = _verified_prefix(view, pos)
    size = m.size
    if not 0 <= size <= pos:
        raise IntegrityError(f"marker at pos {pos} names checkpoint size {size}, after itself", session=view.name, pos=pos)
    root = merkle.root_of_leaves(leaves[:size])
    _check_checkpoint(view, m, root, view.head(size).mac)
    events, leaves = events[:size], leaves[:size]
    reasons: list[str]
    mode: Mode
    cover = _cover(m)
    if m.node is None:
        mode, reasons = "fallback", ["raw-checkpoint marker: the context is the raw log"]
    else:
        f = FullFacts(events, lambda a, b: merkle.span_root_of_leaves(leaves, a, b))
        # Every body is at hand: an earlier digest is held to its whole chain, not to its admission.
        violations, path = rules.check_cover(f, cover, deep=True)
        reasons = [str(v) for v in violations]
        if tuple(m.conditions) != CONDITIONS:
            reasons.insert(0, f"marker certified {m.conditions}, not every condition {list(CONDITIONS)}")
        mode = "fallback" if reasons else "certified"
        if mode == "certified":
            reasons = [f"every condition holds and every digest on path {path} matches the log"]
    tier: tuple[LossClass | None, list[str]] = (None, [])
    if mode == "certified" and m.node is not None:
        nodes = [(c, events[c]) for c in cover]
        tops = [(c, n) for c, n in nodes if isinstance(n, ev.Summary)]
        assert len(tops) == len(cover)
        tier = _tier(f, tops)
        read = lambda p: events[p] if 0 <= p < size else None  # noqa: E731
        context = _with_calls(_context(read, [_summary_item(c, n) for c, n in tops], size), read)
    else:
        context = _raw(events, 0, size)
    return _resolution(view, pos, mode, size, root, context, reasons, tier)


def _tier(f: Facts, cover: list[tuple[int, ev.Summary]]) -> tuple[LossClass, list[str]]:
    """Return the loss class of a certified tier (its weakest node's) and the names of the literals restorable from it."""
    loss = rules.weakest(n.loss for _, n in cover)
    names: set[str] = set()
    for pos, n in cover:
        if rules.restoration_problems(f, n, pos):
            return loss, []
        names.update(_literals(n, f.event))
    return loss, sorted(names)


def _resolution(
    view: SessionView, pos: int, mode: Mode, size: int, root: bytes, context: list[ContextItem], reasons: list[str],
    tier: tuple[LossClass | None, list[str]],
) -> Resolution:
    # The digest covers mode, checkpoint and context only, as it always has: the tier's
    # loss class and literals are in the context already.
    body = _encoder.encode({"marker": pos, "mode": mode, "size": size, "root": root.hex(), "context": context})
    digest = blake3(b"compactstore/resolution/v1\x00" + body).digest()
    return Resolution(view.name, pos, mode, size, root, context, reasons, digest, *tier)


def _raw(events: list[ev.Event], start: int, stop: int) -> list[ContextItem]:
    return [RawItem(p, events[p]) for p in range(start, stop) if events[p].kind not in ev.DERIVED_KINDS]


def _context(read: Callable[[int], ev.Event | None], cover: list[SummaryItem], size: int) -> list[ContextItem]:
    """Return the context of a certified cover: each node in place of its span, the raw events outside them (derived ones left out)."""
    out: list[ContextItem] = []
    at = 0
    for item in [*cover, None]:
        stop = size if item is None else item.start
        for p in range(at, stop):
            event = read(p)
            assert event is not None, p
            if event.kind not in ev.DERIVED_KINDS:
                out.append(RawItem(p, event))
        if item is not None:
            out.append(item)
            at = item.stop
    return out


def _with_calls(context: list[ContextItem], read: Callable[[int], ev.Event | None]) -> list[ContextItem]:
    """Return ``context`` with the call of each raw tool result whose call a node summarized put right before it.

    Model APIs take a tool result only after the call that made it. A call open at a
    node's stop is one of its ``unresolved`` items, at its position: that call, read
    from the log, goes in right before its result. A result whose call is found nowhere
    (a redacted call) is left as it is.
    """
    calls = {i.event.call_id for i in context if isinstance(i, RawItem) and isinstance(i.event, ev.ToolCall)}
    opened = {x.id: x.pos for i in context if isinstance(i, SummaryItem) for x in i.unresolved if x.kind == "tool_call"}
    out: list[ContextItem] = []
    for i in context:
        if isinstance(i, RawItem) and isinstance(i.event, ev.ToolResult):
            cid = i.event.call_id
            if cid not in calls and cid in opened:
                call = read(opened[cid])
                if isinstance(call, ev.ToolCall) and call.call_id == cid:
                    out.append(RawItem(opened[cid], call))
                    calls.add(cid)
        out.append(i)
    return out


def _summary_item(node_pos: int, n: ev.Summary) -> SummaryItem:
    """Return the item of a certified cover node: what its sealed body lists."""
    return SummaryItem(
        node_pos, n.tier, n.start, n.stop, n.span_root, n.summary, n.loss, list(n.negative_facts),
        list(n.unresolved), list(n.kept), list(n.spills), n.contract, list(n.resolved),
    )


# --- the context a resumed agent loads now ------------------------------------------


class Certified:
    """Certified resolutions of a session's markers at their checkpoints, kept between calls of :func:`context`.

    A marker's certification depends only on the log before it, which never changes
    (a redaction appends, and the store keeps one ``Certified`` per redaction count),
    so it is kept by the marker's position and leaf. Only a certified resolution is
    kept: it was proven against the checkpoint root the marker names, and the marker
    is proven in the sealed head again at every use. A fallback is never kept, so a
    failure is always decided afresh.
    """

    #: resolutions kept; the oldest goes first (a session's context uses its latest markers)
    KEPT = 4

    def __init__(self) -> None:
        self._got: dict[tuple[int, bytes], Resolution] = {}
        self._lock = threading.Lock()

    def get(self, record: ev.Record) -> Resolution | None:
        """Return the certified resolution kept for the marker ``record``, or None."""
        with self._lock:
            return self._got.get((record.pos, record.leaf))

    def put(self, record: ev.Record, resolution: Resolution) -> None:
        """Keep the certified ``resolution`` of the marker ``record``."""
        with self._lock:
            while len(self._got) >= self.KEPT:
                self._got.pop(next(iter(self._got)))
            self._got[(record.pos, record.leaf)] = resolution


def context(view: SessionView, markers: Iterable[int], certified: Certified | None = None) -> Resolution:
    """Return what a resumed agent loads now; see :meth:`compactstore.store.Session.context`.

    ``markers``: the positions of the session's markers, latest first. The first that
    certifies at its checkpoint, and whose cover still holds what every obligation open
    now needs (:func:`compactstore.rules.cover_gate`), gives the context: its cover and
    the raw events after its checkpoint, derived events left out, the tail re-hashed and
    held against the sealed head. When none does, the context is the raw log, with each
    marker's reasons. ``certified`` keeps a marker's certified resolution between calls
    (see :class:`Certified`); the cover gate and the tail are decided at every call.
    """
    head = view.sealed_head()
    reasons: list[str] = []
    for pos in markers:
        record = view.proven(pos)
        m = Marker.from_record(record)
        if m.node is None:
            reasons.append(f"marker at pos {pos}: raw-checkpoint marker")
            continue
        got: Resolution | list[str] | None = certified.get(record) if certified is not None else None
        if isinstance(got, Resolution) and (got.size, got.root) != (m.size, m.root):
            got = None  # not this marker's checkpoint: decide afresh
        if got is None and 0 <= m.size <= pos and tuple(m.conditions) == CONDITIONS:
            got = _resume_certified(view, record, m)
        if got is None:  # facts from a full pass, or a malformed marker: the full path decides
            full = _resume_full(view, pos, m)
            got = full if full.mode == "certified" else full.reasons
        if isinstance(got, Resolution) and certified is not None:
            certified.put(record, got)
        if isinstance(got, list):
            reasons.append(f"marker at pos {pos}: " + "; ".join(got[:3]) + (f"; and {len(got) - 3} more" if len(got) > 3 else ""))
            continue
        nodes = [e for item in got.context if isinstance(item, SummaryItem)
                 and isinstance(e := view.proven(item.pos).event, ev.Summary)]
        now = view.facts(head.size)
        stale = rules.cover_gate(now, nodes)
        if stale:
            reasons.append(f"marker at pos {pos}: since its checkpoint, " + "; ".join(str(v) for v in stale[:3]))
            continue
        done = _extended(view, got, head)
        return msgspec.structs.replace(done, needed=needed(view, now, done.context))
    if not reasons:
        reasons.append("no marker in the session: the context is the raw log")
    events, _ = _verified_prefix(view, head.size - 1) if head.size else ([], [])
    if head.size and view.head(head.size).root != head.root:
        raise IntegrityError("the stored tree does not give the sealed head's root", session=view.name)
    return _resolution(view, -1, "fallback", head.size, head.root, _raw(events, 0, head.size), reasons, (None, []))


def empty_context(session: str) -> Resolution:
    """Return the context of a session with no events: a fallback to the empty raw log."""
    root = merkle.empty_root()
    reasons = ["no marker in the session: the context is the raw log"]
    body = _encoder.encode({"marker": -1, "mode": "fallback", "size": 0, "root": root.hex(), "context": []})
    digest = blake3(b"compactstore/resolution/v1\x00" + body).digest()
    return Resolution(session, -1, "fallback", 0, root, [], reasons, digest)


def _extended(view: SessionView, got: Resolution, head: ev.TreeHead) -> Resolution:
    """Return ``got`` extended by the raw events after its checkpoint up to ``head``, each re-hashed and held against it."""
    reader = view.reader(head.size)
    tail: list[ContextItem] = []
    for r in view.scan(got.size, head.size):
        reader.add(r)
        if r.event.kind not in ev.DERIVED_KINDS:
            tail.append(RawItem(r.pos, r.event))
    if len(reader.leaves) != head.size - got.size:
        raise IntegrityError(f"positions missing before pos {head.size}", session=view.name)
    if view.root_with(reader.leaves, head.size) != head.root:
        raise IntegrityError(
            f"events after the checkpoint at size {got.size} do not give the sealed head's root", session=view.name
        )
    calls = {x.pos: x.event for x in got.context if isinstance(x, RawItem)}
    context = _with_calls([*got.context, *tail], lambda p: calls[p] if p in calls else view.proven(p).event)
    return _resolution(view, got.marker, "certified", head.size, head.root, context, got.reasons,
                       (got.loss, got.restorable))


# --- artifacts and reconstruction --------------------------------------------------


class Artifact(msgspec.Struct, frozen=True):
    """What a later instance expands: loss class, payload (summary and literals), digest.

    ``digest`` is BLAKE3 over the payload, the loss class, the node's position and span
    root, the tree head it was made at (``size``, ``root``), the session's name and the
    store's identity, so an artifact altered on its way through a context window (its
    loss tag relabelled, say) no longer verifies. A restoration against the log takes
    only ``node``, ``size`` and ``digest`` from it and re-reads everything else.
    """

    loss: LossClass | str | None
    payload: dict[str, JSON]
    digest: str | None
    span_root: str | None = None
    #: the session that made it
    session: str | None = None
    #: the position of the summary node it was made from
    node: int | None = None
    #: the tree head (size and hex root) it was made at
    size: int | None = None
    root: str | None = None
    #: the identity of the store that made it
    store: str | None = None


def artifact_digest(
    payload: Mapping[str, JSON],
    span_root: str | None,
    *,
    loss: LossClass | str | None = None,
    session: str | None = None,
    node: int | None = None,
    size: int | None = None,
    root: str | None = None,
    store: str | None = None,
) -> str:
    """Return the digest an artifact with these fields must carry."""
    body = _encoder.encode({
        "payload": payload, "span_root": span_root, "loss": loss, "session": session, "node": node,
        "size": size, "root": root, "store": store,
    })
    return blake3(b"compactstore/artifact/v2\x00" + body).hexdigest()


def _digest_of(a: Artifact) -> str:
    return artifact_digest(
        a.payload, a.span_root, loss=a.loss, session=a.session, node=a.node, size=a.size, root=a.root, store=a.store
    )


def literal_name(excerpt: ev.Excerpt, binding_keys: Mapping[int, str]) -> str:
    """Return how an excerpt is named among an artifact's literals: its binding key, or ``pos:path``."""
    if excerpt.path == "value" and excerpt.pos in binding_keys:
        return binding_keys[excerpt.pos]
    return f"{excerpt.pos}:{excerpt.path}"


def _literals(node: ev.Summary, read: Callable[[int], ev.Event | None]) -> dict[str, JSON]:
    """Return a node's kept excerpts by literal name; ``read`` gives the events they come from."""
    keys: dict[int, str] = {}
    for e in node.kept:
        event = read(e.pos) if e.path == "value" else None
        if isinstance(event, ev.Binding):
            keys[e.pos] = event.key
    # A key names its latest kept value; an earlier one, re-bound since, keeps its ``pos:path``.
    latest = {k: p for p, k in sorted(keys.items())}
    keys = {p: k for p, k in keys.items() if latest[k] == p}
    return {literal_name(e, keys): e.value for e in node.kept}


def position_of(view: SessionView, field: str, obj: object) -> int:
    """Return the position a caller's ``Node`` or ``Marker`` (or plain position) names.

    A ``Node`` or ``Marker`` is held to the log first (:func:`compactstore.view.logged_position`):
    its session and leaf must be those of the event this session logged there. A plain
    position is returned as given, for the caller to check.

    Raises:
        ForeignReference: the object names another session, or another event.
        InvalidArgument: there is no event at its position.
    """
    if not isinstance(obj, Node | Marker):
        if isinstance(obj, int) and not isinstance(obj, bool):
            return obj
        raise InvalidArgument(field, f"want a {'Marker' if field == 'marker' else 'Node'} or its position, got {type(obj).__name__}")
    return logged_position(view, field, obj)


def same_session(name: str, field: str, obj: Node | Marker) -> None:
    """Refuse a caller's ``Node`` or ``Marker`` taken from a session other than ``name`` (see :func:`compactstore.view.same_session`).

    Raises:
        ForeignReference: it names another session.
    """
    view_same_session(name, field, obj)


def artifact(view: SessionView, node: int) -> Artifact:
    """Return the artifact of the node at ``node``; see :meth:`compactstore.store.Session.artifact`."""
    return _made(view, node, view.sealed_head())


def _made(view: SessionView, pos: int, head: ev.TreeHead) -> Artifact:
    """Return the artifact of the node at ``pos`` as the log holds it, made at tree head ``head``."""
    if not 0 <= pos < head.size:
        raise InvalidArgument("node", f"no event at {pos} in session {view.name!r} before size {head.size}")
    record = view.proven(pos)
    node = record.event
    if not isinstance(node, ev.Summary):
        raise InvalidArgument("node", f"pos {pos} is a {record.kind!r} event, not a summary node")
    payload: dict[str, JSON] = {
        "summary": node.summary,
        "literals": _literals(node, lambda p: view.proven(p).event),
        "negative_facts": msgspec.to_builtins(node.negative_facts),
        "unresolved": msgspec.to_builtins(node.unresolved),
        "spills": {r.key: r.handle for r in node.spills},
    }
    made = Artifact(node.loss, payload, None, node.span_root, view.name, pos, head.size, head.root.hex(), view.store_id)
    return msgspec.structs.replace(made, digest=_digest_of(made))


def certified_artifact(view: SessionView, given: Artifact) -> Artifact:
    """Return ``given`` made again from the log, after checking that it is what the log gives.

    Only the node position and tree size are taken from ``given``: the node is re-read
    by position and proven in the sealed head, the head at ``size`` proven a prefix of
    it, and the artifact made again from them must equal ``given`` field for field,
    digest included. So
    a relabelled loss class, an edited payload, another session's or store's artifact,
    or one that names no node, is refused; the loss class of what comes back is the
    logged node's, and a LOSSLESS one is held to the rule again
    (:func:`compactstore.rules.restoration_problems`).

    Raises:
        ReconstructionUnsoundError: naming what does not match (``ForeignReference`` for
            another session or store).
        KeyRequired: the store is keyed and was opened without its key.
    """
    given = read_artifact(given)
    if given.session != view.name:
        raise ForeignReference("artifact", f"was made in session {given.session!r}, not {view.name!r}", session=view.name)
    if given.store != view.store_id:
        raise ForeignReference("artifact", "was made by another store", session=view.name)
    pos, size = given.node, given.size
    if pos is None or size is None:
        raise ReconstructionUnsoundError("the artifact names no node and tree head: nothing in the log can vouch for it")
    latest = view.sealed_head()
    if not 0 <= pos < size <= latest.size:
        raise ForeignReference(
            "artifact", f"names node {pos} at size {size}, not in this session (size {latest.size})", session=view.name
        )
    made = _made(view, pos, view.sealed_head(size))
    # Every field, by its canonical bytes (``1`` is not ``true``), not the digest alone: an
    # artifact edited but still carrying the digest it was made with is altered too, and
    # the caller holding it would act on what it says, not on what the log gives.
    if made.digest != given.digest or not rules.same_value(made, given):
        raise ReconstructionUnsoundError(
            f"the artifact does not match node {pos} as logged: its loss class, payload, span root or tree head "
            "was altered after it was made"
        )
    node = view.proven(pos).event
    assert isinstance(node, ev.Summary)
    if node.loss is LossClass.LOSSLESS:
        problems = rules.restoration_problems(view.facts(pos), node, pos)
        if problems:
            raise ReconstructionUnsoundError(f"node at pos {pos} is logged LOSSLESS but is not: " + "; ".join(problems))
    return made


def _loss_of(artifact: Artifact) -> LossClass:
    # An absent or unreadable tag means LOSSY_LITERAL: a false LOSSLESS costs a silent
    # divergence, a false LOSSY only a re-fetch. Looked up by a str only (read_artifact
    # left nothing else): the enum's own lookup compares with the object's __eq__.
    loss = artifact.loss
    if isinstance(loss, LossClass):
        return loss
    return LossClass(loss) if loss in _LOSS_TAGS else LossClass.LOSSY_LITERAL


_LOSS_TAGS = frozenset(c.value for c in LossClass)


def read_artifact(given: object) -> Artifact:
    """Return ``given``, an :class:`Artifact`, copied into exact types: what every path taking a caller's artifact reads.

    ``payload`` is copied into exact JSON types (:func:`compactstore.events.as_json_map`);
    ``digest``, ``span_root``, ``session``, ``root`` and ``store`` must be a str or None,
    ``node`` and ``size`` an int (not a bool) or None. ``loss`` stays a LossClass or a
    str; any other object is an unreadable tag, and reads as absent (None), which
    means LOSSY_LITERAL (the design's pessimistic default).

    Raises:
        InvalidArgument: naming ``artifact`` or the field of the wrong type.
    """
    if not isinstance(given, Artifact):
        raise InvalidArgument("artifact", f"want an Artifact, got {type(given).__name__}")
    payload = ev.as_json_map("artifact.payload", given.payload)
    for name in ("digest", "span_root", "session", "root", "store"):
        value = getattr(given, name)
        if value is not None and type(value) is not str:
            raise InvalidArgument(f"artifact.{name}", f"want a str or None, got {type(value).__name__}")
    for name in ("node", "size"):
        value = getattr(given, name)
        if value is not None and type(value) is not int:
            raise InvalidArgument(f"artifact.{name}", f"want an int or None, got {type(value).__name__}")
    loss = given.loss
    if type(loss) is not LossClass and type(loss) is not str:
        loss = None
    return Artifact(loss, payload, given.digest, given.span_root, given.session, given.node, given.size, given.root,
                    given.store)


def reconstruct(
    artifact: Artifact,
    operation: str,
    lookup: Callable[[str], JSON | None],
    *,
    uses: Mapping[str, JSON] | None = None,
    tool_results: Iterable[JSON] = (),
    prior: Mapping[str, JSON] | None = None,
    prior_digests: Mapping[str, str] | None = None,
) -> dict[str, JSON]:
    """Expand (tolerant operations) or restore (restoration operations) an artifact's payload.

    A restoration needs a LOSSLESS artifact whose digest verifies, that names its node,
    whose every literal the durable source gives exactly, and whose node the durable
    source confirms is LOSSLESS with the artifact's span root (``lookup("<node>:loss")``,
    ``lookup("<node>:span_root")``) and whose claim holds (``lookup("<node>:restorable")``
    is True), with the artifact's summary, negative facts, unresolved items and spills:
    a loss tag relabelled or a payload edited on the way is refused even with its digest
    recomputed. :meth:`compactstore.store.Session.reconstruct` goes further and
    makes the artifact again from the log.

    Args:
        operation: ``summarize``, ``plan``, ``brainstorm``, ``rank`` (tolerant) or
            ``authorize``, ``commit``, ``emit_authoritative``, ``retry_idempotent``.
        lookup: the durable source: returns a literal's exact value (or a field of a
            logged event, as ``pos:path``), or None.
        uses: the literals (name -> value) the operation is about to act on; each must
            be in the artifact or among ``tool_results`` (invention guard).
        tool_results: values produced by tool calls in the current turn (a list, not a str).
        prior: the literals the earlier attempts of this operation used (retry guard);
            required for ``retry_idempotent`` (an empty mapping when there were none).
        prior_digests: the digests of the values the earlier attempts used
            (:func:`compactstore.rules.value_digest`), which is all a redaction keeps of an
            attempt it erased: when given, they decide, and ``prior`` only names values in
            messages.

    Raises:
        ReconstructionUnsoundError: naming the literal and why.
        InvalidArgument: naming the argument of the wrong type: an artifact that is not
            an :class:`Artifact` or whose payload is not JSON, ``uses``, ``prior`` or a tool
            result that is not JSON, a ``lookup`` that is not callable, ``retry_idempotent``
            without ``prior``.
    """
    artifact, uses, produced_values, prior = _checked_arguments(artifact, operation, lookup, uses, tool_results, prior)
    digests = None if prior is None else {k: rules.value_digest(v) for k, v in prior.items()}
    if prior_digests is not None:
        digests = {ev.as_text("prior_digests", k): ev.as_text(f"prior_digests[{k!r}]", v) for k, v in
                   ev.as_json_map("prior_digests", prior_digests).items()}
    if operation not in TOLERANT_OPS | RESTORATION_OPS:
        raise ReconstructionUnsoundError(f"unknown operation {shown(operation)}: refusing to guess its loss tolerance")
    if operation == "retry_idempotent" and digests is None:
        raise InvalidArgument("prior", "retry_idempotent needs the literals the earlier attempts used "
                              "(an empty mapping when there were none): without them a retry is unguarded")
    payload = dict(artifact.payload)
    raw_literals = payload.get("literals")
    literals: dict[str, JSON] = raw_literals if isinstance(raw_literals, dict) else {}
    for name, value in (uses or {}).items():
        if name in literals:
            if not rules.same_value(literals[name], value):
                raise ReconstructionUnsoundError(f"literal {name!r}: {value!r} differs from the artifact's {literals[name]!r}")
        elif not any(rules.same_value(value, v) for v in produced_values):
            raise ReconstructionUnsoundError(
                f"literal {name!r} = {value!r} is in neither the artifact nor a tool result of this turn: it would be invented"
            )
    conflicts = rules.retry_conflicts(digests or {}, {**literals, **(uses or {})}, prior or {})
    if conflicts:
        raise ReconstructionUnsoundError(conflicts[0])
    if operation in TOLERANT_OPS:
        return payload
    loss = _loss_of(artifact)
    if loss is not LossClass.LOSSLESS or not artifact.digest:
        # The digest is left out of the message: it binds the store's identity, which differs per store.
        why = loss.value if loss is not LossClass.LOSSLESS else "LOSSLESS but carries no digest"
        raise ReconstructionUnsoundError(
            f"operation {operation!r} needs restoration, but the artifact is {why}: "
            "re-fetch the literals from the durable source instead"
        )
    if artifact.digest != _digest_of(artifact):
        raise ReconstructionUnsoundError("the artifact's digest does not verify: it was altered after it was made")
    node = artifact.node
    if not isinstance(node, int) or isinstance(node, bool) or node < 0:
        raise ReconstructionUnsoundError("the artifact names no node: nothing in the durable source vouches for its loss class")
    for name, value in literals.items():
        durable = lookup(name)
        if durable is None:
            raise ReconstructionUnsoundError(f"literal {name!r} is absent from the durable source: cannot restore it")
        if not rules.same_value(ev.as_json(f"lookup({name!r})", durable), value):
            raise ReconstructionUnsoundError(
                f"literal {name!r}: the artifact says {value!r}, the durable source {durable!r}: the compaction layer is corrupt"
            )
    # The tag travelled with the artifact; the durable source says what the node really is.
    # What it answers is read in exact types: a str subclass could call itself equal to anything.
    logged = ev.as_json(f"lookup({node}:loss)", lookup(f"{node}:loss"))
    if not rules.same_value(logged, LossClass.LOSSLESS.value):
        raise ReconstructionUnsoundError(
            f"the durable source holds node {node} as {logged!r}, not LOSSLESS: the artifact's loss tag is not the log's"
        )
    # Logged LOSSLESS is a claim; the durable source says whether it holds (a node
    # planted around admission can claim it and keep nothing).
    if lookup(f"{node}:{RESTORABLE}") is not True:
        raise ReconstructionUnsoundError(
            f"the durable source does not vouch for node {node} as LOSSLESS: its claim does not hold against the log"
        )
    if not rules.same_value(ev.as_json(f"lookup({node}:span_root)", lookup(f"{node}:span_root")), artifact.span_root):
        raise ReconstructionUnsoundError(f"the durable source gives node {node} another span root than the artifact's")
    # What the payload says besides its literals is the node's too: a summary, fact, item
    # or spill edited on the way, its digest recomputed, is not what the log holds.
    answers = {name: ev.as_json(f"lookup({node}:{name})", lookup(f"{node}:{name}"))
               for name in ("spills", "summary", "negative_facts", "unresolved")}
    spills = answers["spills"]
    logged_part: dict[str, JSON] = {
        "summary": answers["summary"],
        "negative_facts": answers["negative_facts"],
        "unresolved": answers["unresolved"],
        "spills": {r["key"]: r.get("handle") for r in spills if isinstance(r, dict) and type(r.get("key")) is str}
        if isinstance(spills, list) else None,
    }
    edited = [part for part, value in logged_part.items() if not rules.same_value(payload.get(part), value)]
    if edited:
        raise ReconstructionUnsoundError(
            f"the artifact's {', '.join(edited)} differ from node {node} in the durable source: it was altered"
        )
    return payload


def _checked_arguments(
    artifact: object, operation: object, lookup: object, uses: object, tool_results: object, prior: object
) -> tuple[Artifact, dict[str, JSON] | None, list[JSON], dict[str, JSON] | None]:
    """Return the artifact, ``uses``, ``tool_results`` and ``prior`` copied into exact types, or raise InvalidArgument naming the bad one."""
    given = read_artifact(artifact)
    as_operation(operation)
    ev.as_callable("lookup", lookup)
    acting = None if uses is None else ev.as_json_map("uses", uses)
    results = [ev.as_json(f"tool_results[{i}]", v) for i, v in enumerate(ev.as_list("tool_results", tool_results))]
    return given, acting, results, None if prior is None else ev.as_json_map("prior", prior)


def as_operation(operation: object) -> str:
    """Return ``operation``, an exact str (a known operation or not: an unknown one is refused later, as unsound).

    Raises:
        InvalidArgument: naming ``operation``: not a str.
    """
    if type(operation) is not str:
        raise InvalidArgument("operation", f"want a str such as 'authorize' or 'plan', got {type(operation).__name__}")
    return ev.as_text("operation", operation, empty=True)


#: The name :func:`lookup` answers for a summary node at ``pos`` as ``"<pos>:restorable"``:
#: True only when the node is LOSSLESS and its claim holds against the log.
RESTORABLE = "restorable"


def lookup(view: SessionView, name: str) -> JSON | None:
    """Return the exact value of a literal from the log: a binding key, or ``pos:path``.

    ``"<pos>:restorable"`` of a summary node is not a field: it says whether literals may
    be restored from it (LOSSLESS, and its claim holds against the log:
    :func:`compactstore.rules.restoration_problems`), which :func:`reconstruct` asks.

    ``name`` reads as ``pos:path`` when ASCII digits come before its first colon
    (:func:`compactstore.events.names_position`); any other name is a binding key
    (``"²:v"`` is one).

    What it returns is proven in the sealed head: the event at ``pos`` by an inclusion
    proof; for a binding key, every body up to the head is re-hashed into its root (the
    latest binding of a key is only known by reading them all).

    Raises:
        InvalidArgument: naming ``name``: not a str, or its digits spell no position (more than 19).
        KeyRequired: the store is keyed and was opened without its key.
        IntegrityError: a body read does not match its leaf or the sealed head.
    """
    if type(name) is not str:
        raise InvalidArgument("name", f"want a binding key or 'pos:path', got {type(name).__name__}")
    positional = ev.split_position("name", name)
    head = view.sealed_head()
    if positional is not None:
        pos, path = positional
        if not 0 <= pos < head.size:
            return None
        record = view.proven(pos)
        if isinstance(record.event, ev.Redacted):
            return None
        if isinstance(record.event, ev.Dropped):
            raise BodyDroppedError(pos, record.event.by, view.read(record.event.by).event.ts, f"look up {name!r}")
        if path == RESTORABLE and isinstance(record.event, ev.Summary):
            # Not a field: whether the node's LOSSLESS claim holds against the log now.
            return not rules.restoration_problems(view.facts(pos), record.event, pos)
        try:
            return rules.extract(record.event, path)
        except KeyError:
            return None
    found = None
    leaves = []
    for record in view.scan(0, head.size):
        event = record.event
        leaf = record.leaf if isinstance(event, ev.ERASED) else merkle.leaf_hash(record.body)
        if leaf != record.leaf:
            raise IntegrityError(f"event at pos {record.pos} does not match its leaf", session=view.name, pos=record.pos)
        leaves.append(leaf)
        if isinstance(event, ev.Binding) and event.key == name:
            found = event.value
        elif isinstance(event, ev.Redacted):
            found = None  # it may have bound the key anew: the latest value is unknown
    if len(leaves) != head.size or merkle.root_of_leaves(leaves) != head.root:
        raise IntegrityError(f"the log up to size {head.size} does not give the sealed head's root", session=view.name)
    return found


def restore(
    view: SessionView,
    artifact: Artifact,
    operation: str,
    *,
    uses: Mapping[str, JSON] | None = None,
    tool_results: Iterable[JSON] = (),
    attempt: str | None = None,
) -> tuple[dict[str, JSON], ev.Attempt | None]:
    """Reconstruct against the log; return the payload and, under ``attempt``, the attempt to record.

    A restoration operation acts on the artifact made again from the log
    (:func:`certified_artifact`), never on the caller's copy. The literals every earlier
    attempt under ``attempt`` used are read here to refuse early; the store holds the
    attempt to them again when it commits it (:func:`rules.admit_attempt`).

    Raises:
        InvalidArgument: ``attempt`` is not a non-empty str, or is missing for ``retry_idempotent``.
    """
    if as_operation(operation) in RESTORATION_OPS:
        artifact = certified_artifact(view, artifact)
    prior = None
    if attempt is not None:
        earlier = view.facts().attempts(ev.as_text("attempt", attempt))
        prior, said = rules.prior_literals(earlier), rules.said_literals(earlier)
    elif operation == "retry_idempotent":
        raise InvalidArgument("attempt", "retry_idempotent needs an attempt key: without one no earlier attempt "
                              "can be held against it", hint='pass attempt="<the idempotency key of the operation>"')
    payload = reconstruct(
        artifact, operation, lambda n: lookup(view, n), uses=uses, tool_results=tool_results,
        prior=said if prior is not None else None, prior_digests=prior,
    )
    if attempt is None:
        return payload, None
    raw = payload.get("literals")
    used = {**(raw if isinstance(raw, dict) else {}), **(uses or {})}
    return payload, ev.Attempt(key=attempt, operation=operation, literals=used)


# --- restoring a raw span ---------------------------------------------------------


class RestoredSpan(msgspec.Struct, frozen=True):
    """The raw events ``[start, stop)`` a summary node replaced, exactly as logged.

    Attributes:
        session: the session's name.
        node: the position of the node whose span this is.
        start, stop: the raw positions covered.
        bodies: each event's canonical bytes, in position order: exactly what its leaf hashes.
        certified_by: ``content_digest`` (one BLAKE3 over the bodies matched the node's)
            or ``span_root`` (the bodies' Merkle root was rebuilt, for a node written
            without a content digest).
    """

    session: str
    node: int
    start: int
    stop: int
    bodies: list[bytes]
    certified_by: Literal["content_digest", "span_root"]

    def events(self) -> list[ev.Event]:
        """Return the events, decoded from their bodies (not done until asked)."""
        return [ev.decode_canonical(b) for b in self.bodies]
