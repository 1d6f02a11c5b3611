#!/usr/bin/env python3
"""PostgreSQL: appends per second when several processes append to different sessions at once.

    python benchmarks/sessions_parallel.py [--procs 1,2,4] [--appends 300]

Each process opens the store, appends to a session of its own one event per transaction
(1 KiB turns) and reports its time; the rate is all appends over the slowest process's
time. Writers to different sessions share nothing but the server (and the sequence the
seqs are drawn from), so this measures what the seal of the global order costs them.
Starts a throwaway cluster as ``tests/pg.py`` does (fsync off, as the tests run it:
round trips dominate).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from pg import Databases, TempServer, find_bin_dir  # noqa: E402

import compactstore as cs  # noqa: E402


def _worker(url: str, i: int, n: int, q: mp.Queue[float]) -> None:
    with cs.open(url) as st:
        s = st.session(f"w{i}")
        s.append(cs.Turn("user", "warm"))
        t0 = time.perf_counter()
        for _ in range(n):
            s.append(cs.Turn("user", "x" * 1000))
        q.put(time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", default="1,2,4")
    parser.add_argument("--appends", type=int, default=300, help="appends per process")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    bin_dir = find_bin_dir()
    if bin_dir is None:
        sys.exit("no PostgreSQL binaries found")
    server = TempServer(bin_dir)
    url = server.start()
    dbs = Databases(url)
    print(f"command: {' '.join(sys.argv)}")
    print("procs  appends  appends/s (median of rounds)")
    try:
        for procs in (int(p) for p in args.procs.split(",")):
            rates = []
            for _ in range(args.repeat):
                u = dbs.create()
                cs.open(u).close()
                q: mp.Queue[float] = mp.Queue()
                ps = [mp.Process(target=_worker, args=(u, i, args.appends, q)) for i in range(procs)]
                for p in ps:
                    p.start()
                times = [q.get() for _ in ps]
                for p in ps:
                    p.join()
                rates.append(procs * args.appends / max(times))
                dbs.drop(u)
            print(f"{procs:>5}  {procs * args.appends:>7}  {sorted(rates)[len(rates) // 2]:>9,.0f}")
    finally:
        dbs.close()
        server.stop()


if __name__ == "__main__":
    main()
