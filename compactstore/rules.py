"""Every rule of the store, written once, as pure functions over :class:`compactstore.facts.Facts`.

- **The gate** (seed 001): before a lossy compaction, an open obligation that needs a
  non-regenerable binding whose latest value is bound inside the span makes it keep
  the binding verbatim, spill it, or be refused (:func:`risks`).
- **Loss-class monotonicity**: a node is no better than its weakest child (:func:`weakest`).
- **The lossless check**: a LOSSLESS node keeps every binding, negative fact and open
  or resolved item of its span (:func:`lossless_problems`).
- **The marker conditions** (seed 003), checked at emission and at resume by the same
  code: closure, negative-fact retention, anchoring (:func:`check_marker`).
- **Admission**: what the store checks of every derived event (summary node, spill,
  marker, attempt), whichever way it enters the log (:func:`admit_node`,
  :func:`admit_spill`, :func:`admit_marker`, :func:`admit_attempt`).
- **The retry guard** (seed 000): an attempt under an idempotency key acts on the
  literals every earlier attempt under that key acted on (:func:`prior_literals`).

Rules read event fields, never prose, and do no I/O: where the facts come from (a pass
over the log or the structural index) is the caller's choice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import msgspec
from blake3 import blake3

from . import events as ev
from .errors import (
    CompactionInvariantError,
    InvalidArgument,
    InvalidEvent,
    MarkerInvalid,
    ReconstructionUnsoundError,
)
from .events import Excerpt, LossClass
from .facts import Facts

CONDITIONS = ("closure", "negative_facts", "anchoring")
Condition = Literal["closure", "negative_facts", "anchoring"]

#: Loss classes from best to worst.
LOSS_ORDER = {LossClass.LOSSLESS: 0, LossClass.LOSSY_GIST: 1, LossClass.LOSSY_LITERAL: 2}


class Violation(msgspec.Struct, frozen=True, order=True):
    """One failed marker condition: which, at which position, about which item."""

    condition: Condition
    pos: int
    item: str

    def __str__(self) -> str:
        return f"{self.condition} at pos {self.pos}: {self.item}"


class Risk(msgspec.Struct, frozen=True):
    """An open obligation that needs a non-regenerable binding bound inside the span."""

    obligation: str
    obligation_pos: int
    key: str
    binding_pos: int

    def __str__(self) -> str:
        return (
            f"obligation {self.obligation!r} (pos {self.obligation_pos}) needs non-regenerable "
            f"binding {self.key!r} bound at pos {self.binding_pos}"
        )


# --- literals ------------------------------------------------------------------------


def extract(event: ev.Event, path: str) -> ev.JSON:
    """Return field ``path`` (``value``, ``args.sql``, ``output.rows[0]``) of ``event``.

    Raises:
        KeyError: the event has no such field.
    """
    value: object = event
    for part in path.replace("[", ".[").split("."):
        if part.startswith("[") and part.endswith("]") and isinstance(value, list):
            try:
                value = value[int(part[1:-1])]
            except (ValueError, IndexError):
                raise KeyError(path) from None
        elif isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, msgspec.Struct) and part in value.__struct_fields__:
            value = getattr(value, part)
        else:
            raise KeyError(path)
    return msgspec.to_builtins(value)


def value_digest(value: ev.JSON) -> str:
    """Return the hex BLAKE3 digest of a value's canonical JSON (what a spill records)."""
    return blake3(ev.encode_json(value).encode()).hexdigest()


def kept_keys(node: ev.Summary, f: Facts) -> set[str]:
    """Return the binding keys a node keeps verbatim or spilled."""
    return f.keys_at({e.pos for e in node.kept if e.path == "value"}) | {sp.key for sp in node.spills}


def weakest(losses: Iterable[LossClass]) -> LossClass:
    """Return the weakest of ``losses``: what a node over children of these classes can claim at best."""
    return max(losses, key=LOSS_ORDER.__getitem__)


# --- the gate and the lossless check --------------------------------------------------


