"""Every rule of the store, written once, as pure functions over :class:`compactstore.facts.Facts`.

- **The gate**: before a lossy compaction, an open obligation that needs a
  non-regenerable binding whose live value (its latest binding at the checkpoint) is
  bound inside the span makes it keep that value verbatim, spill it, or be refused
  (:func:`risks`). A binding is kept by the position of its live value, never by its
  key: an excerpt or spill of a value bound earlier and re-bound since keeps nothing
  an obligation can use (:func:`kept_positions`).
- **Loss-class monotonicity**: a node is no better than its weakest child (:func:`weakest`).
- **The lossless check**: a LOSSLESS node keeps every literal of its span verbatim,
  each provable against its leaf, and retains every negative fact and open or resolved
  item of its span (:func:`lossless_problems`). The literals of a span
  (:func:`span_literals`, the one list the check, the compactor and admission read)
  are read from event fields, never from prose, the same way on every backend:

  - a binding's ``value``;
  - a tool call's ``name`` and every leaf of its ``args``;
  - every leaf of a tool result's ``output`` (for a failed call, its exact error);
  - the ``content`` of a user's turn (role ``user`` or ``human``), and of any turn with
    status ``rejected``: the decisions (approve, reject, authorize);
  - a handle's ``detail`` (a path, a command line) when it has one;
  - the ``value`` of a framework snapshot or pending write, whole (the store never
    interprets it).

  A leaf is a scalar, an empty list or map, a map with a key that a field path
  cannot spell (empty, or holding ``.``, ``[`` or ``]``), or a map or list whose items'
  paths would be longer than :data:`MAX_PATH` characters; its path is the field path
  :func:`extract` reads (``args.sql``, ``output.rows[0]``). An excerpt of a field keeps
  every leaf under it. Derived events (nodes, spills, markers, attempts, redactions)
  repeat or point at raw literals and give none of their own; a redacted body's
  literals are gone, so a span holding one cannot be LOSSLESS. Listing a literal (in a
  fact's text, a summary, an item) does not keep it; spilling keeps a binding for the
  gate, not for a LOSSLESS claim, whose artifact must carry every literal.
- **What a node claims** is held to the log: each retained negative fact is the log's
  fact at its position (the event there, its status, its text), each item listed as
  unresolved or resolved is one the log opened there and left open or closed as
  claimed (:func:`false_claims`).
- **The marker conditions**, checked at emission and at resume by the same
  code: closure, negative-fact retention, anchoring (:func:`check_marker`), over every
  node of a marker's cover (:func:`check_cover`).
- **A growing session digest**: an L2 node's children are contiguous L1 nodes, or the
  current session digest (an earlier L2) followed by the L1 nodes after it; the new L2
  supersedes that digest, and only it may overlap the digest and the digests it
  superseded in turn (:func:`children_of`, :func:`overlap`). No tier above L2: a
  digest that grows keeps a resumed context to one digest, the L1 nodes after it and
  the raw tail however long the session, which is all a level above would buy.
- **What a node lost** (:func:`lost`): each literal of its span it neither keeps nor
  states verbatim in its summary text.
- **Restoration**: literals are restored only from a LOSSLESS node whose
  claim holds against the log when the restoration is decided (:func:`restoration_problems`).
- **Admission**: what the store checks of every derived event (summary node, spill,
  marker, attempt), whichever way it enters the log (:func:`admit_node`,
  :func:`admit_spill`, :func:`admit_marker`, :func:`admit_attempt`).
- **The retry guard**: an attempt under an idempotency key acts on the
  literals every earlier attempt under that key acted on (:func:`prior_literals`).

Rules read event fields, never prose, and do no I/O: where the facts come from (a pass
over the log or the structural index) is the caller's choice.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Mapping, Sequence
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
    shown,
)
from .events import Excerpt, LossClass
from .facts import Facts

CONDITIONS = ("closure", "negative_facts", "anchoring")
Condition = Literal["closure", "negative_facts", "anchoring"]

#: The canonical encoding of a value (the events' own): what two literals are compared by.
_encoder = msgspec.json.Encoder(order="sorted")

#: Loss classes from best to worst.
LOSS_ORDER = {LossClass.LOSSLESS: 0, LossClass.LOSSY_GIST: 1, LossClass.LOSSY_LITERAL: 2}

#: Turn roles that speak for the user: their turns carry the user's decisions, so their words are literals.
USER_ROLES = frozenset({"user", "human"})


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
            # An index is ASCII digits, as a handle's position is: ``[-1]``, ``[ 1]``,
            # ``[1_0]`` or ``[٣]`` would name an item by a path no literal has.
            index = ev.position_in(part[1:-1])
            if index is None or index >= len(value):
                raise KeyError(path)
            value = value[index]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, msgspec.Struct) and part in value.__struct_fields__:
            value = getattr(value, part)
        else:
            raise KeyError(path)
    return msgspec.to_builtins(value)


def same_value(a: ev.JSON, b: ev.JSON) -> bool:
    """Return whether ``a`` and ``b`` are the same literal: the same canonical JSON bytes.

    The one comparison of values the rules, the compactor and the resolver make. Python's
    ``==`` says ``True == 1 == 1.0`` and ``False == 0 == 0.0``, so a spill of ``true``
    would stand for a binding of ``1``, and an artifact's ``1.0`` for a logged ``1``:
    each is another literal, which an operation acting on it would get wrong.
    """
    return _encoder.encode(a) == _encoder.encode(b)


def value_digest(value: ev.JSON) -> str:
    """Return the hex BLAKE3 digest of a value's canonical JSON (what a spill records)."""
    return blake3(_encoder.encode(value)).hexdigest()


def kept_positions(node: ev.Summary) -> set[int]:
    """Return the positions of the binding values ``node`` keeps verbatim (a ``value`` excerpt) or spilled.

    A binding is kept by the position of its value, not by its key: an excerpt of a
    value re-bound since does not keep the live one.
    """
    return {e.pos for e in node.kept if e.path == "value"} | {sp.source for sp in node.spills}


def weakest(losses: Iterable[LossClass]) -> LossClass:
    """Return the weakest of ``losses``: what a node over children of these classes can claim at best."""
    return max(losses, key=LOSS_ORDER.__getitem__)


# --- the gate and the lossless check --------------------------------------------------


