"""What a witness costs per commit: single appends with and without a FileWitness, in one run.

Each commit with a witness also takes the witness file's lock, reads it, writes it
to a temporary file, fsyncs it, renames it and fsyncs its directory. Rounds alternate
between the two stores so that the machine's noise falls on both alike.

    .venv/bin/python benchmarks/witness.py [--commits 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import compactstore as cs


def one_round(path: Path, witness: Path | None, commits: int, turn: cs.Turn) -> float:
    """Return the seconds per commit of ``commits`` single appends to one session."""
    with cs.open(str(path), witness=str(witness) if witness else None) as st:
        s = st.session("bench")
        start = time.perf_counter()
        for _ in range(commits):
            s.append(turn)
        return (time.perf_counter() - start) / commits


def main() -> None:
    """Print per-commit time with and without a witness, and their ratio."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--commits", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print("$", " ".join([Path(sys.executable).name, *sys.argv]))
    print(f"# {platform.platform()}, Python {platform.python_version()}")
    turn = cs.Turn("user", "x" * 1024)
    times: dict[str, list[float]] = {"plain": [], "witness": []}
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        one_round(root / "warm.db", root / "warm.json", 20, turn)
        for r in range(args.rounds):
            order = ["plain", "witness"] if r % 2 == 0 else ["witness", "plain"]
            for name in order:
                witness = root / "w.json" if name == "witness" else None
                times[name].append(one_round(root / f"{name}.db", witness, args.commits, turn))
    print(f"{'store':<10}{'min µs':>10}{'median µs':>12}{'max µs':>10}")
    for name, ts in times.items():
        print(f"{name:<10}{min(ts) * 1e6:>10.0f}{statistics.median(ts) * 1e6:>12.0f}{max(ts) * 1e6:>10.0f}")
    ratio = statistics.median(times["witness"]) / statistics.median(times["plain"])
    print(f"with a witness / without, per commit (medians): {ratio:.2f}x")


if __name__ == "__main__":
    main()
