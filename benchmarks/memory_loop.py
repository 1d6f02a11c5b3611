#!/usr/bin/env python3
"""The memory loop: how big is a resumed agent's context under rolling compaction, against the raw log?

    python benchmarks/memory_loop.py [--turns 3000] [--at 500,1000,3000] [--every 40] [--roll-up-every 5]

One session plays ``--turns`` agent turns through the public API: a user turn, a tool
call and its result (every 7th fails), an assistant turn; every 11th turn a proposal the
user rejects; every 5th a binding re-bound under one of four keys (non-regenerable);
every 50th an obligation that needs the latest key, fulfilled 30 turns later. After each
turn ``Session.maintain(policy)`` applies ``cs.CompactionPolicy(every=40,
roll_up_every=5)`` with a deterministic summarizer whose text has a fixed bound (a
language model's summary does not grow with the session either); ``on_risk="spill"``.

At each ``--at`` point it resumes from the latest marker the policy emitted and prints
the context's size (items, and characters of the model input,
``Resolution.as_messages("openai-responses")`` encoded as JSON) against the raw log
rendered the same way, the time of the resume (median of ``--repeat`` calls on the
same handle, warm, and on a fresh store handle per call, cold), and the
fallbacks (resumes that were not certified) and refusals (compactions the gate refused,
markers refused at emission) so far. The summaries' notes are counted apart too: the raw
tail after the checkpoint is bounded by the policy's window, the notes must be bounded
by themselves. Goals: context <= 10% of the raw characters at the last point and not
growing with the session (neither the whole nor the notes); the resume under 10 ms;
certified.

Writes benchmarks/results/memory_loop.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Goal, Section, Stat, seconds  # noqa: E402

import compactstore as cs  # noqa: E402
from compactstore import events as ev  # noqa: E402
from compactstore import render  # noqa: E402
from compactstore.resolver import RawItem  # noqa: E402

TOOLS = ("run_sql", "read_file", "write_file", "http_get", "grep")
#: A summary's text is cut to this many characters, however long its span: a model's would be too.
SUMMARY_LIMIT = 600


def bounded_summary(records: Sequence[cs.Record]) -> str:
    """Summarize deterministically in at most SUMMARY_LIMIT characters: counts, failures and rejections by position."""
    kinds: dict[str, int] = {}
    for r in records:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
    negative = [f"{r.pos} {r.event.status}" for r in records if r.event.status in ("failed", "rejected")]
    first, last = records[0].pos, records[-1].pos
    counts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    text = f"positions {first}..{last}: {counts}; negatives: {', '.join(negative) or 'none'}"
    return text if len(text) <= SUMMARY_LIMIT else text[: SUMMARY_LIMIT - 1] + "…"


def turn(s: cs.Session, t: int) -> None:
    """Append agent turn ``t``: four to nine events in one batch."""
    tool = TOOLS[t % len(TOOLS)]
    failed = t % 7 == 3
    events: list[ev.Event] = [
        cs.Turn("user", f"Turn {t}: continue the migration of table t{t % 13}, checking constraint c{t % 17} first."),
        cs.ToolCall(f"call-{t}", tool, {"target": f"t{t % 13}", "attempt": t}),
        cs.ToolResult(f"call-{t}", f"ERROR: deadlock detected on t{t % 13} (attempt {t})" if failed
                      else {"rows": t % 97, "table": f"t{t % 13}", "note": "ok " * 20}, ok=not failed,
                      status="failed" if failed else None),
        cs.Turn("assistant", f"Step {t} {'failed, retrying later' if failed else 'done'}; next: table t{(t + 1) % 13}."),
    ]  # fmt: skip
    if t % 11 == 5:
        events += [cs.Turn("assistant", f"Proposal {t}: backfill t{t % 13} in place."),
                   cs.Turn("user", f"No: do not backfill t{t % 13} in place.", status="rejected")]
    if t % 5 == 0:
        events.append(cs.Binding(key=f"snapshot{t % 4}", value=f"snap-{t:06d}-{(t * 7919) % 100003:05d}"))
    if t % 50 == 10:
        events.append(cs.Obligation(name=f"restore-{t}", needs=[f"snapshot{t % 4}"]))
    if t % 50 == 40:
        events.append(cs.Fulfilment(name=f"restore-{t - 30}"))
    s.extend(events)


def characters(items: list[render.Message]) -> int:
    """Return the characters of model input ``items`` encoded as JSON."""
    return len(json.dumps(items, ensure_ascii=False))


def context_of(s: cs.Session, marker: int | None) -> cs.Resolution:
    """Return what a resumed agent loads now: the latest certifying marker's cover and the raw tail."""
    if marker is None:
        raise RuntimeError("the policy has emitted no marker yet")
    return s.context()