def risks(f: Facts, start: int, stop: int, kept: Iterable[int | str] = ()) -> list[Risk]:
    """Return each open obligation that needs a non-regenerable binding whose live value is bound in ``[start, stop)``.

    The live value of a key is its latest binding before ``f.size``. ``kept`` names what
    the compaction keeps: positions of binding values (see :func:`kept_positions`), or
    keys, each standing for its latest binding before ``stop`` (what ``keep=KEY`` keeps).
    """
    positions = {k for k in kept if isinstance(k, int) and not isinstance(k, bool)}
    keys = {k for k in kept if isinstance(k, str)}
    out = []
    latest: dict[str, tuple[int, bool] | None] = {}
    for opos, name, needs in f.open_obligations():
        for key in needs:
            if key not in latest:
                latest[key] = f.latest_binding(key, f.size)
            found = latest[key]
            if found is None:
                continue
            bpos, regenerable = found
            # The live value lies in the span, so it is also the key's latest before ``stop``.
            if start <= bpos < stop and not regenerable and bpos not in positions and key not in keys:
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


def literals_of(pos: int, event: ev.Event) -> list[Excerpt]:
    """Return the literals of the event at ``pos`` an operation could act on, as excerpts (see the module docstring)."""
    out: list[Excerpt] = []
    if event.kind in ev.DERIVED_KINDS:
        return out
    if isinstance(event, ev.Binding):
        out.append(Excerpt(pos, "value", event.value))
    elif isinstance(event, ev.ToolCall):
        out.append(Excerpt(pos, "name", event.name))
        if event.args:
            _leaves(pos, "args", event.args, out)
    elif isinstance(event, ev.ToolResult):
        if event.output is not None:
            _leaves(pos, "output", event.output, out)
    elif isinstance(event, ev.Turn):
        if event.role in USER_ROLES or event.status == "rejected":
            out.append(Excerpt(pos, "content", event.content))
    elif isinstance(event, ev.HandleOpened):
        if event.detail:
            out.append(Excerpt(pos, "detail", event.detail))
    elif isinstance(event, ev.GraphState | ev.Write):
        if event.value is not None:
            out.append(Excerpt(pos, "value", event.value))
    return out


#: The most characters a literal's field path has: every literal spells its path out, so
#: without a bound a long key above many items would cost its length once per item.
MAX_PATH = 1024


def _leaves(pos: int, path: str, value: ev.JSON, out: list[Excerpt]) -> None:
    room = MAX_PATH - len(path)
    if isinstance(value, dict) and value and all(_spellable(k) and len(k) < room for k in value):
        for k in sorted(value):
            _leaves(pos, f"{path}.{k}", value[k], out)
    elif isinstance(value, list) and value and len(str(len(value))) + 2 <= room:
        for i, v in enumerate(value):
            _leaves(pos, f"{path}[{i}]", v, out)
    else:
        out.append(Excerpt(pos, path, value))


def _spellable(key: object) -> bool:
    """Return whether a map key can be spelled in a field path that :func:`extract` reads back."""
    return isinstance(key, str) and key != "" and not any(c in key for c in ".[]")


def span_literals(f: Facts, start: int, stop: int) -> list[Excerpt]:
    """Return every literal of positions ``[start, stop)`` an operation could act on, by position and path.

    The one list the lossless check, the compactor and admission read (see the module
    docstring for what a literal is). A position that cannot be read (a redacted body)
    gives none: :func:`lossless_problems` refuses a span that holds one.
    """
    out: list[Excerpt] = []
    for pos in range(start, stop):
        event = f.event(pos)
        if event is not None:
            out.extend(literals_of(pos, event))
    return out


_SEPARATOR = re.compile(r"[.\[]")


def _prefixes(path: str) -> list[str]:
    """Return the field paths that hold ``path``, itself included (``args``, ``args.a``, ``args.a[0]``)."""
    # The separators are found in C: a loop over the characters cost a bytecode step per character.
    return [path[:m.start()] for m in _SEPARATOR.finditer(path, 1)] + [path]


def _provable(f: Facts, kept: Iterable[Excerpt]) -> set[tuple[int, str]]:
    """Return ``(pos, path)`` of the excerpts whose value digest is that of the field they name in the log."""
    out = set()
    for e in kept:
        if _excerpt_matches(f.event(e.pos) if e.pos >= 0 else None, e):
            out.add((e.pos, e.path))
    return out


def _excerpt_matches(source: ev.Event | None, e: Excerpt) -> bool:
    """Return whether excerpt ``e`` is field ``e.path`` of ``source``, compared by value digest (``1`` is not ``true``)."""
    if source is None:
        return False
    try:
        return same_value(extract(source, e.path), e.value)
    except (KeyError, InvalidArgument, TypeError):
        return False


def lossless_problems(f: Facts, node: ev.Summary) -> list[str]:
    """Return why ``node`` cannot be LOSSLESS.

    Each literal of its span not kept verbatim by a provable excerpt, each position it
    cannot read (a redacted body), each negative fact it does not retain as the log
    gives it, each open or resolved item of its span it does not list.
    """
    start, stop = node.start, node.stop
    kept = _provable(f, node.kept)
    missing = [
        f"pos {lit.pos} {lit.path}" for lit in span_literals(f, start, stop)
        if not any((lit.pos, p) in kept for p in _prefixes(lit.path))
    ]
    unread = [p for p in range(start, stop) if isinstance(f.event(p), ev.Redacted | ev.Dropped | type(None))]
    missing_facts = [x.pos for x in retention_gaps(f, node)]
    items, done = set(node.unresolved), set(node.resolved)
    missing_items = [i.id for i in f.unresolved_at(start, stop) if i not in items]
    missing_items += [i.id for i in f.resolved_in(start, stop) if i not in done]
    problems = []
    erased = f.redacted_in(start, stop)
    if erased:
        problems.append(f"positions {erased} were redacted: what they held cannot be shown kept")
    if missing:
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        problems.append(f"literals not kept verbatim: {', '.join(missing[:8])}{more}")
    if unread:
        problems.append(f"positions {unread} were redacted: their literals cannot be kept")
    if missing_facts:
        problems.append(f"negative facts not retained at pos {missing_facts}")
    if missing_items:
        problems.append(f"open or resolved items not listed: {missing_items}")
    return problems