def risks(f: Facts, start: int, stop: int, kept: set[str] = frozenset()) -> list[Risk]:  # type: ignore[assignment]
    """Return each open obligation that needs a non-regenerable binding last bound in ``[start, stop)``."""
    out = []
    latest: dict[str, tuple[int, bool] | None] = {}
    for opos, name, needs in f.open_obligations():
        for key in needs:
            if key not in latest:
                latest[key] = f.latest_binding(key, f.size)
            found = latest[key]
            if found is None or key in kept:
                continue
            bpos, regenerable = found
            if start <= bpos < stop and not regenerable:
                out.append(Risk(name, opos, key, bpos))
    return out


def unbound_needs(f: Facts, needs: Iterable[str]) -> list[str]:
    """Return those of ``needs`` that no binding before ``f.size`` names, in order.

    An obligation on such a key puts nothing at risk, so the gate would protect nothing.
    """
    return [key for key in dict.fromkeys(needs) if f.latest_binding(key, f.size) is None]


def gate_error(found: Sequence[Risk], start: int, stop: int) -> CompactionInvariantError:
    """Return the gate's refusal of a lossy compaction of ``[start, stop)`` that would lose ``found``."""
    lines = "; ".join(str(r) for r in found)
    return CompactionInvariantError(
        f"compacting [{start}, {stop}) would lose what open obligations need: {lines}",
        risks=found,
        hint='pass on_risk="preserve" to keep these bindings verbatim, or on_risk="spill" to spill them',
    )


def lossless_problems(f: Facts, node: ev.Summary) -> list[str]:
    """Return why ``node`` cannot be LOSSLESS: each binding, negative fact or item of its span it does not keep."""
    start, stop = node.start, node.stop
    keys = kept_keys(node, f)
    retained = {x.pos for x in node.negative_facts}
    missing = sorted(k for k in f.keys_in(start, stop) if k not in keys)
    missing_facts = [x.pos for x in f.negatives_in(start, stop) if x.pos not in retained]
    items, done = set(node.unresolved), set(node.resolved)
    missing_items = [i.id for i in f.unresolved_at(start, stop) if i not in items]
    missing_items += [i.id for i in f.resolved_in(start, stop) if i not in done]
    problems = []
    if missing:
        problems.append(f"bindings not kept: {missing}")
    if missing_facts:
        problems.append(f"negative facts not retained at pos {missing_facts}")
    if missing_items:
        problems.append(f"open or resolved items not listed: {missing_items}")
    return problems


def lossless_error(node: ev.Summary, problems: Sequence[str]) -> CompactionInvariantError:
    """Return the refusal of a LOSSLESS claim that ``problems`` contradict."""
    return CompactionInvariantError(f"[{node.start}, {node.stop}) cannot be LOSSLESS: " + "; ".join(problems))


# --- the marker conditions -------------------------------------------------------------


def check_marker(f: Facts, node_pos: int) -> tuple[list[Violation], list[int]]:
    """Check closure, negative-fact retention and anchoring for resuming from ``node_pos`` at ``f.size``.

    Returns the violations (sorted; empty when the marker may be emitted or trusted) and
    the positions of the nodes on the path.
    """
    found: list[Violation] = []
    top = f.event(node_pos)
    if not isinstance(top, ev.Summary):
        return [Violation("anchoring", node_pos, "not a summary node before the checkpoint")], []
    path = _check_path(f, node_pos, found)
    listed = set(top.unresolved)
    for item in f.unresolved_at(top.start, top.stop):
        if item not in listed:
            found.append(Violation(
                "closure", item.pos, f"{item.kind} {item.id!r} is open at the boundary but not listed as UNRESOLVED"
            ))
    _check_resolved(top, f.resolved_in(top.start, top.stop), found)
    retained = {x.pos for x in top.negative_facts}
    for fact in f.negatives_in(top.start, top.stop):
        if fact.pos not in retained:
            found.append(Violation("negative_facts", fact.pos, f"{fact.status} item dropped: {fact.text}"))
    for r in risks(f, top.start, top.stop, kept_keys(top, f)):
        found.append(Violation(
            "anchoring", r.binding_pos,
            f"binding {r.key!r} needed by open obligation {r.obligation!r} (pos {r.obligation_pos}) "
            "is neither kept nor spilled",
        ))
    return sorted(set(found)), path


