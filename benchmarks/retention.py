#!/usr/bin/env python3
"""Retention on a long session: the store kept to what its certified cover does not stand for.

    python benchmarks/retention.py [--events 100000] [--keep 200] [--target PATH|URL]

One session of ``--events`` events, about 1 KiB each: per turn a user turn and an
assistant turn of 1 KiB, a tool call and its result (every 7th fails, every 11th turn
the user rejects a proposal, every 5th a binding), maintained after every turn by
``CompactionPolicy()`` on its defaults. Then ``Session.retain(keep_last=--keep)`` and
``Store.reclaim()``. Reported: the store's size before (after a ``reclaim`` of its own,
so both sides are compacted alike) and after; the time of each step; ``verify()``; and
whether the model input of ``context()`` and the resolution of the marker that gives it
are byte-identical before and after.

Goals: ``verify()`` ok, model input and marker resolution byte-identical, and the store
at most half its size.

Writes benchmarks/results/retention.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Goal, Section, seconds  # noqa: E402

import compactstore as cs  # noqa: E402
from compactstore import events as ev  # noqa: E402

KIB = "x" * 1000


def turn(s: cs.Session, t: int) -> None:
    """Append turn ``t``: about four events of 1 KiB or less."""
    failed = t % 7 == 3
    events: list[ev.Event] = [
        cs.Turn("user", f"Turn {t}: continue with table t{t % 13}. " + KIB),
        cs.ToolCall(f"call-{t}", "run_sql", {"table": f"t{t % 13}", "attempt": t}),
        cs.ToolResult(f"call-{t}", f"ERROR: deadlock on t{t % 13} ({t})" if failed else {"rows": t % 97, "note": KIB[:500]},
                      ok=not failed, status="failed" if failed else None),
        cs.Turn("assistant", f"Step {t} {'failed' if failed else 'done'}. " + KIB),
    ]  # fmt: skip
    if t % 11 == 5:
        events.append(cs.Turn("user", f"No: not in place ({t}).", status="rejected"))
    if t % 5 == 0:
        events.append(cs.Binding(key=f"snapshot{t % 4}", value=f"snap-{t:06d}"))
    s.extend(events)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000, help="events in the session (default 100,000)")
    parser.add_argument("--keep", type=int, default=200, help="newest positions whose bodies stay (default 200)")
    parser.add_argument("--target", help="a store location (default: a SQLite file in a temporary folder)")
    args = parser.parse_args(argv)
    info = harness.machine()
    harness.print_machine(info)
    folder = Path(tempfile.mkdtemp(prefix="retention-"))
    target = args.target or str(folder / "store.db")
    sqlite = "://" not in target
    try:
        with cs.open(target, clock=ev.tick_clock()) as store:
            s = store.session("long")
            policy = cs.CompactionPolicy()
            started = time.perf_counter()
            t = 0
            while s.size < args.events:
                turn(s, t)
                s.maintain(policy)
                t += 1
            built = time.perf_counter() - started
            print(f"built {s.size:,} events in {built:.1f} s", flush=True)
            store.reclaim()
            before = harness.disk_bytes(target) if sqlite else 0
            ctx = s.context()
            fed = msgspec.json.encode(ctx.as_messages("chat"))
            resumed = s.resume(ctx.marker).digest
            started = time.perf_counter()
            record = s.retain(keep_last=args.keep)
            retained = time.perf_counter() - started
            dropped = len(ev.SpanSet(record.event.spans)) if record is not None else 0  # type: ignore[attr-defined]
            started = time.perf_counter()
            freed = store.reclaim()
            reclaimed = time.perf_counter() - started
            after = harness.disk_bytes(target) if sqlite else 0
            now = s.context()
            same_input = msgspec.json.encode(now.as_messages("chat")) == fed
            same_marker = now.marker == ctx.marker and s.resume(ctx.marker).digest == resumed
            started = time.perf_counter()
            report = store.verify()
            verified = time.perf_counter() - started
            events = s.size
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    section = Section("A long session kept to what its certified cover does not stand for",
                      ("events", "dropped", "size before", "size after", "retain", "reclaim", "verify", "context"))
    mib = 1024 * 1024
    section.rows.append((f"{events:,}", f"{dropped:,}", f"{before / mib:.1f} MiB" if sqlite else "-",
                         f"{after / mib:.1f} MiB" if sqlite else f"{freed / mib:.1f} MiB freed",
                         seconds(retained), seconds(reclaimed), seconds(verified),
                         "byte-identical" if same_input and same_marker else "CHANGED"))
    section.data.append({"events": events, "dropped": dropped, "bytes_before": before, "bytes_after": after,
                         "freed": freed, "retain_s": retained, "reclaim_s": reclaimed, "verify_s": verified,
                         "build_s": built, "verified": report.ok, "same_input": same_input, "same_marker": same_marker})
    section.goals += [
        Goal("verify() ok", float(report.ok), 1.0),
        Goal("model input and the marker's resolution byte-identical", float(same_input and same_marker), 1.0),
    ]
    if sqlite:
        section.goals.append(Goal("store size after / before", after / before, 0.5, higher_is_better=False))
    section.print()
    path = harness.write_json("retention", info, [section], params=vars(args))
    print(f"\nwrote {path}")
    return 0 if report.ok and same_input and same_marker else 1


if __name__ == "__main__":
    sys.exit(main())
