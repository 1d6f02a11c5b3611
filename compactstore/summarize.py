"""Summarizers: plain callables from the records summarized to summary text.

The store never calls a language model; the caller supplies the summarizer. The
extractive one here is deterministic and bounded, for demos, tests and sessions that
run without a model.

The protocol: an L1 compaction hands the summarizer the raw events of its span (the
derived events that lie in the span, earlier summaries and markers among them, are
left out: an L1 summarizes what happened, not what was said about it); a roll-up hands
it the nodes it rolls up (the current session digest first, then the L1 nodes after
it), each once. A summarizer's text must be at most the policy's ``summary_limit``
characters (:class:`compactstore.policy.CompactionPolicy`), so that what a resumed
agent reads stays bounded however long the session.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from . import events as ev
from .events import Record
from .structure import text_of

Summarizer = Callable[[Sequence[Record]], str]
"""A plain callable from the records summarized to summary text."""

#: The most characters :func:`extractive` writes, whatever it summarizes.
LIMIT = 1200
#: The most characters of one event's line, or of one child node's summary in a roll-up.
LINE = 100


def raw(records: Sequence[Record]) -> list[Record]:
    """Return the raw events among ``records``: what an L1 summarizer is given of its span."""
    return [r for r in records if r.kind not in ev.DERIVED_KINDS]


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: max(0, n - 1)] + "…"


def extractive(records: Sequence[Record]) -> str:
    """Summarize deterministically in at most :data:`LIMIT` characters, literal values left out.

    Raw events give one short line each, in order, until the limit, then a count of
    the rest; summary nodes (a roll-up's input) give their span and the head of their
    own text, an equal share of the limit each, so a digest grown again and again
    never nests copies of earlier digests. A binding shows as ``bound KEY`` without its
    value, so this summary keeps the gist and drops literals, as a language-model
    summary would.
    """
    nodes = [r for r in records if isinstance(r.event, ev.Summary)]
    if nodes:
        share = max(LINE, (LIMIT - 40 * len(nodes)) // len(nodes))
        lines = []
        for r in nodes:
            s = r.event
            assert isinstance(s, ev.Summary)
            lines.append(f"[{s.start}-{s.stop}) {_cut(' '.join(s.summary.split()), share)}")
        return _bounded(lines, "nodes")
    lines = []
    for r in raw(records):
        event = r.event
        status = f" [{event.status}]" if event.status not in (None, "ok") else ""
        lines.append(f"{r.pos}: {_cut(' '.join(text_of(event).split()), LINE)}{status}")
    return _bounded(lines, "events")


def _bounded(lines: list[str], what: str) -> str:
    """Join ``lines`` while they fit in :data:`LIMIT`, counting the ones left out."""
    out: list[str] = []
    used = 0
    for i, line in enumerate(lines):
        rest = f"… and {len(lines) - i} more {what}"
        if used + len(line) + 1 + len(rest) > LIMIT and i < len(lines) - 1 or used + len(line) > LIMIT:
            out.append(rest)
            break
        out.append(line)
        used += len(line) + 1
    text = "\n".join(out)
    return _cut(text, LIMIT)
