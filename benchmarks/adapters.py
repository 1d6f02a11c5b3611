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
items per call. Every store is a fresh SQLite file in WAL mode at ``synchronous=FULL``
(the stock stores' setting; compactstore with ``durable=True``), so an acknowledged item
survives power loss on both sides. The rounds interleave the two sides; the ratio is
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
import asyncio
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Goal, Section, Stat, interleaved, rate, ratio, seconds  # noqa: E402
from plain import messages as workload  # noqa: E402

import compactstore as cs  # noqa: E402

Item = dict[str, str]


class Side:
    """One store on one fresh file: add items in calls, read them back, close."""

    def __init__(self, path: str) -> None:
        """Open a fresh store at ``path``."""
        self.path = path

    def add(self, items: list[Item]) -> None:
        """Add ``items`` in one call."""
        raise NotImplementedError

    def read_back(self) -> int:
        """Read every item back; return how many."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the store."""


class _Writes(Side):
    """Pending writes of one task per call, against one checkpoint of one thread."""

    def _start(self, saver: Any) -> None:
        from langgraph.checkpoint.base import empty_checkpoint

        self.saver = saver
        base = {"configurable": {"thread_id": "chat", "checkpoint_ns": ""}}
        self.config = saver.put(base, empty_checkpoint(), {"source": "input", "step": -1, "parents": {}}, {})
        self.calls = 0

    def add(self, items: list[Item]) -> None:
        self.calls += 1
        self.saver.put_writes(self.config, [("messages", item) for item in items], f"task-{self.calls}")

    def read_back(self) -> int:
        got = self.saver.get_tuple(self.config)
        return len(got.pending_writes or []) if got else 0


class StockSaver(_Writes):
    """langgraph-checkpoint-sqlite's SqliteSaver (WAL, synchronous=FULL)."""

    name = "SqliteSaver.put_writes"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        from langgraph.checkpoint.sqlite import SqliteSaver

        self.conn = sqlite3.connect(path, check_same_thread=False)
        self.conn.execute("PRAGMA synchronous = FULL")
        self._start(SqliteSaver(self.conn))

    def close(self) -> None:
        self.conn.close()


class OurSaver(_Writes):
    """compactstore's CompactStoreSaver (durable=True)."""

    name = "CompactStoreSaver.put_writes"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        from compactstore.adapters.langgraph import CompactStoreSaver

        self.store = cs.open(path, durable=True)
        self._start(CompactStoreSaver(self.store))

    def close(self) -> None:
        self.store.close()


class _Items(Side):
    """Items added to one SDK session."""

    def _start(self, session: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.session = session

    def add(self, items: list[Item]) -> None:
        self.loop.run_until_complete(self.session.add_items(items))

    def read_back(self) -> int:
        return len(self.loop.run_until_complete(self.session.get_items()))

    def close(self) -> None:
        self.loop.close()


class StockSession(_Items):
    """The Agents SDK's SQLiteSession on a file (WAL, synchronous=FULL, its defaults)."""

    name = "SQLiteSession.add_items"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        from agents import SQLiteSession

        self._start(SQLiteSession("chat", path))

    def close(self) -> None:
        self.session.close()
        super().close()


class OurSession(_Items):
    """compactstore's CompactStoreSession (durable=True)."""

    name = "CompactStoreSession.add_items"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        from compactstore.adapters.openai_agents import CompactStoreSession

        self.store = cs.open(path, durable=True)
        self._start(CompactStoreSession("chat", self.store))

    def close(self) -> None:
        super().close()
        self.store.close()


class Run:
    """One timed round of one side: a fresh file, the items added in calls, then read back."""

    def __init__(self, cls: type[Side], items: list[Item], per_call: int, tmp: str) -> None:
        """Prepare rounds of ``cls`` adding ``items``, ``per_call`` per call, in files under ``tmp``."""
        self.cls, self.items, self.per_call, self.tmp = cls, items, per_call, tmp
        self.read: list[float] = []
        self.k = 0

    def __call__(self) -> float:
        self.k += 1
        path = os.path.join(self.tmp, f"{self.cls.__name__}-{self.per_call}-{self.k}.db")
        side = self.cls(path)
        chunks = [self.items[i : i + self.per_call] for i in range(0, len(self.items), self.per_call)]
        t0 = time.perf_counter()
        for chunk in chunks:
            side.add(chunk)
        elapsed = time.perf_counter() - t0
        t1 = time.perf_counter()
        n = side.read_back()
        self.read.append(time.perf_counter() - t1)
        assert n == len(self.items), f"{self.cls.name} read back {n} of {len(self.items)} items"
        side.close()
        for suffix in ("", "-wal", "-shm"):
            Path(path + suffix).unlink(missing_ok=True)
        return elapsed


PAIRS: list[tuple[str, type[Side], type[Side]]] = [
    ("LangGraph", StockSaver, OurSaver),
    ("OpenAI Agents", StockSession, OurSession),
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
                runs = {cls.name: Run(cls, items, per_call, tmp) for cls in (stock, ours)}
                got = interleaved([(name, run) for name, run in runs.items()], repeat, warmup=0)
                theirs = Stat.of(got[stock.name]).median
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
                                         "side": "stock" if name == stock.name else "adapter"})
                    if name == ours.name:
                        section.goals.append(Goal(f"{framework}, {mode}: {name} / {stock.name}", vs, 1.0))
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
