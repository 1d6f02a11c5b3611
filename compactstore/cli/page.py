"""One self-contained HTML page for a session's picture: inline CSS and SVG, no script, no network."""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from html import escape

from ..picture import (
    NEGATIVE, Bar, Bin, Cell, NodeRange, Picture, Pin, column, columns, lanes, lost_name, passed_over, rank, why_not,
)

LOSS_COLOR = {"LOSSLESS": "#2f9e44", "LOSSY_GIST": "#e8a317", "LOSSY_LITERAL": "#d9480f"}
STATE_COLOR = {"certified": "#2b8a3e", "fallback": "#c92a2a", "broken": "#212529"}
KIND_COLOR = {
    "user": "#4263eb", "assistant": "#1098ad", "turn": "#868e96", "tool_call": "#7048e8", "tool_result": "#37b24d",
    "binding": "#ae3ec9", "obligation": "#d6336c", "fulfilment": "#74b816", "handle_opened": "#495057",
    "handle_closed": "#495057", "derived": "#dee2e6", "redacted": "#343a40",
}
DERIVED_GLYPH = {"node": "▤", "marker": "⚑", "spill": "⇣", "redaction": "✂", "redacted": "▒"}

WIDTH = 1100
LEFT, RIGHT = 78, 1080
MAX_COLUMNS = 600
#: The share of the timeline's width the positions drawn one by one take when earlier ones are counted.
TAIL_SHARE = 0.6
#: A marker's mark: certified at its checkpoint now, not resumed; any other state is ✗.
MARK: dict[str | None, str] = {"certified": "✓", None: "·"}
#: Lost literals listed on a node's card; the others are counted.
LOST_SHOWN = 16

CSS = """
:root { --bg:#f4f5f9; --card:#fff; --ink:#1d2330; --mute:#6b7385; --line:#e4e7ee;
        --bad:#e03131; --ok:#2b8a3e; --open:#f59f00; --gist:#e8a317; --literal:#d9480f; --lossless:#2f9e44; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
       font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
header { padding: 26px 36px 6px; }
.brand { color: var(--mute); font-size: 13px; letter-spacing: .08em; text-transform: uppercase; }
h1 { margin: 2px 0 4px; font-size: 28px; }
h2 { margin: 0 0 12px; font-size: 17px; }
.meta { color: var(--mute); }
code, pre { font-family: "DejaVu Sans Mono", ui-monospace, Menlo, Consolas, monospace; font-size: 12.5px; }
.chips { display: flex; flex-wrap: wrap; gap: 8px; margin: 14px 0 0; }
.chip { border-radius: 999px; padding: 3px 12px; background: #e9ecf3; font-size: 13.5px; }
.chip b { font-size: 15px; }
.chip.ok { background: #d3f9d8; color: #1b5e20; } .chip.bad { background: #ffe3e3; color: #a51111; }
.chip.open { background: #fff3bf; color: #7a5200; }
main { padding: 0 36px 36px; }
.card { background: var(--card); border-radius: 14px; padding: 18px 22px; margin: 16px 0;
        box-shadow: 0 1px 2px rgba(20,30,60,.06), 0 6px 18px rgba(20,30,60,.06); }
.grid { display: grid; grid-template-columns: 3fr 2fr; gap: 16px; }
.grid > .card, .grid > div > .card:first-child { margin-top: 0; }
svg { width: 100%; height: auto; display: block; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 18px; color: var(--mute); font-size: 13px; margin-top: 8px; }
.sw { display: inline-block; width: 12px; height: 12px; border-radius: 3px; vertical-align: -1px; margin-right: 5px; }
.node, .marker { border: 1px solid var(--line); border-radius: 10px; padding: 10px 12px; margin: 0 0 10px; }
.counted { background: #f8f9fa; border-style: dashed; }
.marker.gives { border: 2px solid var(--ok); }
.now { font-size: 13.5px; font-weight: 600; margin-top: 4px; } .now.ok { color: var(--ok); } .now.bad { color: var(--bad); }
.bad { color: var(--bad); }
.row { display: flex; flex-wrap: wrap; align-items: center; gap: 6px 10px; }
.badge { border-radius: 6px; padding: 1px 8px; color: #fff; font-size: 12px; font-weight: 600; }
.verdict { margin-left: auto; font-size: 13px; font-weight: 600; }
.verdict.ok { color: var(--ok); } .verdict.bad { color: var(--bad); }
.summary { background: #f8f9fc; border-radius: 8px; padding: 8px 10px; margin: 8px 0; max-height: 7.5em;
           overflow: auto; white-space: pre-wrap; }
.tag { display: inline-block; border-radius: 6px; padding: 0 7px; font-size: 12.5px; margin: 2px 4px 2px 0; }
.tag.failed, .tag.rejected, .tag.superseded, .tag.dropped { background: #ffe3e3; color: #a51111; }
.tag.open { background: #fff3bf; color: #7a5200; } .tag.lost { background: #ffe3e3; color: #a61e1e; } .tag.kept { background: #e7f5ff; color: #1864ab; }
.tag.listed { background: #f1f3f5; color: #343a40; }
.small { color: var(--mute); font-size: 13px; }
.reasons { margin: 6px 0 0 18px; padding: 0; font-size: 13.5px; }
.finding { background: #fff5f5; border: 1px solid #ffc9c9; border-radius: 10px; padding: 10px 12px; margin: 0 0 8px; }
table { border-collapse: collapse; width: 100%; font-size: 13.5px; }
th { text-align: left; color: var(--mute); font-weight: 600; border-bottom: 1px solid var(--line); padding: 4px 8px; }
td { border-bottom: 1px solid var(--line); padding: 4px 8px; vertical-align: top; }
td.num { text-align: right; color: var(--mute); width: 3em; }
details summary { cursor: pointer; font-weight: 600; }
footer { color: var(--mute); font-size: 12px; padding: 0 36px 24px; }
"""


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _color(cell: Cell) -> str:
    if cell.negative:
        return "#e03131"
    if cell.kind == "redacted":
        return KIND_COLOR["redacted"]
    if cell.derived:
        return KIND_COLOR["derived"]
    if cell.kind == "turn":
        return KIND_COLOR.get(cell.role or "", KIND_COLOR["turn"])
    return KIND_COLOR.get(cell.kind, "#adb5bd")


