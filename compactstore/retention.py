"""Retention: which raw bodies a certified cover stands for, so that dropping them loses nothing a rule or a context reads.

A marker that certifies says its cover's summary nodes stand for their spans: a resumed
context shows the nodes, not the span's raw events. Retention drops the bodies of such
events and keeps their leaves, so every tree, proof, seal and certification still holds.
It drops only raw conversation that gives no structural fact on its own, so that every
source of facts (the index, a pass over the events) reads the session alike afterwards:

- a turn, a tool call or a tool result inside a cover node's span, before the marker's
  checkpoint and the newest ``keep_last`` positions;
- with no status, no ``supersedes``, no ``uses``, and not made negative since (a negative
  fact's event stays: a resumed agent may be pointed back at it);
- not cited by any node (an excerpt's, a spill's or a fact's position);
- a tool call and its result only together, both in one node's span, the call's id opened
  and closed once there and not closing an item opened before the span.

What stays (bindings, obligations, handles, failures, rejections, every derived event) is
what the rules, the recall tool and a restoration's refusal read.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence

import msgspec
from blake3 import blake3

from . import events as ev
from . import rules
from .errors import InvalidArgument, InvalidEvent
from .facts import Facts
from .structure import IndexRow
from .view import SessionView

#: The raw kinds retention may drop.
KINDS = frozenset({"turn", "tool_call", "tool_result"})
_TAG = b"compactstore.retention.index\x00"


def runs(positions: Iterable[int]) -> list[ev.Span]:
    """Return sorted distinct ``positions`` as maximal runs ``[start, stop)``."""
    out: list[ev.Span] = []
    for p in sorted(set(positions)):
        if out and out[-1].stop == p:
            out[-1] = ev.Span(out[-1].start, p + 1)
        else:
            out.append(ev.Span(p, p + 1))
    return out


def index_digest(rows: Sequence[IndexRow]) -> str:
    """Return the digest of the structural index's ``rows`` (in any order), as a retention records it."""
    return blake3(_TAG + msgspec.json.encode(sorted(tuple(r) for r in rows))).hexdigest()


def droppable(view: SessionView, f: Facts, cover: Sequence[int], before: int, since: int = 0) -> list[int]:
    """Return the positions whose bodies the nodes at ``cover`` stand for and retention may drop, in ``[since, before)``.

    ``f``: the session's facts now; ``before``: the first position kept whatever it holds
    (the marker's checkpoint, or the newest positions a caller keeps); ``since``: where to
    start looking (a maintenance run looks past what earlier retentions reached). A node
    is read whole or not at all, so what may be dropped of it does not depend on ``since``.
    """
    cited: set[int] = set()
    for _, n in f.nodes():
        cited.update(x.pos for x in n.kept)
        cited.update(x.pos for x in n.negative_facts)
        cited.update(r.source for r in n.spills)
    out: list[int] = []
    for c in cover:
        node = f.event(c)
        if not isinstance(node, ev.Summary):
            continue
        start, stop = node.start, min(node.stop, before)
        if start >= stop or stop <= since:
            continue
        negative = {x.pos for x in f.negatives_in(start, stop)}
        closes_earlier = {i.id for i in f.resolved_in(start, stop) if i.kind == "tool_call"}
        plain: list[int] = []
        calls: dict[str, list[int]] = {}
        results: dict[str, list[int]] = {}
        for r in view.scan(start, stop):
            e = r.event
            if (r.kind not in KINDS or r.pos in cited or r.pos in negative or e.status is not None
                    or e.supersedes is not None or e.uses):
                if isinstance(e, ev.ToolCall | ev.ToolResult):
                    calls.setdefault(e.call_id, []).append(-1)  # a call id that must stay whole
                continue
            if isinstance(e, ev.ToolCall):
                calls.setdefault(e.call_id, []).append(r.pos)
            elif isinstance(e, ev.ToolResult):
                results.setdefault(e.call_id, []).append(r.pos)
            else:
                plain.append(r.pos)
        for call_id, at in calls.items():
            got = results.get(call_id, [])
            if len(at) == 1 and len(got) == 1 and at[0] >= 0 and at[0] < got[0] and call_id not in closes_earlier:
                plain += [at[0], got[0]]
        out += plain
    return sorted(out)


def planned(view: SessionView, f: Facts, marker_pos: int, keep_last: int, *, since: int = 0) -> ev.Retention | None:
    """Return the retention of what the cover of the marker at ``marker_pos`` stands for (None: nothing to drop).

    The newest ``keep_last`` positions of the session keep their bodies.

    Raises:
        InvalidArgument: ``marker_pos`` is not a marker with a cover.
    """
    m = f.event(marker_pos)
    if not isinstance(m, ev.RecoveryMarker) or m.node is None:
        raise InvalidArgument("marker", f"pos {marker_pos} is not a marker with a summary cover")
    dropped = droppable(view, f, m.cover or [m.node], min(m.size, f.size - keep_last), since)
    erased = set(view.erasures()) if dropped else set()
    dropped = [p for p in dropped if p not in erased]
    if not dropped:
        return None
    return ev.Retention(marker=marker_pos, spans=runs(dropped), index_digest=index_digest(view.index_rows(dropped)))


