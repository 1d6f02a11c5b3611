#!/usr/bin/env python3
"""Adapters: 10,000 items added through each compactstore adapter against the stock store it replaces.

    python benchmarks/adapters.py [--items N] [--repeat N] [--quick]

The question: what does an agent pay, per item it adds, for keeping its framework's
memory in compactstore instead of the framework's own SQLite store? Same items, same
calls, same durability, side by side in one run:

* LangGraph: ``CompactStoreSaver.put_writes`` against ``SqliteSaver.put_writes`` (from
  langgraph-checkpoint-sqlite), each item one pending write of a task against one
  checkpoint;
* OpenAI Agents SDK: ``CompactStoreSession.add_items`` against ``SQLiteSession.add_items``.

Each in two modes: one item per call (a transaction, so an fsync, per item) and 100
items per call, one transaction (one fsync) per call on both sides. Every store is a
fresh SQLite file in WAL mode at ``synchronous=FULL`` (set on the stock stores'
connections; compactstore with ``durable=True``), so an acknowledged item survives power
loss on both sides; each round reads the setting back from the connection that wrote,
and a store at another one fails the run. The stores are the classes ``peers.py``
measures (``plain.py``). The rounds interleave the two sides; the ratio is
stock time / adapter time between medians (above 1: the adapter is faster). Reading
every item back (``get_tuple`` with its pending writes, ``get_items()``) is reported
beside it, and each ratio is a goal line (>= 1.0: the adapter keeps up with the store it
replaces). ``--quick`` (what ``make bench`` runs) adds 500 items per round in the
one-per-call mode, as ``peers.py --quick`` does, and 5,000 in the batched mode (peers.py
measures both adapters on 10,000 as well).

Writes benchmarks/results/adapters.json.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Goal, Section, Stat, interleaved, rate, ratio, seconds  # noqa: E402
from plain import (  # noqa: E402
    AdapterLangGraphWrites,
    AdapterOpenAI,
    LangGraphWrites,
    OpenAISession,
    Run,
    Store,
)
from plain import messages as workload  # noqa: E402

#: (framework, its stock store, compactstore's adapter in its place): the classes peers.py measures too
PAIRS: list[tuple[str, type[Store], type[Store]]] = [
    ("LangGraph", LangGraphWrites, AdapterLangGraphWrites),
    ("OpenAI Agents", OpenAISession, AdapterOpenAI),
]


def measure(count: int, one_count: int, repeat: int) -> Section:
    """Time each adapter against its stock store, one item per call and 100 per call, interleaved."""
    section = Section(
        "Adding items through each adapter against the stock store, SQLite WAL at synchronous=FULL",
        ("framework", "mode", "store", "items", "min", "median", "max", "items/s", "stock / adapter", "read back"),
    )
    tmp = tempfile.mkdtemp(prefix="cs-bench-adapters-")
    try:
        for _, stock, ours in PAIRS:
            for cls in (stock, ours):
                Run(cls, workload(50), 1, tmp)()  # imports, schemas, caches: not timed
        for framework, stock, ours in PAIRS:
            for per_call, n in ((1, one_count), (100, count)):
                items = workload(n)
                runs = {cls.call: Run(cls, items, per_call, tmp) for cls in (stock, ours)}
                got = interleaved([(name, run) for name, run in runs.items()], repeat, warmup=0)
                theirs = Stat.of(got[stock.call]).median
                mode = "one item per call" if per_call == 1 else f"{per_call} items per call"
                for name, run in runs.items():
                    st = Stat.of(got[name])
                    read = Stat.of(run.read).median
                    vs = theirs / st.median
                    section.rows.append((framework, mode, name, f"{n:,}", seconds(st.min), seconds(st.median),
                                         seconds(st.max), rate(n / st.median), ratio(vs), seconds(read)))
                    section.data.append({"framework": framework, "mode": mode, "store": name, "items": n,
                                         "per_call": per_call, **st.as_dict(), "items_per_s": n / st.median,
                                         "stock_over_adapter": vs, "read_back_s": read,
                                         "side": "stock" if name == stock.call else "adapter"})
                    if name == ours.call:
                        section.goals.append(Goal(f"{framework}, {mode}: {name} / {stock.call}", vs, 1.0))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    section.notes.append("stock / adapter: the stock store's median time over the adapter's; above 1x the "
                         "adapter is faster. read back: the median time to read every item back once.")
    return section


def main() -> None:
    """Parse arguments, measure, print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=10_000, help="items added per round (default 10,000)")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds per side (default 5)")
    parser.add_argument("--quick", action="store_true",
                        help="500 items per round in the one-per-call mode, 5,000 in the batched one")
    args = parser.parse_args()
    for module, dist in (("langgraph.checkpoint.sqlite", "langgraph-checkpoint-sqlite"), ("agents", "openai-agents")):
        try:
            __import__(module)
        except ImportError:
            sys.exit(f"{dist} is not installed: pip install -e '.[test]'")
    one = min(args.items, 500) if args.quick else args.items
    batched = min(args.items, 5_000) if args.quick else args.items
    info = harness.machine()
    harness.print_machine(info, args.repeat)
    section = measure(batched, one, args.repeat)
    section.print()
    path = harness.write_json("adapters", info, [section], items=batched, one_per_call_items=one)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
