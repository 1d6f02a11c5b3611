"""show and the HTML page draw the context a resumed agent loads now: its cover span by span, its size against the raw log."""

from __future__ import annotations

import json

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
