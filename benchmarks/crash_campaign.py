#!/usr/bin/env python3
"""The long crash campaign: writer processes on a durable SQLite store, killed with SIGKILL.

    python benchmarks/crash_campaign.py [--kills N] [--writers N] [--seed N] [--json PATH]

Runs ``tests/reliability/crash_harness.py`` (the same harness as the short test) until
``--kills`` writers were killed at random moments, checking the store after every
round, and prints the figures RELIABILITY.md records. Exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "reliability"))

# tests/reliability/crash_harness.py: on the path only at run time, so mypy does not see it.
from crash_harness import Campaign  # type: ignore[import-not-found]  # noqa: E402


def main() -> int:
    """Run the campaign and print its figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=300)
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="crash-campaign-") as d:
        campaign = Campaign(Path(d), seed=args.seed, writers=args.writers)
        figures = campaign.run(args.kills)
    print(figures.summary())
    for failure in figures.failures[:20]:
        print("FAILED:", failure)
    if args.json:
        out = {k: v for k, v in vars(figures).items() if k != "failures"}
        out["failures"] = figures.failures
        args.json.write_text(json.dumps(out, indent=2, default=dict) + "\n")
    return 1 if figures.failures or figures.lost else 0


if __name__ == "__main__":
    sys.exit(main())
