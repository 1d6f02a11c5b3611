#!/usr/bin/env python3
"""Profiles of the hot paths the benchmarks time: where the time goes, by function and by SQL statement.

    python benchmarks/hotpaths.py [PATH ...] [--size N] [--top N]

PATH is one or more of ``extend`` (Session.extend of 1,000 1 KiB turns), ``append`` (one
Session.append per call), ``mark``, ``resume`` (certified), ``resume-raw``, ``restore``
(scan + span root of a 1,000-event span), ``verify`` and ``tree`` (merkle.tree_root
over 4,096 leaves of 1 KiB); default: all of them. The session used by ``mark``,
``resume`` and ``restore`` is built as in benchmarks/resume.py, with ``--size`` events
(default 30,000).

For each path it prints the wall time per call, the share of it spent inside SQLite
statements (by statement, SQLite paths only), and the cProfile table of the functions with
the largest self time: self share, cumulative share, calls. cProfile slows Python code
more than C code, so the shares of Python functions are upper bounds; the SQL split is
measured without the profiler.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from plain import CLOCK_START, turns  # noqa: E402

import compactstore as cs  # noqa: E402
from compactstore import merkle  # noqa: E402

PATHS = ("extend", "append", "mark", "resume", "resume-raw", "restore", "verify", "tree")


class _Timed:
    """A stand-in for a sqlite3 connection that times every statement (first 48 characters)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.spent: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter[str] = collections.Counter()

    def _time(self, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.spent[key] += time.perf_counter() - t0
            self.calls[key] += 1

    def execute(self, sql: str, *args: Any) -> Any:
        return _TimedCursor(self, sql[:48], self._time(sql[:48], self._conn.execute, sql, *args))

    def executemany(self, sql: str, *args: Any) -> Any:
        return self._time("many: " + sql[:42], self._conn.executemany, sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _TimedCursor:
    """A cursor whose fetches count towards the statement that made it."""

    def __init__(self, timed: _Timed, key: str, cursor: sqlite3.Cursor) -> None:
        self._timed, self._key, self._cursor = timed, key, cursor

    def fetchall(self) -> Any:
        t0 = time.perf_counter()
        try:
            return self._cursor.fetchall()
        finally:
            self._timed.spent[self._key] += time.perf_counter() - t0

    def fetchone(self) -> Any:
        t0 = time.perf_counter()
        try:
            return self._cursor.fetchone()
        finally:
            self._timed.spent[self._key] += time.perf_counter() - t0

    def __iter__(self) -> Any:
        return iter(self.fetchall())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


def _sql_split(store: cs.Store, fn: Callable[[], object], calls: int) -> None:
    backend = store.backend
    conn = getattr(backend, "_conn", None)
    if not isinstance(conn, sqlite3.Connection):
        print("  (SQL split: not a SQLite connection)")
        return
    timed = _Timed(conn)
    backend._conn = timed  # type: ignore[attr-defined]
    try:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        wall = time.perf_counter() - t0
    finally:
        backend._conn = conn  # type: ignore[attr-defined]
    sql = sum(timed.spent.values())
    print(f"  wall {harness.seconds(wall / calls)} per call; inside SQLite {sql / wall:.0%}, "
          f"Python {1 - sql / wall:.0%}")
    for key, spent in sorted(timed.spent.items(), key=lambda kv: -kv[1])[:8]:
        print(f"    {spent / wall:6.1%}  x{timed.calls[key] / calls:<6.1f} {key}")


def _profile(fn: Callable[[], object], calls: int, top: int) -> None:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    stats = pstats.Stats(prof)
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    for (file, line, func), (_, ncalls, tt, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if file != "~" else "C"
        rows.append((tt, ct, ncalls, f"{where}({func})"))
    rows.sort(reverse=True)
    print(f"  cProfile, {calls} calls, {harness.seconds(total / calls)} per call under the profiler:")
    print("     self     cum      calls  function")
    for tt, ct, ncalls, name in rows[:top]:
        print(f"    {tt / total:6.1%}  {ct / total:6.1%}  {ncalls:8d}  {name}")


def main(argv: list[str] | None = None) -> int:
    """Profile every requested path and print the tables."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("paths", nargs="*", choices=PATHS, default=list(PATHS), metavar="PATH")
    parser.add_argument("--size", type=int, default=30_000, help="events in the resumed session (default 30,000)")
    parser.add_argument("--top", type=int, default=15, help="functions shown per path (default 15)")
    args = parser.parse_args(argv)
    info = harness.machine()
    harness.print_machine(info)
    tmp = tempfile.mkdtemp(prefix="cs-bench-hot-")
    log = None
    try:
        work = turns(1000)
        if {"mark", "resume", "resume-raw", "restore"} & set(args.paths):
            from resume import Log

            log = Log(tmp, args.size, work)
        for path in args.paths:
            print(f"\n== {path} ==")
            if path in ("extend", "append"):
                store = cs.open(os.path.join(tmp, f"{path}.db"), clock=cs.events.tick_clock(CLOCK_START, 1))
                s = store.session("hot")
                s.extend(work)
                it = iter(range(10**9))
                fn: Callable[[], object] = ((lambda: s.extend(work)) if path == "extend"
                                            else (lambda: s.append(work[next(it) % 1000])))
                calls = 10 if path == "extend" else 1000
                _sql_split(store, fn, calls)
                _profile(fn, calls, args.top)
                store.close()
            elif path == "verify":
                store = cs.open(os.path.join(tmp, "verify.db"), clock=cs.events.tick_clock(CLOCK_START, 1))
                s = store.session("hot")
                for _ in range(10):
                    s.extend(work)
                _sql_split(store, store.verify, 2)
                _profile(store.verify, 2, args.top)
                store.close()
            elif path == "tree":
                leaves = [os.urandom(1024) for _ in range(4096)]
                _profile(lambda: merkle.tree_root(leaves), 20, args.top)
            else:
                assert log is not None
                fn = {"mark": log.mark, "resume": log.resume, "resume-raw": log.resume_raw,
                      "restore": log.restore}[path]
                calls = 20 if path == "restore" else 2
                _sql_split(log.store, fn, calls)
                _profile(fn, calls, args.top)
    finally:
        if log is not None:
            log.store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
