#!/usr/bin/env python3
"""SQLite, one process: open a fresh store, append one warm-up batch, then N more turns (200 characters each).

    OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind python benchmarks/append_instructions.py DB 0
    OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind python benchmarks/append_instructions.py DB 1000

Instructions per append: (the N=1000 run's total - the N=0 run's) / 1000. With
``--batch B`` the N turns go through ``Session.extend``, B per call (N a multiple of
B), after a warm-up batch of B: instructions per extended event, the same way.
``--via langgraph`` or ``--via openai`` sends the same turns (as chat messages) through
``CompactStoreSaver.put_writes`` or ``CompactStoreSession.add_items`` instead, B per
call (1 without ``--batch``); ``--via sqlitesaver`` or ``--via sqlitesession`` through
the peers those adapters are measured against (langgraph's ``SqliteSaver.put_writes``,
the OpenAI Agents SDK's ``SQLiteSession.add_items``), on a file at the same path.
"""

from __future__ import annotations

import argparse
import asyncio
import os

import compactstore as cs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("n", type=int)
    parser.add_argument("--batch", type=int, default=0, help="turns per extend call (0: one append per call)")
    parser.add_argument("--via", choices=("store", "langgraph", "openai", "sqlitesaver", "sqlitesession"), default="store")
    args = parser.parse_args()
    path, n, batch = args.path, args.n, args.batch
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    if args.via != "store":
        _adapter(args.via, path, n, batch or 1)
        return
    with cs.open(path) as st:
        s = st.session("s")
        turn = cs.Turn("user", "x" * 200)
        if batch:
            s.extend([cs.Turn("user", "w" * 200)] * batch)
            work = [turn] * batch
            for _ in range(n // batch):
                s.extend(work)
            return
        s.append(cs.Turn("user", "w" * 200))
        for _ in range(n):
            s.append(turn)


def _adapter(via: str, path: str, n: int, per: int) -> None:
    """Send a warm-up call of ``per`` messages, then ``n`` more, ``per`` per call, through an adapter."""
    warm = [{"role": "user", "content": "w" * 200}] * per
    work = [{"role": "user", "content": "x" * 200}] * per
    if via == "sqlitesaver":
        import sqlite3

        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(path, check_same_thread=False)
        peer = SqliteSaver(conn)
        peer.setup()
        config = peer.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, empty_checkpoint(),
                          {"source": "input", "step": -1, "parents": {}}, {})
        for k in range(n // per + 1):
            peer.put_writes(config, [("messages", m) for m in (work if k else warm)], task_id=f"task-{k}")
        conn.close()
        return
    if via == "sqlitesession":
        from agents import SQLiteSession

        session = SQLiteSession("t", path)
        loop = asyncio.new_event_loop()
        for k in range(n // per + 1):
            loop.run_until_complete(session.add_items([dict(m) for m in (work if k else warm)]))  # type: ignore[misc]
        loop.close()
        session.close()
        return
    with cs.open(path) as st:
        if via == "langgraph":
            from langgraph.checkpoint.base import empty_checkpoint

            from compactstore.adapters.langgraph import CompactStoreSaver

            saver = CompactStoreSaver(st)
            config = saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, empty_checkpoint(),
                               {"source": "input", "step": -1, "parents": {}}, {})
            for k in range(n // per + 1):
                saver.put_writes(config, [("messages", m) for m in (work if k else warm)], task_id=f"task-{k}")
            return
        from compactstore.adapters.openai_agents import CompactStoreSession

        session = CompactStoreSession("t", st)
        loop = asyncio.new_event_loop()
        for k in range(n // per + 1):
            loop.run_until_complete(session.add_items([dict(m) for m in (work if k else warm)]))
        loop.close()


if __name__ == "__main__":
    main()
