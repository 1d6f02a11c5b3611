#!/usr/bin/env python3
"""Digest throughput: what the Merkle tree costs over hashing the same bytes once.

    python benchmarks/digest.py [--repeat N]

Part 1, Merkle roots: over random leaves of 1 KiB and 16 KiB it times, in one run,

* raw BLAKE3: ``blake3.blake3(buf).digest()`` over all leaves as one buffer, single
  threaded (the reference: no tree can hash its input faster than this);
* ``merkle.tree_root`` over the leaves (BLAKE3, the default);
* a ``merkle.Frontier`` fed one ``leaf_hash`` per leaf, as a store appends, then ``root()``;
* ``merkle.tree_root`` with SHA-256, and raw SHA-256 over the buffer, for context.

Each measurement is repeated; the table gives min / median / max seconds, the median
throughput in MB/s (10**6 bytes of leaf data per second) and the median throughput as a
fraction of raw BLAKE3 over the same bytes. Further parts are more functions returning
rows, listed in SECTIONS.

Uses only the standard library, blake3 and compactstore.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import platform
import random
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

try:
    import compactstore  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import blake3

from compactstore import merkle

Row = tuple[str, ...]

# (label, leaf size in bytes, number of leaves)
WORKLOADS = [("1 KiB leaves", 1024, 4096), ("16 KiB leaves", 16 * 1024, 512)]
SEED = 20240601


def cpu_model() -> str:
    """Return the CPU model name from /proc/cpuinfo, or what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("model name", "Hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def timings(fn: Callable[[], object], repeat: int) -> list[float]:
    """Return ``repeat`` wall-clock durations of ``fn()``, after one untimed warm-up call."""
    fn()
    out = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    finally:
        if gc_was_enabled:
            gc.enable()
    return out


def frontier_root(leaves: Sequence[bytes]) -> bytes:
    """Append every leaf to a fresh Frontier, as a store would, and return its root."""
    f = merkle.Frontier()
    leaf_hash, append = merkle.leaf_hash, f.append
    for leaf in leaves:
        append(leaf_hash(leaf))
    return f.root()


def merkle_rows(repeat: int = 7) -> tuple[Row, list[Row]]:
    """Time raw BLAKE3 against the Merkle root computations; return (header, rows)."""
    header = ("workload", "method", "min s", "median s", "max s", "MB/s", "vs raw BLAKE3")
    rows: list[Row] = []
    rng = random.Random(SEED)
    for label, leaf_size, count in WORKLOADS:
        leaves = [rng.randbytes(leaf_size) for _ in range(count)]
        buf = b"".join(leaves)
        # The tree and the Frontier must agree before their speed means anything.
        assert frontier_root(leaves) == merkle.tree_root(leaves)
        methods: list[tuple[str, Callable[[], object]]] = [
            ("raw BLAKE3, one buffer", lambda: blake3.blake3(buf).digest()),
            ("merkle.tree_root (BLAKE3)", lambda: merkle.tree_root(leaves)),
            ("Frontier append loop (BLAKE3)", lambda: frontier_root(leaves)),
            ("merkle.tree_root (SHA-256)", lambda: merkle.tree_root(leaves, "sha256")),
            ("raw SHA-256, one buffer", lambda: hashlib.sha256(buf).digest()),
        ]
        workload = f"{count} x {label}"
        raw_median = None
        for name, fn in methods:
            ts = timings(fn, repeat)
            median = statistics.median(ts)
            raw_median = raw_median or median
            rows.append(
                (
                    workload,
                    name,
                    f"{min(ts):.5f}",
                    f"{median:.5f}",
                    f"{max(ts):.5f}",
                    f"{len(buf) / median / 1e6:,.0f}",
                    f"{raw_median / median:.2f}x",
                )
            )
    return header, rows


SECTIONS: list[tuple[str, Callable[[int], tuple[Row, list[Row]]]]] = [
    ("Merkle roots vs raw hashing", merkle_rows),
]


def print_table(header: Row, rows: list[Row]) -> None:
    """Print rows under header, text left-aligned in the first two columns, numbers right-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(row: Row) -> str:
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        return "  ".join(cells).rstrip()

    print(fmt(header))
    print("  ".join("-" * w for w in widths))
    previous = None
    for row in rows:
        if previous is not None and row[0] != previous:
            print()
        print(fmt(row if row[0] != previous else ("", *row[1:])))
        previous = row[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed repetitions per measurement (default 7)")
    args = parser.parse_args(argv)

    print(f"command:  {shlex.join([sys.executable, *sys.argv])}")
    print(f"machine:  {platform.platform()}, {platform.machine()}")
    print(f"cpu:      {cpu_model()} ({os.cpu_count()} logical CPUs)")
    print(f"python:   {platform.python_implementation()} {platform.python_version()}")
    print(f"blake3:   {blake3.__version__} (single-threaded)")
    print(f"repeat:   {args.repeat} timed runs per row after one warm-up; throughput from the median")
    for title, section in SECTIONS:
        print()
        print(f"== {title} ==")
        header, rows = section(args.repeat)
        print_table(header, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