def measure(s: cs.Session, marker: int | None, turns: int, repeat: int, stats: dict[str, int], path: str) -> dict[str, Any]:
    """Return the context's size and resume time (warm: this handle; cold: a fresh handle per call) against the raw log."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = context_of(s, marker)
        times.append(time.perf_counter() - t0)
    cold = []
    for _ in range(repeat):
        with cs.open(path) as fresh:
            other = fresh.session(s.name)
            t0 = time.perf_counter()
            got = context_of(other, marker)
            cold.append(time.perf_counter() - t0)
        assert got.digest == r.digest
    raw = [RawItem(x.pos, x.event) for x in s.scan() if x.kind not in ev.DERIVED_KINDS]
    raw_chars = characters(render.messages(raw, "openai-responses"))
    ctx_chars = characters(r.as_messages("openai-responses"))
    st = Stat.of(times)
    notes = [i for i in r.context if isinstance(i, cs.resolver.SummaryItem)]
    summaries = len(notes)
    # The summaries' notes alone: the part that must not grow; the raw tail is bounded by the policy's window.
    notes_chars = characters(render.messages(notes, "openai-responses"))
    return {
        "turns": turns, "events": s.size, "raw_items": len(raw), "raw_chars": raw_chars,
        "context_items": len(r.context), "summaries": summaries, "context_chars": ctx_chars,
        "notes_chars": notes_chars,
        "share": ctx_chars / raw_chars, "mode": r.mode, "resume": st.as_dict(), "median_s": st.median,
        "cold": Stat.of(cold).as_dict(), "cold_median_s": Stat.of(cold).median,
        "nodes": stats["nodes"], "digests": stats["digests"], "fallbacks": stats["fallbacks"] + (r.mode != "certified"),
        "refusals": stats["refusals"],
    }


def run(turns: int, at: list[int], every: int, roll_up_every: int | None, repeat: int, path: str) -> list[dict[str, Any]]:
    """Play the session, maintaining it after every turn, and measure at each point of ``at``."""
    policy = cs.CompactionPolicy(every=every, roll_up_every=roll_up_every, summarizer=bounded_summary)
    stats = {"nodes": 0, "digests": 0, "fallbacks": 0, "refusals": 0}
    out = []
    marker = None
    with cs.open(path, clock=ev.tick_clock()) as store:
        s = store.session("memory-loop")
        for t in range(turns):
            turn(s, t)
            done = s.maintain(policy)
            stats["nodes"] += len(done.compacted)
            stats["digests"] += len(done.rolled_up)
            stats["refusals"] += len(done.refused)
            marker = done.marker if done.marker is not None else marker
            if t + 1 in at:
                row = measure(s, marker, t + 1, repeat, stats, path)
                out.append(row)
                print(f"  {t + 1:,} turns: {row['context_items']:,} items, {row['context_chars']:,} characters "
                      f"({row['share']:.1%} of raw), resume {seconds(row['median_s'])} warm, "
                      f"{seconds(row['cold_median_s'])} cold, {row['mode']}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the memory loop, print its table and write benchmarks/results/memory_loop.json."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=3000, help="agent turns (default 3000)")
    parser.add_argument("--at", default="500,1000,3000", help="turns at which to measure (default 500,1000,3000)")
    parser.add_argument("--every", type=int, default=40, help="compact every N raw events (default 40)")
    parser.add_argument("--roll-up-every", type=int, default=5, help="grow the digest every N L1 nodes; 0: never")
    parser.add_argument("--repeat", type=int, default=7, help="timed resumes per point (default 7)")
    args = parser.parse_args(argv)
    at = sorted({int(x) for x in args.at.split(",") if 0 < int(x) <= args.turns})
    info = harness.machine()
    harness.print_machine(info, args.repeat)
    print(f"loop:     {args.turns:,} turns, CompactionPolicy(every={args.every}, roll_up_every={args.roll_up_every}), "
          f"bounded deterministic summarizer, maintain after every turn, SQLite")
    folder = tempfile.mkdtemp(prefix="memory-loop-")
    started = time.perf_counter()
    try:
        rows = run(args.turns, at, args.every, args.roll_up_every or None, args.repeat,
                   str(Path(folder) / "loop.db"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    elapsed = time.perf_counter() - started
    section = Section(
        "Resumed context against the raw log, under rolling compaction",
        ("turns", "events", "raw items", "raw chars", "context items", "summaries", "context chars", "notes chars", "share",
         "resume (median)", "cold (median)", "mode", "nodes", "digests", "fallbacks", "refusals"),
    )
    for r in rows:
        section.rows.append((f"{r['turns']:,}", f"{r['events']:,}", f"{r['raw_items']:,}", f"{r['raw_chars']:,}",
                             f"{r['context_items']:,}", str(r["summaries"]), f"{r['context_chars']:,}",
                             f"{r['notes_chars']:,}",
                             f"{r['share']:.1%}", seconds(r["median_s"]), seconds(r["cold_median_s"]), r["mode"], str(r["nodes"]),
                             str(r["digests"]), str(r["fallbacks"]), str(r["refusals"])))
        section.data.append(r)
    section.notes.append(f"whole run (appends, maintenance after every turn, measurements): {elapsed:.1f} s")
    if rows:
        last, first = rows[-1], rows[0]
        section.goals += [
            Goal(f"context / raw characters at {last['turns']:,} turns", last["share"], 0.10, higher_is_better=False),
            Goal(f"context characters at {last['turns']:,} turns / at {first['turns']:,}",
                 last["context_chars"] / first["context_chars"], 1.5, higher_is_better=False,
                 note="the context does not grow with the session"),
            Goal(f"summary notes' characters at {last['turns']:,} turns / at {first['turns']:,}",
                 last["notes_chars"] / first["notes_chars"], 1.5, higher_is_better=False,
                 note="the summaries do not grow with the session; the raw tail is the policy's window"),
            Goal(f"resume at {last['turns']:,} turns (ms)", last["median_s"] * 1e3, 10, higher_is_better=False),
            Goal(f"cold resume (fresh handle) at {last['turns']:,} turns (ms)", last["cold_median_s"] * 1e3, 10,
                 higher_is_better=False),
            Goal("resumes certified (share)", sum(r["mode"] == "certified" for r in rows) / len(rows), 1.0),
        ]
    section.print()
    path = harness.write_json("memory_loop", info, [section], params=vars(args), elapsed_s=elapsed)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
