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

from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Literal

import msgspec
from blake3 import blake3

from . import events as ev
from . import merkle
from .compaction import Node, _unhex, content_digest_of
from .errors import CompactStoreError, IntegrityError, InvalidArgument, ReconstructionUnsoundError
from .events import JSON, LossClass
from .index import Index
from .markers import CONDITIONS, Marker, Reader, check, check_indexed
from .seal import head_mac

if TYPE_CHECKING:
    from .backends import Backend
    from .store import Record, Session

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
        mode: ``certified`` (context is the summary tier) or ``fallback`` (raw events).
        context: the items a resumed agent loads, in log order.
        reasons: why the mode was chosen (each failed condition, for a fallback).
        digest: BLAKE3 of the canonical encoding of mode, checkpoint and context: the
            same marker gives the same digest every time, on every backend.
    """

    session: str
    marker: int
    mode: Mode
    size: int
    root: bytes
    context: list[ContextItem]
    reasons: list[str]
    digest: bytes


def _verified_prefix(session: Session, marker_pos: int) -> tuple[list[ev.Event], list[bytes]]:
    """Return events and re-computed leaves ``[0, marker_pos]``, checked against the stored tree."""
    events, leaves = [], []
    for r in session.scan(0, marker_pos + 1):
        # A redacted body is gone; its stored leaf is vouched for by the tree below.
        leaf = r.leaf if isinstance(r.event, ev.Redacted) else merkle.leaf_hash(r.body)
        if leaf != r.leaf:
            raise IntegrityError(f"event at pos {r.pos} does not match its leaf", session=session.name, pos=r.pos)
        events.append(r.event)
        leaves.append(leaf)
    if len(leaves) != marker_pos + 1:
        raise IntegrityError(f"positions missing before pos {marker_pos}", session=session.name)
    if merkle.root_of_leaves(leaves) != session.head(marker_pos + 1).root:
        raise IntegrityError(
            f"events [0, {marker_pos + 1}) do not give the stored tree's root", session=session.name, pos=marker_pos
        )
    return events, leaves


def resume(session: Session, marker: Marker | int, *, rehash: bool = False) -> Resolution:
    """Resume from ``marker``; see :meth:`Session.resume`."""
    pos = marker.pos if isinstance(marker, Marker) else marker
    if not isinstance(pos, int):
        raise InvalidArgument("marker", f"want a Marker or its position, got {type(marker).__name__}")
    record = session.read(pos)
    m = Marker.from_record(record)
    index = None
    if not rehash and m.node is not None and 0 <= m.size <= pos and tuple(m.conditions) == CONDITIONS:
        index = Index.of(session, m.size)
    if index is not None:
        resolution = _resume_indexed(session, record, m, index)
        if resolution is not None:
            return resolution
    return _resume_full(session, pos, m)


def _resume_indexed(session: Session, record: Record, m: Marker, index: Index) -> Resolution | None:
    """Resume from a certified marker reading only what the context holds; None when it falls back.

    The checkpoint root is the stored tree's at ``m.size`` (O(log n) subtree roots). Every
    body read (the marker, the nodes on the path, their excerpts' and spills' sources,
    the events behind the negative facts the node retains, and the raw events of the
    context) is re-hashed and held against that root and the stored head after the
    marker; bodies not read are vouched for by the stored tree, and by
    :meth:`Store.verify`, which re-hashes every one.
    """
    pos, size, node = m.pos, m.size, m.node
    assert node is not None
    reader = Reader(session, size, verify=True)
    marker_leaf = merkle.leaf_hash(record.body)
    if marker_leaf != record.leaf:
        raise IntegrityError(f"event at pos {pos} does not match its leaf", session=session.name, pos=pos)
    root = session.head(size).root
    _check_checkpoint(session, m, root)
    violations, path = check_indexed(reader, lambda a, b: session.span_root(a, b).hex(), index, node, size)
    if violations:
        return None  # the fallback's context is every raw event: the full path gives it, reasons and all
    top = reader(node)
    assert isinstance(top, ev.Summary)
    reader.prefetch(f.pos for f in top.negative_facts)
    raw: list[Record] = []
    for start, stop in ((0, top.start), (top.stop, size)):
        for r in session.scan(start, stop):
            reader.add(r)
            raw.append(r)
    if len(raw) != top.start + size - top.stop:
        raise IntegrityError(f"positions missing before pos {size}", session=session.name)
    if _root_with(session, index.backend, index.sid, reader.leaves, size) != m.root:
        raise IntegrityError(
            f"events read under marker at pos {pos} do not give the stored tree's root at its checkpoint (size {size})",
            session=session.name,
            pos=pos,
        )
    if _root_with(session, index.backend, index.sid, {pos: marker_leaf}, pos + 1) != session.head(pos + 1).root:
        raise IntegrityError(
            f"marker at pos {pos} does not give the stored tree's root", session=session.name, pos=pos
        )
    reasons = [f"every condition holds and every digest on path {path} matches the log"]
    item = _summary_item(node, top)
    context: list[ContextItem] = [
        *(RawItem(r.pos, r.event) for r in raw if r.pos < top.start and r.event.kind not in ev.DERIVED_KINDS),
        item,
        *(RawItem(r.pos, r.event) for r in raw if r.pos >= top.stop and r.event.kind not in ev.DERIVED_KINDS),
    ]
    return _resolution(session, pos, "certified", size, root, context, reasons)


def _check_checkpoint(session: Session, m: Marker, root: bytes) -> None:
    """Raise IntegrityError unless the marker names ``root`` (with a valid MAC on a keyed store)."""
    if root != m.root:
        raise IntegrityError(
            f"raw checkpoint of marker at pos {m.pos} does not verify: root of [0, {m.size}) is {root.hex()[:16]}…, "
            f"the marker names {m.root.hex()[:16]}…",
            session=session.name,
            pos=m.pos,
        )
    key = session.store.mac_key
    if key is not None and m.mac != head_mac(key, session.name, m.size, root):
        raise IntegrityError(f"marker at pos {m.pos}: checkpoint MAC does not verify", session=session.name, pos=m.pos)


def _root_with(session: Session, backend: Backend, sid: int, leaves: Mapping[int, bytes], size: int) -> bytes:
    """Return the root of ``[0, size)`` from the ``leaves`` given and stored subtree roots for the rest.

    A subtree holding no given position comes from the store (O(log n) of them per run
    of given positions), so the root equals the stored tree's only if every given leaf
    is the one the tree holds.
    """
    known = sorted(p for p in leaves if p < size)
    need: set[tuple[int, int]] = set()

    def has(level: int, idx: int) -> bool:
        lo = bisect_left(known, idx << level)
        return lo < len(known) and known[lo] < (idx + 1) << level

    def plan(level: int, idx: int) -> None:
        if not has(level, idx):
            need.add((level, idx))
        elif level:
            plan(level - 1, 2 * idx)
            plan(level - 1, 2 * idx + 1)

    cover = merkle.cover(0, size)
    for level, idx in cover:
        plan(level, idx)
    stored = merkle.resolve(need, lambda coords: _subtrees(session, backend, sid, coords)) if need else {}

    def root(level: int, idx: int) -> bytes:
        if not has(level, idx):
            return stored[(level, idx)]
        if level == 0:
            return leaves[idx]
        return merkle.node_hash(root(level - 1, 2 * idx), root(level - 1, 2 * idx + 1))

    return merkle.fold([root(level, idx) for level, idx in cover]) if cover else merkle.empty_root()


def _subtrees(session: Session, backend: Backend, sid: int, coords: list[tuple[int, int]]) -> list[bytes]:
    """Return the stored roots at ``coords``, reading runs of neighbours with one range query each."""
    got: dict[tuple[int, int], bytes] = {}
    for level in sorted({lv for lv, _ in coords}):
        wanted = sorted(i for lv, i in coords if lv == level)
        runs: list[list[int]] = [[wanted[0], wanted[0]]]
        for i in wanted[1:]:
            if i - runs[-1][1] <= _GAP:
                runs[-1][1] = i
            else:
                runs.append([i, i])
        for lo, hi in runs:
            got.update(((level, i), h) for i, h in backend.subtree_range(sid, level, lo, hi + 1))
    missing = [c for c in coords if c not in got]
    if missing:
        level, idx = missing[0]
        raise IntegrityError(f"subtree ({level}, {idx}) is missing", session=session.name, pos=idx << level)
    return [got[c] for c in coords]


#: Neighbouring stored roots closer than this are read by one range query, the ones between included.
_GAP = 16


def _resume_full(session: Session, pos: int, m: Marker) -> Resolution:
    """Resume re-hashing every body up to the marker and re-running the full checks."""
    events, leaves = _verified_prefix(session, pos)
    size = m.size
    if not 0 <= size <= pos:
        raise IntegrityError(f"marker at pos {pos} names checkpoint size {size}, after itself", session=session.name, pos=pos)
    root = merkle.root_of_leaves(leaves[:size])
    _check_checkpoint(session, m, root)
    events, leaves = events[:size], leaves[:size]
    reasons: list[str]
    mode: Mode
    if m.node is None:
        mode, reasons = "fallback", ["raw-checkpoint marker: the context is the raw log"]
    else:
        violations, path = check(events, leaves, m.node)
        reasons = [str(v) for v in violations]
        if tuple(m.conditions) != CONDITIONS:
            reasons.insert(0, f"marker certified {m.conditions}, not every condition {list(CONDITIONS)}")
        mode = "fallback" if reasons else "certified"
        if mode == "certified":
            reasons = [f"every condition holds and every digest on path {path} matches the log"]
    context = _certified(events, m.node) if mode == "certified" and m.node is not None else _raw(events, 0, size)
    return _resolution(session, pos, mode, size, root, context, reasons)


def _resolution(
    session: Session, pos: int, mode: Mode, size: int, root: bytes, context: list[ContextItem], reasons: list[str]
) -> Resolution:
    body = _encoder.encode({"marker": pos, "mode": mode, "size": size, "root": root.hex(), "context": context})
    digest = blake3(b"compactstore/resolution/v1\x00" + body).digest()
    return Resolution(session.name, pos, mode, size, root, context, reasons, digest)


def _raw(events: list[ev.Event], start: int, stop: int) -> list[ContextItem]:
    return [RawItem(p, events[p]) for p in range(start, stop) if events[p].kind not in ev.DERIVED_KINDS]


def _certified(events: list[ev.Event], node_pos: int) -> list[ContextItem]:
    n = events[node_pos]
    assert isinstance(n, ev.Summary)
    return [*_raw(events, 0, n.start), _summary_item(node_pos, n), *_raw(events, n.stop, len(events))]


def _summary_item(node_pos: int, n: ev.Summary) -> SummaryItem:
    return SummaryItem(
        node_pos, n.tier, n.start, n.stop, n.span_root, n.summary, n.loss, list(n.negative_facts),
        list(n.unresolved), list(n.kept), list(n.spills), n.contract, list(n.resolved),
    )


# --- artifacts and reconstruction --------------------------------------------------


class Artifact(msgspec.Struct, frozen=True):
    """What a later instance expands: loss class, payload (summary and literals), digest.

    ``digest`` is BLAKE3 over the payload and the node's span root, so an artifact
    altered on its way through a context window no longer verifies.
    """

    loss: LossClass | str | None
    payload: dict[str, JSON]
    digest: str | None
    span_root: str | None = None


def artifact_digest(payload: Mapping[str, JSON], span_root: str | None) -> str:
    """Return the digest an artifact with this payload and span root must carry."""
    body = _encoder.encode({"payload": payload, "span_root": span_root})
    return blake3(b"compactstore/artifact/v1\x00" + body).hexdigest()


def literal_name(excerpt: ev.Excerpt, binding_keys: Mapping[int, str]) -> str:
    """Return how an excerpt is named among an artifact's literals: its binding key, or ``pos:path``."""
    if excerpt.path == "value" and excerpt.pos in binding_keys:
        return binding_keys[excerpt.pos]
    return f"{excerpt.pos}:{excerpt.path}"


