"""Summarizers: plain callables from a span's records to summary text.

The store never calls a language model; the caller supplies the summarizer. The
extractive one here is deterministic, for demos and tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from . import events as ev
from .events import Record
from .structure import text_of

Summarizer = Callable[[Sequence[Record]], str]
"""A plain callable from the span's records to summary text."""


def extractive(records: Sequence[Record]) -> str:
    """Summarize deterministically: one short line per event, literal values left out.

    A binding shows as ``bound KEY`` without its value, so this summary keeps the gist
    and drops literals, as a language-model summary would.
    """
    lines = []
    for r in records:
        event = r.event
        if isinstance(event, ev.Summary):
            lines.append(f"[{event.start}-{event.stop}) {event.summary}")
            continue
        status = f" [{event.status}]" if event.status not in (None, "ok") else ""
        lines.append(f"{r.pos}: {text_of(event)[:80]}{status}")
    return "\n".join(lines)