def restoration_problems(f: Facts, node: ev.Summary, pos: int) -> list[str]:
    """Return why literals cannot be restored from ``node`` at ``pos``: empty only when they can.

    A restoration acts on exact literals, so only a LOSSLESS node gives them, and only
    while its claim holds against the log at decision time, whatever admitted it: its
    span and excerpts match the log, an L2's children are LOSSLESS, it keeps every
    binding, negative fact and item of its span, and claims none the log does not bear
    out (:func:`false_claims`). ``f``: the log up to at least ``pos``.
    """
    if node.loss is not LossClass.LOSSLESS:
        return [f"node at pos {pos} is {node.loss.value}: only a LOSSLESS node restores literals"]
    found: list[Violation] = []
    if not node_anchoring(f, node, pos, found):
        return [str(v) for v in found]
    problems = [str(v) for v in found]
    if node.tier == 2:
        kids = [f.event(c) if 0 <= c < pos else None for c in node.children]
        lossy = [c for c, k in zip(node.children, kids) if not isinstance(k, ev.Summary) or k.loss is not LossClass.LOSSLESS]
        if lossy:
            problems.append(f"children at pos {lossy} are not LOSSLESS")
    # A LOSSLESS node is the span exactly: a fact or item it claims that the log does not
    # bear out (a phantom open call) is no more exact than one it drops.
    problems += [str(v) for _, v in false_claims(f, node)]
    return problems + lossless_problems(f, node)


def lossless_error(node: ev.Summary, problems: Sequence[str]) -> CompactionInvariantError:
    """Return the refusal of a LOSSLESS claim that ``problems`` contradict."""
    return CompactionInvariantError(f"[{node.start}, {node.stop}) cannot be LOSSLESS: " + "; ".join(problems))


def _stated(value: ev.JSON, text: str) -> bool:
    """Return whether ``text`` states ``value`` verbatim: a string as it is, anything else as its canonical JSON."""
    return (value if isinstance(value, str) else ev.encode_json(value)) in text


def lost(f: Facts, node: ev.Summary, pos: int) -> list[ev.Lost]:
    """Return the loss manifest of ``node`` (at ``pos``): each literal of its span it neither keeps nor states.

    A literal of the span (:func:`span_literals`) is kept when an excerpt of the node
    provably holds it (an excerpt of the field or of a field holding it, its value
    matching the log) or, for a binding's value, when a spill the node points at
    holds it; it is stated when the summary text contains it verbatim (a string as it
    is, any other value as its canonical JSON, so ``42`` is stated by ``"v42"`` too:
    the manifest may miss a loss, never invent one). Every other literal is lost, and
    listed with its position, field path, the kind of its event and, for a binding,
    its key. A redacted position in the span is listed once, with kind ``redacted``:
    what it held is unknown. ``f``: the log before ``pos``. A LOSSLESS node loses nothing.
    """
    kept = _provable(f, node.kept)
    spilled = {r.source for r in node.spills if _spill_matches(f, r, pos)}
    out: list[ev.Lost] = []
    for p in range(node.start, min(node.stop, f.size)):
        event = f.event(p)
        if event is None or isinstance(event, ev.ERASED):
            out.append(ev.Lost(p, "", "redacted" if not isinstance(event, ev.Dropped) else "dropped"))
            continue
        key = event.key if isinstance(event, ev.Binding) else None
        for lit in literals_of(p, event):
            if any((p, q) in kept for q in _prefixes(lit.path)):
                continue
            if key is not None and lit.path == "value" and p in spilled:
                continue
            if not _stated(lit.value, node.summary):
                out.append(ev.Lost(p, lit.path, event.kind, key))
    return out


# --- the marker conditions -------------------------------------------------------------


def check_marker(f: Facts, node_pos: int, *, settled: bool = False, deep: bool = False) -> tuple[list[Violation], list[int]]:
    """Check closure, negative-fact retention and anchoring for resuming from ``node_pos`` at ``f.size``.

    Returns the violations (sorted; empty when the marker may be emitted or trusted) and
    the positions of the nodes on the path. ``settled``: the node is known to meet every
    condition over its own span (an earlier check found it did, with no redaction since):
    those read only the log before the node, which never changes, so only what depends
    on the checkpoint is checked again (what an obligation open at ``f.size`` needs, and
    the redacted positions). ``deep``: see :func:`retention_gaps`.
    """
    found: list[Violation] = []
    top = f.event(node_pos)
    if not isinstance(top, ev.Summary):
        why = "redacted: the node was erased with what it was built from" if f.redacted_in(node_pos, node_pos + 1) else (
            "not a summary node before the checkpoint")
        return [Violation("anchoring", node_pos, why)], []
    if settled:
        path = _path_of(f, node_pos, top)
    else:
        path = _check_path(f, node_pos, found)
        listed = set(top.unresolved)
        for item in f.unresolved_at(top.start, top.stop):
            if item not in listed:
                found.append(Violation(
                    "closure", item.pos, f"{item.kind} {item.id!r} is open at the boundary but not listed as UNRESOLVED"
                ))
        _check_resolved(top, f.resolved_in(top.start, top.stop), found)
        for fact in retention_gaps(f, top, deep=deep):
            found.append(Violation("negative_facts", fact.pos, f"{fact.status} item dropped: {fact.text}"))
        found.extend(v for _, v in false_claims(f, top))
    # A redacted position is unknown, not empty: it may have been a failure, a rejection
    # or an open call, and nothing can show that the summary kept it.
    for p in f.redacted_in(top.start, top.stop):
        found.append(Violation("negative_facts", p, "redacted: what it held cannot be shown retained"))
    for r in risks(f, top.start, top.stop, kept_positions(top)):
        found.append(Violation(
            "anchoring", r.binding_pos,
            f"live value of binding {r.key!r} (bound at pos {r.binding_pos}) needed by open obligation "
            f"{r.obligation!r} (pos {r.obligation_pos}) is neither kept nor spilled",
        ))
    return sorted(set(found)), path


def _path_of(f: Facts, node_pos: int, node: ev.Summary) -> list[int]:
    """Return the path :func:`_check_path` gives for a node whose anchoring held: it and its summary-node children."""
    kids = [c for c in node.children if 0 <= c < node_pos and isinstance(f.event(c), ev.Summary)] if node.tier == 2 else []
    return sorted({node_pos, *kids})


#: The newest negative facts of its children a roll-up lists itself, for a resumed agent to read.
DIGEST_FACTS = 40


