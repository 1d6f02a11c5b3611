#!/usr/bin/env python3
"""WAL frames per single-append commit: compactstore ``Session.append`` against plain ``sqlite3``, checkpoints off.

    .venv/bin/python benchmarks/wal_frames.py [--appends 300]

Both write the 1 KiB turns of ``plain.turns`` at ``synchronous=FULL`` after 50 warm-up
commits; frames = growth of the ``-wal`` file / (page size + 24-byte frame header). Each
frame is a page written (and checksummed) before the commit's fsync.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import harness  # noqa: F401  (puts the checkout on sys.path when run from it)
import compactstore as cs
from plain import CLOCK_START, PlainSQLite, turns

WARM = 50


def _wal(path: str) -> int:
    return os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0


def main() -> None:
    """Print frames per commit of each side."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--appends", type=int, default=300, help="measured commits per side (default 300)")
    n = parser.parse_args().appends
    work = turns(WARM + n)
    tmp = tempfile.mkdtemp(prefix="cs-bench-frames-")
    path = os.path.join(tmp, "cs.db")
    with cs.open(path, durable=True, clock=cs.events.tick_clock(CLOCK_START, 1)) as st:
        conn = st.backend._conn  # type: ignore[attr-defined]
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        frame = int(conn.execute("PRAGMA page_size").fetchone()[0]) + 24
        s = st.session("bench")
        for e in work[:WARM]:
            s.append(e)
        w0 = _wal(path)
        for e in work[WARM:]:
            s.append(e)
        ours = (_wal(path) - w0) / frame / n
    plain_path = os.path.join(tmp, "plain.db")
    p = PlainSQLite(plain_path, "FULL")
    p.conn.execute("PRAGMA wal_autocheckpoint = 0")
    for row in p.rows_for(work[:WARM]):
        p.insert((row,))
    w0 = _wal(plain_path)
    for row in p.rows_for(work[WARM:]):
        p.insert((row,))
    theirs = (_wal(plain_path) - w0) / frame / n
    p.close()
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"WAL frames per commit, {n} single appends of 1 KiB turns: compactstore {ours:.2f}, plain sqlite3 {theirs:.2f}")


if __name__ == "__main__":
    main()
