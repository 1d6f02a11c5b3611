#!/usr/bin/env python3
"""SQLite, one process: open a fresh store, append one warm-up batch, then N more turns (200 characters each).

    OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind python benchmarks/append_instructions.py DB 0
    OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind python benchmarks/append_instructions.py DB 1000

Instructions per append: (the N=1000 run's total - the N=0 run's) / 1000. With
``--batch B`` the N turns go through ``Session.extend``, B per call (N a multiple of
B), after a warm-up batch of B: instructions per extended event, the same way.
"""

from __future__ import annotations

import argparse
import os

import compactstore as cs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("n", type=int)
    parser.add_argument("--batch", type=int, default=0, help="turns per extend call (0: one append per call)")
    args = parser.parse_args()
    path, n, batch = args.path, args.n, args.batch
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
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


if __name__ == "__main__":
    main()
