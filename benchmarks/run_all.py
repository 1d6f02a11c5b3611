#!/usr/bin/env python3
"""Run the whole benchmark suite, print every table, write JSON and a plot.

    python benchmarks/run_all.py            # what `make bench` runs: under 15 minutes on 2 cores
    python benchmarks/run_all.py --full     # the long measurements: 1M-event sessions, 10,000 turns per peer

Each benchmark runs in its own process, one after the other, and prints its own table
(command, machine, min / median / max, ratios measured side by side). Afterwards this
writes benchmarks/results/summary.json (what ran, how long it took, every goal line) and
benchmarks/results/scaling.png (append throughput, and resume and proof latency, against
log size; beside them, each adapter's throughput over that of the stock store it
replaces), prints the goal lines of every benchmark together, and, when the whole suite
ran, writes benchmarks/README.md: what is measured and how, and one table of every goal
of this run with the command that measures it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

HERE = Path(__file__).resolve().parent

#: (name, arguments for the quick suite, arguments for --full)
SUITE: list[tuple[str, list[str], list[str]]] = [
    ("digest", [], []),
    ("native", [], []),
    ("paths", ["--repeat", "3", "--events", "5000"], []),
    ("verify_big", ["--quick"], []),
    ("append", ["--quick"], []),
    ("resume", [], ["--sizes", "10000,100000,1000000"]),
    ("resume_sim", [], ["--sessions", "40"]),
    ("memory_loop", [], []),
    ("sdk_compaction", ["--turns", "300"], ["--turns", "1000"]),
    ("peers", ["--quick"], []),
    ("adapters", ["--quick"], []),
]
BUDGET_S = 15 * 60
#: The page a whole run writes (see :func:`page`).
PAGE = HERE / "README.md"

#: What the page says before the run's table: how the figures are measured and how to run them.
INTRO = """\
# Benchmarks

Written by `make bench` (`benchmarks/run_all.py`), which runs every benchmark below and
replaces the table with its own run's. Every figure is a ratio measured in one run against
a plain reference or a peer: competitors run in the same process, interleaved (one of each
per round, the order rotating from round to round), five or more timed rounds after a
warm-up, compared by their medians. Absolute times are context only. Each row names the
command that measures it; each benchmark also runs alone, prints its command, machine,
tables and goal lines, and writes `benchmarks/results/<name>.json` (see
`results/README.md`).

```sh
make bench                          # the whole suite, under 15 minutes on 2 cores
python benchmarks/run_all.py --full # the long forms: 1M-event sessions, 10,000 turns per peer
```

- `digest.py`: Merkle roots against the plain RFC 9162 tree; `verify()` on every CPU against one.
- `native.py`: the native Merkle root against raw BLAKE3 over the same bytes.
- `paths.py`: the same store work on the native path and the pure one.
- `verify_big.py`: `verify()` of a large store and `restore_span` against raw BLAKE3.
- `append.py`: batched and single appends against plain `sqlite3` (and psycopg with
  `--only postgres --pg-temp`), and throughput against log size.
- `resume.py`: `mark`, certified `resume` and proofs against session size.
- `resume_sim.py`: seeded long sessions whose summaries drop facts, resumed naively and
  through markers: divergent resumes.
- `memory_loop.py`: the memory loop on `CompactionPolicy()`: what the model is fed against
  the raw log, and a cold `context()`.
- `sdk_compaction.py`: one conversation through `CompactStoreSession` and through the
  Agents SDK's own compaction.
- `peers.py`, `adapters.py`: the same turns through langgraph's `SqliteSaver`, the Agents
  SDK's `SQLiteSession`, eventsourcing and compactstore, natively and through its adapters.

