"""`compactstore show`: the picture as data, in the terminal, and as one HTML page rendered by Chromium."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

import compactstore as cs
from compactstore import demo
from compactstore.cli import main
from compactstore.cli.page import MAX_COLUMNS, page
from compactstore.cli.show import LEVELS, render
from compactstore.picture import BINS, MARKERS, NODES, TAIL, MarkerRange, Picture, picture
from compactstore.structure import build


def _quiet(text: str, style: str | None = None) -> None:
    pass


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Return the path of a store the demo wrote."""
    path = str(tmp_path_factory.mktemp("demo") / "compactstore.db")
    demo.run(path, _quiet)
    return path


@pytest.fixture(scope="module")
def pic(demo_store: str) -> Picture:
    """Return the picture of the demo's session."""
    with cs.open(demo_store) as store:
        return picture(store.session(demo.SESSION))


def test_the_picture_holds_nodes_markers_facts_and_findings(pic: Picture) -> None:
    """Nodes with their spans and loss classes, markers with what they resume to, negative facts, the finding."""
    assert pic.size == 43 and len(pic.cells) == 43
    assert [(b.pos, b.tier, b.start, b.stop, b.loss) for b in pic.nodes] == [
        (30, 1, 0, 17, "LOSSY_GIST"), (31, 1, 17, 29, "LOSSY_GIST"), (32, 2, 0, 29, "LOSSY_GIST"),
        (41, 1, 34, 41, "LOSSY_GIST")]
    assert all(b.anchored for b in pic.nodes)
    assert [(m.pos, m.node, m.state) for m in pic.markers] == [(33, 32, "certified"), (42, None, "fallback")]
    assert pic.markers[1].reasons[0].startswith("raw-checkpoint marker")
    assert [c.pos for c in pic.cells if c.negative] == [6, 7, 8, 20, 22, 36]
    assert [c.pos for c in pic.cells if c.open] == [16, 17, 27, 39]
    assert pic.cells[14].binding == "non-regenerable" and pic.cells[4].binding == "regenerable"
    assert [(f.key, f.node, f.needed_at) for f in pic.findings or []] == [("snapshot", 30, 39)]
    assert pic.nodes[3].violations == [
        "negative_facts at pos 36: rejected item dropped: user: Do not drop anything until the rollback "
        "window closes on Friday."]


def test_a_marker_over_a_tampered_log_shows_as_broken(demo_store: str, tmp_path: Path) -> None:
    """A checkpoint that no longer verifies is drawn as broken, with the error as its reason."""
    copy = str(tmp_path / "t.db")
    shutil.copyfile(demo_store, copy)
    demo.tamper(copy, 8, b"No. Do not", b"OK. Go on,")
    with cs.open(copy) as store:
        got = picture(store.session(demo.SESSION))
    assert [m.state for m in got.markers] == ["broken", "broken"]
    # Whichever check meets the rewritten body first, the reason says the tree does not hold it.
    reason = got.markers[0].reasons[0]
    assert "not in the tree of the latest sealed head" in reason or "do not give the stored tree's root" in reason


def test_the_terminal_picture_draws_lanes_strip_and_markers(pic: Picture) -> None:
    """The lanes label nodes by loss class, the strip marks negative facts, markers say whether they certify."""
    console = Console(width=100, record=True, color_system=None)
    console.print(render(pic, 100))
    text = console.export_text()
    lines = text.splitlines()
    l2 = next(line for line in lines if line.strip().startswith("L2"))
    l1 = next(line for line in lines if line.strip().startswith("L1"))
    raw = next(line for line in lines if line.strip().startswith("raw"))
    assert "#32 LOSSY_GIST" in l2 and "#30 LOSSY_GIST" in l1 and "#41" in l1
    assert raw.count("✗") == 2 and raw.count("⊘") == 2 and raw.count("↺") == 2
    assert "⚑33→32 ✓" in text and "⚑42→raw ✗" in text
    assert "✗ negative_facts at pos 36" in text and "✓ certifies" in text
    assert "audit: binding 'snapshot'" in text
    # The L2 bar spans what its children span.
    assert l2.index("[") == l1.index("[") and l2.index("]") == l1.index("]", l1.index("#31"))


def test_show_scales_a_long_session_to_the_width(tmp_path: Path) -> None:
    """Thousands of positions share columns: the strip keeps the terminal's width and counts the earlier failure."""
    path = str(tmp_path / "long.db")
    with cs.open(path, clock=cs.events.tick_clock()) as store:
        s = store.session("long")
        s.extend([cs.Turn("user", f"step {i}", status="failed" if i == 2500 else None) for i in range(3000)])
        s.mark(s.compact(0, 2000))
        got = picture(s)
    console = Console(width=90, record=True, color_system=None)
    console.print(render(got, 90))
    raw = next(line for line in console.export_text().splitlines() if line.strip().startswith("raw"))
    assert len(raw.rstrip()) <= 90 and any(level in raw for level in LEVELS)
    assert got.tail == 3002 - TAIL and sum(b.negative for b in got.bins) == 1
    html = page(got)
    assert len(html) < 2_000_000 and html.count("<rect") < 1500