def artifact(session: Session, node: Node) -> Artifact:
    """Return the artifact of ``node``; see :meth:`Session.artifact`."""
    keys = {}
    for e in node.kept:
        event = session.read(e.pos).event
        if isinstance(event, ev.Binding):
            keys[e.pos] = event.key
    literals = {literal_name(e, keys): e.value for e in node.kept}
    payload: dict[str, JSON] = {
        "summary": node.summary,
        "literals": literals,
        "negative_facts": msgspec.to_builtins(node.negative_facts),
        "unresolved": msgspec.to_builtins(node.unresolved),
        "spills": {r.key: r.handle for r in node.spills},
    }
    span_root = node.span_root.hex()
    return Artifact(node.loss, payload, artifact_digest(payload, span_root), span_root)


def _loss_of(artifact: Artifact) -> LossClass:
    # An absent or unreadable tag means LOSSY_LITERAL: a false LOSSLESS costs a silent
    # divergence, a false LOSSY only a re-fetch.
    try:
        return LossClass(artifact.loss)
    except ValueError:
        return LossClass.LOSSY_LITERAL


def reconstruct(
    artifact: Artifact,
    operation: str,
    lookup: Callable[[str], JSON | None],
    *,
    uses: Mapping[str, JSON] | None = None,
    tool_results: Iterable[JSON] = (),
    prior: Mapping[str, JSON] | None = None,
) -> dict[str, JSON]:
    """Expand (tolerant operations) or restore (restoration operations) an artifact's payload.

    Args:
        operation: ``summarize``, ``plan``, ``brainstorm``, ``rank`` (tolerant) or
            ``authorize``, ``commit``, ``emit_authoritative``, ``retry_idempotent``.
        lookup: the durable source: returns a literal's exact value, or None.
        uses: the literals (name -> value) the operation is about to act on; each must
            be in the artifact or among ``tool_results`` (invention guard).
        tool_results: values produced by tool calls in the current turn.
        prior: the literals an earlier attempt of this operation used (retry guard).

    Raises:
        ReconstructionUnsoundError: naming the literal and why.
    """
    if operation not in TOLERANT_OPS | RESTORATION_OPS:
        raise ReconstructionUnsoundError(f"unknown operation {operation!r}: refusing to guess its loss tolerance")
    payload = dict(artifact.payload) if isinstance(artifact.payload, dict) else {}
    raw_literals = payload.get("literals")
    literals: dict[str, JSON] = raw_literals if isinstance(raw_literals, dict) else {}
    produced = [_canonical(v) for v in tool_results]
    for name, value in (uses or {}).items():
        if name in literals:
            if _canonical(literals[name]) != _canonical(value):
                raise ReconstructionUnsoundError(f"literal {name!r}: {value!r} differs from the artifact's {literals[name]!r}")
        elif _canonical(value) not in produced:
            raise ReconstructionUnsoundError(
                f"literal {name!r} = {value!r} is in neither the artifact nor a tool result of this turn: it would be invented"
            )
    acting = {**literals, **(uses or {})}
    for name, value in (prior or {}).items():
        if name in acting and _canonical(acting[name]) != _canonical(value):
            raise ReconstructionUnsoundError(
                f"retry reconstructs literal {name!r} as {acting[name]!r}, but the earlier attempt used {value!r}"
            )
    if operation in TOLERANT_OPS:
        return payload
    loss = _loss_of(artifact)
    if loss is not LossClass.LOSSLESS or not artifact.digest:
        raise ReconstructionUnsoundError(
            f"operation {operation!r} needs restoration, but the artifact is {loss.value} with digest "
            f"{artifact.digest!r}: re-fetch the literals from the durable source instead"
        )
    if artifact.digest != artifact_digest(artifact.payload, artifact.span_root):
        raise ReconstructionUnsoundError("the artifact's digest does not verify: it was altered after it was made")
    for name, value in literals.items():
        durable = lookup(name)
        if durable is None:
            raise ReconstructionUnsoundError(f"literal {name!r} is absent from the durable source: cannot restore it")
        if _canonical(durable) != _canonical(value):
            raise ReconstructionUnsoundError(
                f"literal {name!r}: the artifact says {value!r}, the durable source {durable!r}: the compaction layer is corrupt"
            )
    return payload