def _glyph(cell: Cell) -> str:
    if cell.negative:
        return NEGATIVE[cell.negative]
    if cell.derived:
        return DERIVED_GLYPH.get(cell.kind, "·")
    if cell.binding == "non-regenerable":
        return "◆"
    return ""


def _n(count: int, word: str) -> str:
    return f"{count:,} {word}{'s' * (count != 1)}"


class _Geometry:
    def __init__(self, p: Picture) -> None:
        self.size = max(p.size, 1)
        self.ranges = columns(p, MAX_COLUMNS)
        self.starts = [a for a, _ in self.ranges]
        # The positions drawn one by one take TAIL_SHARE of the width when some are counted.
        counted = sum(1 for a, _ in self.ranges if a < p.tail)
        own = len(self.ranges) - counted
        span = RIGHT - LEFT
        if counted and own:
            widths = [span * (1 - TAIL_SHARE) / counted] * counted + [span * TAIL_SHARE / own] * own
        else:
            widths = [span / max(len(self.ranges), 1)] * len(self.ranges)
        self.widths = widths
        self.lefts = _cumulative(widths)
        self.tiers = sorted(lanes(p), reverse=True)
        self.pins_y = 34
        self.lane_top = 78
        self.lane_h = 34
        self.lane_gap = 14
        self.strip_y = self.lane_top + len(self.tiers) * (self.lane_h + self.lane_gap) + 12
        self.strip_h = 46
        self.height = self.strip_y + self.strip_h + 58

    def x(self, pos: int) -> float:
        """Return the x of position ``pos``: its column's left edge, and a share of the column when it stands for several."""
        if pos >= self.size or not self.ranges:
            return RIGHT
        col = max(bisect_right(self.starts, pos) - 1, 0)
        a, b = self.ranges[col]
        return self.lefts[col] + (pos - a) / max(b - a, 1) * self.widths[col]

    def lane_y(self, tier: int) -> float:
        return self.lane_top + self.tiers.index(tier) * (self.lane_h + self.lane_gap)


def _cumulative(widths: list[float]) -> list[float]:
    """Return the left edge of each column of ``widths``, from LEFT."""
    out, at = [], float(LEFT)
    for w in widths:
        out.append(at)
        at += w
    return out


def _lane_bars(p: Picture) -> list[Bar]:
    """Return the nodes the lanes draw one by one."""
    return [b for bars, _ in lanes(p).values() for b in bars]


def _bar(b: Bar, g: _Geometry) -> list[str]:
    x0, x1 = g.x(b.start) + 1.5, max(g.x(b.stop) - 1.5, g.x(b.start) + 3)
    y = g.lane_y(b.tier)
    color = LOSS_COLOR.get(b.loss, LOSS_COLOR["LOSSY_LITERAL"])
    out = [
        f'<rect x="{x0:.1f}" y="{y + g.lane_h:.1f}" width="{x1 - x0:.1f}" height="{g.strip_y - y - g.lane_h:.1f}" '
        f'fill="{color}" opacity="0.09"/>',
    ]
    stroke = ' stroke="#e03131" stroke-width="2.5" stroke-dasharray="5 3"' if not b.anchored else ""
    title = (f"L{b.tier} node at pos {b.pos} covering [{b.start}, {b.stop}) · {b.loss} · "
             f"{b.totals.negative_facts} negative facts, {b.totals.unresolved} UNRESOLVED")
    out.append(f'<g><title>{_e(title)}</title><rect x="{x0:.1f}" y="{y:.1f}" width="{x1 - x0:.1f}" '
               f'height="{g.lane_h}" rx="8" fill="{color}"{stroke}/>')
    width = x1 - x0
    for label in (f"L{b.tier} · #{b.pos} · {b.loss}", f"#{b.pos} {b.loss}", f"#{b.pos}"):
        if len(label) * 7.4 + 12 <= width:
            out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{y + 22:.1f}" text-anchor="middle" class="bl">{_e(label)}</text>')
            break
    out.append("</g>")
    return out


