"""What verified reads cost: the same calls with ``verify=True`` (the default) and ``verify=False``, in one run.

Four reads: ``CompactStoreSaver.get_tuple`` of a thread's latest checkpoint, its
``list`` of all 50 checkpoints, ``CompactStoreSession.get_items`` of a session's items,
and a ``Session.scan`` of 10,000 events. Each is timed on one store handle whose readers read once before (as a running
agent's do), so a verified call pays the head read, the seal check and a comparison per
row against the proven prefix; ``--cold`` opens a new handle per call (the whole proof
each time). Rounds alternate the order of the two modes so that the machine's noise
falls on both alike; the ratio is of the medians (unverified / verified: 1.0 is free).

    .venv/bin/python benchmarks/verified_reads.py [--rounds 7] [--calls 200] [--cold]

Instructions per call, without the noise of a shared machine: ``--count NAME`` builds the
store in ``--db`` (once), warms one reader and runs ``--calls`` calls of it inside
``functools.reduce``, so that callgrind can count that loop alone:

    OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind --collect-atstart=no \
        --toggle-collect=functools_reduce .venv/bin/python benchmarks/verified_reads.py \
        --count get_tuple [--unverified] --calls 1000 --db /tmp/reads.db
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import empty_checkpoint

import compactstore as cs
from compactstore.adapters.langgraph import CompactStoreSaver
from compactstore.adapters.openai_agents import CompactStoreSession


def build(path: str) -> None:
    """Write a thread of 50 checkpoints, a session of 200 items and a session of 10,000 events."""
    with cs.open(path, clock=cs.events.tick_clock()) as st:
        saver = CompactStoreSaver(st)
        parent: dict[str, Any] | None = None
        for i in range(50):
            cp = empty_checkpoint()
            cp["channel_values"], cp["channel_versions"] = {"messages": f"state {i}" * 20}, {"messages": i + 1}
            config: dict[str, Any] = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
            if parent is not None:
                config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
            parent = saver.put(config, cp, {"source": "loop", "step": i}, {"messages": i + 1})  # type: ignore[arg-type,assignment]
        items = CompactStoreSession("s", st)
        asyncio.run(items.add_items([{"role": "user", "content": f"item {i} " * 10} for i in range(200)]))
        st.session("scan").extend([cs.Turn("user", f"turn {i} " * 10) for i in range(10_000)])


def readers(st: cs.Store, verify: bool) -> dict[str, Callable[[], object]]:
    """Return the three reads over ``st``, each with its own saver or session built once."""
    saver = CompactStoreSaver(st, verify=verify)
    items = CompactStoreSession("s", st, verify=verify)
    scan = st.session("scan")
    return {
        "get_tuple": lambda: saver.get_tuple({"configurable": {"thread_id": "t"}}),
        "list 50": lambda: sum(1 for _ in saver.list({"configurable": {"thread_id": "t"}})),
        "get_items": lambda: items._get(None),  # what get_items runs in its worker thread
        "scan 10k": lambda: sum(1 for _ in scan.scan(verify=verify)),
    }


def timed(call: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n


def main() -> None:
    """Print per-call times with and without verification, and their ratios."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--cold", action="store_true", help="a new store handle per call")
    ap.add_argument("--count", metavar="NAME", help="only run NAME --calls times on a warm reader (for callgrind)")
    ap.add_argument("--unverified", action="store_true", help="with --count: verify=False")
    ap.add_argument("--db", default="verified_reads.db", help="with --count: the store, built when missing")
    args = ap.parse_args()
    if args.count:
        if not Path(args.db).exists():
            build(args.db)
        with cs.open(args.db) as st:
            read = readers(st, not args.unverified)[args.count]
            read()
            functools.reduce(lambda _, __: read(), range(args.calls), None)
        return
    print("$", " ".join([Path(sys.executable).name, *sys.argv]))
    print(f"# {platform.platform()}, Python {platform.python_version()}, merkle {cs.merkle.IMPLEMENTATION}")
    times: dict[tuple[str, bool], list[float]] = {}
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "bench.db")
        build(path)
        with cs.open(path) as st:
            warm = {True: readers(st, True), False: readers(st, False)}
            for mode in warm.values():
                for call in mode.values():
                    call()
            for r in range(args.rounds):
                for verify in ((True, False) if r % 2 == 0 else (False, True)):
                    for name in warm[verify]:
                        n = max(1, args.calls // (20 if name == "scan 10k" else 10 if name == "list 50" else 1))
                        if args.cold:
                            def call(name: str = name, verify: bool = verify) -> object:
                                with cs.open(path) as fresh:
                                    return readers(fresh, verify)[name]()
                        else:
                            call = warm[verify][name]
                        times.setdefault((name, verify), []).append(timed(call, n))
    print(f"{'read':<12}{'unverified µs':>15}{'verified µs':>13}{'unverified/verified':>21}")
    for name in ("get_tuple", "list 50", "get_items", "scan 10k"):
        off, on = statistics.median(times[(name, False)]), statistics.median(times[(name, True)])
        print(f"{name:<12}{off * 1e6:>15.0f}{on * 1e6:>13.0f}{off / on:>21.2f}")


if __name__ == "__main__":
    main()