def _canonical(value: JSON) -> bytes:
    return _encoder.encode(value)


def lookup(session: Session, name: str) -> JSON | None:
    """Return the exact value of a literal from the log: a binding key, or ``pos:path``."""
    from .compaction import _extract

    if ":" in name and name.split(":", 1)[0].isdigit():
        pos_text, path = name.split(":", 1)
        pos = int(pos_text)
        if not 0 <= pos < session.size:
            return None
        record = session.read(pos)
        if merkle.leaf_hash(record.body) != record.leaf:
            raise IntegrityError(f"event at pos {pos} does not match its leaf", session=session.name, pos=pos)
        try:
            return _extract(record.event, path)
        except (KeyError, IndexError, ValueError):
            return None
    found = None
    for record in session.scan():
        if record.kind == "binding" and record.event.key == name:  # type: ignore[attr-defined]
            if merkle.leaf_hash(record.body) != record.leaf:
                raise IntegrityError(f"binding at pos {record.pos} does not match its leaf", session=session.name, pos=record.pos)
            found = record.event.value  # type: ignore[attr-defined]
    return found


def restore(
    session: Session,
    artifact: Artifact,
    operation: str,
    *,
    uses: Mapping[str, JSON] | None = None,
    tool_results: Iterable[JSON] = (),
    attempt: str | None = None,
) -> dict[str, JSON]:
    """Reconstruct against this session's log, recording the attempt's literals under ``attempt``."""
    prior = None
    if attempt is not None:
        for record in session.scan():
            if isinstance(record.event, ev.Attempt) and record.event.key == attempt:
                prior = record.event.literals
    payload = reconstruct(
        artifact, operation, lambda n: lookup(session, n), uses=uses, tool_results=tool_results, prior=prior
    )
    if attempt is not None:
        raw = payload.get("literals")
        used = {**(raw if isinstance(raw, dict) else {}), **(uses or {})}
        session.append(ev.Attempt(key=attempt, operation=operation, literals=used))
    return payload


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
        return [ev.decode(b) for b in self.bodies]