The references live in `plain.py` (the workload, plain `sqlite3` and psycopg inserting the
very rows compactstore stores, the plain RFC 9162 tree); `harness.py` holds the
interleaved timing, the tables and the JSON.
"""


def plot(results: dict[str, Any], out: Path) -> Path | None:
    """Draw append throughput and resume / proof latency against log size, and the adapters; return the PNG path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no plot: matplotlib is not installed; pip install -e '.[bench]')")
        return None
    fig, (left, right, side) = plt.subplots(1, 3, figsize=(19, 6.5), gridspec_kw={"width_ratios": [1, 1, 0.9]})
    append = results.get("append")
    if append:
        scale = next((s for s in append["sections"] if s["title"].startswith("Append throughput against")), None)
        if scale:
            series: dict[str, list[tuple[int, float]]] = {}
            for d in scale["data"]:
                series.setdefault(f"{d['method']} ({d['mode']})", []).append((d["size"], d["rows_per_s"]))
            for label, points in series.items():
                xs, ys = zip(*sorted(points))
                left.plot(xs, ys, marker="o", label=label)
    if left.lines:
        left.set_xscale("log")
        left.set_yscale("log")
    left.set_xlabel("events already in the session")
    left.set_ylabel("appends per second (median)")
    left.set_title("Append throughput against log size")
    left.grid(True, which="both", alpha=0.3)
    if left.lines:
        left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1)
    resume = results.get("resume")
    if resume:
        series = {}
        for d in resume["sections"][0]["data"]:
            if d["method"].startswith("raw"):
                continue
            series.setdefault(f"{d['operation']}: {d['method']}", []).append((d["size"], d["median"]))
        for label, points in series.items():
            xs, ys = zip(*sorted(points))
            right.plot(xs, ys, marker="o", label=label)
    if right.lines:
        right.set_xscale("log")
        right.set_yscale("log")
    right.set_xlabel("events in the session")
    right.set_ylabel("seconds per call (median)")
    right.set_title("Resume and proof latency against log size")
    right.grid(True, which="both", alpha=0.3)
    if right.lines:
        right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    _adapters(side, results.get("adapters"), results.get("peers"))
    machine = next((r["machine"] for r in results.values() if "machine" in r), None)
    if machine:
        fig.suptitle(f"compactstore {machine['packages'].get('compactstore', '')} on {machine['cpu']} "
                     f"({machine['logical_cpus']} CPUs), {machine['python']}, SQLite {machine['sqlite']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _adapters(ax: Any, adapters: dict[str, Any] | None, peers: dict[str, Any] | None) -> None:
    """Draw, mode by mode, each adapter's throughput over that of the stock store it replaces.

    The adapters have no log-size axis (their cost per item does not depend on it), so
    they get one bar per mode: the ratio between medians of one interleaved run, the
    goal (1.0) as a line, and the items per second of both sides beside the bar.
    """
    rows: list[tuple[str, float, str]] = []
    data = adapters["sections"][0]["data"] if adapters and adapters.get("sections") else []
    groups: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    ours: dict[str, Any] | None
    theirs: dict[str, Any] | None
    for d in data:
        side = d.get("side") or ("adapter" if d["store"].startswith("CompactStore") else "stock")
        groups.setdefault((d["framework"], d["per_call"]), {})[side] = d
    for (framework, per_call), sides in groups.items():
        if "stock" in sides and "adapter" in sides:
            ours, theirs = sides["adapter"], sides["stock"]
            method = ours["store"].split(".")[-1]
            rows.append((f"{framework} {method}\n{per_call} per call",
                         ours["items_per_s"] / theirs["items_per_s"],
                         f"{ours['items_per_s']:,.0f} vs {theirs['items_per_s']:,.0f} items/s"))
    # The full-state checkpoint per turn is measured only by peers.py.
    state = {d["store"]: d for d in (peers["sections"][0]["data"] if peers and peers.get("sections") else [])
             if d["mode"] == "full state per turn"}
    ours, theirs = state.get("compactstore via langgraph adapter, full state"), state.get("langgraph put, full state")
    if ours and theirs:
        rows.append(("LangGraph put\nfull state per turn", ours["turns_per_s"] / theirs["turns_per_s"],
                     f"{ours['turns_per_s']:,.0f} vs {theirs['turns_per_s']:,.0f} turns/s"))
    ax.set_title("Adapters against the stores they replace")
    if not rows:
        ax.text(0.5, 0.5, "no adapters.json or peers.json", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    ys = list(range(len(rows)))
    ratios = [r for _, r, _ in rows]
    bars = ax.barh(ys, ratios, height=0.6, color=["C0" if r >= 1.0 else "C1" for r in ratios])
    for bar, (_, r, detail) in zip(bars, rows):
        # Right of the goal line as well as of the bar, so the line never crosses the text.
        ax.annotate(f"{r:.2f}x\n{detail}", (max(bar.get_width(), 1.0), bar.get_y() + bar.get_height() / 2),
                    xytext=(5, 0), textcoords="offset points", va="center", fontsize=8)
    ax.axvline(1.0, color="0.3", linestyle="--", linewidth=1, label="goal: >= 1.0 (as fast as the stock store)")
    ax.set_yticks(ys, [label for label, _, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(2.0, max(ratios) * 1.6))
    ax.set_xlabel("adapter / stock store, items per second (medians)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1)


def page(info: dict[str, Any], ran: list[dict[str, Any]], results: dict[str, Any], seconds: float) -> str:
    """Return benchmarks/README.md for one run: :data:`INTRO`, the machine, and one row per goal with its command.

    ``ran``: what ran, with each benchmark's command and exit status; ``results``: the
    JSON each benchmark that succeeded wrote. A benchmark that failed gets a row saying so.
    """
    lines = [INTRO, "## The latest run", "",
             f"{info['cpu']} ({info['logical_cpus']} logical CPUs), {info['python']}, SQLite {info['sqlite']}; "
             f"{seconds / 60:.1f} minutes in all.", "Ratios are ours / the reference unless the goal names a unit.", "",
             "| command | goal | measured | target | |", "| --- | --- | --- | --- | --- |"]
    for r in ran:
        name = r["benchmark"]
        command = "`python " + " ".join([f"benchmarks/{name}.py", *r["command"][2:]]) + "`"
        goals = [g for s in results[name]["sections"] for g in s["goals"]] if name in results else []
        if not goals:
            lines.append(f"| {command} | {'failed, exit ' + str(r['exit']) if r['exit'] else '(no goal)'} | | | |")
        for i, g in enumerate(goals):
            op = ">=" if g["higher_is_better"] else "<="
            note = f" ({g['note']})" if g.get("note") else ""
            lines.append(f"| {command if i == 0 else ''} | {g['name']}{note} | {g['value']:.3g} | {op} {g['target']:g} "
                         f"| {'met' if g['met'] else '**missed**'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run every benchmark, then write the summary and the plot; exit non-zero if one failed."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="the long measurements (well over 15 minutes)")
    parser.add_argument("--only", nargs="*", choices=[n for n, _, _ in SUITE], help="run only these benchmarks")
    args = parser.parse_args(argv)
    info = harness.machine()
    harness.print_machine(info)
    started = time.perf_counter()
    ran: list[dict[str, Any]] = []
    failed = []
    for name, quick, full in SUITE:
        if args.only and name not in args.only:
            continue
        cmd = [sys.executable, str(HERE / f"{name}.py"), *(full if args.full else quick)]
        print(f"\n######## {name} ########", flush=True)
        t0 = time.perf_counter()
        code = subprocess.call(cmd)
        elapsed = time.perf_counter() - t0
        ran.append({"benchmark": name, "command": cmd, "seconds": elapsed, "exit": code})
        print(f"######## {name}: {elapsed:.0f} s, exit {code}", flush=True)
        if code:
            failed.append(name)
    total = time.perf_counter() - started
    results = {}
    for r in ran:
        path = harness.RESULTS / f"{r['benchmark']}.json"
        if r["exit"] == 0 and path.exists():
            results[r["benchmark"]] = json.loads(path.read_text(encoding="utf-8"))
    goals = [{"benchmark": name, **g} for name, res in results.items() for s in res["sections"] for g in s["goals"]]
    png = plot(results, harness.RESULTS / "scaling.png")
    harness.RESULTS.mkdir(parents=True, exist_ok=True)
    (harness.RESULTS / "summary.json").write_text(json.dumps(
        {"machine": info, "full": args.full, "seconds": total, "runs": ran, "goals": goals}, indent=1) + "\n",
        encoding="utf-8")
    print("\n######## goals ########")
    for g in goals:
        op = ">=" if g["higher_is_better"] else "<="
        verdict = "met" if g["met"] else "MISSED"
        print(f"{g['benchmark']:<10}  {verdict:<6}  {g['name']}: {g['value']:.3g} (target {op} {g['target']:g})")
    took = ", ".join(f"{r['benchmark']} {r['seconds']:.0f} s" for r in ran)
    print(f"\nsuite: {total / 60:.1f} min ({took})")
    if not args.full and total > BUDGET_S:
        print(f"warning: the quick suite took longer than its {BUDGET_S // 60}-minute budget")
    print(f"wrote {harness.RESULTS / 'summary.json'}" + (f" and {png}" if png else ""))
    if not args.only:  # the page is one whole run's
        PAGE.write_text(page(info, ran, results, total), encoding="utf-8")
        print(f"wrote {PAGE}")
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
