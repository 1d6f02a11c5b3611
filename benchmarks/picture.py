#!/usr/bin/env python3
"""The picture at scale: how long do ``compactstore show`` and ``show --html`` take, and how much do they write?

    python benchmarks/picture.py [--events 100000] [--every 100] [--roll-up-every 5] [--repeat 3] [--store PATH]

One session of ``--events`` events is played through the public API with memory_loop.py's
agent turns (a user turn, a tool call and its result, every 7th failing, an assistant
turn; rejected proposals, re-bound non-regenerable snapshots, obligations fulfilled 30
turns later), ``Session.maintain(cs.CompactionPolicy(every, roll_up_every))`` after
every turn with memory_loop's bounded deterministic summarizer: many L1 nodes, a digest
that grows, and a marker after every compaction. ``--store PATH`` keeps the store there
and reuses it on the next run when it already holds the session at that size.

Then ``compactstore show`` (verifying the store first, as by default, and with
``--no-verify``) and ``show --html`` are run as subprocesses, interleaved, ``--repeat``
rounds after a warm-up; each is timed whole (interpreter start included) and its output
measured: the bytes the terminal picture prints (piped, ``COLUMNS=160``) and the bytes
of the page. ``compactstore verify`` alone is timed beside them, as the part of ``show``
that is the store's check rather than the picture. Goals: ``show`` at most 2 s and
100 KB; ``show --html`` at most 3 s and 2 MB.

Writes benchmarks/results/picture.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Goal, Section, Stat, seconds  # noqa: E402
from memory_loop import bounded_summary, turn  # noqa: E402

import compactstore as cs  # noqa: E402
from compactstore import events as ev  # noqa: E402

SESSION = "picture"
#: The terminal width the picture is drawn at (piped output has no terminal to ask).
COLUMNS = 160


def build(path: str, events: int, every: int, roll_up_every: int | None) -> dict[str, int]:
    """Play agent turns into ``path`` until the session holds ``events`` events, maintaining after every turn."""
    policy = cs.CompactionPolicy(every=every, roll_up_every=roll_up_every, summarizer=bounded_summary)
    counts = {"turns": 0, "nodes": 0, "digests": 0, "markers": 0, "refusals": 0}
    started = time.perf_counter()
    with cs.open(path, clock=ev.tick_clock()) as store:
        s = store.session(SESSION)
        while s.size < events:
            turn(s, counts["turns"])
            done = s.maintain(policy)
            counts["turns"] += 1
            counts["nodes"] += len(done.compacted)
            counts["digests"] += len(done.rolled_up)
            counts["markers"] += done.marker is not None
            counts["refusals"] += len(done.refused)
            if counts["turns"] % 2000 == 0:
                print(f"  built {s.size:,} events ({counts['turns']:,} turns) in {time.perf_counter() - started:.0f} s",
                      flush=True)
        counts["events"] = s.size
    return counts


def held(path: str, events: int) -> int | None:
    """Return the size of the session kept at ``path`` when it holds at least ``events`` events, else None."""
    if not Path(path).exists():
        return None
    try:
        with cs.open(path, create=False) as store:
            size = store.session(SESSION).size
    except cs.CompactStoreError:
        return None
    return size if size >= events else None


def command(*args: str) -> list[str]:
    """Return the argv that runs the installed ``compactstore`` CLI with ``args``."""
    return [sys.executable, "-m", "compactstore", *args]


def main(argv: list[str] | None = None) -> int:
    """Build (or reuse) the session, time show and show --html as subprocesses, print the table and goals."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000, help="events in the session (default 100000)")
    parser.add_argument("--every", type=int, default=100, help="compact every N raw events (default 100)")
    parser.add_argument("--roll-up-every", type=int, default=5, help="grow the digest every N L1 nodes; 0: never")
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds per command (default 3)")
    parser.add_argument("--store", help="keep the store at PATH and reuse it when it holds the session already")
    args = parser.parse_args(argv)
    info = harness.machine()
    harness.print_machine(info, args.repeat)
    folder = tempfile.mkdtemp(prefix="picture-")
    path = args.store or str(Path(folder) / "picture.db")
    try:
        size = held(path, args.events)
        if size is None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            print(f"session:  building {args.events:,} events: CompactionPolicy(every={args.every}, "
                  f"roll_up_every={args.roll_up_every}), maintain after every turn, SQLite at {path}", flush=True)
            started = time.perf_counter()
            counts = build(path, args.events, args.every, args.roll_up_every or None)
            size = counts["events"]
            print(f"session:  {size:,} events, {counts['nodes']:,} L1 nodes, {counts['digests']:,} digests, "
                  f"{counts['markers']:,} markers, {counts['refusals']:,} refusals; built in "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
        else:
            print(f"session:  reusing {size:,} events at {path}")
        page = str(Path(folder) / "picture.html")
        env = {**os.environ, "COLUMNS": str(COLUMNS)}
        out: dict[str, int] = {}

        def run(name: str, argv: list[str], written: str | None = None) -> None:
            got = subprocess.run(argv, capture_output=True, env=env, check=False)
            if got.returncode != 0:
                raise RuntimeError(f"{name} exited {got.returncode}: {got.stderr.decode(errors='replace')[-2000:]}")
            out[name] = Path(written).stat().st_size if written else len(got.stdout)

        store_args = ["-s", path, "--session", SESSION]
        methods: list[tuple[str, harness.Method]] = [
            ("show", lambda: run("show", command("show", *store_args))),
            ("show --no-verify", lambda: run("show --no-verify", command("show", "--no-verify", *store_args))),
            ("show --html", lambda: run("show --html", command("show", "--html", page, *store_args), page)),
            ("show --html --no-verify",
             lambda: run("show --html --no-verify", command("show", "--html", page, "--no-verify", *store_args), page)),
            ("verify", lambda: run("verify", command("verify", "-s", path))),
        ]
        got = harness.interleaved(methods, args.repeat)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    section = Section(f"compactstore show at {size:,} events (subprocess, interpreter start included)",
                      ("command", "output", "min", "median", "max"))
    for name, _ in methods:
        st = Stat.of(got[name])
        written = f"{out[name]:,} B" if name != "verify" else "-"
        section.rows.append((name, written, seconds(st.min), seconds(st.median), seconds(st.max)))
        section.data.append({"command": name, "output_bytes": out[name], **st.as_dict()})
    median = {name: Stat.of(got[name]).median for name, _ in methods}
    section.notes.append("show verifies the store first (compactstore verify, timed alone in the last row); "
                         "--no-verify draws without it")
    section.goals += [
        Goal("show (s)", median["show"], 2.0, higher_is_better=False),
        Goal("show --no-verify (s)", median["show --no-verify"], 2.0, higher_is_better=False),
        Goal("show output (KB)", out["show"] / 1000, 100, higher_is_better=False),
        Goal("show --html (s)", median["show --html"], 3.0, higher_is_better=False),
        Goal("show --html --no-verify (s)", median["show --html --no-verify"], 3.0, higher_is_better=False),
        Goal("show --html page (MB)", out["show --html"] / 1e6, 2.0, higher_is_better=False),
    ]
    section.print()
    result = harness.write_json("picture", info, [section], params=vars(args), events=size)
    print(f"\nwrote {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