def _turns(s: cs.Session, turns: int) -> None:
    """Play ``turns`` agent turns (every ninth call fails), maintaining the session after each with a short summarizer."""
    policy = cs.CompactionPolicy(every=30, roll_up_every=4, summarizer=lambda records: f"{len(records)} records")
    for t in range(turns):
        failed = t % 9 == 4
        s.extend([cs.Turn("user", f"step {t}"), cs.ToolCall(f"c{t}", "run", {"n": t}),
                  cs.ToolResult(f"c{t}", "ERROR: lock timeout" if failed else "ok", ok=not failed,
                                status="failed" if failed else None),
                  cs.Turn("assistant", f"done {t}")])
        s.maintain(policy)


@pytest.fixture(scope="module")
def long_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Return the path of a store holding 300 maintained agent turns: dozens of nodes and markers past the tail."""
    path = str(tmp_path_factory.mktemp("long") / "long.db")
    with cs.open(path, clock=cs.events.tick_clock()) as store:
        _turns(store.session("long"), 300)
    return path


def test_a_long_session_is_drawn_bounded_and_counted(long_store: str) -> None:
    """The tail one by one, the rest in counted bins, the newest nodes and markers one by one, the others counted."""
    with cs.open(long_store) as store:
        s = store.session("long")
        got = picture(s)
        records = list(s.scan())
        cover = [n.pos for n in s.cover()]
        context = s.context()
    negatives = build((r.pos, r.event) for r in records).negatives
    assert got.size == len(records) > TAIL and [c.pos for c in got.cells] == list(range(got.size - TAIL, got.size))
    assert 0 < len(got.bins) <= BINS and got.bins[0].start == 0 and got.bins[-1].stop == got.tail
    assert all(a.stop == b.start for a, b in zip(got.bins, got.bins[1:]))
    assert sum(b.negative for b in got.bins) == sum(1 for p in negatives if p < got.tail)
    assert got.negatives == len(negatives) and sum(b.dropped for b in got.bins) == 0
    nodes = [r.pos for r in records if r.kind == "node"]
    markers = [r.pos for r in records if r.kind == "marker"]
    derived = [r.pos for r in records if r.kind in ("node", "spill", "attempt")]
    assert len(nodes) > NODES and got.marker_total == len(markers) > MARKERS
    assert sum(b.derived for b in got.bins) == sum(1 for p in derived if p < got.tail)
    assert sum(b.markers for b in got.bins) == sum(1 for p in markers if p < got.tail)
    drawn = [b.pos for b in got.nodes]
    assert set(cover) <= set(drawn) and set(nodes[-NODES:]) <= set(drawn) and len(drawn) <= 4 * NODES
    assert [m.pos for m in got.markers] == markers[-MARKERS:]
    assert got.marker_ranges == [MarkerRange(len(markers) - MARKERS, markers[0], markers[-MARKERS - 1])]
    (older,) = got.node_ranges
    assert older.rolled_up and older.first == derived[0] and older.last < min(drawn)
    assert older.count == sum(1 for p in derived if p <= older.last)
    # The newest marker gives the context; the older ones drawn are not resumed, as nothing depends on them now.
    assert context.marker == markers[-1] and got.markers[-1].gives and got.markers[-1].state == "certified"
    assert all(m.state is None and not m.gives for m in got.markers[:-1])
    digest = next(b for b in got.nodes if b.pos == cover[0])
    assert digest.violations is not None and digest.totals.negative_facts >= len(digest.negative_facts)


def test_the_terminal_picture_of_a_long_session_fits_its_width(long_store: str) -> None:
    """Every line keeps the width; the counted nodes and markers have one row each; the page stays small."""
    with cs.open(long_store) as store:
        got = picture(store.session("long"))
    console = Console(width=120, record=True, color_system=None)
    console.print(render(got, 120))
    text = console.export_text()
    assert all(len(line.rstrip()) <= 120 for line in text.splitlines())
    assert f"positions before {got.tail:,} counted, the last {TAIL} drawn one by one" in text
    l1 = next(line for line in text.splitlines() if line.strip().startswith("L1"))
    assert "older nodes, rolled up" in l1 and "[[" not in l1
    older = got.marker_ranges[0]
    assert f"{older.first}…{older.last}" in text and f"{older.count:,} older" in text
    assert "not resumed: marker" in text and "gives the context now" in text
    html = page(got)
    assert html.count('class="pl"') <= MARKERS and f"{older.count:,} older markers" in html


def test_show_bounds_what_it_writes_for_a_long_session(long_store: str, tmp_path: Path) -> None:
    """The command, run as a process, prints the terminal picture and writes the page within their size bounds."""
    env = {**os.environ, "COLUMNS": "160"}
    base = [sys.executable, "-m", "compactstore", "show", "-s", long_store]
    shown = subprocess.run(base, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert shown.returncode == 0, shown.stderr
    assert len(shown.stdout.encode()) < 100_000 and "context now (marker" in shown.stdout
    out = tmp_path / "long.html"
    written = subprocess.run([*base, "--html", str(out)], capture_output=True, text=True, env=env, timeout=300,
                             check=False)
    assert written.returncode == 0, written.stderr
    html = out.read_text()
    assert len(html.encode()) < 2_000_000 and html.count("<rect") <= 2 * MAX_COLUMNS + 4 * BINS
    assert written.stdout.startswith(f"wrote {out}: session 'long',")


def test_show_prints_the_picture_and_its_json(demo_store: str) -> None:
    """`compactstore show` on the demo's store: the drawing, or the same picture as JSON."""
    result = CliRunner().invoke(main, ["show", "-s", demo_store])
    assert result.exit_code == 0 and "session 'migration-42'" in result.stdout
    data = CliRunner().invoke(main, ["show", "-s", demo_store, "--json"])
    assert data.exit_code == 0 and '"state":"certified"' in data.stdout.replace(" ", "")


