#!/usr/bin/env python3
"""The memory loop as a user first meets it: what the model is fed, and what maintenance costs, on the defaults.

    python benchmarks/memory_loop.py [--turns 3000] [--at 1000,3000] [--repeat 3] [--long]

One session plays ``--turns`` agent turns through the public API: a user turn, a tool
call and its result (every 7th fails), an assistant turn; every 11th turn a proposal the
user rejects; every 5th a binding re-bound under one of four keys (non-regenerable);
every 50th an obligation that needs the latest key, fulfilled 30 turns later. After each
turn ``Session.maintain(policy)`` runs. Three lines, each its own store:

* ``defaults``: ``cs.CompactionPolicy()``, no summarizer argument: the extractive one;
* ``stand-in``: ``cs.CompactionPolicy(summarizer=stand_in)``, a deterministic stand-in
  for a language model whose summary is a few hundred characters;
* ``none``: no maintenance at all, the baseline the whole run is held to.

At each ``--at`` point it reads ``Session.context()`` and records what the model is fed
(``as_messages("chat")`` encoded as JSON; the most over the 40 turns up to the point,
since a context moves with the policy's phase) against the raw log rendered the same way,
and the time of a cold ``context()`` (a fresh store handle per call, as a restarted
agent; median of ``--repeat``). The whole run's time (appends and maintenance) is the
median of ``--repeat`` rounds, the lines interleaved round by round. ``--long`` plays
10,000 turns once, points at 1,000, 3,000 and 10,000.

Goals on the defaults: fed context at most 10% of the raw characters at 3,000 turns and at
most 1.5 times its size at 1,000; the whole run at most 3 times the run without
maintenance; a cold ``context()`` under 15 ms at 3,000 turns; certified, no refusal.

Writes benchmarks/results/memory_loop.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Goal, Section, seconds  # noqa: E402

import compactstore as cs  # noqa: E402
from compactstore import events as ev  # noqa: E402
from compactstore import render  # noqa: E402
from compactstore.resolver import RawItem  # noqa: E402

TOOLS = ("run_sql", "read_file", "write_file", "http_get", "grep")
#: The stand-in's summaries are cut to this many characters, as a model asked for five lines would be.
STAND_IN_LIMIT = 400
#: The fed context at a point is the most fed over this many turns up to it.
WINDOW = 40


def stand_in(records: Sequence[cs.Record]) -> str:
    """Summarize as a language model would, deterministically: counts, then failures and rejections by position."""
    kinds: dict[str, int] = {}
    for r in records:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
    negative = [f"{r.pos} {r.event.status}" for r in records if r.event.status in ("failed", "rejected")]
    counts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    text = f"{len(records)} records ({counts}); failures and rejections: {', '.join(negative) or 'none'}"
    return text if len(text) <= STAND_IN_LIMIT else text[: STAND_IN_LIMIT - 1] + "…"


LINES: dict[str, cs.CompactionPolicy | None] = {
    "defaults": cs.CompactionPolicy(),
    "stand-in": cs.CompactionPolicy(summarizer=stand_in),
    "none": None,
}


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


class Run:
    """One line played once: the whole run's time and what was measured at each point."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.points: dict[int, dict[str, Any]] = {}
        self.refusals = 0
        self.fed_most = 0
        self.modes: set[str] = set()


def play(path: str, policy: cs.CompactionPolicy | None, turns: int, at: set[int], repeat: int) -> Run:
    """Play ``turns`` turns on a new store at ``path`` under ``policy``; measure at each point of ``at`` (untimed)."""
    run = Run()
    with cs.open(path, clock=ev.tick_clock()) as store:
        s = store.session("memory-loop")
        for t in range(turns):
            started = time.perf_counter()
            turn(s, t)
            if policy is not None:
                run.refusals += len(s.maintain(policy).refused)
            run.seconds += time.perf_counter() - started
            if policy is not None and any(0 <= p - (t + 1) < WINDOW for p in at):
                got = s.context()
                run.modes.add(got.mode)
                run.fed_most = max(run.fed_most, characters(got.as_messages("chat")))
            if t + 1 in at:
                run.points[t + 1] = measure(s, path, run, policy is not None, repeat)
                run.fed_most = 0
    return run