def _check_resolved(top: ev.Summary, resolved: Iterable[ev.Item], found: list[Violation]) -> None:
    """Hold ``top.resolved`` to ``resolved``: the items opened before its span and closed inside it.

    A missing one looks still open in a resumed context; one listed that was not closed
    there would tell the agent something was done that was not.
    """
    listed, want = set(top.resolved), set(resolved)
    for item in sorted(want - listed, key=lambda i: (i.pos, i.kind, i.id)):
        found.append(Violation(
            "closure", item.pos, f"{item.kind} {item.id!r} is closed in the span but not listed as RESOLVED"
        ))
    for item in sorted(listed - want, key=lambda i: (i.pos, i.kind, i.id)):
        found.append(Violation(
            "closure", item.pos,
            f"{item.kind} {item.id!r} is listed as RESOLVED but was not opened before the span and closed in it",
        ))


def _check_path(f: Facts, node_pos: int, found: list[Violation]) -> list[int]:
    """Check every node from ``node_pos`` down through its children; return their positions."""
    path, stack = [], [node_pos]
    while stack:
        pos = stack.pop()
        node = f.event(pos)
        if not isinstance(node, ev.Summary):
            found.append(Violation("anchoring", pos, "path names a position that is not a summary node"))
            continue
        path.append(pos)
        if node_anchoring(f, node, pos, found) and node.tier == 2:
            stack.extend(c for c in node.children if c < pos)
    return sorted(path)


def node_anchoring(f: Facts, node: ev.Summary, pos: int, found: list[Violation]) -> bool:
    """Add to ``found`` how the node at ``pos`` does not match the log; say whether its span is well formed.

    The node's span root must be the log's, an L2's children contiguous L1 nodes
    covering its span, and its excerpts and spills must match their sources.
    """
    if not 0 <= node.start < node.stop <= pos:
        found.append(Violation("anchoring", pos, f"span [{node.start}, {node.stop}) is not before the node"))
        return False
    root = f.span_root(node.start, node.stop).hex()
    if node.span_root != root:
        found.append(Violation(
            "anchoring", pos,
            f"span root of [{node.start}, {node.stop}) is {node.span_root[:16]}…, the log gives {root[:16]}…",
        ))
    if node.tier == 2:
        kids = [f.event(c) if 0 <= c < pos else None for c in node.children]
        spans = [(k.start, k.stop) for k in kids if isinstance(k, ev.Summary) and k.tier == 1]
        contiguous = len(spans) == len(kids) > 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        if not contiguous or spans[0][0] != node.start or spans[-1][1] != node.stop:
            found.append(Violation("anchoring", pos, "children are not contiguous L1 nodes covering its span"))
    for e in node.kept:
        source = f.event(e.pos) if 0 <= e.pos < pos else None
        try:
            ok = source is not None and extract(source, e.path) == e.value
        except KeyError:
            ok = False
        if not ok:
            found.append(Violation("anchoring", e.pos, f"kept excerpt {e.path!r} does not match the log"))
    for ref in node.spills:
        if not _spill_matches(f, ref, pos):
            found.append(Violation("anchoring", ref.source, f"spill {ref.handle} of {ref.key!r} does not match the log"))
    return True


def spill_position(handle: str) -> int | None:
    """Return the position a spill handle (``spill:<pos>``) names, or None when it names none."""
    prefix, _, digits = handle.partition(":")
    if prefix != "spill" or not digits.isdigit() or int(digits) >= 2**63:
        return None
    return int(digits)


def _spill_matches(f: Facts, ref: ev.SpillRef, before: int) -> bool:
    at = spill_position(ref.handle)
    spill = f.event(at) if at is not None and at < before else None
    source = f.event(ref.source) if 0 <= ref.source < before else None
    return (
        isinstance(spill, ev.Spill)
        and isinstance(source, ev.Binding)
        and spill.key == ref.key == source.key
        and spill.value == source.value
        and value_digest(spill.value) == spill.digest == ref.digest
    )


def marker_error(node: int, violations: Sequence[Violation]) -> MarkerInvalid:
    """Return the error that refuses a marker for ``node``, naming the first violations."""
    return MarkerInvalid(
        f"marker for node at pos {node} refused: " + "; ".join(str(v) for v in violations[:5])
        + (f"; and {len(violations) - 5} more" if len(violations) > 5 else ""),
        violations,
    )


# --- admission of derived events -------------------------------------------------------


