"""``compactstore show``: a session as a picture, in the terminal (rich) or as one HTML page."""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Sequence

import click
import msgspec
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ..events import Lost
from ..picture import (
    NEGATIVE, Bar, Bin, Cell, Loaded, Picture, Pin, column, columns, lanes, lost_name, passed_over, picture,
    why_not,
)
from .app import EXIT_REFUSED, Failure, display, emit, main, opened, pick_session, reporting, store_options
from .verify import SHOWN

LOSS_STYLE = {"LOSSLESS": "black on green3", "LOSSY_GIST": "black on gold1", "LOSSY_LITERAL": "white on red3"}
SHORT_LOSS = {"LOSSLESS": "lossless", "LOSSY_GIST": "gist", "LOSSY_LITERAL": "literal"}
STATE_STYLE = {"certified": "bold green3", "fallback": "bold red3", "broken": "bold white on red3"}
#: Counted nodes and markers, drawn dim beside those drawn one by one.
COUNTED_STYLE = "grey50 on grey19"
#: Negative facts per column of counted positions, fewest to most.
LEVELS = "▁▂▃▄▅▆▇█"


def glyph(cell: Cell) -> tuple[str, str]:
    """Return the character and style (a background colour by kind) that stand for ``cell`` in the strip."""
    if cell.negative:
        return NEGATIVE[cell.negative], "bold white on red3"
    if cell.kind == "redacted":
        return "▒", "grey50 on grey15"
    if cell.derived:
        return {"node": "▤", "marker": "⚑", "spill": "⇣"}.get(cell.kind, "·"), "grey30 on grey70"
    if cell.open:
        return "○", "bold black on orange1"
    if cell.binding:
        return ("◆" if cell.binding == "non-regenerable" else "◇"), "bold white on magenta"
    if cell.kind == "turn":
        return ("u", "white on dodger_blue2") if cell.role == "user" else ("a", "black on dark_cyan")
    return {"tool_call": ("▸", "white on medium_purple"), "tool_result": ("✓", "black on green3"),
            "obligation": ("●", "white on deep_pink3"), "fulfilment": ("●", "black on green3"),
            "handle_opened": ("⊏", "white on grey37"), "handle_closed": ("⊐", "white on grey37")}.get(
        cell.kind, ("▪", "black on white"))


