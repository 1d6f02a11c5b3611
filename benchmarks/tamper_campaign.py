#!/usr/bin/env python3
"""The long tamper campaign: random mutations of a SQLite store file, triggers dropped.

    python benchmarks/tamper_campaign.py [--mutations N] [--seed N] [--json PATH]

Runs ``tests/reliability/tamper_harness.py`` (the same harness as the short test) on an
unkeyed and on a keyed store, ``--mutations`` each, and prints the detection rate per
mutation class, every miss and every change caught only by an untyped error.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "reliability"))

# tests/reliability/tamper_harness.py: on the path only at run time, so mypy does not see it.
from tamper_harness import campaign  # type: ignore[import-not-found]  # noqa: E402


def main() -> int:
    """Run both campaigns and print their figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutations", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    out = {}
    for keyed in (False, True):
        name = "keyed" if keyed else "unkeyed"
        with tempfile.TemporaryDirectory(prefix="tamper-campaign-") as d:
            f = campaign(Path(d), args.mutations, keyed=keyed, seed=args.seed + keyed)
        print(f"{name}: {f.summary()}")
        for what in sorted(set(f.missed)):
            print(f"  missed x{f.missed.count(what)}: {what}")
        for what in f.untyped[:20]:
            print(f"  untyped: {what}")
        out[name] = {"tried": dict(f.tried), "detected": dict(f.detected), "missed": f.missed,
                     "untyped": f.untyped, "skipped": f.skipped, "seconds": round(f.seconds, 1)}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