class _NodeSpan(msgspec.Struct, frozen=True, tag="node", tag_field="kind"):
    """The fields of a summary node's body that a restoration reads; the others are skipped, not built."""

    start: int
    stop: int
    span_root: str
    content_digest: str | None = None


_node_span = msgspec.json.Decoder(_NodeSpan)

#: Bodies joined per BLAKE3 update when a span is certified (the digest is the same for
#: any split). A join of about a hundred KiB is reused from the heap and hashed while
#: in cache; one join of a whole 1 MB span is a fresh allocation, paged in on each call,
#: and costs about a quarter more CPU (1,000 bodies of 1.15 KB).
_DIGEST_ROWS = 128


def restore_span(session: Session, node: Node | int) -> RestoredSpan:
    """Return the raw events a node covers, certified; see :meth:`Session.restore_span`.

    What is trusted: the latest tree head, by its seal (a keyed MAC in a keyed store).
    The node's body is re-hashed and its leaf proven in that head, so the node is the
    one the store appended, and the store refused it at append unless its content
    digest and span root were those of the span's stored bodies and leaves. The bodies
    read now are then certified by matching that digest (or, for a node without one,
    by rebuilding that span root from them). The span root is not recomputed from the
    stored tree: the node's proven leaf already vouches for it.
    """
    pos = node.pos if isinstance(node, Node) else node
    store, backend, name = session.store, session.store.backend, session.name
    # The node is read again from the log: a Node passed in is only a position here.
    sid = session._sid()
    row = backend.row(sid, pos) if sid is not None else None
    if sid is None or row is None:
        raise InvalidArgument("node", f"no event at {pos} in session {name!r}")
    try:
        n = _node_span.decode(row.body)  # type: ignore[arg-type]
    except (msgspec.DecodeError, TypeError):
        # Not a node (or erased): the full decoding says which, in its own words.
        Node.from_record(session._record(row))
        raise InvalidArgument("node", f"pos {pos} is not a summary node") from None
    if merkle.leaf_hash(row.body) != row.leaf:  # type: ignore[arg-type]
        raise IntegrityError(f"node at pos {pos} does not match its leaf", session=name, pos=pos)
    if store.keyed and store.mac_key is None:
        raise CompactStoreError("this store is keyed", hint="open it with its key to certify a restoration")
    head = backend.head(sid)
    if head is None or head.seal != store._seal(name, head.size, head.root, head.prev):
        raise IntegrityError("the latest tree head's seal does not verify", session=name)
    if not 0 <= n.start < n.stop <= pos < head.size:
        raise IntegrityError(f"node at pos {pos} covers [{n.start}, {n.stop}), not a span before it", session=name, pos=pos)
    proof = merkle.serve(merkle.inclusion_spans(pos, head.size), lambda c: backend.hashes(sid, c))
    if merkle.root_from_inclusion(row.leaf, pos, head.size, proof) != head.root:
        raise IntegrityError(f"node at pos {pos} is not in the tree of the latest head", session=name, pos=pos)
    start, stop = n.start, n.stop
    got = backend.bodies(sid, start, stop)
    if len(got) != stop - start:
        raise IntegrityError(f"[{start}, {stop}) holds {len(got)} events, want {stop - start}", session=name, pos=start)
    digest = None if n.content_digest is None else _unhex(n.content_digest)
    try:
        # Hashing refuses a None (redacted) body by itself: no separate pass over the span.
        if digest is not None:
            by: Literal["content_digest", "span_root"] = "content_digest"
            ok = content_digest_of(got[i : i + _DIGEST_ROWS] for i in range(0, len(got), _DIGEST_ROWS)) == digest  # type: ignore[misc]
        else:
            by = "span_root"
            want = _unhex(n.span_root)
            ok = merkle.span_root_of_leaves(merkle.leaf_hashes(got), start, stop, first=start) == want  # type: ignore[arg-type]
    except TypeError:
        if None not in got:
            raise
        erased = sorted(p for p in backend.redactions(sid) if start <= p < stop)
        raise ReconstructionUnsoundError(
            f"[{start}, {stop}) cannot be restored: positions {erased} were redacted, only their leaves remain"
        ) from None
    if not ok:
        raise IntegrityError(
            f"the bodies of [{start}, {stop}) do not give the {by.replace('_', ' ')} of node at pos {pos}",
            session=name, pos=pos,
        )
    return RestoredSpan(name, pos, start, stop, got, by)  # type: ignore[arg-type]