def check(view: SessionView, f: Facts, event: ev.Retention, pos: int, settled: Container[int] = ()) -> None:
    """Refuse the retention ``event`` at ``pos`` unless every position it drops is one :func:`droppable` gives.

    Raises:
        InvalidEvent: naming the field: a marker that is not a certified one before it, spans
            that are not sorted and disjoint, a position its cover does not stand for, or an
            index digest other than that of the rows at its positions.
    """
    m = f.event(event.marker) if 0 <= event.marker < pos else None
    if not isinstance(m, ev.RecoveryMarker) or m.node is None:
        raise InvalidEvent("marker", f"pos {event.marker} is not a marker with a summary cover before pos {pos}")
    at = 0
    for i, s in enumerate(event.spans):
        if not at <= s.start < s.stop:
            raise InvalidEvent(f"spans[{i}]", "spans must be non-empty, sorted and disjoint")
        at = s.stop
    if not event.spans:
        raise InvalidEvent("spans", "must name at least one position")
    cover = m.cover or [m.node]
    violations, _ = rules.check_cover(f, cover, settled)
    if violations:
        raise InvalidEvent("marker", f"the cover of marker {event.marker} does not certify now: {violations[0]}")
    listed = list(ev.SpanSet(event.spans))
    allowed = set(droppable(view, f, cover, m.size, since=listed[0]))
    erased = view.erasures()
    for p in listed:
        if p in erased:
            raise InvalidEvent("spans", f"pos {p} was already erased by the event at pos {erased[p]}")
        if p not in allowed:
            raise InvalidEvent("spans", f"pos {p} is not raw conversation the cover of marker {event.marker} stands for "
                               "alone (a binding, a failure, a cited or paired event stays)")
    if index_digest(view.index_rows(listed)) != event.index_digest:
        raise InvalidEvent("index_digest", "is not the digest of the structural index's rows at the dropped positions")


def stored_problems(f: Facts, event: ev.Retention, pos: int, rows: Sequence[IndexRow]) -> list[str]:
    """Return why the stored retention ``event`` at ``pos`` could not have been admitted, read after its bodies are gone.

    What it dropped no longer reads, but its facts do (``rows``: the index's rows at its
    positions, which ``verify`` holds to its digest): none may be a binding, an obligation,
    a handle, a negative fact or an attempt, and a tool call's rows come in pairs within
    the positions. Its marker must be a marker with a cover before it whose nodes' spans
    hold every position, which no node cites.
    """
    out: list[str] = []
    listed = ev.SpanSet(event.spans)
    m = f.event(event.marker) if 0 <= event.marker < pos else None
    # A marker or node redacted since (with what it was built from) no longer reads: the
    # facts below still do.
    if not isinstance(m, ev.Redacted):
        if not isinstance(m, ev.RecoveryMarker) or m.node is None:
            return [f"pos {event.marker} is not a marker with a summary cover before pos {pos}"]
        spans, gone = [], False
        for c in m.cover or [m.node]:
            node = f.event(c)
            gone = gone or isinstance(node, ev.Redacted)
            if isinstance(node, ev.Summary):
                spans.append((node.start, min(node.stop, m.size)))
        outside = [] if gone else [p for p in listed if not any(a <= p < b for a, b in spans)]
        if outside:
            out.append(f"positions {outside[:5]} are outside the spans marker {event.marker}'s cover stands for")
    cited = {x.pos for _, n in f.nodes() for x in n.kept} | {x.pos for _, n in f.nodes() for x in n.negative_facts}
    cited |= {r.source for _, n in f.nodes() for r in n.spills}
    if any(p in listed for p in cited):
        out.append(f"positions {sorted(p for p in cited if p in listed)[:5]} are cited by a summary node")
    items: dict[str, int] = {}
    for r in rows:
        if r.rel == "open_at":
            continue  # a snapshot of what is open at this boundary, not a fact of its event
        if r.rel in ("open", "close") and r.key.startswith("tool_call/"):
            items[r.key] = items.get(r.key, 0) + (1 if r.rel == "open" else -1)
        else:
            out.append(f"pos {r.pos} gave a {r.rel} fact ({r.key}): it is not raw conversation retention may drop")
    unpaired = sorted(k for k, n in items.items() if n)
    if unpaired:
        out.append(f"tool calls {unpaired[:5]} are dropped without their results, or results without their calls")
    return out
