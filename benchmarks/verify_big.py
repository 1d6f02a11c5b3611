#!/usr/bin/env python3
"""Verifying a large store, and restoring a span, against raw BLAKE3 over the same bodies.

    python benchmarks/verify_big.py [--size BYTES] [--quick] [--body BYTES] [--repeat N] [--before PATH]

It builds a SQLite store of about ``--size`` bytes of bodies (default 1 GB; ``--quick``:
100 MB) once, in a temporary directory, through the public API: one session of turns
whose text is ``--body`` characters (default 32 KiB), appended 64 per ``extend``, in a
child process so this one stays small. Then it times, interleaved in one run:

* ``Store.verify()`` in this process, workers as verify chooses them;
* raw single-threaded BLAKE3 over the same bodies read from the database: plain
  ``sqlite3`` reading ``body`` in ``seq`` order, 256 rows per fetch, each fed to one
  ``blake3.blake3()`` hasher (``max_threads=1``); the reference of the goal;
* for context, the plain read alone (the same query, no hashing);
* with ``--before PATH``, ``Store.verify()`` again with compactstore's native calls routed
  through another build of the extension (see ``native.py``), its workers too.

The peak RSS of a verify run is measured in a subprocess: a small process starts a fresh
``python`` that opens the store and calls ``verify()``, and prints its
``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` (Linux counts in a child the resident
size of its parent when it started: the small process's, a few MB).

Restoring: ``Session.restore_span`` of a 1,000-turn span, against raw BLAKE3 over the
span's bodies in memory: resume.py's 1 KiB-turn session of 10,000 events, and a session
of 1,000 turns of ``--body`` characters compacted in one node; for context, the plain
``sqlite3`` read of the same span's bodies (by session and position, no hashing).

Goals: ``verify`` / raw BLAKE3 >= 0.8 (ratio of the raw reference's median time to
verify's) with a peak RSS under 200 MB; ``restore_span`` / raw BLAKE3 >= 0.5. Writes
benchmarks/results/verify_big.json.
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Goal, Method, Section, Stat, interleaved, rate, ratio, seconds  # noqa: E402
from plain import CLOCK_START, turns  # noqa: E402

import blake3  # noqa: E402

import compactstore as cs  # noqa: E402
from native import other_build, via  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BATCH = 64
SEED = 20240601
SPAN = 1000

# Builds the verified store: run as a child so the benchmark's own resident size stays small.
_BUILD = """
import base64, random, sys
import compactstore as cs
path, total, body = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(int(sys.argv[4]))
raw = body * 3 // 4
with cs.open(path, clock=cs.events.tick_clock(int(sys.argv[5]), 1)) as store:
    s = store.session("big")
    done = 0
    while done < total:
        batch = [cs.Turn("assistant" if i % 2 else "user", base64.b64encode(rng.randbytes(raw)).decode())
                 for i in range(64)]
        s.extend(batch)
        done += 64 * body
"""

# Spawns the verifying process from a small one, so ru_maxrss starts from a few MB; prints
# that, then what the verifying process printed.
_RSS = """
import resource, subprocess, sys
got = subprocess.run([sys.executable, "-c", sys.argv[1], sys.argv[2]], check=True, capture_output=True, text=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, got.stdout.strip())
"""

# Prints its own peak from /proc/self/status too: Linux may fold memory freed before exit
# into ru_maxrss late or not at all (VmHWM takes the current size into account).
_VERIFY = """
import sys
import compactstore as cs
with cs.open(sys.argv[1]) as store:
    report = store.verify()