def retention_gaps(f: Facts, node: ev.Summary, *, deep: bool = False) -> list[ev.Fact]:
    """Return the negative facts of ``node``'s span (:meth:`Facts.negatives_in`) that it does not retain.

    Retained as the log gives it: a fact at the right position with another status or
    text (a rejection kept as "superseded: approved") retains nothing. An L1 node
    retains what it lists. An L2 node retains what it lists and what its children
    retain: a fact belongs to the span of the event that made it negative, so the facts
    of an L2's span are exactly those of its children's spans, and it drops only what
    an L1 child drops and neither it nor another child lists. An earlier digest among
    its children drops nothing: :func:`admit_node` refuses an L2 node with a gap, so a
    digest is never read back over its whole span, however long the session. ``deep``
    holds an earlier digest to its own children too, down the whole chain, for a check
    that trusts no admission (a resume that re-hashes every body).
    """
    listed = set(node.negative_facts)
    if node.tier != 2:
        return [x for x in f.negatives_in(node.start, node.stop) if x not in listed]
    kids = [k for c in node.children if 0 <= c < f.size and isinstance(k := f.event(c), ev.Summary)]
    for k in kids:
        listed.update(k.negative_facts)
    gaps = {x for k in kids if k.tier == 1 for x in f.negatives_in(k.start, k.stop) if x not in listed}
    if deep:
        gaps.update(x for k in kids if k.tier == 2 for x in retention_gaps(f, k, deep=True) if x not in listed)
    return sorted(gaps, key=lambda x: x.pos)


def digest_facts(f: Facts, node: ev.Summary) -> list[ev.Fact]:
    """Return the negative facts an L2 ``node`` must list itself: what its L1 children dropped, and the newest of theirs.

    The newest :data:`DIGEST_FACTS` of the facts its children list (an earlier digest among
    them lists the newest of its own subtree, and so on down), so that from the oldest of
    them on its list is whole: a resumed agent reads the latest failures in the digest's
    own body, and fetches the earlier ones its children keep by their range.
    """
    listed = {x for c in node.children if 0 <= c < f.size and isinstance(k := f.event(c), ev.Summary)
              for x in k.negative_facts}
    newest = sorted(listed, key=lambda x: x.pos)[-DIGEST_FACTS:]
    return sorted({*retention_gaps(f, msgspec.structs.replace(node, negative_facts=[])), *newest}, key=lambda x: x.pos)


def check_cover(
    f: Facts, cover: Sequence[int], settled: Container[int] = (), *, deep: bool = False
) -> tuple[list[Violation], list[int]]:
    """Check the three conditions over every node of a marker's ``cover`` at ``f.size``.

    A cover is one or more summary nodes before the checkpoint, in span order, their
    spans disjoint: a resumed context shows each node in place of its span and the raw
    events outside them. Each node is held to :func:`check_marker` over its own span
    (what is open at its stop, what its span made negative, what an open obligation
    needs of it): together they are the conditions over every span the context
    replaces. Returns the violations (sorted) and the positions of every node on the
    cover's paths. ``settled``: positions of nodes known to meet the conditions over
    their own spans; ``deep``: see :func:`check_marker`.
    """
    found: list[Violation] = []
    path: set[int] = set()
    before: tuple[int, ev.Summary] | None = None
    if not cover:
        return [Violation("anchoring", -1, "the cover names no summary node")], []
    for pos in cover:
        violations, got = check_marker(f, pos, settled=pos in settled, deep=deep)
        found.extend(violations)
        path.update(got)
        node = f.event(pos)
        if not isinstance(node, ev.Summary):
            continue
        if before is not None and node.start < before[1].stop:
            found.append(Violation(
                "anchoring", pos,
                f"cover nodes out of span order or overlapping: [{before[1].start}, {before[1].stop}) at pos {before[0]} "
                f"then [{node.start}, {node.stop})"))
        before = (pos, node)
    return sorted(set(found)), sorted(path)


def cover(f: Facts) -> list[int]:
    """Return the positions of the nodes a marker at ``f.size`` resolves to, in span order.

    Every node before the checkpoint that no later node rolls up: the newest session
    digest and the L1 nodes after it (and any other node no digest holds). Admission
    keeps their spans disjoint (:func:`overlap`).
    """
    nodes = f.nodes()
    rolled = {c for _, n in nodes if n.tier == 2 for c in n.children}
    return [p for _, p in sorted((n.start, p) for p, n in nodes if p not in rolled)]


def cover_gate(f: Facts, nodes: Sequence[ev.Summary]) -> list[Violation]:
    """Return what an obligation open at ``f.size`` needs of a cover's spans that the cover neither keeps nor spills.

    A marker is certified at its checkpoint; an obligation opened since may need a live
    value a node of its cover dropped, and a context resumed from it then lacks that value.
    """
    return [
        Violation("anchoring", r.binding_pos,
                  f"live value of binding {r.key!r} (bound at pos {r.binding_pos}) needed by open obligation "
                  f"{r.obligation!r} (pos {r.obligation_pos}) is neither kept nor spilled")
        for n in nodes for r in risks(f, n.start, n.stop, kept_positions(n))
    ]


def _check_resolved(top: ev.Summary, resolved: Iterable[ev.Item], found: list[Violation]) -> None:
    """Hold ``top.resolved`` to ``resolved``: the items opened before its span and closed inside it.

    A missing one looks still open in a resumed context. (One listed that was not closed
    there, which would tell the agent something was done that was not, is a false claim:
    see :func:`false_claims`.)
    """
    listed, want = set(top.resolved), set(resolved)
    for item in sorted(want - listed, key=lambda i: (i.pos, i.kind, i.id)):
        found.append(Violation(
            "closure", item.pos, f"{item.kind} {item.id!r} is closed in the span but not listed as RESOLVED"
        ))


def _clip(text: str, n: int = 60) -> str:
    return repr(text if len(text) <= n else text[: n - 1] + "…")


