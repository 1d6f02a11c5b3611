"""A digest's note names every negative fact it retains, the earlier ones by status and position, so it grows by a position per fact."""

from __future__ import annotations

import re

import compactstore as cs
from compactstore import render
from compactstore.resolver import SummaryItem


def _note_of(store: cs.Store, name: str, failures: int) -> tuple[str, SummaryItem]:
    """Return the note of a certified node over ``failures`` failed calls (each text its own), and the node's context item."""
    s = store.session(name)
    for i in range(failures):
        s.append(cs.ToolCall(f"c{i}", "run_sql", {"n": i}))
        s.append(cs.ToolResult(f"c{i}", f"ERROR {i}: deadlock detected on table t{i} " + "x" * (300 if i == failures - 1 else 0),
                               ok=False, status="failed"))
    s.append(cs.Turn("user", "carry on"))
    s.mark(s.compact(0, s.size - 1))
    r = s.context()
    assert r.mode == "certified"
    (item,) = [i for i in r.context if isinstance(i, SummaryItem)]
    (note,) = [m for m in r.as_messages("chat") if m["role"] == "system"]
    assert isinstance(note["content"], str)
    return note["content"], item


def test_a_note_names_every_negative_fact_the_newest_in_full(store: cs.Store) -> None:
    """Every retained fact's position is in the note; the newest are written with their text, cut to a bounded excerpt."""
    note, item = _note_of(store, "many", 120)
    positions = {f.pos for f in item.negative_facts}
    named = {int(p) for line in note.splitlines() if line.startswith("- ") for p in re.findall(r"\b\d+\b", line.split(":")[-1] if "earlier" in line else line[:14])}
    assert positions <= named
    assert len(item.negative_facts) == 120  # the context item keeps every fact whole
    assert "- earlier failed (80; the text of each is in the log at its position): pos 1, 3, 5," in note
    newest = item.negative_facts[-1]
    assert f"- pos {newest.pos} failed: {newest.text[: render.FACT_EXCERPT - 1]}…" in note.splitlines()


def test_a_note_grows_by_a_position_not_a_sentence_per_fact(store: cs.Store) -> None:
    """Twice the failures add well under a dozen characters of the note's negative facts per extra fact."""
    small, _ = _note_of(store, "small", 100)
    large, _ = _note_of(store, "large", 200)
    assert len(_facts(large)) - len(_facts(small)) < 100 * 12


def _facts(note: str) -> str:
    """Return the negative-facts section of a note."""
    return note.split("Negative facts")[1].split("\n", 1)[1].split("\n" + "UNRESOLVED")[0]