def overlap(f: Facts, tier: int, start: int, stop: int, before: int) -> InvalidArgument | None:
    """Return the refusal of a tier-``tier`` node over ``[start, stop)`` that overlaps one of the same tier before ``before``."""
    for pos, node in f.nodes():
        if pos < before and node.tier == tier and max(start, node.start) < min(stop, node.stop):
            return InvalidArgument(
                "span", f"[{start}, {stop}) overlaps the L{tier} node at pos {pos} covering [{node.start}, {node.stop})"
            )
    return None


def children_of(f: Facts, node: ev.Summary, pos: int) -> list[ev.Summary]:
    """Return the L1 children of an L2 ``node`` at ``pos``, checked to be contiguous and cover its span.

    Raises:
        InvalidArgument: naming ``nodes``: a child is not an earlier L1 node, or they are not contiguous.
    """
    kids: list[ev.Summary] = []
    for c in node.children:
        kid = f.event(c) if 0 <= c < pos else None
        if not isinstance(kid, ev.Summary):
            raise InvalidArgument("nodes", f"pos {c} is not a summary node before pos {pos}")
        if kid.tier != 1:
            raise InvalidArgument("nodes", f"node at pos {c} is L{kid.tier}; an L2 digests L1 nodes")
        kids.append(kid)
    if not kids:
        raise InvalidArgument("nodes", "want one or more L1 nodes (or their positions)")
    for (a, ka), (b, kb) in zip(zip(node.children, kids), zip(node.children[1:], kids[1:])):
        if ka.stop != kb.start:
            raise InvalidArgument(
                "nodes",
                f"nodes at pos {a} and {b} are not contiguous: [{ka.start}, {ka.stop}) then [{kb.start}, {kb.stop})",
            )
    if kids[0].start != node.start or kids[-1].stop != node.stop:
        raise InvalidArgument("nodes", f"the children cover [{kids[0].start}, {kids[-1].stop}), not [{node.start}, {node.stop})")
    return kids


def admit_node(f: Facts, node: ev.Summary, pos: int) -> None:
    """Refuse a summary node at ``pos`` that breaks a rule; ``f`` is the log before it.

    Checked: its span and tier; no overlap with a node of its tier; an L2's children;
    loss-class monotonicity; its excerpts and spills against the log; the lossless
    check for a LOSSLESS claim, and the gate for a lossy tier-1 node. The span root and
    content digest, which need the span's bodies, are the store's to check.

    Raises:
        InvalidEvent, InvalidArgument: the node is malformed or overlaps another.
        CompactionInvariantError: it claims a loss class it does not meet, its excerpts
            or spills do not match the log, or it loses what an open obligation needs.
    """
    start, stop = node.start, node.stop
    if not 0 <= start < stop <= min(pos, f.size):
        raise InvalidEvent("start", f"span [{start}, {stop}) is not a non-empty span before pos {pos}")
    if node.tier not in (1, 2):
        raise InvalidEvent("tier", f"want 1 (over raw events) or 2 (over L1 nodes), got {node.tier}")
    found = overlap(f, node.tier, start, stop, pos)
    if found is not None:
        raise found
    if node.tier == 1:
        if node.children:
            raise InvalidEvent("children", "an L1 node covers raw events and has no children")
    else:
        floor = weakest(kid.loss for kid in children_of(f, node, pos))
        if LOSS_ORDER[node.loss] < LOSS_ORDER[floor]:
            raise CompactionInvariantError(
                f"an L2 node cannot be {node.loss.value} over children that are {floor.value}"
            )
    mismatched: list[Violation] = []
    node_anchoring(f, node, pos, mismatched)
    mismatched = [v for v in mismatched if "span root" not in v.item]  # the store checks it against the bodies
    if mismatched:
        raise CompactionInvariantError(
            f"node at pos {pos} does not match the log: " + "; ".join(str(v) for v in mismatched)
        )
    if node.loss is LossClass.LOSSLESS:
        problems = lossless_problems(f, node)
        if problems:
            raise lossless_error(node, problems)
    elif node.tier == 1:
        at_risk = risks(f, start, stop, kept_keys(node, f))
        if at_risk:
            raise gate_error(at_risk, start, stop)