assert report.ok, report.problems[:3]
try:
    with open("/proc/self/status") as status:
        print(next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:")))
except (OSError, StopIteration):
    print(0)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def build(path: str, size: int, body: int) -> float:
    """Build the store of about ``size`` bytes of bodies in a child process; return seconds."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", _BUILD, path, str(size), str(body), str(SEED), str(CLOCK_START)],
                   check=True, env=_env())
    return time.perf_counter() - t0


def read_bodies(path: str, hashing: bool) -> int:
    """Read every body in seq order with plain sqlite3, hashing each if ``hashing``; return bytes read."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        cur = con.execute("SELECT body FROM events ORDER BY seq")
        h = blake3.blake3(max_threads=1)
        total = 0
        while rows := cur.fetchmany(256):
            for (b,) in rows:
                total += len(b)
                if hashing:
                    h.update(b)
        h.digest()
        return total
    finally:
        con.close()


def _cpu() -> float:
    """Return the CPU seconds of this process, its threads and its finished children (verify's workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _with_cpu(fn: Callable[[], object], cpu: list[float]) -> Callable[[], float]:
    """Return ``fn`` timing itself: wall seconds for the harness, CPU seconds appended to ``cpu``."""

    def timed() -> float:
        c0, t0 = _cpu(), time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
        cpu.append(_cpu() - c0)
        return wall

    return timed


def void(_: object) -> None:
    """Drop a result: the harness takes a method's returned number as its own timing."""


def verify_rows(tmp: str, size: int, body: int, repeat: int, before: ModuleType | None = None) -> Section:
    """Time Store.verify() of a store of ``size`` bytes of bodies against raw BLAKE3 over them (and another build's)."""
    section = Section(
        "Store.verify() of a large store against raw single-threaded BLAKE3 over its bodies read from SQLite",
        ("store", "method", "min", "median", "max", "MB/s", "raw / this", "CPU s", "raw / this, CPU"),
    )
    path = os.path.join(tmp, "big.db")
    built = build(path, size, body)
    disk = harness.disk_bytes(path) / 1e6
    print(f"  built {disk:,.0f} MB on disk in {built:.1f} s", flush=True)
    # Peak RSS first, in a fresh process tree, before this process has read anything.
    got = subprocess.run([sys.executable, "-c", _RSS, _VERIFY, path], capture_output=True, text=True, check=True,
                         env=_env())
    maxrss, hwm = (int(x) / 1e6 for x in got.stdout.split()[-2:])
    rss = max(maxrss, hwm)
    total = read_bodies(path, hashing=False)
    store = cs.open(path)
    try:
        events = store.session("big").size

        def verify() -> None:
            report = store.verify()
            assert report.ok, report.problems[:3]

        names = ["raw BLAKE3, one thread, bodies read by plain sqlite3 (reference)", "Store.verify()",
                 "plain sqlite3 read alone (context)"]
        fns: list[Callable[[], object]] = [lambda: read_bodies(path, True), verify, lambda: read_bodies(path, False)]
        if before is not None:
            names.append("Store.verify() (before)")
            fns.append(via(before, verify))
        cpu: dict[str, list[float]] = {name: [] for name in names}
        methods = [(name, _with_cpu(fn, cpu[name])) for name, fn in zip(names, fns)]
        load = os.getloadavg()[0]
        timed = interleaved(methods, repeat)
    finally:
        store.close()
    raw = Stat.of(timed[names[0]]).median
    # The warm-up round's CPU seconds are dropped, as the harness drops its wall time.
    work = {name: Stat.of(c[1:]).median for name, c in cpu.items()}
    label = f"{events:,} turns of {body:,} chars, {total / 1e6:,.0f} MB of bodies"
    for name in names:
        st = Stat.of(timed[name])
        section.rows.append((label, name, seconds(st.min), seconds(st.median), seconds(st.max),
                             rate(total / st.median / 1e6), ratio(raw / st.median), f"{work[name]:.2f}",
                             ratio(work[names[0]] / work[name])))
        section.data.append({"method": name, "events": events, "bytes": total, **st.as_dict(),
                             "mb_per_s": total / st.median / 1e6, "cpu_s": work[name]})
    ours = Stat.of(timed["Store.verify()"]).median
    section.goals.append(Goal("Store.verify() / raw BLAKE3 over its bodies (raw time / verify time)", raw / ours, 0.8,
                              note=f"{total / 1e9:.2f} GB of bodies, load average {load:.1f}"))
    section.goals.append(Goal(f"peak RSS verifying a {disk / 1e3:.2f} GB store (MB)", rss, 200,
                              higher_is_better=False))
    section.data.append({"method": "peak RSS of a verifying process", "store_mb": disk, "peak_rss_mb": rss,
                         "ru_maxrss_children_mb": maxrss, "vmhwm_mb": hwm})
    section.notes.append("CPU s: seconds of CPU of this process and its worker processes (median), the work "
                         "whatever the machine's load; the wall-time ratio is the goal")
    section.notes.append(f"store: {disk:,.0f} MB on disk; peak RSS of a fresh process opening it and running "
                         f"verify(): {maxrss:,.0f} MB by ru_maxrss of RUSAGE_CHILDREN (its workers counted), "
                         f"{hwm:,.0f} MB by its own VmHWM; the goal takes the larger")
    return section


def _raw(buf: bytes) -> Method:
    """Return raw single-threaded BLAKE3 over ``buf``, as a method to time."""
    return lambda: void(blake3.blake3(buf, max_threads=1).digest())


def _plain_read(path: str, sid: int, start: int, stop: int) -> tuple[Method, Callable[[], None]]:
    """Return the plain ``sqlite3`` read of the bodies of ``[start, stop)`` (no hashing), and its closer."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
    sql = "SELECT body FROM events WHERE session_id = ? AND pos >= ? AND pos < ? ORDER BY pos"

    def read() -> None:
        got = con.execute(sql, (sid, start, stop)).fetchall()
        assert len(got) == stop - start

    return read, con.close


def restore_rows(tmp: str, body: int, repeat: int) -> Section:
    """Time Session.restore_span of 1,000 turns against raw BLAKE3 over the span's bodies in memory."""
    import resume  # the 1 KiB-turn session of resume.py, reused as it is

    section = Section(
        "Session.restore_span of a 1,000-turn span against raw BLAKE3 over its bodies in memory",
        ("span", "method", "min", "median", "max", "MB/s", "raw / this"),
    )
    small = resume.Log(tmp, 10_000, turns(resume.BLOCK))
    closers: list[Callable[[], None]] = []
    rng = random.Random(SEED)
    store = cs.open(os.path.join(tmp, "restore.db"), clock=cs.events.tick_clock(CLOCK_START, 1))
    try:
        s = store.session("restore")
        for _ in range(SPAN // 100):
            s.extend([cs.Turn("user", base64.b64encode(rng.randbytes(body * 3 // 4)).decode()) for _ in range(100)])
        node = s.compact(0, SPAN, summary="a thousand long turns")
        big = b"".join(r.body for r in s.scan(0, SPAN))

        def restore_big() -> None:
            got = s.restore_span(node)
            assert got.certified_by == "content_digest" and len(got.bodies) == SPAN

        # The same span's bodies read by plain sqlite3 (by session and position, no hashing):
        # what the read alone costs, as context for the ratio.
        small_sid, big_sid = small.store.backend.session_id("run"), store.backend.session_id("restore")
        assert small_sid is not None and big_sid is not None
        plain_small, close_small = _plain_read(small.path, small_sid, small.start, small.stop)
        plain_big, close_big = _plain_read(os.path.join(tmp, "restore.db"), big_sid, 0, SPAN)
        closers.extend([close_small, close_big])
        cases = [
            ("resume.py's 1,000-event span at 10,000 events (mostly 1 KiB turns)", small.restore, small.span_buf,
             plain_small),
            (f"1,000 turns of {body:,} chars", restore_big, big, plain_big),
        ]
        methods: list[tuple[str, Method]] = []
        for label, fn, buf, plain in cases:
            methods.append((f"{label}|raw", _raw(buf)))
            methods.append((f"{label}|ours", fn))
            methods.append((f"{label}|plain", plain))
        timed = interleaved(methods, repeat)
        for label, _, buf, _ in cases:
            raw = Stat.of(timed[f"{label}|raw"]).median
            for key, name in (("raw", "raw BLAKE3, one thread (reference)"), ("ours", "Session.restore_span(node)"),
                              ("plain", "plain sqlite3 read of its bodies alone (context)")):
                st = Stat.of(timed[f"{label}|{key}"])
                section.rows.append((label, name, seconds(st.min), seconds(st.median), seconds(st.max),
                                     rate(len(buf) / st.median / 1e6), ratio(raw / st.median)))
                section.data.append({"span": label, "method": name, "bytes": len(buf), **st.as_dict()})
            ours = Stat.of(timed[f"{label}|ours"]).median
            section.goals.append(Goal(f"restore_span / raw BLAKE3, {label}", raw / ours, 0.5,
                                      note=f"{len(buf) / 1e6:.2f} MB"))
    finally:
        for close in closers:
            close()
        store.close()
        small.store.close()
    return section


def main(argv: list[str] | None = None) -> int:
    """Run both parts, print their tables and write benchmarks/results/verify_big.json."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000_000, help="bytes of bodies in the store (default 1 GB)")
    parser.add_argument("--quick", action="store_true", help="100 MB of bodies")
    parser.add_argument("--body", type=int, default=32 * 1024, help="characters of each turn's text (default 32 KiB)")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds per row (default 5)")
    parser.add_argument("--only", nargs="*", choices=["verify", "restore"], help="run only these parts")
    parser.add_argument("--before", metavar="PATH",
                        help="another build of compactstore.native: verify() is also timed through it (see native.py)")
    args = parser.parse_args(argv)
    before = other_build(args.before) if args.before else None
    size = 100_000_000 if args.quick else args.size
    info = harness.machine()
    harness.print_machine(info, args.repeat)
    print(f"blake3:   {blake3.__version__}; compactstore.merkle: {cs.merkle.IMPLEMENTATION}")
    tmp = tempfile.mkdtemp(prefix="cs-bench-verify-big-")
    done = []
    try:
        if not args.only or "verify" in args.only:
            done.append(verify_rows(tmp, size, args.body, args.repeat, before))
            done[-1].print()
        if not args.only or "restore" in args.only:
            done.append(restore_rows(tmp, args.body, args.repeat))
            done[-1].print()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    path = harness.write_json("verify_big", info, done, repeat=args.repeat, size=size, body=args.body,
                              before=args.before)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
