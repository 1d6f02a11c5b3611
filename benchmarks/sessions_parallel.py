#!/usr/bin/env python3
"""PostgreSQL: appends per second when several processes append to different sessions at once.

    python benchmarks/sessions_parallel.py [--procs 1,2,4] [--appends 300] [--against SRC]

Each process opens the store, appends to a session of its own one event per transaction
(1 KiB turns) and reports its time; the rate is all appends over the slowest process's
time. Writers to different sessions share nothing but the server (and the sequence the
seqs are drawn from), so this measures what the seal of the global order costs them.
Starts a throwaway cluster as ``tests/pg.py`` does (fsync off, as the tests run it:
round trips dominate).

``--against SRC`` (a directory holding another version's ``compactstore`` package, e.g.
``git archive main compactstore | tar -x -C SRC``, with the built extension copied in):
both versions run on the same server, in interleaved rounds (the order alternating), and
the table gives each one's median rate and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from pg import Databases, TempServer, find_bin_dir  # noqa: E402

#: One writer: open, warm up, wait for the go line on stdin, append, print the seconds taken.
_WORKER = """
import sys, time
import compactstore as cs
url, i, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with cs.open(url) as st:
    s = st.session(f"w{i}")
    s.append(cs.Turn("user", "warm"))
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    for _ in range(n):
        s.append(cs.Turn("user", "x" * 1000))
    print(time.perf_counter() - t0, flush=True)
"""


def _round(url: str, procs: int, appends: int, src: str | None) -> float:
    """Return the appends per second of ``procs`` writers of the version at ``src`` (None: this one)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    ps = [subprocess.Popen([sys.executable, "-c", _WORKER, url, str(i), str(appends)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True, env=env, cwd="/") for i in range(procs)]
    for p in ps:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in ps:  # all start together
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    times = []
    for p in ps:
        assert p.stdout is not None
        times.append(float(p.stdout.readline()))
        p.wait()
    return procs * appends / max(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--procs", default="1,2,4")
    parser.add_argument("--appends", type=int, default=300, help="appends per process")
    parser.add_argument("--repeat", type=int, default=3, help="rounds")
    parser.add_argument("--against", default=None, help="another version's source directory, run side by side")
    args = parser.parse_args()
    bin_dir = find_bin_dir()
    if bin_dir is None:
        sys.exit("no PostgreSQL binaries found")
    server = TempServer(bin_dir)
    url = server.start()
    dbs = Databases(url)
    versions: list[tuple[str, str | None]] = [("this", None)]
    if args.against:
        versions.insert(0, ("against", args.against))
    print(f"command: {' '.join(sys.argv)}")
    try:
        for procs in (int(p) for p in args.procs.split(",")):
            rates: dict[str, list[float]] = {name: [] for name, _ in versions}
            for r in range(args.repeat):
                for name, src in versions if r % 2 == 0 else versions[::-1]:
                    u = dbs.create()
                    rates[name].append(_round(u, procs, args.appends, src))
                    dbs.drop(u)
            line = "  ".join(f"{name} {statistics.median(v):>7,.0f}/s" for name, v in rates.items())
            if args.against:
                ratios = [t / a for t, a in zip(rates["this"], rates["against"])]
                line += f"  this/against {statistics.median(ratios):.2f} (rounds {', '.join(f'{x:.2f}' for x in ratios)})"
            print(f"procs {procs}: {procs * args.appends} appends  {line}", flush=True)
    finally:
        dbs.close()
        server.stop()


if __name__ == "__main__":
    main()