def admit_spill(f: Facts, spill: ev.Spill, pos: int) -> None:
    """Refuse a spill at ``pos`` that is not the exact value of the binding it names, with its digest.

    Raises:
        InvalidEvent: naming ``source``, ``key``, ``value`` or ``digest``.
    """
    source = f.event(spill.source) if 0 <= spill.source < pos else None
    if not isinstance(source, ev.Binding):
        raise InvalidEvent("source", f"pos {spill.source} is not a binding before pos {pos}")
    if source.key != spill.key:
        raise InvalidEvent("key", f"got {spill.key!r}, the binding at pos {spill.source} binds {source.key!r}")
    if source.value != spill.value:
        raise InvalidEvent("value", f"is not the value bound at pos {spill.source}")
    if value_digest(spill.value) != spill.digest:
        raise InvalidEvent("digest", f"got {spill.digest[:16]}…, the value gives {value_digest(spill.value)[:16]}…")


def admit_marker(f: Facts, marker: ev.RecoveryMarker, pos: int) -> list[int]:
    """Refuse a marker at ``pos`` whose claims do not hold; ``f`` is the log at its checkpoint ``marker.size``.

    A raw-checkpoint marker (no node) claims no condition. A marker that names a node
    claims every condition, which must hold at its checkpoint, over the path it records.
    Its root and MAC are the store's to check. Returns the path.

    Raises:
        InvalidEvent: its checkpoint is not before it, or it claims conditions without a node.
        MarkerInvalid: a condition fails, naming each violation.
    """
    if not 0 <= marker.size <= pos:
        raise InvalidEvent("size", f"checkpoint size {marker.size} is not in [0, {pos}]")
    if marker.node is None:
        if marker.conditions or marker.path:
            raise InvalidEvent("conditions", "a raw-checkpoint marker certifies no condition and has no path")
        return []
    if tuple(marker.conditions) != CONDITIONS:
        raise InvalidEvent("conditions", f"a marker that names a node certifies {list(CONDITIONS)}, got {marker.conditions}")
    violations, path = check_marker(f, marker.node)
    if violations:
        raise marker_error(marker.node, violations)
    if list(marker.path) != path:
        raise InvalidEvent("path", f"got {marker.path}, the node's path is {path}")
    return path


def prior_literals(attempts: Iterable[tuple[int, ev.Attempt]]) -> dict[str, ev.JSON]:
    """Return the literals the ``attempts`` under one key acted on: each name with the value it was first given.

    Every attempt counts, one that acted on no literal included, so a later attempt
    cannot clear what an earlier one used; admitted attempts agree on every name they share.
    """
    used: dict[str, ev.JSON] = {}
    for _, attempt in attempts:
        for name, value in attempt.literals.items():
            used.setdefault(name, value)
    return used


def retry_conflicts(prior: Mapping[str, ev.JSON], acting: Mapping[str, ev.JSON]) -> list[str]:
    """Return why acting on ``acting`` breaks the retry guard: each literal whose value differs from ``prior``'s.

    Values are compared by their canonical JSON, so ``1``, ``1.0`` and ``true`` differ.
    """
    return [
        f"retry reconstructs literal {name!r} as {acting[name]!r}, but the earlier attempt used {value!r}"
        for name, value in prior.items()
        if name in acting and ev.encode_json(acting[name]) != ev.encode_json(value)
    ]


def admit_attempt(f: Facts, attempt: ev.Attempt, pos: int) -> None:
    """Refuse an attempt at ``pos`` that acts on a literal other than an earlier attempt under its key used.

    ``f`` is the log before it. The store runs this inside the write transaction, so of
    two writers racing under one key with different literals, the second to commit is refused.

    Raises:
        ReconstructionUnsoundError: naming the literal and both values; nothing is written.
    """
    conflicts = retry_conflicts(prior_literals(f.attempts(attempt.key)), attempt.literals)
    if conflicts:
        raise ReconstructionUnsoundError(f"attempt {attempt.key!r} at pos {pos}: " + "; ".join(conflicts))


def excerpt_of(event: ev.Event, pos: int, path: str) -> Excerpt:
    """Return field ``path`` of ``event`` (at ``pos``) as an excerpt.

    Raises:
        InvalidArgument: naming ``keep``: no such field.
    """
    try:
        return Excerpt(pos, path, extract(event, path))
    except KeyError:
        raise InvalidArgument("keep", f"event at pos {pos} has no field {path!r}") from None
