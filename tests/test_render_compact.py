"""A digest's note stays bounded however many negative facts it retains: the newest in full, the earlier grouped, the rest counted."""

from __future__ import annotations

import re

import compactstore as cs
from compactstore import recall, render
from compactstore.resolver import SummaryItem


def _note_of(store: cs.Store, name: str, failures: int, texts: int | None = None) -> tuple[str, SummaryItem]:
    """Return the note of a certified node over ``failures`` failed calls, and the node's context item.

    The failures' texts cycle through ``texts`` distinct ones (each its own when None).
    """
    s = store.session(name)
    batch: list[cs.Event] = []
    for i in range(failures):
        k = i if texts is None else i % texts
        batch += [cs.ToolCall(f"c{i}", "run_sql", {"n": i}),
                  cs.ToolResult(f"c{i}", f"ERROR {k}: deadlock detected on table t{k} " + "x" * (300 if i == failures - 1 else 0),
                                ok=False, status="failed")]
        if len(batch) >= 500:
            s.extend(batch)
            batch = []
    s.extend([*batch, cs.Turn("user", "carry on")])
    s.mark(s.compact(0, s.size - 1))
    r = s.context()
    assert r.mode == "certified"
    (item,) = [i for i in r.context if isinstance(i, SummaryItem)]
    (note,) = [m for m in r.as_messages("chat") if m["role"] == "system"]
    assert isinstance(note["content"], str)
    return note["content"], item


def _facts(note: str) -> list[str]:
    """Return the lines of a note's negative-facts section."""
    section = note.split("Negative facts")[1].split("\n", 1)[1]
    return [line for line in section.splitlines() if line.startswith("- ")]


def _accounted(lines: list[str]) -> int:
    """Return how many facts the lines account for: one per newest line, a group's count, a counted rest."""
    n = 0
    for line in lines:
        if m := re.match(r"- (\d+) more earlier \w+ facts", line):
            n += int(m.group(1))
        elif m := re.match(r"- earlier \w+ ×(\d+)", line):
            n += int(m.group(1))
        else:
            n += 1
    return n


def test_the_newest_facts_are_written_in_full_and_every_fact_is_accounted_for(store: cs.Store) -> None:
    """The newest facts carry their text (cut to an excerpt); the lines' counts add up to every fact the node keeps."""
    note, item = _note_of(store, "many", 120)
    assert len(item.negative_facts) == 120  # the context item keeps every fact whole
    lines = _facts(note)
    assert _accounted(lines) == 120
    newest = item.negative_facts[-1]
    assert f"- pos {newest.pos} failed: {newest.text[: render.FACT_EXCERPT - 1]}…" in lines
    for f in item.negative_facts[-render.FACTS_IN_FULL :]:
        assert any(line.startswith(f"- pos {f.pos} failed: ") for line in lines)
    # The earlier groups past the listed ones are counted by status, with the span of their positions.
    counted = [line for line in lines if " more earlier failed facts" in line]
    assert len(counted) == 1
    assert f"between pos {item.negative_facts[0].pos} and " in counted[0]


def test_a_note_does_not_grow_with_the_facts_it_retains(store: cs.Store) -> None:
    """Ten times the failures, each with its own text, leave the note's negative facts within a few characters."""
    small, small_item = _note_of(store, "small", 150)
    large, large_item = _note_of(store, "large", 1500)
    assert len(large_item.negative_facts) == 10 * len(small_item.negative_facts)
    assert _accounted(_facts(large)) == 1500
    # Only the positions' digits differ: a bounded number of lines, each a digit longer in each of its numbers.
    assert len(_facts(large)) == len(_facts(small))
    assert abs(len("\n".join(_facts(large))) - len("\n".join(_facts(small)))) < 8 * len(_facts(small))