def counted_glyph(b: Bin, most: int) -> tuple[str, str]:
    """Return the character and style for counted positions: a dropped negative fact, how many, or what else they hold."""
    if b.dropped:
        return "✗", "bold white on red3"
    if b.negative:
        return LEVELS[min(len(LEVELS) - 1, (b.negative * len(LEVELS) - 1) // max(most, 1))], "red3 on grey15"
    if b.open:
        return "○", "bold black on orange1"
    if b.redacted:
        return "▒", "grey50 on grey15"
    if b.bindings:
        return "◆", "magenta on grey15"
    return "░", "grey50 on grey15"


class Scale:
    """Maps positions to character columns: several columns a position, or several positions a column."""

    def __init__(self, p: Picture, width: int) -> None:
        self.size = p.size
        self.ranges = columns(p, width)
        self.per = max(1, min(2, width // max(len(self.ranges), 1))) if not p.bins else 1
        self.starts = [a for a, _ in self.ranges]
        self.width = len(self.ranges) * self.per

    def col(self, pos: int) -> int:
        """Return the first column of position ``pos`` (``size`` gives the strip's end)."""
        if pos >= self.size:
            return self.width
        return (bisect_right(self.starts, pos) - 1) * self.per


def _strip(p: Picture, scale: Scale) -> Text:
    shown = [column(p, a, b) for a, b in scale.ranges]
    most = max((x.negative for x in shown if isinstance(x, Bin)), default=0)
    text = Text()
    for x in shown:
        ch, style = glyph(x) if isinstance(x, Cell) else counted_glyph(x, most)
        text.append(ch, style=style)
        text.append(" " * (scale.per - 1))
    return text


#: A stretch of a lane: its span, the labels it may carry (longest first) and its style.
Stretch = tuple[int, int, Sequence[str], str]


def _stretches(p: Picture, bars: Sequence[Bar], counted: int) -> list[Stretch]:
    """Return what a lane draws: its nodes drawn one by one, and the counted ones before them as one stretch."""
    out: list[Stretch] = []
    for b in bars:
        style = LOSS_STYLE.get(b.loss, "white on red3") + ("" if b.anchored else " strike")
        out.append((b.start, b.stop, (f"#{b.pos} {b.loss}", f"#{b.pos} {SHORT_LOSS.get(b.loss, '?')}", f"#{b.pos}"),
                    style))
    if counted:
        out.append((0, counted, ("older nodes, rolled up", "older", ""), COUNTED_STYLE))
    return sorted(out, key=lambda s: s[0])


def _lane(stretches: Sequence[Stretch], scale: Scale) -> Text:
    text = Text()
    at = 0
    for start, stop, labels, style in stretches:
        a, b = max(scale.col(start), at), max(scale.col(stop), at + 1)
        text.append(" " * (a - at))
        inner = max(b - a - 2, 0)
        label = next((x for x in labels if len(x) <= inner), "")
        text.append("│" if b - a == 1 else "[" + label.center(inner, "─") + "]", style=style)
        at = b
    return text


def pin_label(m: Pin) -> str:
    """Return a marker's label on the timeline: where it points, and ✓ certified, ✗ not, · not resumed."""
    mark = {"certified": "✓", None: "·"}.get(m.state, "✗")
    return f"⚑{m.pos}→{m.node if m.node is not None else 'raw'} {mark}"


def _pins(p: Picture, scale: Scale) -> Text:
    """Return the markers' row: each marker drawn one by one labelled where its label fits, counted ones dim."""
    line: list[tuple[str, str]] = [(" ", "")] * scale.width
    for (a, b), start in zip(scale.ranges, scale.starts):
        x = column(p, a, b)
        if isinstance(x, Bin) and x.markers:
            line[scale.col(start)] = ("·", "grey50")
    for m in sorted(p.markers, key=lambda m: -m.pos):
        col = min(scale.col(m.pos), scale.width - 1)
        style = STATE_STYLE.get(m.state or "", "grey70")
        label = pin_label(m)
        a = col if col + len(label) <= scale.width else col - len(label) + 1
        if a >= 0 and all(line[i][1] in ("", "grey50") for i in range(a, a + len(label))):
            line[a: a + len(label)] = [(ch, style) for ch in label]
        elif line[col][1] in ("", "grey50"):
            line[col] = ("⚑", style)
    text = Text()
    for ch, style in line:
        text.append(ch, style=style or None)
    text.rstrip()
    return text


def _axis(p: Picture, scale: Scale) -> Text:
    """Return the axis: round positions labelled where they fit, in the counted part and in the part drawn one by one."""
    line = [" "] * (scale.width + 8)
    pieces = [(0, p.tail), (p.tail, p.size)] if p.bins else [(0, p.size)]
    for start, stop in pieces:
        cols = max(scale.col(stop) - scale.col(start), 1)
        per_col = (stop - start) / cols
        room = len(f"{p.size:,}") + 3
        step = next(n * m for m in (10**k for k in range(10)) for n in (1, 2, 5) if n * m / per_col >= room)
        first = -(-start // step) * step
        for pos in [start, *range(first, stop + 1, step)]:
            label = f"{pos:,}"
            c = min(scale.col(pos), scale.width - len(label))  # the last label ends at the strip's end
            if c >= 0 and all(ch == " " for ch in line[max(c - 1, 0): c + len(label) + 1]):
                line[c: c + len(label)] = label
    return Text("".join(line).rstrip(), style="grey50")


def timeline(p: Picture, width: int) -> Table:
    """Return the lanes (L2, L1, raw strip, markers) as a rich table, scaled to ``width`` columns."""
    scale = Scale(p, max(width - 10, 10))
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", min_width=5, no_wrap=True, justify="right")
    grid.add_column(no_wrap=True, overflow="crop")
    for tier, (bars, counted) in sorted(lanes(p).items(), reverse=True):
        grid.add_row(f"L{tier}", _lane(_stretches(p, bars, counted), scale))
    grid.add_row("raw", _strip(p, scale))
    grid.add_row("", _axis(p, scale))
    if p.markers:
        grid.add_row("marks", _pins(p, scale))
    return grid


LEGEND = (
    (("u", "white on dodger_blue2", "user"), ("a", "black on dark_cyan", "assistant"),
     ("▸", "white on medium_purple", "tool call"), ("✓", "black on green3", "result"),
     ("●", "white on deep_pink3", "obligation")),
    (("✗⊘↺", "bold white on red3", "failed, rejected, superseded"), ("○", "bold black on orange1", "still open")),
    (("◇◆", "bold white on magenta", "binding (◆ non-regenerable)"), ("▤⇣⚑", "grey30 on grey70", "node, spill, marker")),
)
COUNTED_LEGEND = (
    ("▁▄█", "red3 on grey15", "negative facts, counted"), ("✗", "bold white on red3", "one dropped by the cover"),
    ("░", "grey50 on grey15", "none"), ("·", "grey50", "markers, counted"),
)


def _legend(p: Picture) -> Group:
    lines = []
    for row in LEGEND + ((COUNTED_LEGEND,) if p.bins else ()):
        text = Text("       ")
        for ch, style, what in row:
            text.append(ch, style=style)
            text.append(f" {what}   ", style="grey50")
        lines.append(text)
    return Group(*lines)


def _verdict(b: Bar) -> Text:
    if not b.anchored:
        return Text("✗ span root does not match the log", style="bold red3")
    if b.violations is None:
        return Text(f"· not checked: a span of {b.stop - b.start:,} positions", style="grey50")
    if not b.violations:
        return Text("✓ certifies", style="green3")
    first = b.violations[0].split(":", 1)[0]
    more = f" (+{len(b.violations) - 1})" if len(b.violations) > 1 else ""
    return Text(f"✗ {first}{more}", style="red3")


def named(names: Sequence[str], total: int, most: int = 3) -> str:
    """Return the first ``most`` of ``names`` joined, and how many of ``total`` more there are."""
    shown = ", ".join(names[:most])
    return shown + (f" (+{total - min(len(names), most)})" if total > min(len(names), most) else "")


def retains(b: Bar) -> str:
    """Return what a node retains, counted: negative facts, open and closed items, literals kept, spills."""
    t = b.totals
    out = [f"{t.negative_facts} facts", f"{t.unresolved} open"] + ([f"{t.resolved} closed"] if t.resolved else [])
    if t.kept:
        out.append("kept " + named([f"{e.pos}:{e.path}" for e in reversed(b.kept)], t.kept))
    if t.spills:
        out.append("spill " + named([r.key for r in reversed(b.spills)], t.spills))
    return " · ".join(out)


def _nodes_table(p: Picture) -> Table:
    t = Table(title="summary nodes, newest first", title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
              show_edge=False, pad_edge=False)
    for name in ("#", "tier", "covers", "loss", "retains", "a marker now"):
        t.add_column(name, no_wrap=name != "retains")
    for b in sorted(p.nodes, key=lambda b: -b.pos):
        t.add_row(str(b.pos), f"L{b.tier}", f"[{b.start}, {b.stop})", Text(b.loss, style=LOSS_STYLE.get(b.loss, "")),
                  retains(b), _verdict(b))
    for r in p.node_ranges:
        t.add_row(f"{r.first}…{r.last}", "older", "", "", Text(
            f"{r.count:,} nodes and spills, counted" + (", every node rolled up" if r.rolled_up else ""), style="grey50"),
            "")
    return t


def _lost_lines(p: Picture) -> list[Text]:
    """Return one line per node drawn one by one: the literals of its span it neither keeps nor states."""
    out = []
    for b in sorted(p.nodes, key=lambda b: -b.pos):
        line = Text(f"lost by #{b.pos}: ", style="bold")
        if b.lost is None:
            line.append(f"not read: a span of {b.stop - b.start:,} positions (Session.node reads it)", style="grey50")
        else:
            line.append_text(lost_text(b.lost))
        out.append(line)
    return out


def lost_text(lost: Sequence[Lost], most: int = 6) -> Text:
    """Return a node's loss manifest as one line: the first ``most`` literals it lost, and how many more."""
    if not lost:
        return Text("nothing", style="green3")
    more = f" (+{len(lost) - most})" if len(lost) > most else ""
    return Text(" · ".join(lost_name(x) for x in lost[:most]) + more, style="red3")


def target(m: Pin) -> str:
    """Return what a marker points at: the raw log, its node, or its cover."""
    if m.node is None:
        return "raw log"
    return f"cover {named([str(c) for c in m.cover], len(m.cover))}" if m.cover else f"node {m.node}"


def why(m: Pin, p: Picture) -> str:
    """Return why a marker gives the context now, or does not."""
    if m.gives:
        return "gives the context now: " + (m.reasons[0] if m.reasons else "it certifies")
    if m.state is None:
        source = p.loaded.marker if p.loaded is not None else -1
        return f"not resumed: marker {source} is newer and gives the context now"
    if m.stale:
        return f"certified at its checkpoint, not the context now: {m.stale[0]}" + (
            f" (+{len(m.stale) - 1})" if len(m.stale) > 1 else "")
    return m.reasons[0] if m.reasons else ""


def _markers_table(p: Picture) -> Table:
    t = Table(title="markers, newest first", title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
              show_edge=False, pad_edge=False)
    for name in ("#", "points at", "checkpoint", "resumes", "why"):
        t.add_column(name, no_wrap=name != "why")
    for m in sorted(p.markers, key=lambda m: -m.pos):
        t.add_row(str(m.pos), target(m), f"size {m.size}",
                  Text(m.state or "-", style=STATE_STYLE.get(m.state or "", "grey50")), why(m, p))
    for r in p.marker_ranges:
        t.add_row(f"{r.first}…{r.last}", f"{r.count:,} older", "", Text("-", style="grey50"),
                  Text("counted, not resumed" + ("" if p.loaded is None or p.loaded.marker < 0 else
                                                 "; a newer marker gives the context now"), style="grey50"))
    return t


def _facts_table(p: Picture, width: int) -> Table:
    t = Table(title="negative facts and open items, newest first", title_justify="left", title_style="bold",
              box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    t.add_column("pos", justify="right", no_wrap=True)
    t.add_column("what", width=10)
    room = max(width - len(str(p.size)) - 10 - 16 - 4 * 2 - 2, 16)
    t.add_column("event", width=room, no_wrap=True, overflow="ellipsis")
    t.add_column("kept by", width=16, no_wrap=True, overflow="ellipsis")
    for c in sorted((c for c in p.cells if c.negative or c.open), key=lambda c: -c.pos):
        by = Text()
        for n in c.kept_by:
            by.append(f"{n} ")
        for n in c.dropped_by:
            by.append(f"✗{n} ", style="bold red3")  # covered, and dropped
        for n in c.listed_by:
            by.append(f"{n} ")
        what = Text(c.negative, style="red3") if c.negative else Text("open", style="orange1")
        t.add_row(str(c.pos), what, c.text, by if by.plain else Text("-"))
    for i in sorted((i for i in p.open_items if i.pos < p.tail), key=lambda i: -i.pos):
        t.add_row(str(i.pos), Text("open", style="orange1"), f"{i.kind} {i.id}", Text("-"))
    return t


def _counted_line(p: Picture) -> Text | None:
    """Return what the positions before the tail hold that the facts table does not list, or None."""
    if not p.bins:
        return None
    negative = sum(b.negative for b in p.bins)
    dropped = sum(b.dropped for b in p.bins)
    hidden = p.open_total - len([i for i in p.open_items])
    line = Text(f"before pos {p.tail:,}: {negative:,} negative fact{'s' * (negative != 1)}, counted in the strip",
                style="grey50")
    if dropped:
        line.append(f"; {dropped:,} of them dropped by a node of the cover", style="bold red3")
    if hidden:
        line.append(f"; {hidden:,} more items still open", style="grey50")
    return line


def loaded_lines(x: Loaded, p: Picture | None = None) -> list[Text]:
    """Return the context a resumed agent loads now: its cover, span by span, its size against the raw log, and why."""
    source = f"marker {x.marker}" if x.marker >= 0 else "no marker certifies"
    raw = f"raw log {x.raw_items:,} items"
    if x.raw_characters is not None:
        share = x.characters / x.raw_characters if x.raw_characters else 1.0
        raw += f", {x.raw_characters:,} characters ({share:.1%})"
    head = Text(f"context now ({source}, {x.mode}): {x.items:,} items, {x.characters:,} characters; {raw}", style="bold")
    lines = [head]
    if x.mode != "certified" or x.marker < 0:
        lines += [Text(f"  because {r}", style="red3") for r in x.reasons]
    for m in passed_over(p) if p is not None and x.marker >= 0 else []:
        lines.append(Text(f"  because marker {m.pos}, certified at emission, is passed over: {why_not(m)}", style="red3"))
    earlier = f"{x.earlier} earlier spans · " if x.earlier else ""
    cover = " · ".join(f"[{s.start}, {s.stop}) " + (f"node {s.node}" if s.node >= 0 else "raw") for s in x.spans)
    lines.append(Text(f"cover: {earlier}{cover}", style="grey50"))
    return lines


def render(p: Picture, width: int) -> Group:
    """Return the whole terminal picture of ``p``."""
    head = Text()
    head.append(f"session {p.session!r}", style="bold")
    head.append(f"  ·  {p.size:,} events  ·  root {p.root[:16]}…", style="grey50")
    parts: list[object] = [head]
    if p.bins:
        parts.append(Text(f"positions before {p.tail:,} counted, the last {p.size - p.tail:,} drawn one by one",
                          style="grey50"))
    parts += [Text(""), timeline(p, width), _legend(p), Text("")]
    if p.nodes or p.node_ranges:
        parts += [_nodes_table(p), *_lost_lines(p), Text("")]
    if p.markers:
        parts += [_markers_table(p), Text("")]
    if p.loaded is not None:
        parts += [*loaded_lines(p.loaded, p), Text("")]
    elif p.context_error is not None:
        parts += [Text(f"context now: does not read: {p.context_error}", style="bold red3"), Text("")]
    if any(c.negative or c.open for c in p.cells) or p.open_total:
        parts += [_facts_table(p, width)]
    counted = _counted_line(p)
    if counted is not None:
        parts.append(counted)
    parts.append(Text(""))
    if p.findings is None:
        parts.append(Text(f"audit: not run on {p.size:,} events (it reads every one): `compactstore audit` runs it",
                          style="grey50"))
    for f in p.findings or []:
        parts.append(Text(f"audit: binding {f.key!r} (pos {f.binding_pos}) was compacted away by node {f.node} and "
                          f"needed {f.steps_later} steps later at pos {f.needed_at} by {f.via}", style="red3"))
    return Group(*parts)  # type: ignore[arg-type]


@main.command("show")
@store_options
@click.option("--html", "html_path", type=click.Path(dir_okay=False, writable=True), metavar="FILE",
              help="Write one self-contained HTML page (inline SVG, no network) to FILE instead.")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Verify the store first, and refuse (exit 1) to draw a session that does not verify.")
def show_command(target: str, key_env: str | None, session_name: str | None, as_json: bool,
                 html_path: str | None, verify: bool) -> None:
    """Draw a session: the raw positions as a strip, L1 and L2 nodes over the spans they cover,
    their loss classes, negative facts, open items, and each marker with whether it certifies.

    In the terminal by default; --html FILE writes a page to open in any browser; --json
    prints the same picture as data. The store is verified first: a session that does
    not verify is not drawn (exit 1) unless --no-verify is given.
    """
    with opened(target, key_env, as_json) as store:
        session = pick_session(store, session_name, target, as_json)
        with reporting(as_json):
            if verify:
                # A picture of a log that does not verify would draw forgeries as facts.
                report = store.verify()
                problems = [p for p in report.problems if p.session in (session.name, None)]
                if problems:
                    raise Failure(
                        f"the store {display(target)} does not verify: {len(problems)} problem"
                        f"{'s' * (len(problems) != 1)} in session {session.name!r}", EXIT_REFUSED,
                        error="IntegrityError", as_json=as_json, lines=[str(p) for p in problems[:SHOWN]],
                        details={"problems": [str(p) for p in problems]},
                        hint="`compactstore verify` lists them; --no-verify draws the session anyway")
            pic = picture(session)
    if html_path:
        from .page import page

        with open(html_path, "w", encoding="utf-8") as out:
            out.write(page(pic))
        emit(as_json, {"ok": True, "verified": verify, "html": html_path, "session": pic.session, "size": pic.size},
             f"wrote {html_path}: session {pic.session!r}, {pic.size} events, {len(pic.nodes)} nodes"
             + "".join(f" (and {r.count:,} older nodes and spills)" for r in pic.node_ranges)
             + f", {pic.marker_total} markers")
        return
    if as_json:
        click.echo(json.dumps({"ok": True, "verified": verify, **msgspec.to_builtins(pic)}))
        return
    console = Console(highlight=False)
    console.print(render(pic, min(console.width, 160)))