def measure(s: cs.Session, path: str, run: Run, compacted: bool, repeat: int) -> dict[str, Any]:
    """Return the raw log's size as model input and, under a policy, the fed context and a cold context()'s time."""
    raw = [RawItem(x.pos, x.event) for x in s.scan() if x.kind not in ev.DERIVED_KINDS]
    out: dict[str, Any] = {"events": s.size, "raw_chars": characters(render.messages(raw, "chat"))}
    if not compacted:
        return out
    cold = []
    for _ in range(repeat):
        with cs.open(path) as fresh:
            other = fresh.session(s.name)
            started = time.perf_counter()
            got = other.context()
            cold.append(time.perf_counter() - started)
        run.modes.add(got.mode)
    out.update(fed_chars=run.fed_most, share=run.fed_most / out["raw_chars"], cold_s=statistics.median(cold),
               summaries=sum(isinstance(i, cs.resolver.SummaryItem) for i in got.context), mode=got.mode)
    return out


def rounds(turns: int, at: set[int], repeat: int, folder: Path, lines: Sequence[str], times: int) -> dict[str, list[Run]]:
    """Play every line ``times`` times, interleaved round by round in a rotating order."""
    out: dict[str, list[Run]] = {name: [] for name in lines}
    for i in range(times):
        order = list(lines[i % len(lines):]) + list(lines[: i % len(lines)])
        for name in order:
            path = str(folder / f"{name}-{i}.db")
            out[name].append(play(path, LINES[name], turns, at, repeat))
            print(f"  round {i + 1}/{times} {name}: {out[name][-1].seconds:.2f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the memory loop, print its table and write benchmarks/results/memory_loop.json."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=3000, help="agent turns (default 3000)")
    parser.add_argument("--at", default="1000,3000", help="turns at which to measure (default 1000,3000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the whole run, and cold reads per point (default 3)")
    parser.add_argument("--long", action="store_true", help="10,000 turns, once, measured at 1,000, 3,000 and 10,000")
    args = parser.parse_args(argv)
    if args.long:
        args.turns, args.at, times = 10_000, "1000,3000,10000", 1
    else:
        times = args.repeat
    at = {int(x) for x in args.at.split(",") if 0 < int(x) <= args.turns}
    info = harness.machine()
    harness.print_machine(info, args.repeat)
    print(f"loop:     {args.turns:,} turns, maintain after every turn, SQLite; lines {', '.join(LINES)}")
    folder = Path(tempfile.mkdtemp(prefix="memory-loop-"))
    try:
        runs = rounds(args.turns, at, args.repeat, folder, list(LINES), times)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    whole = {name: statistics.median(r.seconds for r in rs) for name, rs in runs.items()}
    section = Section(
        "What the model is fed, and what maintenance costs, under rolling compaction",
        ("line", "turns", "events", "raw chars", "fed chars (most)", "share", "summaries", "cold context()", "mode"),
    )
    for name in ("defaults", "stand-in"):
        last = runs[name][-1]
        for p in sorted(at):
            r = last.points[p]
            section.rows.append((name, f"{p:,}", f"{r['events']:,}", f"{r['raw_chars']:,}", f"{r['fed_chars']:,}",
                                 f"{r['share']:.1%}", str(r["summaries"]), seconds(r["cold_s"]), r["mode"]))
            section.data.append({"line": name, "turns": p, **r})
    for name in LINES:
        section.notes.append(f"whole run, {name}: {seconds(whole[name])} (median of {times})")
    d = runs["defaults"][-1]
    first, last_at = min(at), max(at)
    refusals = sum(r.refusals for rs in runs.values() for r in rs)
    section.goals += [
        Goal(f"defaults: fed / raw characters at {last_at:,} turns", d.points[last_at]["share"], 0.10,
             higher_is_better=False),
        Goal(f"defaults: fed characters at {last_at:,} turns / at {first:,}",
             d.points[last_at]["fed_chars"] / d.points[first]["fed_chars"], 1.5, higher_is_better=False),
        Goal("defaults: whole run / the run without maintenance", whole["defaults"] / whole["none"], 3.0,
             higher_is_better=False),
        Goal(f"defaults: cold context() at {min(last_at, 3000):,} turns (ms)",
             d.points[min(last_at, 3000) if min(last_at, 3000) in d.points else last_at]["cold_s"] * 1e3, 15,
             higher_is_better=False),
        Goal("contexts certified (share of lines and points)",
             float(all(r.modes == {"certified"} for n, rs in runs.items() if n != "none" for r in rs)), 1.0),
        Goal("refusals", float(refusals), 0.0, higher_is_better=False),
    ]
    section.print()
    path = harness.write_json("memory_loop", info, [section], params=vars(args))
    print(f"\nwrote {path}")
    return 0


Callable  # re-exported for type checkers of callers that pass a summarizer


if __name__ == "__main__":
    sys.exit(main())