def test_repeated_facts_are_one_group_with_their_count_and_newest_positions(store: cs.Store) -> None:
    """Facts of one status and text go in as one line: how many, the text, and the newest positions."""
    s = store.session("repeated")
    s.extend([cs.Turn("user", f"No: do not backfill t{i % 3} in place.", status="rejected") for i in range(200)])
    s.append(cs.Turn("user", "carry on"))
    s.mark(s.compact(0, s.size - 1))
    r = s.context()
    (item,) = [i for i in r.context if isinstance(i, SummaryItem)]
    (note,) = [m["content"] for m in r.as_messages("openai-responses") if m.get("role") == "developer"]
    assert isinstance(note, str)
    lines = _facts(note)
    assert _accounted(lines) == 200
    groups = [line for line in lines if line.startswith("- earlier rejected ×")]
    assert len(groups) == 3
    earlier = item.negative_facts[: -render.FACTS_IN_FULL]
    for k in range(3):
        (line,) = [g for g in groups if f"backfill t{k} " in g]
        mine = [f.pos for f in earlier if f"backfill t{k} " in f.text]
        newest = ", ".join(map(str, reversed(mine[-render.GROUP_POSITIONS :])))
        assert line.startswith(f"- earlier rejected ×{len(mine)}: ")
        assert line.endswith(f"(pos {newest} and {len(mine) - render.GROUP_POSITIONS} earlier; "
                             f"recall facts:{mine[0]}-{mine[-1] + 1})")


def _node(n: int, width: int) -> SummaryItem:
    """Return a context item over ``n`` of every list a node holds, each text ``width`` characters or more."""
    pad = "y" * width
    return SummaryItem(
        pos=10 * n, tier=2, start=0, stop=10 * n - 1, span_root="", summary="s" * (100 * width), loss=cs.LossClass.LOSSY_GIST,
        negative_facts=[cs.events.Fact(3 * i, "failed", f"ERROR {i} {pad}") for i in range(n)],
        unresolved=[cs.events.Item(3 * i + 1, "tool_call", f"call-{i}-{pad}") for i in range(n)],
        resolved=[cs.events.Item(3 * i + 2, "handle", f"h{i}") for i in range(n)],
        kept=[cs.events.Excerpt(3 * i + 2, "value", f"{i} {pad}") for i in range(n)],
        spills=[cs.events.SpillRef(f"spill:{5 * n + i}", f"key{i % (n // 2 or 1)}-{pad}", 3 * i, "d") for i in range(n)],
        contract="c" * (100 * width),
    )


def test_every_list_a_note_prints_is_capped_so_the_note_does_not_grow_with_the_node() -> None:
    """Ten times the facts, open and closed items, kept literals and spills, each longer, leave the note within a few characters."""
    small = [render.messages([_node(300, 400)], fmt)[0]["content"] for fmt in render.FORMATS]
    large = [render.messages([_node(3000, 4000)], fmt)[0]["content"] for fmt in render.FORMATS]
    for a, b in zip(small, large, strict=True):
        assert isinstance(a, str) and isinstance(b, str)
        assert a.count("\n") == b.count("\n")
        assert abs(len(a) - len(b)) < 4 * a.count("\n") + 200  # a digit more in each number
        assert len(b) < 60_000
    note = str(large[0])
    for section, cap in (("UNRESOLVED (", render.ITEMS_LISTED), ("Resolved in", render.ITEMS_LISTED),
                         ("Kept verbatim", render.ITEMS_LISTED), ("Spilled to", render.SPILLS_LISTED)):
        lines = note.split(section, 1)[1].split("\n")[1:]
        listed = [line for line in lines[: cap + 2] if line.startswith("- ")]
        assert len(listed) == cap + 1, section  # the capped ones and one line counting the rest
        assert re.search(r"recall span:\d+-\d+", listed[0]), section


def test_what_a_note_counts_instead_of_quoting_names_a_handle_that_recalls_it(store: cs.Store) -> None:
    """The earlier facts a note groups or counts are fetched, every one, through the facts handles it names."""
    note, item = _note_of(store, "recalled", 400)
    s = store.session("recalled")
    quoted = {int(p) for p in re.findall(r"^- pos (\d+) ", note, re.M)}
    for listed in re.findall(r"\(pos ([\d, ]+)", note):
        quoted |= {int(p) for p in listed.split(", ")}
    fetched: set[int] = set()
    for handle in re.findall(r"recall (facts:\d+-\d+)", note):
        todo: str | None = handle
        while todo is not None:
            got = recall.recall(s, todo)
            fetched |= {int(p) for p in re.findall(r"^- pos (\d+) failed: ", got, re.M)}
            more = re.search(r"\(more: (facts:\d+-\d+)\)$", got)
            todo = more.group(1) if more else None
    unquoted = {f.pos for f in item.negative_facts} - quoted
    assert len(unquoted) > 300 and unquoted <= fetched