def _counted_bar(p: Picture, stop: int, g: _Geometry) -> list[str]:
    """Return the nodes counted before those the L1 lane draws, all rolled up, as one hatched bar over ``[0, stop)``."""
    x0, x1 = g.x(0) + 1.5, max(g.x(stop) - 1.5, g.x(0) + 3)
    y = g.lane_y(1)
    older = sum(r.count for r in p.node_ranges)
    title = f"older nodes over [0, {stop}), rolled up" + (f"; {older:,} older nodes and spills counted" if older else "")
    out = [f'<g><title>{_e(title)}</title><rect x="{x0:.1f}" y="{y:.1f}" width="{x1 - x0:.1f}" height="{g.lane_h}" '
           f'rx="8" fill="url(#counted)" stroke="#adb5bd"/>']
    for label in ("older L1 nodes, rolled up", "older", ""):
        if len(label) * 7.4 + 12 <= x1 - x0:
            out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{y + 22:.1f}" text-anchor="middle" class="cl">{_e(label)}</text>')
            break
    out.append("</g>")
    return out


def _cells_column(p: Picture, g: _Geometry, a: int, b: int, out: list[str]) -> None:
    """Draw the column of positions ``[a, b)`` drawn one by one: its weightiest cell, dropped facts, open items."""
    cells = p.cells[a - p.tail: b - p.tail]
    cell = max(cells, key=rank)
    y, h = g.strip_y, g.strip_h
    x0, x1 = g.x(a), g.x(b) if b < p.size else RIGHT
    gap = 1.2 if x1 - x0 > 4 else 0
    title = f"pos {a}" + (f"–{b - 1}" if b - a > 1 else "") + f" · {cell.text}"
    if cell.negative:
        title += f" · {cell.negative}"
    out.append(f'<g><title>{_e(title)}</title><rect x="{x0:.2f}" y="{y}" width="{max(x1 - x0 - gap, 0.6):.2f}" '
               f'height="{h}" rx="{3 if x1 - x0 > 8 else 0}" fill="{_color(cell)}"/>')
    glyph = _glyph(cell)
    if glyph and x1 - x0 >= 11:
        fill = "#495057" if cell.derived and cell.kind != "redacted" else "#fff"
        out.append(f'<text x="{(x0 + x1 - gap) / 2:.1f}" y="{y + h / 2 + 6:.1f}" text-anchor="middle" '
                   f'class="gl" fill="{fill}">{glyph}</text>')
    out.append("</g>")
    dropped = sorted({n for c in cells for n in c.dropped_by})
    if dropped:
        what = f"dropped by node{'s' * (len(dropped) > 1)} {', '.join(f'#{d}' for d in dropped)}"
        out.append(f'<rect x="{x0 - 1.5:.2f}" y="{y - 3}" width="{max(x1 - x0 - gap, 0.6) + 3:.2f}" height="{h + 6}" '
                   f'rx="4" fill="none" stroke="#a51111" stroke-width="2.5" stroke-dasharray="4 2">'
                   f'<title>{_e(what)}</title></rect>')
    opened = [c for c in cells if c.open]
    if opened:
        out.append(f'<circle cx="{(x0 + x1 - gap) / 2:.1f}" cy="{y + h + 9}" r="4.5" fill="#f59f00">'
                   f'<title>{_e("still open: " + opened[0].text)}</title></circle>')


def _bins_column(x: Bin, most: int, g: _Geometry, out: list[str]) -> None:
    """Draw a column of counted positions: a grey bar, and in red from its foot the share of negative facts."""
    y, h = g.strip_y, g.strip_h
    x0, x1 = g.x(x.start), g.x(x.stop) if x.stop < g.size else RIGHT
    width = max(x1 - x0 - (1 if x1 - x0 > 3 else 0), 0.6)
    parts = [_n(x.negative, "negative fact")]
    if x.dropped:
        parts.append(f"{x.dropped:,} dropped by a node of the cover")
    parts += [_n(x.open, "item") + " still open"] if x.open else []
    parts += [_n(x.bindings, "non-regenerable binding")] if x.bindings else []
    parts += [f"{x.derived:,} nodes and spills", _n(x.markers, "marker")]
    parts += [f"{x.redacted:,} redacted"] if x.redacted else []
    title = f"pos {x.start}–{x.stop - 1}: " + ", ".join(parts)
    red = h * x.negative / most if most else 0.0
    out.append(f'<g><title>{_e(title)}</title><rect x="{x0:.2f}" y="{y}" width="{width:.2f}" height="{h}" '
               f'fill="{KIND_COLOR["redacted"] if x.redacted else "#ced4da"}"/>'
               + (f'<rect x="{x0:.2f}" y="{y + h - red:.2f}" width="{width:.2f}" height="{red:.2f}" fill="#ff8787"/>'
                  if red else "") + "</g>")
    if x.dropped:
        out.append(f'<rect x="{x0 - 1:.2f}" y="{y - 3}" width="{width + 2:.2f}" height="{h + 6}" fill="none" '
                   f'stroke="#a51111" stroke-width="2" stroke-dasharray="4 2"/>')
    if x.open:
        out.append(f'<circle cx="{(x0 + x1) / 2:.1f}" cy="{y + h + 9}" r="3.5" fill="#f59f00"/>')