def false_claims(f: Facts, node: ev.Summary) -> list[tuple[str, Violation]]:
    """Return each claim of ``node`` that the log at ``f.size`` does not bear out, with the field that holds it.

    - ``negative_facts``: a retained fact must be the log's negative fact at its
      position, same status and text, at a position the node may cite: in its span, or
      before it and made negative by an event in it. A position outside ``[0, stop)``
      is impossible.
    - ``unresolved``: an item listed as unresolved must be opened at its position inside
      the span and still open at its stop.
    - ``resolved``: an item listed as resolved must be opened at its position before the
      span, open at its start, and closed inside it.
    """
    start, stop = node.start, node.stop
    out: list[tuple[str, Violation]] = []
    # Read only what the node cites: its span's facts are not read for an L2 over a whole session.
    inside = f.negatives_at([x.pos for x in node.negative_facts if start <= x.pos < stop])
    earlier = [x for x in node.negative_facts if 0 <= x.pos < start]
    caused = {x.pos: x for x in f.negatives_in(start, stop) if x.pos < start} if earlier else {}
    for i, x in enumerate(node.negative_facts):
        what = f"negative_facts[{i}] ({x.status} at pos {x.pos})"
        if not 0 <= x.pos < stop:
            out.append(("negative_facts", Violation(
                "negative_facts", x.pos, f"{what} is outside [0, {stop}): the span cannot cite it")))
            continue
        want = inside(x.pos) if x.pos >= start else caused.get(x.pos)
        if want is None:
            out.append(("negative_facts", Violation(
                "negative_facts", x.pos, f"{what}: the log gives no negative fact there that the span may cite")))
        elif want != x:
            out.append(("negative_facts", Violation(
                "negative_facts", x.pos,
                f"{what} {_clip(x.text)} does not match the log: {want.status} {_clip(want.text)}")))
    open_at_stop = set(f.unresolved_at(start, stop))
    for i, item in enumerate(node.unresolved):
        what = f"unresolved[{i}] ({item.kind} {item.id!r} at pos {item.pos})"
        if not start <= item.pos < stop:
            out.append(("unresolved", Violation(
                "closure", item.pos, f"{what} is outside the span [{start}, {stop}): it cannot be open in it")))
        elif item not in open_at_stop:
            out.append(("unresolved", Violation(
                "closure", item.pos,
                f"{item.kind} {item.id!r} is listed as UNRESOLVED but was not opened at pos {item.pos} "
                "and left open at the boundary")))
    closed = set(f.resolved_in(start, stop))
    for i, item in enumerate(node.resolved):
        if not 0 <= item.pos < start:
            out.append(("resolved", Violation(
                "closure", item.pos,
                f"resolved[{i}] ({item.kind} {item.id!r} at pos {item.pos}) is outside [0, {start}): "
                "it cannot be opened before the span")))
        elif item not in closed:
            out.append(("resolved", Violation(
                "closure", item.pos,
                f"{item.kind} {item.id!r} is listed as RESOLVED but was not opened before the span and closed in it")))
    return out


def _check_path(f: Facts, node_pos: int, found: list[Violation]) -> list[int]:
    """Check the node at ``node_pos`` and its children; return their positions.

    A child that is an earlier session digest is anchored (its span root, its children's
    shape, its excerpts and spills) but its own children are not walked again: its
    admission checked them, and the path stays the same size however long the session.
    """
    path, stack = [], [(node_pos, True)]
    while stack:
        pos, top = stack.pop()
        node = f.event(pos)
        if not isinstance(node, ev.Summary):
            found.append(Violation("anchoring", pos, "path names a position that is not a summary node"))
            continue
        path.append(pos)
        if node_anchoring(f, node, pos, found) and node.tier == 2 and top:
            stack.extend((c, False) for c in node.children if c < pos)
    return sorted(path)


def node_anchoring(f: Facts, node: ev.Summary, pos: int, found: list[Violation]) -> bool:
    """Add to ``found`` how the node at ``pos`` does not match the log; say whether its span is well formed.

    The node's span root must be the log's, an L2's children contiguous L1 nodes
    covering its span, and its excerpts and spills must match their sources.
    """
    if not 0 <= node.start < node.stop <= pos:
        found.append(Violation("anchoring", pos, f"span [{node.start}, {node.stop}) is not before the node"))
        return False
    # Every event read below, in one batch: its children, its excerpts' and spills' sources.
    reads = [*(node.children if node.tier == 2 else ()), *(e.pos for e in node.kept), *(r.source for r in node.spills),
             *(p for r in node.spills if (p := spill_position(r.handle)) is not None)]
    f.read(p for p in reads if 0 <= p < pos)
    root = f.span_root(node.start, node.stop).hex()
    if node.span_root != root:
        found.append(Violation(
            "anchoring", pos,
            f"span root of [{node.start}, {node.stop}) is {node.span_root[:16]}…, the log gives {root[:16]}…",
        ))
    if node.tier == 2:
        kids = [f.event(c) if 0 <= c < pos else None for c in node.children]
        spans = [(k.start, k.stop) for i, k in enumerate(kids) if isinstance(k, ev.Summary) and _child_tier_ok(i, k, len(kids))]
        contiguous = len(spans) == len(kids) > 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        if not contiguous or spans[0][0] != node.start or spans[-1][1] != node.stop:
            found.append(Violation(
                "anchoring", pos, "children are not contiguous L1 nodes (after at most one earlier digest) covering its span"))
    for e in node.kept:
        if not _excerpt_matches(f.event(e.pos) if 0 <= e.pos < pos else None, e):
            found.append(Violation("anchoring", e.pos, f"kept excerpt {e.path!r} does not match the log"))
    for ref in node.spills:
        if not _spill_matches(f, ref, pos):
            found.append(Violation("anchoring", ref.source, f"spill {ref.handle} of {ref.key!r} does not match the log"))
    return True


def _child_tier_ok(i: int, kid: ev.Summary, count: int) -> bool:
    """Return whether an L2's ``i``-th of ``count`` children may be of ``kid``'s tier: L1, or a digest first and L1 nodes after it."""
    return kid.tier == 1 or (kid.tier == 2 and i == 0 and count > 1)


def spill_position(handle: object) -> int | None:
    """Return the position a spill handle (``spill:<pos>``, ASCII digits) names, or None when it names none."""
    if type(handle) is not str:
        return None
    prefix, _, digits = handle.partition(":")
    return ev.position_in(digits) if prefix == "spill" else None


def spill_problem(spill: ev.Spill, source: ev.Event | None, handle: str) -> str | None:
    """Return why ``spill`` does not hold the exact value it stands for, or None when it does.

    It must be the value bound at its ``source`` (``source`` is the event there), under
    its key, byte for byte, and carry that value's digest. What :meth:`Session.spilled`
    returns is held to this, as admission and anchoring are.
    """
    if not isinstance(source, ev.Binding) or source.key != spill.key:
        return f"{handle}: pos {spill.source} is not the binding of {spill.key!r} it names"
    if not same_value(spill.value, source.value):
        return f"{handle}: its value is not the value bound at pos {spill.source}"
    if value_digest(spill.value) != spill.digest:
        return f"{handle}: its value does not match its digest"
    return None


