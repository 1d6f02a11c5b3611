"""``compactstore show``: a session as a picture, in the terminal (rich) or as one HTML page."""

from __future__ import annotations

import json
from collections.abc import Sequence

import click
import msgspec
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ..events import Lost
from ..picture import NEGATIVE, Bar, Cell, Loaded, Picture, Pin, columns, lost_name, picture, rank
from .app import EXIT_REFUSED, Failure, display, emit, main, opened, pick_session, reporting, store_options
from .verify import SHOWN

LOSS_STYLE = {"LOSSLESS": "black on green3", "LOSSY_GIST": "black on gold1", "LOSSY_LITERAL": "white on red3"}
SHORT_LOSS = {"LOSSLESS": "lossless", "LOSSY_GIST": "gist", "LOSSY_LITERAL": "literal"}
STATE_STYLE = {"certified": "bold green3", "fallback": "bold red3", "broken": "bold white on red3"}
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


class Scale:
    """Maps positions to character columns: several columns a position, or several positions a column."""

    def __init__(self, size: int, width: int) -> None:
        self.size = size
        self.per = max(1, min(2, width // max(size, 1)))
        self.ranges = columns(size, width) if size > width else [(p, p + 1) for p in range(size)]
        self.width = len(self.ranges) * self.per

    def col(self, pos: int) -> int:
        """Return the first column of position ``pos`` (``size`` gives the strip's end)."""
        if pos >= self.size:
            return self.width
        if len(self.ranges) == self.size:
            return pos * self.per
        return next(i for i, (a, b) in enumerate(self.ranges) if a <= pos < b) * self.per


def _strip(p: Picture, scale: Scale) -> Text:
    text = Text()
    for a, b in scale.ranges:
        cell = max(p.cells[a:b], key=rank)
        ch, style = glyph(cell)
        text.append(ch, style=style)
        text.append(" " * (scale.per - 1))
    return text


def _lane(bars: Sequence[Bar], scale: Scale) -> Text:
    text = Text()
    at = 0
    for bar in sorted(bars, key=lambda b: b.start):
        a, b = max(scale.col(bar.start), at), max(scale.col(bar.stop), at + 1)
        text.append(" " * (a - at))
        inner = max(b - a - 2, 0)
        label = next((x for x in (f"#{bar.pos} {bar.loss}", f"#{bar.pos} {SHORT_LOSS.get(bar.loss, '?')}",
                                  f"#{bar.pos}") if len(x) <= inner), "")
        body = label.center(inner, "─")
        style = LOSS_STYLE.get(bar.loss, "white on red3") + ("" if bar.anchored else " strike")
        text.append(("[" + body + "]")[: b - a], style=style)
        at = b
    return text


def _pins(pins: Sequence[Pin], scale: Scale) -> Text:
    text = Text()
    at = 0
    for pin in pins:
        label = f"⚑{pin.pos}→{pin.node if pin.node is not None else 'raw'} " + ("✓" if pin.state == "certified" else "✗")
        col = scale.col(pin.pos)
        a = max(col if col + len(label) <= scale.width else col - len(label) + 1, at)
        text.append(" " * (a - at))
        text.append(label, style=STATE_STYLE[pin.state])
        at = a + len(label) + 1
        text.append(" ")
    return text


def _axis(scale: Scale) -> Text:
    per_pos = scale.width / max(scale.size, 1)
    step = next(n * m for m in (1, 10, 100, 1000, 10**4, 10**5, 10**6, 10**7, 10**8) for n in (1, 2, 5)
                if n * m * per_pos >= len(str(scale.size)) + 4)
    line = [" "] * (scale.width + 8)
    for pos in range(0, scale.size + 1, step):
        label = str(pos)
        c = scale.col(pos)
        if all(ch == " " for ch in line[max(c - 1, 0): c + len(label) + 1]):
            line[c: c + len(label)] = label
    return Text("".join(line).rstrip(), style="grey50")


def timeline(p: Picture, width: int) -> Table:
    """Return the lanes (L2, L1, raw strip, markers) as a rich table, scaled to ``width`` columns."""
    scale = Scale(p.size, max(width - 10, 10))
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", min_width=5, no_wrap=True, justify="right")
    grid.add_column(no_wrap=True, overflow="crop")
    for tier in sorted({b.tier for b in p.nodes}, reverse=True):
        grid.add_row(f"L{tier}", _lane([b for b in p.nodes if b.tier == tier], scale))
    grid.add_row("raw", _strip(p, scale))
    grid.add_row("", _axis(scale))
    if p.markers:
        grid.add_row("marks", _pins(p.markers, scale))
    return grid


LEGEND = (
    (("u", "white on dodger_blue2", "user"), ("a", "black on dark_cyan", "assistant"),
     ("▸", "white on medium_purple", "tool call"), ("✓", "black on green3", "result"),
     ("●", "white on deep_pink3", "obligation")),
    (("✗⊘↺", "bold white on red3", "failed, rejected, superseded"), ("○", "bold black on orange1", "still open")),
    (("◇◆", "bold white on magenta", "binding (◆ non-regenerable)"), ("▤⇣⚑", "grey30 on grey70", "node, spill, marker")),
)


def _legend() -> Group:
    lines = []
    for row in LEGEND:
        text = Text("       ")
        for ch, style, what in row:
            text.append(ch, style=style)
            text.append(f" {what}   ", style="grey50")
        lines.append(text)
    return Group(*lines)


def _verdict(b: Bar) -> Text:
    if not b.anchored:
        return Text("✗ span root does not match the log", style="bold red3")
    if not b.violations:
        return Text("✓ certifies", style="green3")
    first = b.violations[0].split(":", 1)[0]
    more = f" (+{len(b.violations) - 1})" if len(b.violations) > 1 else ""
    return Text(f"✗ {first}{more}", style="red3")


def _nodes_table(p: Picture) -> Table:
    t = Table(title="summary nodes", title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name, width in (("#", 3), ("tier", 4), ("covers", 9), ("loss", 13), ("retains", None),
                        ("a marker now", None)):
        t.add_column(name, width=width, no_wrap=width is not None)
    for b in p.nodes:
        retains = [f"{len(b.negative_facts)} facts", f"{len(b.unresolved)} open"]
        retains += [f"{len(b.resolved)} closed"] if b.resolved else []
        retains += [f"kept {e.pos}:{e.path}" for e in b.kept] + [f"spill {r.key}" for r in b.spills]
        t.add_row(str(b.pos), f"L{b.tier}", f"[{b.start}, {b.stop})", Text(b.loss, style=LOSS_STYLE.get(b.loss, "")),
                  " · ".join(retains), _verdict(b))
    return t


def _lost_lines(p: Picture) -> list[Text]:
    """Return one line per node: the literals of its span it neither keeps nor states (its loss manifest)."""
    out = []
    for b in p.nodes:
        line = Text(f"lost by #{b.pos}: ", style="bold")
        line.append_text(lost_text(b.lost))
        out.append(line)
    return out


def lost_text(lost: Sequence[Lost], most: int = 6) -> Text:
    """Return a node's loss manifest as one line: the first ``most`` literals it lost, and how many more."""
    if not lost:
        return Text("nothing", style="green3")
    more = f" (+{len(lost) - most})" if len(lost) > most else ""
    return Text(" · ".join(lost_name(x) for x in lost[:most]) + more, style="red3")


def _markers_table(p: Picture) -> Table:
    t = Table(title="markers", title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name, width in (("#", 3), ("points at", 9), ("checkpoint", 10), ("resumes", 9), ("why", None)):
        t.add_column(name, width=width, no_wrap=width is not None)
    for m in p.markers:
        t.add_row(str(m.pos), "raw log" if m.node is None else
                  (f"cover {', '.join(map(str, m.cover))}" if m.cover else f"node {m.node}"), f"size {m.size}",
                  Text(m.state, style=STATE_STYLE[m.state]), m.reasons[0] if m.reasons else "")
    return t


def _facts_table(p: Picture, width: int) -> Table:
    t = Table(title="negative facts and open items", title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    t.add_column("pos", justify="right", width=3)
    t.add_column("what", width=10)
    room = max(width - 3 - 10 - 8 - 4 * 2 - 2, 16)
    t.add_column("event", width=room, no_wrap=True, overflow="ellipsis")
    t.add_column("kept by", width=8)
    for c in p.cells:
        if not (c.negative or c.open):
            continue
        by = Text()
        for b in p.nodes:
            if any(f.pos == c.pos for f in b.negative_facts) or any(i.pos == c.pos for i in b.unresolved):
                by.append(f"{b.pos} ")
            elif c.negative and b.start <= c.pos < b.stop:
                by.append(f"✗{b.pos} ", style="bold red3")  # covered, and dropped
        what = Text(c.negative, style="red3") if c.negative else Text("open", style="orange1")
        t.add_row(str(c.pos), what, c.text, by if by.plain else Text("-"))
    return t


def loaded_lines(x: Loaded) -> list[Text]:
    """Return the context a resumed agent loads now: its cover, span by span, and its size against the raw log."""
    source = f"marker {x.marker}" if x.marker >= 0 else "no marker certifies"
    share = x.characters / x.raw_characters if x.raw_characters else 1.0
    head = Text(f"context now ({source}, {x.mode}): {x.items} items, {x.characters:,} characters; "
                f"raw log {x.raw_items} items, {x.raw_characters:,} characters ({share:.1%})", style="bold")
    cover = " · ".join(f"[{s.start}, {s.stop}) " + (f"node {s.node}" if s.node >= 0 else "raw") for s in x.spans)
    return [head, Text(f"cover: {cover}", style="grey50")]


def render(p: Picture, width: int) -> Group:
    """Return the whole terminal picture of ``p``."""
    head = Text()
    head.append(f"session {p.session!r}", style="bold")
    head.append(f"  ·  {p.size} events  ·  root {p.root[:16]}…", style="grey50")
    parts: list[object] = [head, Text(""), timeline(p, width), _legend(), Text("")]
    if p.nodes:
        parts += [_nodes_table(p), *_lost_lines(p), Text("")]
    if p.markers:
        parts += [_markers_table(p), Text("")]
    if p.loaded is not None:
        parts += [*loaded_lines(p.loaded), Text("")]
    if any(c.negative or c.open for c in p.cells):
        parts += [_facts_table(p, width), Text("")]
    for f in p.findings:
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
             f"wrote {html_path}: session {pic.session!r}, {pic.size} events, {len(pic.nodes)} nodes, "
             f"{len(pic.markers)} markers")
        return
    if as_json:
        click.echo(json.dumps({"ok": True, "verified": verify, **msgspec.to_builtins(pic)}))
        return
    console = Console(highlight=False)
    console.print(render(pic, min(console.width, 160)))