def _strip(p: Picture, g: _Geometry) -> list[str]:
    out: list[str] = []
    shown = [(a, b, column(p, a, b)) for a, b in g.ranges]
    most = max((x.negative for _, _, x in shown if isinstance(x, Bin)), default=0)
    for a, b, x in shown:
        if isinstance(x, Bin):
            _bins_column(x, most, g, out)
        else:
            _cells_column(p, g, a, b, out)
    if p.bins:
        # Where the counted positions end and those drawn one by one begin.
        xt = g.x(p.tail)
        out.append(f'<line x1="{xt - 0.6:.1f}" y1="{g.lane_top - 8}" x2="{xt - 0.6:.1f}" y2="{g.strip_y + g.strip_h + 14}" '
                   f'stroke="#495057" stroke-width="1.2" stroke-dasharray="3 3"/>')
        out.append(f'<text x="{xt - 6:.1f}" y="{g.strip_y + g.strip_h + 50}" text-anchor="end" class="ax">'
                   f'← {p.tail:,} positions counted</text>')
        out.append(f'<text x="{xt + 6:.1f}" y="{g.strip_y + g.strip_h + 50}" class="ax">'
                   f'the last {p.size - p.tail:,} one by one →</text>')
    return out


def _axis(p: Picture, g: _Geometry) -> list[str]:
    y = g.strip_y + g.strip_h + 34
    out = [f'<line x1="{LEFT}" y1="{y - 14}" x2="{RIGHT}" y2="{y - 14}" stroke="#ced4da"/>']
    taken: list[tuple[float, float]] = []
    pieces = [(0, p.tail), (p.tail, p.size)] if p.bins else [(0, p.size)]
    for start, stop in pieces:
        width = max(g.x(stop) - g.x(start), 1.0)
        room = 9 * len(f"{p.size:,}") + 14
        step = next(n * m for m in (10**k for k in range(10)) for n in (1, 2, 5)
                    if width * n * m / max(stop - start, 1) >= room)
        for pos in [start, *range(-(-start // step) * step, stop + 1, step)]:
            x = g.x(pos)
            label = f"{pos:,}"
            half = 4.5 * len(label)
            if any(x - half < b and x + half > a for a, b in taken):
                continue
            taken.append((x - half - 6, x + half + 6))
            out.append(f'<line x1="{x:.1f}" y1="{y - 18}" x2="{x:.1f}" y2="{y - 10}" stroke="#adb5bd"/>')
            out.append(f'<text x="{x:.1f}" y="{y + 4}" text-anchor="middle" class="ax">{label}</text>')
    return out


def _pin_x(m: Pin, g: _Geometry) -> float:
    return (g.x(m.pos) + g.x(m.pos + 1)) / 2


def _labels(pins: list[Pin], g: _Geometry) -> list[tuple[float, str, str]]:
    """Place each pin's label right or left of it, shortened or left out where it would collide; newest first."""
    taken = [(_pin_x(m, g) - 14, _pin_x(m, g) + 14) for m in pins]
    placed: dict[int, tuple[float, str, str]] = {}
    for m in sorted(pins, key=lambda m: -m.pos):
        cx = _pin_x(m, g)
        choice = (0.0, "", "start")
        # A marker not resumed says nothing of its own: its circle alone, the counted ones' band left readable.
        for label in (f"#{m.pos} {m.state}", f"#{m.pos}") if m.state is not None else ():
            width = len(label) * 7.6
            spans = [((cx + 19, cx + 19 + width), (cx + 19, label, "start")),
                     ((cx - 19 - width, cx - 19), (cx - 19, label, "end"))]
            free = [spot for (a, b), spot in spans
                    if LEFT - 60 <= a and b <= WIDTH - 4 and all(b <= x or a >= y for x, y in taken)]
            if free:
                choice = free[0]
                a = choice[0] if choice[2] == "start" else choice[0] - width
                taken.append((a, a + width))
                break
        placed[m.pos] = choice
    return [placed[m.pos] for m in pins]


def _pin(m: Pin, p: Picture, g: _Geometry, label: tuple[float, str, str]) -> list[str]:
    cx = _pin_x(m, g)
    color = STATE_COLOR.get(m.state or "", "#868e96")
    out = []
    target = next((b for b in _lane_bars(p) if b.pos == m.node), None)
    if target is not None:
        tx = min(max(cx, g.x(target.start) + 14), g.x(target.stop) - 14)
        ty = g.lane_y(target.tier)
        out.append(f'<path d="M{cx:.1f},{g.pins_y + 13} C{cx:.1f},{ty - 16:.1f} {tx:.1f},{g.pins_y + 20} {tx:.1f},{ty:.1f}" '
                   f'fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="5 4"/>')
    out.append(f'<line x1="{cx:.1f}" y1="{g.pins_y}" x2="{cx:.1f}" y2="{g.strip_y}" stroke="{color}" stroke-width="1" '
               f'opacity="0.35"/>')
    mark = MARK.get(m.state, "✗")
    where = "the raw log" if m.node is None else f"node {m.node}"
    title = (f"marker at pos {m.pos} → {where} · checkpoint size {m.size} · resumes {m.state or 'not resumed'}: "
             + "; ".join(m.reasons))
    lx, text, anchor = label
    ring = ' stroke="#1d2330" stroke-width="3"' if m.gives else ""
    out.append(f'<g><title>{_e(title)}</title><circle cx="{cx:.1f}" cy="{g.pins_y}" r="13" fill="{color}"{ring}/>'
               f'<text x="{cx:.1f}" y="{g.pins_y + 5.5}" text-anchor="middle" class="pm">{mark}</text>'
               + (f'<text x="{lx:.1f}" y="{g.pins_y + 5}" text-anchor="{anchor}" class="pl" fill="{color}">'
                  f'{_e(text)}</text>' if text else "") + "</g>")
    return out


def _counted_pins(p: Picture, g: _Geometry) -> list[str]:
    """Return the markers not drawn one by one: a thin grey band over each run of columns that holds some, with how many."""
    out = []
    run: list[Bin] = []
    shown = [column(p, a, b) for a, b in g.ranges]
    for x in [*shown, None]:
        if isinstance(x, Bin) and x.markers:
            run.append(x)
            continue
        if run:
            x0, x1 = g.x(run[0].start), g.x(run[-1].stop)
            count = sum(b.markers for b in run)
            title = f"{_n(count, 'marker')} at pos {run[0].start}–{run[-1].stop - 1}, counted"
            out.append(f'<g><title>{_e(title)}</title><rect x="{x0:.1f}" y="{g.pins_y - 4}" width="{max(x1 - x0, 2):.1f}" '
                       f'height="8" rx="4" fill="#adb5bd"/></g>')
            run = []
    if out and p.marker_ranges:
        r = p.marker_ranges[0]
        out.append(f'<text x="{LEFT + 4}" y="{g.pins_y - 12}" class="ax">{_n(r.count, "older marker")}, counted</text>')
    return out


def timeline(p: Picture) -> str:
    """Return the session's timeline as an inline SVG element."""
    g = _Geometry(p)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {g.height}" role="img" '
        f'aria-label="timeline of session {_e(p.session)}">',
        "<style>text{font-family:system-ui,'DejaVu Sans',sans-serif}.bl{font-size:13px;font-weight:700;fill:#fff}"
        ".cl{font-size:13px;font-weight:700;fill:#495057}"
        ".gl{font-size:15px;font-weight:700}.ax{font-size:12px;fill:#868e96}.lane{font-size:12.5px;fill:#6b7385;"
        "font-weight:600}.pm{font-size:15px;font-weight:700;fill:#fff}.pl{font-size:13px;font-weight:700}</style>",
        '<defs><pattern id="counted" width="8" height="8" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
        '<rect width="8" height="8" fill="#e9ecef"/><rect width="3" height="8" fill="#ced4da"/></pattern></defs>',
    ]
    labels: list[tuple[str, float]] = [("markers", g.pins_y + 4)] if p.markers else []
    labels += [(f"L{t}", g.lane_y(t) + 21) for t in g.tiers]
    labels += [("raw", g.strip_y + g.strip_h / 2 + 4)]
    for text, y in labels:
        parts.append(f'<text x="{LEFT - 14}" y="{y:.1f}" text-anchor="end" class="lane">{text}</text>')
    counted = lanes(p).get(1, ([], 0))[1]
    if counted:
        parts += _counted_bar(p, counted, g)
    for b in sorted(_lane_bars(p), key=lambda b: -b.tier):
        parts += _bar(b, g)
    parts += _strip(p, g)
    parts += _axis(p, g)
    parts += _counted_pins(p, g)
    for m, label in zip(p.markers, _labels(p.markers, g)):
        parts += _pin(m, p, g, label)
    parts.append("</svg>")
    return "\n".join(parts)


def _legend(p: Picture) -> str:
    items = [
        (KIND_COLOR["user"], "user turn"), (KIND_COLOR["assistant"], "assistant turn"),
        (KIND_COLOR["tool_call"], "tool call"), (KIND_COLOR["tool_result"], "tool result"),
        (KIND_COLOR["binding"], "binding (◆ non-regenerable)"), (KIND_COLOR["obligation"], "obligation"),
        ("#e03131", "negative fact: ✗ failed, ⊘ rejected, ↺ superseded (dashed: dropped by a summary)"),
        ("#f59f00", "still open"),
        (KIND_COLOR["derived"], "derived: ▤ node, ⇣ spill, ⚑ marker"),
        (LOSS_COLOR["LOSSLESS"], "LOSSLESS"), (LOSS_COLOR["LOSSY_GIST"], "LOSSY_GIST"),
        (LOSS_COLOR["LOSSY_LITERAL"], "LOSSY_LITERAL"),
    ]
    if p.bins:
        items += [("#ced4da", "counted positions: the red share of a column is its negative facts against the most any "
                              "column holds; hover for the counts")]
    return '<div class="legend">' + "".join(
        f'<span><span class="sw" style="background:{c}"></span>{_e(t)}</span>' for c, t in items) + "</div>"


def _tags(entries: list[str], total: int, cls: str) -> str:
    """Return the tags of a node's list, newest last, with how many older ones are not shown."""
    if not total:
        return '<span class="small">none</span>'
    more = f'<span class="small">{total - len(entries):,} older and </span>' if total > len(entries) else ""
    return more + "".join(f'<span class="tag {cls}">{e}</span>' for e in entries)


def _node_card(b: Bar) -> str:
    color = LOSS_COLOR.get(b.loss, LOSS_COLOR["LOSSY_LITERAL"])
    if not b.anchored:
        verdict = '<span class="verdict bad">✗ span root does not match the log</span>'
    elif b.violations is None:
        verdict = f'<span class="verdict small">not checked here: a span of {b.stop - b.start:,} positions</span>'
    elif b.violations:
        verdict = (f'<span class="verdict bad">✗ a marker emitted now would be refused: '
                   f'{_e(b.violations[0].split(":", 1)[0])}</span>')
    else:
        verdict = '<span class="verdict ok">✓ a marker emitted now would certify</span>'
    t = b.totals
    facts = "".join(f'<span class="tag {f.status}" title="{_e(f.text)}">{f.pos} {f.status}</span>' for f in b.negative_facts)
    facts = (f'<span class="small">{t.negative_facts - len(b.negative_facts):,} older and </span>'
             if t.negative_facts > len(b.negative_facts) else "") + (facts or '<span class="small">none</span>')
    items = _tags([f"{_e(i.kind)} {_e(i.id)}" for i in b.unresolved], t.unresolved, "open")
    kept = "".join(f'<span class="tag kept">{e.pos}:{_e(e.path)}</span>' for e in b.kept)
    kept += "".join(f'<span class="tag kept" title="digest {_e(r.digest)}">{_e(r.key)} → {_e(r.handle)}</span>'
                    for r in b.spills)
    hidden = t.kept + t.spills - len(b.kept) - len(b.spills)
    children = f' · digests {", ".join(f"#{c}" for c in b.children[-8:])}' if b.children else ""
    if len(b.children) > 8:
        children += f" and {len(b.children) - 8:,} earlier"
    rolled = f" · rolled up by #{b.rolled_up_by}" if b.rolled_up_by is not None else " · in the cover"
    rows = [
        f'<div class="row"><span class="badge" style="background:{color}">{_e(b.loss)}</span>'
        f'<b>L{b.tier} #{b.pos}</b><span class="small">covers [{b.start}, {b.stop}){children}{rolled}</span>{verdict}</div>',
        f'<pre class="summary">{_e(b.summary)}</pre>',
        f'<div class="small">negative facts retained: {facts}</div>',
        f'<div class="small">UNRESOLVED: {items}</div>',
    ]
    if kept:
        more = f'<span class="small">{hidden:,} older and </span>' if hidden > 0 else ""
        rows.append(f'<div class="small">kept verbatim or spilled: {more}{kept}</div>')
    if b.lost is None:
        lost = f'<span class="small">not read: a span of {b.stop - b.start:,} positions (Session.node reads it)</span>'
    else:
        lost = "".join(f'<span class="tag lost">{_e(lost_name(x))}</span>' for x in b.lost[:LOST_SHOWN]) \
            or '<span class="small">nothing</span>'
        if len(b.lost) > LOST_SHOWN:
            lost += f'<span class="small"> and {len(b.lost) - LOST_SHOWN:,} more</span>'
    rows.append(f'<div class="small">lost (neither kept nor stated in the summary): {lost}</div>')
    if b.violations:
        rows.append('<ul class="reasons">' + "".join(f"<li>{_e(v)}</li>" for v in b.violations) + "</ul>")
    return '<div class="node">' + "".join(rows) + "</div>"


def _range_card(r: NodeRange) -> str:
    rolled = "; every node among them is rolled up" if r.rolled_up else ""
    return (f'<div class="node counted"><div class="row"><b>{r.count:,} older nodes and spills</b>'
            f'<span class="small">#{r.first} … #{r.last}</span></div>'
            f'<div class="small">counted, not drawn one by one{rolled}</div></div>')


def _claim(m: Pin) -> str:
    """Return what the marker's recorded conditions say, as certified only when resuming certifies them now."""
    if not m.conditions:
        return "certifies nothing: a raw checkpoint"
    listed = ", ".join(m.conditions)
    if m.state == "certified":
        return f"certified at emission and again at its checkpoint now: {listed}"
    if m.state is None:
        return f"claims {listed}; not resumed, as a newer marker gives the context now"
    # The conditions are the marker's own claim: a forged or broken marker may claim anything.
    return f"claims {listed}, which do not hold now"


def _marker_card(m: Pin) -> str:
    color = STATE_COLOR.get(m.state or "", "#868e96")
    where = "the raw log" if m.node is None else f"node #{m.node}"
    if m.cover:
        shown = ", ".join(f"#{c}" for c in m.cover[:4]) + (f" and {len(m.cover) - 4:,} more" if len(m.cover) > 4 else "")
        where = f"cover {shown}"
    digest = f'<div class="small">resolution digest <code>{m.digest[:32]}…</code></div>' if m.digest else ""
    if m.gives:
        now = '<div class="now ok">gives the context a resumed agent loads now</div>'
    elif m.stale:
        now = ('<div class="now bad">does not give the context now: an obligation opened since its checkpoint needs '
               'what its cover dropped</div><ul class="reasons">' + "".join(f"<li>{_e(r)}</li>" for r in m.stale) + "</ul>")
    else:
        now = ""
    state = m.state or "not resumed"
    return (
        f'<div class="marker{" gives" if m.gives else ""}"><div class="row"><b>⚑ #{m.pos} → {_e(where)}</b>'
        f'<span class="small">checkpoint size {m.size} · root <code>{m.root[:16]}…</code></span>'
        f'<span class="verdict" style="color:{color}">{MARK.get(m.state, "✗")} {state}</span></div>'
        f'<div class="small">{_e(_claim(m))}</div>'
        + ('<ul class="reasons">' + "".join(f"<li>{_e(r)}</li>" for r in m.reasons) + "</ul>" if m.reasons else "")
        + now + digest + "</div>"
    )


def _facts(p: Picture) -> str:
    rows = []
    for c in sorted((c for c in p.cells if c.negative or c.open), key=lambda c: -c.pos):
        tags = [f'<span class="tag kept">kept by #{n}</span>' for n in c.kept_by]
        tags += [f'<span class="tag dropped">dropped by #{n}</span>' for n in c.dropped_by]
        tags += [f'<span class="tag listed">listed by #{n}</span>' for n in c.listed_by]
        what = c.negative or "open"
        rows.append(f'<tr><td class="num">{c.pos}</td><td><span class="tag {what}">{what}</span></td>'
                    f'<td>{_e(c.text)}</td><td>{"".join(tags)}</td></tr>')
    for i in sorted((i for i in p.open_items if i.pos < p.tail), key=lambda i: -i.pos):
        rows.append(f'<tr><td class="num">{i.pos}</td><td><span class="tag open">open</span></td>'
                    f'<td>{_e(i.kind)} {_e(i.id)}</td><td></td></tr>')
    counted = ""
    if p.bins:
        negative, dropped = sum(b.negative for b in p.bins), sum(b.dropped for b in p.bins)
        hidden = p.open_total - len(p.open_items)
        counted = (f'<p class="small">Before pos {p.tail:,}: {_n(negative, "negative fact")}, counted in the strip'
                   + (f', <b class="bad">{dropped:,} of them dropped by a node of the cover</b>' if dropped else "")
                   + (f"; {hidden:,} more items still open" if hidden else "") + ".</p>")
    if not rows and not counted:
        return ""
    table = ('<table><tr><th>pos</th><th>what</th><th>event</th><th>in summary nodes</th></tr>' + "".join(rows)
             + "</table>") if rows else ""
    return f'<section class="card"><h2>Negative facts and open items, newest first</h2>{counted}{table}</section>'


def _events(p: Picture) -> str:
    rows = "".join(
        f'<tr><td class="num">{c.pos}</td><td>{_e(c.kind)}</td><td>{_e(c.text)}</td>'
        f'<td>{_e(" ".join(x for x in (c.negative, "open" if c.open else None, c.binding) if x))}</td></tr>'
        for c in sorted(p.cells, key=lambda c: -c.pos)
    )
    what = (f"The last {len(p.cells):,} events, newest first (positions before {p.tail:,} are counted in the timeline)"
            if p.tail else f"All {p.size} events, newest first")
    return (f'<section class="card"><details><summary>{what}</summary><table><tr><th>pos</th>'
            f'<th>kind</th><th>event</th><th></th></tr>{rows}</table></details></section>')


def _chips(p: Picture) -> str:
    chips = []
    by_tier = Counter(b.tier for b in p.nodes)
    tiers = ", ".join(f"{by_tier[t]:,} L{t}" for t in sorted(by_tier))
    older = "".join(f" and {r.count:,} older nodes and spills" for r in p.node_ranges)
    chips.append(f'<span class="chip"><b>{len(p.nodes):,}</b> summary nodes{f" ({tiers})" if tiers else ""}{older}</span>')
    for state, word, cls in (("certified", "certified", "ok"), ("fallback", "falls back", "bad"),
                             ("broken", "does not verify", "bad")):
        n = sum(1 for m in p.markers if m.state == state)
        if n:
            chips.append(f'<span class="chip {cls}"><b>{n}</b> marker{"s" * (n != 1)} {word}</span>')
    unresumed = sum(1 for m in p.markers if m.state is None) + sum(r.count for r in p.marker_ranges)
    if unresumed:
        chips.append(f'<span class="chip"><b>{unresumed:,}</b> older marker{"s" * (unresumed != 1)} not resumed</span>')
    chips.append(f'<span class="chip bad"><b>{p.negatives:,}</b> negative facts</span>')
    chips.append(f'<span class="chip open"><b>{p.open_total:,}</b> still open</span>')
    if p.findings:
        chips.append(f'<span class="chip bad"><b>{len(p.findings)}</b> audit finding{"s" * (len(p.findings) != 1)}</span>')
    return '<div class="chips">' + "".join(chips) + "</div>"


def _loaded_card(p: Picture) -> str:
    """Return the card of the context a resumed agent loads now: where it comes from and why, its cover, its size."""
    x = p.loaded
    if x is None:
        if p.context_error is None:
            return ""
        return f'<section class="card"><h2>Context now</h2><p class="bad">does not read: {_e(p.context_error)}</p></section>'
    source = f"marker #{x.marker}" if x.marker >= 0 else "no marker certifies"
    raw = f"raw log {x.raw_items:,} items"
    if x.raw_characters is not None:
        share = x.characters / x.raw_characters if x.raw_characters else 1.0
        raw += f", {x.raw_characters:,} characters (<b>{share:.1%}</b>)"
    why = []
    if x.marker < 0:
        why += [_e(r) for r in x.reasons]
    else:
        why += [f"marker #{m.pos}, certified at emission, is passed over: {_e(why_not(m))}" for m in passed_over(p)]
    because = ('<p class="small">Why:</p><ul class="reasons">' + "".join(f"<li>{w}</li>" for w in why) + "</ul>"
               if why else "")
    rows = "".join(f'<tr><td>[{s.start}, {s.stop})</td><td>{f"node #{s.node}" if s.node >= 0 else "raw events"}</td></tr>'
                   for s in reversed(x.spans))
    if x.earlier:
        rows += f'<tr><td colspan="2" class="small">and {_n(x.earlier, "earlier span")}</td></tr>'
    return (f'<section class="card"><h2>Context now</h2><p>{_e(source)}, {_e(x.mode)}: <b>{x.items:,}</b> items, '
            f"<b>{x.characters:,}</b> characters; {raw}</p>{because}"
            f"<table><tr><th>span, newest first</th><th>loaded from</th></tr>{rows}</table></section>")


def page(p: Picture) -> str:
    """Return the whole HTML page for ``p``: self-contained, no script, no network."""
    nodes = "".join(_node_card(b) for b in sorted(p.nodes, key=lambda b: -b.pos))
    nodes += "".join(_range_card(r) for r in sorted(p.node_ranges, key=lambda r: -r.last))
    markers = "".join(_marker_card(m) for m in sorted(p.markers, key=lambda m: -m.pos))
    markers += "".join(f'<div class="marker counted"><b>{_n(r.count, "older marker")}</b> '
                       f'<span class="small">#{r.first} … #{r.last}: counted, not resumed</span></div>'
                       for r in p.marker_ranges)
    findings = "".join(
        f'<div class="finding"><b>binding {_e(f.key)!s}</b> (pos {f.binding_pos}) was compacted away by the lossy '
        f"node #{f.node} and needed {f.steps_later} steps later, at pos {f.needed_at}, by {_e(f.via)}</div>"
        for f in p.findings or []
    )
    if p.findings is None:
        findings = (f'<p class="small">Not run on {p.size:,} events: the audit reads every one. '
                    "<code>compactstore audit</code> runs it.</p>")
    findings_card = f'<div class="card"><h2>Audit</h2>{findings}</div>' if findings else ""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>compactstore · {_e(p.session)}</title>
<style>{CSS}</style>
</head>
<body>
<header>
<div class="brand">compactstore</div>
<h1>{_e(p.session)}</h1>
<div class="meta">{p.size:,} events · root <code>{p.root}</code></div>
{_chips(p)}
</header>
<main>
<section class="card"><h2>Timeline</h2>
{timeline(p)}
{_legend(p)}
</section>
{_loaded_card(p)}
<section class="grid">
<div class="card"><h2>Summary nodes, newest first</h2>{nodes or '<p class="small">no summary nodes</p>'}</div>
<div>
<div class="card"><h2>Markers, newest first</h2>{markers or '<p class="small">no markers</p>'}</div>
{findings_card}
</div>
</section>
{_facts(p)}
{_events(p)}
</main>
<footer>Drawn by <code>compactstore show --html</code>. Markers were resumed when this page was made.</footer>
</body>
</html>
"""