def _spill_matches(f: Facts, ref: ev.SpillRef, before: int) -> bool:
    at = spill_position(ref.handle)
    spill = f.event(at) if at is not None and at < before else None
    source = f.event(ref.source) if 0 <= ref.source < before else None
    return (
        isinstance(spill, ev.Spill)
        and spill.source == ref.source
        and spill.key == ref.key
        and spill.digest == ref.digest
        and spill_problem(spill, source, ref.handle) is None
    )


def marker_error(node: int, violations: Sequence[Violation]) -> MarkerInvalid:
    """Return the error that refuses a marker for ``node``, naming the first violations."""
    return MarkerInvalid(
        f"marker for node at pos {node} refused: " + "; ".join(str(v) for v in violations[:5])
        + (f"; and {len(violations) - 5} more" if len(violations) > 5 else ""),
        violations,
    )


# --- redaction: what a derived event quotes ---------------------------------------------

#: Strings shorter than this are not taken as quoted: they occur in any text ("ok", "yes").
QUOTE_MIN = 4
#: The fields in which an event holds what it says (its literals), as opposed to what
#: identifies it (a key, a call id, a role) or places it (status, position, time).
_LITERAL_FIELDS = ("content", "args", "output", "value", "how", "detail", "literals", "summary", "meta")