def test_the_html_page_is_self_contained(demo_store: str, tmp_path: Path) -> None:
    """One file: inline CSS and SVG, no script, nothing fetched from anywhere."""
    out = tmp_path / "s.html"
    result = CliRunner().invoke(main, ["show", "-s", demo_store, "--html", str(out)])
    assert result.exit_code == 0 and "wrote" in result.stdout
    html = out.read_text()
    assert html.startswith("<!doctype html>") and "<svg" in html and "<style>" in html
    assert "<script" not in html and "@import" not in html and "url(" not in html
    assert re.findall(r"https?://[^\s\"']+", html) == ["http://www.w3.org/2000/svg"]  # a namespace, never fetched
    assert not re.search(r"\b(src|href)=", html)
    for needle in ("#33 certified", "dropped by #41", "LOSSY_GIST", "migration-42", "snapshot"):
        assert needle in html, needle


def _pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """Return width, height and the rows of pixels of an 8-bit RGB or RGBA PNG (no interlacing)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos: pos + 4])
        kind, data = png[pos + 4: pos + 8], png[pos + 8: pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", data)
            assert depth == 8 and color in (2, 6) and interlace == 0
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += data
    raw, stride, rows, prev = zlib.decompress(idat), width * channels, [], bytearray(width * channels)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1: start + 1 + stride])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, [bytes(r[i: i + 3]) for r in rows[::4] for i in range(0, stride, channels * 4)]


def test_the_html_page_renders_in_headless_chromium(demo_store: str, tmp_path: Path) -> None:
    """Chromium draws the page: the screenshot exists, has the window's size and is far from blank."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (CI installs Debian's chromium package)")
    page_path = tmp_path / "session.html"
    assert CliRunner().invoke(main, ["show", "-s", demo_store, "--html", str(page_path)]).exit_code == 0
    shot = tmp_path / "shot.png"
    subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,900",
         page_path.as_uri()],
        capture_output=True, timeout=120, check=False,
    )
    assert shot.exists() and shot.stat().st_size > 10_000
    width, height, pixels = _pixels(shot.read_bytes())
    assert (width, height) == (1200, 900)
    counts = Counter(pixels)
    background, most = counts.most_common(1)[0]
    assert most / len(pixels) < 0.8, "the screenshot is mostly one colour"
    assert len(counts) > 50, "the screenshot has too few colours to be the drawn page"
    red = sum(n for px, n in counts.items() if px[0] > 200 and px[1] < 80 and px[2] < 80)
    amber = sum(n for px, n in counts.items() if px[0] > 200 and 130 < px[1] < 190 and px[2] < 60)
    assert red > 50 and amber > 500, "the negative facts (red) and LOSSY_GIST bars (amber) are not drawn"


def test_a_node_lists_the_earlier_items_its_span_closes(tmp_path: Path) -> None:
    """A call opened before a node's span and answered inside it is the node's ``resolved``, and show counts it."""
    with cs.open(str(tmp_path / "r.db"), clock=cs.events.tick_clock()) as store:
        s = store.session("r")
        s.extend([cs.ToolCall("c1", "run"), cs.Turn("user", "wait"), cs.ToolResult("c1", "done")])
        s.compact(1, 3)
        got = picture(s)
    assert [[i.id for i in b.resolved] for b in got.nodes] == [["c1"]]
    console = Console(width=120, record=True, color_system=None)
    console.print(render(got, 120))
    assert "1 closed" in console.export_text()


def test_the_demo_says_why_its_certified_marker_does_not_give_the_context(pic: Picture) -> None:
    """Marker 33 certifies at its checkpoint, yet the context falls back: both views give the obligation opened since."""
    pin = next(m for m in pic.markers if m.pos == 33)
    assert pin.state == "certified" and not pin.gives and pin.stale[0].startswith(
        "since its checkpoint, anchoring at pos 15: live value of binding 'snapshot'")
    console = Console(width=160, record=True, color_system=None)
    console.print(render(pic, 160))
    text = console.export_text()
    assert "context now (no marker certifies, fallback)" in text
    assert "because marker at pos 33: since its checkpoint, anchoring at pos 15" in text
    html = page(pic)
    assert "certified at emission and again at its checkpoint now" in html
    assert "does not give the context now: an obligation opened since its checkpoint" in html
    assert "marker at pos 33: since its checkpoint, anchoring at pos 15" in html
