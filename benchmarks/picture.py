#!/usr/bin/env python3
"""The picture at scale: how long do ``compactstore show`` and ``show --html`` take, and how much do they write?

    python benchmarks/picture.py [--events 100000] [--every 100] [--roll-up-every 5] [--repeat 3] [--store PATH]
                                 [--verify]

One session of ``--events`` events is played through the public API with memory_loop.py's
agent turns (a user turn, a tool call and its result, every 7th failing, an assistant
turn; rejected proposals, re-bound non-regenerable snapshots, obligations fulfilled 30
turns later), ``Session.maintain(cs.CompactionPolicy(every, roll_up_every))`` after
every turn with memory_loop's bounded deterministic summarizer: many L1 nodes, a digest
that grows, and a marker after every compaction. ``--store PATH`` keeps the store there
and reuses it on the next run when it already holds the session at that size.

Then ``compactstore show --no-verify`` and ``show --html --no-verify`` are run as
subprocesses, interleaved, ``--repeat`` rounds after a warm-up, each timed whole
(interpreter start included) with its output measured: the bytes the terminal picture
prints (piped, ``COLUMNS=160``) and the bytes of the page. Beside them, in the same
rounds, a process that only opens the store and calls ``Session.context()``: the part
of the picture that is the resolver's. ``show`` and ``show --html`` as run by default
verify the whole store first: with ``--verify`` they are timed once each afterwards,
with ``compactstore verify`` alone beside them. Goals: ``show`` at most 2 s and 100 KB;
``show --html`` at most 3 s and 2 MB.

Building the session takes most of a run: pass ``--store`` to keep it for the next one.

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
#: A process that opens the store and resolves the context a resumed agent loads now, and nothing else.
CONTEXT = "import sys, compactstore as cs\nwith cs.open(sys.argv[1], create=False) as s: s.session(sys.argv[2]).context()"


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
    parser.add_argument("--verify", action="store_true",
                        help="also time show and show --html verifying the store first, and verify alone, once each")
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
        context = [sys.executable, "-c", CONTEXT, path, SESSION]
        methods: list[tuple[str, harness.Method]] = [
            ("show --no-verify", lambda: run("show --no-verify", command("show", "--no-verify", *store_args))),
            ("show --html --no-verify",
             lambda: run("show --html --no-verify", command("show", "--html", page, "--no-verify", *store_args), page)),
            ("Session.context() alone", lambda: run("Session.context() alone", context)),
        ]
        got = harness.interleaved(methods, args.repeat)
        if args.verify:
            once: list[tuple[str, harness.Method]] = [
                ("show", lambda: run("show", command("show", *store_args))),
                ("show --html", lambda: run("show --html", command("show", "--html", page, *store_args), page)),
                ("verify", lambda: run("verify", command("verify", "-s", path))),
            ]
            for name, method in once:
                started = time.perf_counter()
                method()
                got[name] = [time.perf_counter() - started]
            methods += once
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    section = Section(f"compactstore show at {size:,} events (subprocess, interpreter start included)",
                      ("command", "output", "rounds", "min", "median", "max"))
    for name, _ in methods:
        st = Stat.of(got[name])
        written = f"{out[name]:,} B" if name.startswith("show") else "-"
        section.rows.append((name, written, str(st.n), seconds(st.min), seconds(st.median), seconds(st.max)))
        section.data.append({"command": name, "output_bytes": out[name], **st.as_dict()})
    median = {name: Stat.of(got[name]).median for name, _ in methods}
    section.notes.append("show and show --html verify the whole store first (compactstore verify, timed alone with "
                         "--verify); --no-verify draws without it")
    section.notes.append(f"Session.context() alone (open, resolve, exit): {seconds(median['Session.context() alone'])} "
                         f"of show --no-verify's {seconds(median['show --no-verify'])}")
    for name, target in (("show", 2.0), ("show --html", 3.0)):
        for variant in (name, f"{name} --no-verify"):
            if variant in median:
                section.goals.append(Goal(f"{variant} (s)", median[variant], target, higher_is_better=False))
    section.goals += [
        Goal("show output (KB)", out["show --no-verify"] / 1000, 100, higher_is_better=False),
        Goal("show --html page (MB)", out["show --html --no-verify"] / 1e6, 2.0, higher_is_better=False),
    ]
    section.print()
    result = harness.write_json("picture", info, [section], params=vars(args), events=size)
    print(f"\nwrote {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
