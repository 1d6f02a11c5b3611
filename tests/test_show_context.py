"""show and the HTML page draw the context a resumed agent loads now: its cover span by span, its size against the raw log."""

from __future__ import annotations

import json
from html import escape

from rich.console import Console
from test_loop import _grown, _stretch

import compactstore as cs
from compactstore.cli.page import page
from compactstore.cli.show import render
from compactstore.picture import Span, picture


def test_show_and_page_draw_the_cover_and_the_context_size(store: cs.Store) -> None:
    """The picture names each span of the context and its source node, and items and characters against the raw log."""
    s = store.session("loop")
    digests, after = _grown(s)
    m = s.mark()
    _stretch(s, 90, fail=False)
    got = picture(s).loaded
    assert got is not None and got.marker == m.pos and got.mode == "certified"
    assert got.spans == [Span(0, digests[-1].stop, digests[-1].pos), Span(after[0].start, after[0].stop, after[0].pos),
                         Span(after[0].stop, s.size, -1)]
    r = s.context()
    assert got.items == len(r.context) and got.characters == len(json.dumps(r.as_messages("openai-responses"), ensure_ascii=False))
    assert got.raw_items == sum(1 for x in s.scan() if x.kind not in cs.events.DERIVED_KINDS) > got.items
    console = Console(width=160, record=True, highlight=False)
    console.print(render(picture(s), 160))
    text = console.export_text()
    assert f"context now (marker {m.pos}, certified): {got.items} items" in text
    assert f"[0, {digests[-1].stop}) node {digests[-1].pos} · [{after[0].start}, {after[0].stop}) node {after[0].pos}" in text
    html = page(picture(s))
    assert "<h2>Context now</h2>" in html and f"node #{after[0].pos}" in html and f"{got.characters:,}</b> characters" in html


def _two_markers(s: cs.Session) -> tuple[cs.Marker, cs.Marker]:
    """Mark a node over four turns, then the cover once a node swallows a non-regenerable binding; return both markers."""
    s.extend([cs.Turn("user", f"step {i}") for i in range(4)])
    s.bind("snapshot", "snap-1")
    older = s.mark(s.compact(0, 4, summary="steps 0 to 3"))
    s.extend([cs.Turn("user", f"more {i}") for i in range(3)])
    s.compact(4, s.size, summary="more steps")
    return older, s.mark()


def _shown(s: cs.Session) -> tuple[str, str]:
    """Return the terminal picture of ``s`` as text, and its page."""
    console = Console(width=200, record=True, color_system=None)
    console.print(render(picture(s), 200))
    return console.export_text(), page(picture(s))


def test_a_newer_marker_passed_over_for_an_obligation_says_why(store: cs.Store) -> None:
    """An obligation opened since needs what the newer marker's cover dropped: both views say so; the older one gives the context."""
    s = store.session("why")
    older, newer = _two_markers(s)
    s.oblige("restore", needs=["snapshot"])
    got = picture(s)
    assert got.loaded is not None and got.loaded.marker == older.pos and got.loaded.mode == "certified"
    pins = {m.pos: m for m in got.markers}
    assert pins[older.pos].gives and pins[newer.pos].state == "certified" and not pins[newer.pos].gives
    assert pins[newer.pos].stale == [
        "since its checkpoint, anchoring at pos 4: live value of binding 'snapshot' (bound at pos 4) needed by open "
        "obligation 'restore' (pos 12) is neither kept nor spilled"]
    text, html = _shown(s)
    assert (f"because marker {newer.pos}, certified at emission, is passed over: since its checkpoint, anchoring at "
            "pos 4") in text
    assert f"marker #{newer.pos}, certified at emission, is passed over: since its checkpoint" in html
    assert "does not give the context now: an obligation opened since its checkpoint" in html


def test_a_newer_marker_over_a_redacted_position_says_why(store: cs.Store) -> None:
    """A redaction in the newer marker's span: it falls back at its checkpoint, and both views give its reason."""
    s = store.session("why")
    older, newer = _two_markers(s)
    s.redact([7], "personal data")
    got = picture(s)
    assert got.loaded is not None and got.loaded.marker == older.pos
    pin = next(m for m in got.markers if m.pos == newer.pos)
    why = "anchoring at pos 10: redacted"  # the node over [4, 10), built from pos 7, is erased with it
    assert pin.state == "fallback" and pin.reasons[0].startswith(why)
    text, html = _shown(s)
    assert f"because marker {newer.pos}, certified at emission, is passed over: {why}" in text
    assert f"marker #{newer.pos}, certified at emission, is passed over: {why}" in html


def test_a_context_that_falls_back_gives_each_markers_reason(store: cs.Store) -> None:
    """No marker gives the context: both views list the resolution's reasons; each certified marker says what its cover lacks."""
    s = store.session("why")
    s.extend([cs.Turn("user", "step 0"), cs.Turn("user", "step 1")])
    s.bind("snapshot", "snap-1")
    s.append(cs.Turn("user", "step 2"))
    first = s.mark(s.compact(0, 4, summary="steps 0 to 2"))
    s.extend([cs.Turn("user", f"more {i}") for i in range(3)])
    s.compact(first.pos + 1, s.size, summary="more steps")
    second = s.mark()
    s.oblige("restore", needs=["snapshot"])
    s.mark_raw()
    r = s.context()
    got = picture(s)
    assert got.loaded is not None and got.loaded.mode == "fallback" and got.loaded.reasons == r.reasons
    assert len(r.reasons) == 3 and all(m.stale for m in got.markers if m.pos in (first.pos, second.pos))
    text, html = _shown(s)
    for reason in r.reasons:
        assert f"because {reason}" in text and escape(reason) in html
    assert text.count("certified at its checkpoint, not the context now: since its checkpoint, anchoring at pos 2") == 2
