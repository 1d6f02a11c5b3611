#!/usr/bin/env python3
"""SQLite, one process: open a fresh store, append one warm-up turn, then N more (200 characters each).

    OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind python benchmarks/append_instructions.py DB 0
    OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind python benchmarks/append_instructions.py DB 1000

Instructions per append: (the N=1000 run's total - the N=0 run's) / 1000.
"""

from __future__ import annotations

import os
import sys

import compactstore as cs


def main() -> None:
    path, n = sys.argv[1], int(sys.argv[2])
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    with cs.open(path) as st:
        s = st.session("s")
        s.append(cs.Turn("user", "w" * 200))
        turn = cs.Turn("user", "x" * 200)
        for _ in range(n):
            s.append(turn)


if __name__ == "__main__":
    main()