def _strings(value: object, out: set[str]) -> None:
    """Add to ``out`` every scalar of a JSON value as text (a string as it is, a number in JSON)."""
    if isinstance(value, str):
        out.add(value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out.add(ev.encode_json(value))
    elif isinstance(value, list):
        for v in value:
            _strings(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _strings(v, out)


def literals(event: ev.Event) -> set[str]:
    """Return the literals ``event`` holds, as text, of at least QUOTE_MIN characters each.

    Each string or number of its content, arguments, output, value, details, literals,
    summary or metadata: what a copy of it would quote.
    """
    out: set[str] = set()
    for name in _LITERAL_FIELDS:
        if name in event.__struct_fields__:
            _strings(msgspec.to_builtins(getattr(event, name)), out)
    return {t for t in out if len(t) >= QUOTE_MIN}


def quotes(event: ev.Event, positions: set[int], said: set[str]) -> bool:
    """Return whether the derived ``event`` quotes by text what the events at ``positions`` held.

    It does when a spill's value, a node's summary, fact texts, kept values or contract,
    or an attempt's literals contain one of the literals ``said`` (see :func:`literals`).
    Text is the second test of a copy, after provenance (:func:`built_from`): it catches
    a derived event that restates an erased literal it was not built from.
    """
    texts: set[str] = set()
    if isinstance(event, ev.Spill):
        _strings(msgspec.to_builtins(event.value), texts)
    elif isinstance(event, ev.Summary):
        texts |= {event.summary, event.contract or ""} | {x.text for x in event.negative_facts}
        for e in event.kept:
            _strings(msgspec.to_builtins(e.value), texts)
    elif isinstance(event, ev.Attempt):
        _strings(msgspec.to_builtins(event.literals), texts)
    else:
        return False
    if event.meta:
        _strings(msgspec.to_builtins(event.meta), texts)
    return any(lit in t for t in texts for lit in said)


def built_from(event: ev.Event, positions: set[int], bound: Mapping[str, int], raw: set[int] | None = None) -> bool:
    """Return whether the derived ``event`` was built from an event at one of ``positions`` (its provenance).

    A summary node from every raw position of its span (``raw``: those of ``positions``
    that hold raw events; all of them when not given) and every position it cites (its
    excerpts, retained facts, spills and their sources, its children); a spill from its
    binding; an attempt from the positions its literals name (``pos:path``) and the
    binding each key named when it was made (``bound``: each key's latest binding before
    the attempt). Provenance is read from fields, so no rewording of a literal (spacing,
    escaping, a summarizer's paraphrase) hides a copy of it.
    """
    if isinstance(event, ev.Spill):
        return event.source in positions
    if isinstance(event, ev.Summary):
        if any(event.start <= p < event.stop for p in (positions if raw is None else raw)):
            return True
        cited = {e.pos for e in event.kept} | {x.pos for x in event.negative_facts} | set(event.children)
        cited |= {r.source for r in event.spills} | {h for r in event.spills if (h := spill_position(r.handle)) is not None}
        return bool(cited & positions)
    if isinstance(event, ev.Attempt):
        for name in event.literals:
            head, _, _ = name.partition(":")
            at = int(head) if ":" in name and head.isascii() and head.isdigit() and len(head) <= 19 else bound.get(name)
            if at is not None and at in positions:
                return True
    return False


def copies(held: Mapping[int, ev.Event], later: Iterable[tuple[int, ev.Event]]) -> list[int]:
    """Return the positions among ``later`` of the derived events built from, or quoting, an event of ``held``.

    ``held`` maps each position to be redacted to its event; ``later`` gives the events
    from the first of them on, in order. A copy of a copy is a copy (a node pointing at
    an erased spill). A redaction erases these with the positions it names, so the
    literal leaves the log, not only its first record.
    """
    positions = set(held)
    # A node summarizes the raw events of its span: a derived event inside it (an earlier
    # node, a spill) is not its content, so only raw positions reach it through its span.
    raw = {p for p, e in held.items() if e.kind not in ev.DERIVED_KINDS}
    # The literals are the raw events': a derived one restates them (its own words, a
    # summary's stock phrases, would make every similar summary a copy).
    said: set[str] = set()
    for p in raw:
        said |= literals(held[p])
    bound: dict[str, int] = {}
    found: list[int] = []
    for q, e in later:
        if q not in positions and e.kind in ev.DERIVED_KINDS and (
                built_from(e, positions, bound, raw) or quotes(e, positions, said)):
            found.append(q)
            positions.add(q)
        if isinstance(e, ev.Binding):
            bound[e.key] = q
    return sorted(found)


def guard_of(pos: int, attempt: ev.Attempt) -> ev.Guard:
    """Return what a redaction keeps of the attempt at ``pos`` for the retry guard: the digests of its literals."""
    return ev.Guard(pos=pos, key=attempt.key, literals={name: value_digest(v) for name, v in attempt.literals.items()})


def admit_redaction(held: Mapping[int, ev.Event], later: Iterable[tuple[int, ev.Event]], redaction: ev.Redaction) -> None:
    """Refuse a redaction that leaves a copy of what it erases, or an erased attempt without its guard.

    It must list every derived event built from or quoting what it erases
    (:func:`copies`), and carry, for each attempt it erases, exactly that attempt's
    :func:`guard_of`: the retry guard outlives the attempt's body.

    Raises:
        InvalidEvent: naming ``positions`` (a copy left) or ``guards``.
    """
    later = list(later)
    named = set(redaction.positions)
    kept = sorted(q for q, e in held.items() if isinstance(e, ev.Retention | ev.Redaction))
    if kept:
        raise InvalidEvent("positions", f"{kept[:10]} hold a redaction or a retention: they quote nothing, and "
                           "account for the bodies they erased")
    left = [q for q in copies(held, later) if q not in named]
    if left:
        raise InvalidEvent(
            "positions",
            f"the derived events at {left[:10]} were built from or quote what the redacted positions hold: a "
            "redaction erases them too (Session.redact lists them)",
        )
    erased = {q: e for q, e in later if q in named}
    want = sorted((guard_of(q, e) for q, e in erased.items() if isinstance(e, ev.Attempt)), key=lambda g: g.pos)
    if sorted(redaction.guards, key=lambda g: g.pos) != want:
        raise InvalidEvent(
            "guards", f"want the guard of each attempt it erases (at {[g.pos for g in want]}), got those of "
            f"{[g.pos for g in redaction.guards]}: the retry guard outlives an attempt's body")


# --- admission of derived events -------------------------------------------------------


def overlap(
    f: Facts, tier: int, start: int, stop: int, before: int, grows: tuple[int, ev.Summary] | None = None
) -> InvalidArgument | None:
    """Return the refusal of a tier-``tier`` node over ``[start, stop)`` that overlaps one of the same tier before ``before``.

    ``grows``: the session digest (position and node) a new L2 rolls up as its first
    child. It and the digests it superseded in turn (the L2 nodes before it within its
    span: admission let nothing else overlap it) may overlap the new one; any other L2
    may not, a later digest that already rolled it up included, so the digests of a
    span form one chain.
    """
    for pos, node in f.nodes():
        if pos >= before or node.tier != tier or max(start, node.start) >= min(stop, node.stop):
            continue
        if grows is not None:
            g, digest = grows
            if pos <= g and digest.start <= node.start and node.stop <= digest.stop:
                continue
            if pos > g and node.start <= digest.start and digest.stop <= node.stop:
                return InvalidArgument(
                    "nodes", f"the digest at pos {g} was already rolled up by the L2 node at pos {pos} "
                    f"covering [{node.start}, {node.stop}): grow that one")
        return InvalidArgument(
            "span", f"[{start}, {stop}) overlaps the L{tier} node at pos {pos} covering [{node.start}, {node.stop})"
        )
    return None


def children_of(f: Facts, node: ev.Summary, pos: int) -> list[ev.Summary]:
    """Return the children of an L2 ``node`` at ``pos``, checked to be contiguous and cover its span.

    The children are L1 nodes, or the session digest (an earlier L2) followed by one or
    more L1 nodes after it: the new L2 grows that digest and supersedes it.

    Raises:
        InvalidArgument: naming ``nodes``: a child is not an earlier node of a tier it
            may have there, or they are not contiguous.
    """
    kids: list[ev.Summary] = []
    for i, c in enumerate(node.children):
        kid = f.event(c) if 0 <= c < pos else None
        if not isinstance(kid, ev.Summary):
            raise InvalidArgument("nodes", f"pos {c} is not a summary node before pos {pos}")
        if not _child_tier_ok(i, kid, len(node.children)):
            raise InvalidArgument(
                "nodes", f"node at pos {c} is L{kid.tier}; an L2 digests L1 nodes, after at most one earlier digest "
                "(its first child, followed by L1 nodes)")
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
    loss-class monotonicity; its excerpts and spills against the log; its retained
    facts and listed items against the log (:func:`false_claims`); the lossless check
    for a LOSSLESS claim, and the gate for a lossy tier-1 node. The span root and
    content digest, which need the span's bodies, are the store's to check.

    Raises:
        InvalidEvent, InvalidArgument: the node is malformed or overlaps another, or a
            retained fact or listed item is not the log's (the error names the field:
            ``negative_facts``, ``unresolved``, ``resolved``).
        CompactionInvariantError: it claims a loss class it does not meet, its excerpts
            or spills do not match the log, or it loses what an open obligation needs.
    """
    start, stop = node.start, node.stop
    if not 0 <= start < stop <= min(pos, f.size):
        raise InvalidEvent("start", f"span [{start}, {stop}) is not a non-empty span before pos {pos}")
    if node.tier not in (1, 2):
        raise InvalidEvent("tier", f"want 1 (over raw events) or 2 (over L1 nodes), got {node.tier}")
    kids = children_of(f, node, pos) if node.tier == 2 else []
    grows = (node.children[0], kids[0]) if kids and kids[0].tier == 2 else None
    found = overlap(f, node.tier, start, stop, pos, grows)
    if found is not None:
        raise found
    if node.tier == 1:
        if node.children:
            raise InvalidEvent("children", "an L1 node covers raw events and has no children")
    else:
        floor = weakest(kid.loss for kid in kids)
        if LOSS_ORDER[node.loss] < LOSS_ORDER[floor]:
            raise CompactionInvariantError(
                f"an L2 node cannot be {node.loss.value} over children that are {floor.value}"
            )
    mismatched: list[Violation] = []
    node_anchoring(f, node, pos, mismatched)
    if by_bodies(node):  # the store checks its span root against the bodies, with its content digest
        mismatched = [v for v in mismatched if "span root" not in v.item]
    if mismatched:
        raise CompactionInvariantError(
            f"node at pos {pos} does not match the log: " + "; ".join(str(v) for v in mismatched)
        )
    claims = false_claims(f, node)
    if claims:
        raise InvalidEvent(claims[0][0], "; ".join(str(v) for _, v in claims[:5]) + (
            f"; and {len(claims) - 5} more" if len(claims) > 5 else ""))
    if node.tier == 2:
        gaps = sorted(set(digest_facts(f, node)) - set(node.negative_facts), key=lambda x: x.pos)
        if gaps:
            raise CompactionInvariantError(
                f"L2 node at pos {pos} does not list the negative facts at pos {[x.pos for x in gaps[:10]]}: an L2 "
                "node lists what its L1 children dropped and the newest of theirs, and retains the rest through them")
    if node.loss is LossClass.LOSSLESS:
        problems = lossless_problems(f, node)
        if problems:
            raise lossless_error(node, problems)
    elif node.tier == 1:
        at_risk = risks(f, start, stop, kept_positions(node))
        if at_risk:
            raise gate_error(at_risk, start, stop)


def by_bodies(node: ev.Summary) -> bool:
    """Return whether the store holds ``node`` to its span's bodies: an L1 node, or any node with a content digest.

    An L2 node carries no content digest by default: its children were held to their
    bodies, and its span root is held to the stored tree, so a roll-up never reads the
    span it covers (a session digest covers the whole session).
    """
    return node.tier == 1 or node.content_digest is not None


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
    if not same_value(source.value, spill.value):
        raise InvalidEvent("value", f"is not the value bound at pos {spill.source} (compared by canonical bytes)")
    if value_digest(spill.value) != spill.digest:
        raise InvalidEvent("digest", f"got {spill.digest[:16]}…, the value gives {value_digest(spill.value)[:16]}…")


def admit_marker(f: Facts, marker: ev.RecoveryMarker, pos: int, settled: Container[int] = ()) -> list[int]:
    """Refuse a marker at ``pos`` whose claims do not hold; ``f`` is the log at its checkpoint ``marker.size``.

    A raw-checkpoint marker (no node) claims no condition. A marker that names a node
    claims every condition, which must hold at its checkpoint over every node of its
    cover (``node`` alone, or the ``cover`` it lists, ``node`` first), over the path it
    records. Its root and MAC are the store's to check. Returns the path. ``settled``:
    see :func:`check_cover`.

    Raises:
        InvalidEvent: its checkpoint is not before it, it claims conditions without a
            node, or its cover does not start with its node.
        MarkerInvalid: a condition fails, naming each violation.
    """
    if not 0 <= marker.size <= pos:
        raise InvalidEvent("size", f"checkpoint size {marker.size} is not in [0, {pos}]")
    if marker.node is None:
        if marker.conditions or marker.path or marker.cover:
            raise InvalidEvent("conditions", "a raw-checkpoint marker certifies no condition and has no path or cover")
        return []
    if tuple(marker.conditions) != CONDITIONS:
        raise InvalidEvent("conditions", f"a marker that names a node certifies {list(CONDITIONS)}, got {marker.conditions}")
    if marker.cover and marker.cover[0] != marker.node:
        raise InvalidEvent("cover", f"a cover starts with the marker's node {marker.node}, got {marker.cover}")
    violations, path = check_cover(f, marker_cover(marker), settled)
    if violations:
        raise marker_error(marker.node, violations)
    if list(marker.path) != path:
        raise InvalidEvent("path", f"got {marker.path}, the node's path is {path}")
    return path


def prior_literals(attempts: Iterable[tuple[int, ev.Attempt | ev.Guard]]) -> dict[str, str]:
    """Return the digest of the value each literal of the ``attempts`` under one key was first given, by name.

    An attempt erased by a redaction counts through the guard the redaction kept of it.
    Every attempt counts, one that acted on no literal included, so a later attempt
    cannot clear what an earlier one used; admitted attempts agree on every name they share.
    """
    used: dict[str, str] = {}
    for _, attempt in attempts:
        digests = attempt.literals if isinstance(attempt, ev.Guard) else {n: value_digest(v) for n, v in attempt.literals.items()}
        for name, digest in digests.items():
            used.setdefault(name, digest)
    return used


def said_literals(attempts: Iterable[tuple[int, ev.Attempt | ev.Guard]]) -> dict[str, ev.JSON]:
    """Return the value each literal was first given by the ``attempts`` whose bodies remain, by name (for messages)."""
    said: dict[str, ev.JSON] = {}
    for _, attempt in attempts:
        if isinstance(attempt, ev.Attempt):
            for name, value in attempt.literals.items():
                said.setdefault(name, value)
    return said


def retry_conflicts(prior: Mapping[str, str], acting: Mapping[str, ev.JSON], said: Mapping[str, ev.JSON] = {}) -> list[str]:
    """Return why acting on ``acting`` breaks the retry guard: each literal whose value's digest differs from ``prior``'s.

    Values are compared by the digest of their canonical JSON, so ``1``, ``1.0`` and
    ``true`` differ. ``said``: the earlier values still in the log, to name in the message.
    """
    out = []
    for name, digest in prior.items():
        if name in acting and value_digest(acting[name]) != digest:
            earlier = shown(said[name]) if name in said else f"another value (digest {digest[:16]}…)"
            out.append(f"retry reconstructs literal {name!r} as {shown(acting[name])}, but the earlier attempt used {earlier}")
    return out


def admit_attempt(f: Facts, attempt: ev.Attempt, pos: int) -> None:
    """Refuse an attempt at ``pos`` that acts on a literal other than an earlier attempt under its key used.

    ``f`` is the log before it. The store runs this inside the write transaction, so of
    two writers racing under one key with different literals, the second to commit is refused.

    Raises:
        ReconstructionUnsoundError: naming the literal and both values; nothing is written.
    """
    earlier = f.attempts(attempt.key)
    conflicts = retry_conflicts(prior_literals(earlier), attempt.literals, said_literals(earlier))
    if conflicts:
        raise ReconstructionUnsoundError(f"attempt {attempt.key!r} at pos {pos}: " + "; ".join(conflicts))


def marker_cover(marker: ev.RecoveryMarker) -> list[int]:
    """Return the positions of the nodes ``marker`` resolves to: its ``cover``, or its node alone (none for a raw marker)."""
    if marker.node is None:
        return []
    return list(marker.cover) or [marker.node]


def excerpt_of(event: ev.Event, pos: int, path: str) -> Excerpt:
    """Return field ``path`` of ``event`` (at ``pos``) as an excerpt.

    Raises:
        InvalidArgument: naming ``keep``: no such field.
    """
    try:
        return Excerpt(pos, path, extract(event, path))
    except KeyError:
        raise InvalidArgument("keep", f"event at pos {pos} has no field {path!r}") from None
