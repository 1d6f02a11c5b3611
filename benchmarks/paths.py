#!/usr/bin/env python3
"""The pure and native paths in one table: the same store work with the Rust extension and with ``COMPACTSTORE_PURE=1``.

    python benchmarks/paths.py [--repeat N] [--events N]

Each round runs one child process per path (the path is chosen at import, so each
needs its own interpreter), the two interleaved; the child times, on a fresh SQLite
file at ``durable=False`` (so that the work measured is ours, not the fsync):

* ``append``: 1,000 one-event calls (a 1 KiB turn each);
* ``extend``: ``--events`` events, 100 per call;
* ``extend 1000``: the same, 1,000 per call;
* ``scan``: a verified scan of every event, on a fresh handle;
* ``context``: a fresh handle's ``context()`` after a compaction and a marker;
* ``verify``: ``Store.verify()`` of the whole store;
* ``tree_root``: ``merkle.tree_root`` over 4 MiB of 1 KiB leaves, no store.

It reports the median of each over the rounds, per path, and native / pure as a speed
ratio (above 1: native is faster). Both paths must give the same session root, which
the run checks. Writes benchmarks/results/paths.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Section, Stat, seconds  # noqa: E402

WORKLOADS = ("append", "extend", "extend 1000", "scan", "context", "verify", "tree_root")
PATHS = ("native", "pure")


def child(events: int) -> dict[str, Any]:
    """Run every workload once in this process; return its seconds per workload and the session root."""
    import compactstore as cs
    from compactstore import merkle

    out: dict[str, Any] = {"implementation": merkle.IMPLEMENTATION}
    body = "x" * 1000

    def turns(n: int, at: int) -> list[cs.Event]:
        return [cs.Turn("user", f"{at + i} {body}") for i in range(n)]

    with tempfile.TemporaryDirectory(prefix="paths-") as folder:
        path = str(Path(folder) / "paths.db")
        with cs.open(path, durable=False, clock=cs.events.tick_clock()) as st:
            s = st.session("one")
            t0 = time.perf_counter()
            for i in range(1000):
                s.append(cs.Turn("user", f"{i} {body}"))
            out["append"] = time.perf_counter() - t0
            for name, per in (("extend", 100), ("extend 1000", 1000)):
                s = st.session(name)
                batches = [turns(per, k) for k in range(0, events, per)]
                t0 = time.perf_counter()
                for b in batches:
                    s.extend(b)
                out[name] = time.perf_counter() - t0
            s = st.session("extend")
            s.append(cs.ToolResult("c", "ERROR: failed", ok=False, status="failed"))
            s.mark(s.compact(0, s.size))
            s.append(cs.Turn("user", "after"))
            out["root"] = s.head().root.hex()
        with cs.open(path) as st:
            t0 = time.perf_counter()
            n = sum(1 for _ in st.session("extend 1000").scan())
            out["scan"] = time.perf_counter() - t0
            assert n == events
        with cs.open(path) as st:
            t0 = time.perf_counter()
            mode = st.session("extend").context().mode
            out["context"] = time.perf_counter() - t0
            assert mode == "certified", mode
        with cs.open(path) as st:
            t0 = time.perf_counter()
            report = st.verify()
            out["verify"] = time.perf_counter() - t0
            assert report.ok, report
    leaves = [os.urandom(1024) for _ in range(4096)]
    t0 = time.perf_counter()
    merkle.tree_root(leaves)
    out["tree_root"] = time.perf_counter() - t0
    return out


def run_child(path: str, events: int) -> dict[str, Any]:
    """Run :func:`child` in a fresh interpreter on ``path``; return what it printed."""
    env = {**os.environ, "COMPACTSTORE_PURE": "1" if path == "pure" else "0"}
    done = subprocess.run([sys.executable, __file__, "--child", "--events", str(events)],
                          env=env, check=True, capture_output=True, text=True)
    got: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    if got["implementation"] != path:
        raise SystemExit(f"asked for the {path} path, the child ran {got['implementation']} (is the extension built?)")
    return got


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, print the table and write benchmarks/results/paths.json."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="rounds, each running both paths (default 5)")
    parser.add_argument("--events", type=int, default=10_000, help="events the extend workloads append (default 10,000)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.events)))
        return 0
    info = harness.machine()
    harness.print_machine(info, args.repeat)
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in PATHS}
    started = time.perf_counter()
    for r in range(args.repeat):
        for p in PATHS if r % 2 == 0 else reversed(PATHS):  # alternate which path goes first
            runs[p].append(run_child(p, args.events))
    roots = {run["root"] for p in PATHS for run in runs[p]}
    if len(roots) != 1:
        raise SystemExit(f"the paths gave different session roots: {sorted(roots)}")
    section = Section("The native and the pure path, the same work side by side",
                      ("work", "native (median)", "pure (median)", "native / pure speed"))
    for w in WORKLOADS:
        native, pure = (Stat.of([run[w] for run in runs[p]]) for p in PATHS)
        section.rows.append((w, seconds(native.median), seconds(pure.median), f"{pure.median / native.median:.2f}x"))
        section.data.append({"work": w, "native": native.as_dict(), "pure": pure.as_dict(),
                             "speedup": pure.median / native.median})
    section.notes.append(f"{args.repeat} rounds, each one child process per path, interleaved; "
                         f"{args.events:,} events per extend workload; SQLite, durable=False; identical roots checked")
    section.notes.append(f"whole run: {time.perf_counter() - started:.1f} s")
    section.print()
    out = harness.write_json("paths", info, [section], params=vars(args))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
