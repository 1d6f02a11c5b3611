#!/usr/bin/env python3
"""Digest throughput: what the Merkle tree and the log cost over the plain references.

    python benchmarks/digest.py [--repeat N] [--verify-turns N]

Part 1, Merkle roots: over random leaves of 1 KiB and 16 KiB it times, interleaved in
one run,

* raw BLAKE3: ``blake3.blake3(buf).digest()`` over all leaves as one buffer, single
  threaded (no tree can hash its input faster than this);
* the plain RFC 9162 tree (``plain.plain_tree_root``): the tightest plain tree in Python
  over the same package, one call per leaf and per node, neighbours paired bottom-up.
  This is the reference the library's roots are held to (ratio >= 1.0);
* ``merkle.tree_root``, a ``merkle.Frontier`` fed one ``leaf_hash`` per leaf as a store
  appends, and ``merkle.span_root`` of ``[1, n - 1)`` (against the plain tree over the
  same entries);
* ``Session.span_root`` of ``[1, n - 1)`` served from a store's stored subtree roots
  (against the plain tree over the same stored bodies);
* a SHA-256 tree and raw SHA-256, for context.

Part 2, SQLite appends: ``Session.extend`` of 1,000 1 KiB turns per call (WAL,
``synchronous=NORMAL``, the default) against plain ``sqlite3`` ``executemany`` of the very
same rows, 1,000 per transaction, into the same table; and ``Session.append`` one event per
call with ``durable=True`` (``synchronous=FULL``) against plain single-row commits at
``synchronous=FULL``.

Part 3, verify: ``Store.verify()`` of a store pinned to one CPU (so checking in this
process alone) against the same on every CPU (one worker process per CPU), and raw BLAKE3
over (a 16 MB sample of) the stored bodies, with CPU time / wall time, and the peak RSS of a
fresh process verifying the store. The store has ``verify.PARALLEL_FROM`` turns by default,
the smallest that verify spreads over worker processes: below it the two runs are the same
code. ``--verify-turns 700000`` makes a store of over 1 GB on disk (the scale goal: verify in
under 200 MB).

Each row is the min / median / max of several interleaved rounds; throughput and ratios
come from medians of the same run. Writes benchmarks/results/digest.json.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Goal, Method, Section, Stat, interleaved, rate, ratio, seconds  # noqa: E402
from plain import CLOCK_START, PlainSQLite, plain_tree_root, turns  # noqa: E402

import blake3  # noqa: E402

import compactstore as cs  # noqa: E402
from compactstore import merkle  # noqa: E402
from compactstore.verify import PARALLEL_FROM  # noqa: E402

# (label, leaf size in bytes, number of leaves)
WORKLOADS = [("1 KiB leaves", 1024, 4096), ("16 KiB leaves", 16 * 1024, 512)]
SEED = 20240601


def frontier_root(leaves: list[bytes]) -> bytes:
    """Append every leaf to a fresh Frontier, as a store would, and return its root."""
    f = merkle.Frontier()
    leaf_hash, append = merkle.leaf_hash, f.append
    for leaf in leaves:
        append(leaf_hash(leaf))
    return f.root()


def _store_session(tmp: str, leaf_size: int, count: int) -> tuple[cs.Store, cs.Session, list[bytes]]:
    """Return a store holding ``count`` turns of about ``leaf_size`` bytes, and their bodies."""
    store = cs.open(os.path.join(tmp, f"span-{leaf_size}.db"), clock=cs.events.tick_clock(CLOCK_START, 1))
    s = store.session("span")
    rng = random.Random(SEED)
    events = [cs.Turn("user", rng.randbytes(leaf_size // 2).hex()) for _ in range(count)]
    for i in range(0, count, 512):
        s.extend(events[i : i + 512])
    bodies = [r.body for r in s.scan()]
    return store, s, bodies


def _cpu_timed(fn: Callable[[], object]) -> Callable[[], float]:
    """Return ``fn`` timing itself in CPU seconds of this process (the harness takes the float)."""
    def timed() -> float:
        t0 = time.process_time()
        fn()
        return time.process_time() - t0
    return timed


def merkle_rows(repeat: int = 7) -> Section:
    """Time the Merkle roots against the plain tree and raw hashing, interleaved.

    Each root takes milliseconds, so this part runs three times ``repeat`` rounds, and
    times CPU seconds of this process, not wall time: every method is single-threaded,
    and on a shared machine wall time also counts the time slices other processes take,
    which at a few milliseconds per call swamps the differences measured.
    """
    section = Section(
        "Merkle roots vs the plain RFC 9162 tree and raw hashing",
        ("workload", "method", "MB", "min", "median", "max", "MB/s", "vs raw BLAKE3", "vs plain tree"),
    )
    rng = random.Random(SEED)
    tmp = tempfile.mkdtemp(prefix="cs-bench-digest-")
    try:
        for label, leaf_size, count in WORKLOADS:
            leaves = [rng.randbytes(leaf_size) for _ in range(count)]
            buf = b"".join(leaves)
            inner = leaves[1 : count - 1]
            store, session, bodies = _store_session(tmp, leaf_size, count)
            stored_inner = bodies[1 : count - 1]
            # Every method must give the right answer before its speed means anything.
            assert frontier_root(leaves) == merkle.tree_root(leaves) == plain_tree_root(leaves)
            assert merkle.span_root(leaves, 0, count) == plain_tree_root(leaves)
            assert session.span_root(0, count) == plain_tree_root(bodies) == session.head().root
            # (method, bytes hashed, reference name, fn)
            methods: list[tuple[str, int, str | None, Callable[[], object]]] = [
                ("raw BLAKE3, one buffer", len(buf), None, lambda: blake3.blake3(buf).digest()),
                ("plain RFC 9162 tree (reference)", len(buf), None, lambda: plain_tree_root(leaves)),
                ("merkle.tree_root", len(buf), "plain RFC 9162 tree (reference)", lambda: merkle.tree_root(leaves)),
                ("Frontier append loop", len(buf), "plain RFC 9162 tree (reference)", lambda: frontier_root(leaves)),
                ("plain tree of [1, n-1)", sum(map(len, inner)), None, lambda: plain_tree_root(inner)),
                ("merkle.span_root [1, n-1)", sum(map(len, inner)), "plain tree of [1, n-1)",
                 lambda: merkle.span_root(leaves, 1, count - 1)),
                ("plain tree of stored bodies [1, n-1)", sum(map(len, stored_inner)), None,
                 lambda: plain_tree_root(stored_inner)),
                ("Session.span_root [1, n-1), from the store", sum(map(len, stored_inner)),
                 "plain tree of stored bodies [1, n-1)", lambda: session.span_root(1, count - 1)),
                ("merkle.tree_root, SHA-256", len(buf), None, lambda: merkle.tree_root(leaves, "sha256")),
                ("raw SHA-256, one buffer", len(buf), None, lambda: hashlib.sha256(buf).digest()),
            ]
            got = interleaved([(name, _cpu_timed(fn)) for name, _, _, fn in methods], 3 * repeat)
            med = {name: Stat.of(got[name]).median for name, *_ in methods}
            raw_rate = len(buf) / med["raw BLAKE3, one buffer"]
            workload = f"{count} x {label}"
            for name, n, ref, _ in methods:
                st = Stat.of(got[name])
                mbps = n / st.median
                vs_plain = med[ref] / st.median if ref else None
                section.rows.append((
                    workload, name, f"{n / 1e6:.2f}", seconds(st.min), seconds(st.median), seconds(st.max),
                    rate(mbps / 1e6), ratio(mbps / raw_rate), ratio(vs_plain) if vs_plain else "",
                ))
                section.data.append({"workload": workload, "leaf_bytes": leaf_size, "leaves": count, "method": name,
                                     "bytes": n, **st.as_dict(), "mb_per_s": mbps / 1e6,
                                     "vs_raw_blake3": mbps / raw_rate, "reference": ref, "vs_reference": vs_plain})
                if name in ("merkle.tree_root", "merkle.span_root [1, n-1)") and vs_plain:
                    section.goals.append(Goal(f"{name} / plain tree, {label}", vs_plain, 1.0))
            store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    section.notes.append("times are CPU seconds of the benchmark process (every method is single-threaded); "
                         "vs raw BLAKE3: throughput over the same bytes; vs plain tree: median of the reference "
                         "named in the row above it over the same entries / median of the row")
    return section


def append_rows(repeat: int = 7, batch: int = 1000, singles: int = 100) -> Section:
    """Time compactstore appends against plain sqlite3 inserts of the same rows, interleaved."""
    section = Section(
        "SQLite appends vs plain sqlite3 inserting the same rows",
        ("mode", "method", "rows/round", "min", "median", "max", "rows/s", "vs plain"),
    )
    tmp = tempfile.mkdtemp(prefix="cs-bench-append-")
    try:
        work = turns(batch)
        normal = cs.open(os.path.join(tmp, "cs-normal.db"), clock=cs.events.tick_clock(CLOCK_START, 1))
        durable = cs.open(os.path.join(tmp, "cs-full.db"), clock=cs.events.tick_clock(CLOCK_START, 1), durable=True)
        pn = PlainSQLite(os.path.join(tmp, "plain-normal.db"), "NORMAL")
        pf = PlainSQLite(os.path.join(tmp, "plain-full.db"), "FULL")
        sn, sf = normal.session("bench"), durable.session("bench")
        # Same bytes on both sides: the first batch of each must store identical rows.
        first = sn.extend(work)
        rows = pn.rows_for(work)
        pn.insert(rows)
        assert [r.body for r in first] == [r[6] for r in rows], "plain rows differ from the stored ones"
        ones = work[:singles]

        def plain_batch() -> float:
            batches = [pn.rows_for(work) for _ in range(3)]
            t0 = time.perf_counter()
            for rows in batches:
                pn.insert(rows)
            return time.perf_counter() - t0

        def cs_batch() -> None:
            for _ in range(3):
                sn.extend(work)

        def plain_singles() -> float:
            rows = pf.rows_for(ones)
            t0 = time.perf_counter()
            for row in rows:
                pf.insert((row,))
            return time.perf_counter() - t0

        def cs_singles() -> None:
            for e in ones:
                sf.append(e)

        modes = [
            ("batched, 1,000 per transaction, synchronous=NORMAL", 3 * batch, [
                ("plain sqlite3 executemany", plain_batch),
                ("compactstore Session.extend", cs_batch),
            ]),
            ("one per transaction, synchronous=FULL (durable=True)", singles, [
                ("plain sqlite3 single-row commit", plain_singles),
                ("compactstore Session.append", cs_singles),
            ]),
        ]
        harness.versus_reference(section, modes, repeat, {mode for mode, _, _ in modes})
        for closable in (normal, durable, pn, pf):
            closable.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    section.notes.append("rows are 1 KiB turns (1,024 random bytes, base64), about 1.4 KB stored; the plain side "
                         "inserts the same bytes, leaves included, into the same STRICT table and indexes")
    return section


# Its own peak from /proc/self/status where there is one: on Linux, ru_maxrss of a fresh
# process starts at its parent's resident size when it forked (kept across exec), so it
# would count this benchmark's memory. Its worker processes fork from it: their ru_maxrss
# is theirs.
_RSS_CHILD = """
import resource, sys
import compactstore as cs

def own_peak():
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

with cs.open(sys.argv[1]) as store:
    before = own_peak()
    report = store.verify()
assert report.ok, report.problems[:3]
print(before, max(own_peak(), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))
"""


def _cpu_seconds() -> float:
    """Return the CPU seconds of this process and of its finished children (verify's workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _own_cpu_seconds() -> float:
    """Return the CPU seconds of this process alone (with workers: what does not run in parallel)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime

#: Bytes of bodies hashed by the raw BLAKE3 reference (a sample: the store may not fit in memory).
RAW_SAMPLE = 16_000_000


def verify_rows(repeat: int = 7, count: int = PARALLEL_FROM) -> Section:
    """Time Store.verify() on one CPU and on every CPU against raw BLAKE3 over the stored bodies."""
    section = Section(
        "Store.verify(): one CPU vs every CPU, against raw BLAKE3 over the bodies",
        ("store", "method", "min", "median", "max", "MB/s", "CPU/wall", "vs raw BLAKE3", "vs one CPU"),
    )
    tmp = tempfile.mkdtemp(prefix="cs-bench-verify-")
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        path = os.path.join(tmp, "verify.db")
        store = cs.open(path, clock=cs.events.tick_clock(CLOCK_START, 1))
        s = store.session("verify")
        work = turns(1000)
        while s.size < count:
            s.extend(work[: min(1000, count - s.size)])
        total = 0
        sample: list[bytes] = []
        for r in s.scan():
            if total < RAW_SAMPLE:
                sample.append(r.body)
            total += len(r.body)
        buf = b"".join(sample)
        cpu: dict[str, list[float]] = {"one CPU": [], "every CPU": []}
        caller: list[float] = []  # with workers: CPU seconds of the calling process per second of wall time

        def run(pinned: bool) -> Callable[[], float]:
            def fn() -> float:
                if allowed and pinned:
                    os.sched_setaffinity(0, {min(allowed)})
                c0, o0, t0 = _cpu_seconds(), _own_cpu_seconds(), time.perf_counter()
                try:
                    report = store.verify()
                finally:
                    wall = time.perf_counter() - t0
                    if allowed:
                        os.sched_setaffinity(0, allowed)
                assert report.ok, report.problems[:3]
                cpu["one CPU" if pinned else "every CPU"].append((_cpu_seconds() - c0) / wall)
                if not pinned:
                    caller.append((_own_cpu_seconds() - o0) / wall)
                return wall
            return fn

        def raw_blake3() -> None:
            blake3.blake3(buf).digest()

        methods: list[tuple[str, Method]] = [
            (f"raw BLAKE3 over {len(buf) / 1e6:.0f} MB of the bodies", raw_blake3),
            ("one CPU", run(True)),
            ("every CPU", run(False)),
        ]
        load_before = os.getloadavg()
        got = interleaved(methods, repeat)
        load_after = os.getloadavg()
        raw_rate = len(buf) / Stat.of(got[methods[0][0]]).median
        one = Stat.of(got["one CPU"]).median
        label = f"{count:,} turns, {total / 1e6:,.0f} MB of bodies"
        for i, (name, _) in enumerate(methods):
            st = Stat.of(got[name])
            n = len(buf) if i == 0 else total
            name_shown = name if i == 0 else f"Store.verify(), {name}"
            cw = sorted(cpu[name])[len(cpu[name]) // 2] if name in cpu and cpu[name] else None
            section.rows.append((label, name_shown, seconds(st.min), seconds(st.median), seconds(st.max),
                                 rate(n / st.median / 1e6), f"{cw:.2f}" if cw is not None else "",
                                 ratio(n / st.median / raw_rate), ratio(one / st.median) if name in cpu else ""))
            section.data.append({"method": name_shown, "turns": count, "bytes": n, **st.as_dict(),
                                 "mb_per_s": n / st.median / 1e6, "cpu_per_wall": cw})
        every = Stat.of(got["every CPU"]).median
        cpus = len(allowed) if allowed else os.cpu_count()
        section.goals.append(Goal("Store.verify() every CPU / one CPU", one / every, 1.6,
                                  note=f"{cpus} CPUs, load average {load_before[0]:.1f} before, "
                                       f"{load_after[0]:.1f} after"))
        section.notes.append(f"one CPU: verify checks every chunk in its own process; every CPU: {cpus} worker "
                             f"processes check chunks, the calling one folds them in order and derives the "
                             f"structural index from the events they hand over (from {PARALLEL_FROM:,} events on); "
                             f"1-minute load average {load_before[0]:.1f} before the timed rounds, "
                             f"{load_after[0]:.1f} after, on {os.cpu_count()} logical CPUs")
        if caller:
            own = sorted(caller)[len(caller) // 2]
            section.notes.append(f"every CPU: the calling process's own CPU seconds per second of wall time, median "
                                 f"{own:.2f}: the work not spread over the workers")
            section.data.append({"method": "Store.verify(), every CPU: calling process CPU/wall", "cpu_per_wall": own})
        store.close()
        child = subprocess.run([sys.executable, "-c", _RSS_CHILD, path], capture_output=True, text=True, check=True,
                               env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
        opened, rss = (int(x) / 1e6 for x in child.stdout.split()[-2:])
        size = harness.disk_bytes(path) / 1e6
        section.notes.append(f"a fresh process that opens this {size:,.0f} MB store peaks at {opened:,.0f} MB "
                             f"resident before verify() and at {rss:,.0f} MB after it (its largest worker "
                             "process counted too); CPU/wall counts verify's worker processes")
        section.data.append({"method": "peak RSS of a verifying process", "store_mb": size, "peak_rss_mb": rss,
                             "peak_rss_before_verify_mb": opened})
        if size >= 1000:
            section.goals.append(Goal(f"peak RSS verifying a {size / 1000:.1f} GB store (MB)", rss, 200,
                                      higher_is_better=False))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return section


SECTIONS: list[tuple[str, Callable[[argparse.Namespace], Section]]] = [
    ("merkle", lambda a: merkle_rows(a.repeat)),
    ("append", lambda a: append_rows(a.repeat)),
    ("verify", lambda a: verify_rows(a.repeat, a.verify_turns)),
]


def main(argv: list[str] | None = None) -> int:
    """Run every section, print its table and write benchmarks/results/digest.json."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed rounds per row (default 7, at least 5)")
    parser.add_argument("--verify-turns", type=int, default=PARALLEL_FROM,
                        help=f"turns in the verified store (default {PARALLEL_FROM:,}, where verify goes parallel)")
    parser.add_argument("--only", nargs="*", choices=[n for n, _ in SECTIONS], help="run only these parts")
    args = parser.parse_args(argv)
    info = harness.machine()
    harness.print_machine(info, args.repeat)
    print(f"blake3:   {blake3.__version__}, single-threaded calls")
    done = []
    for name, section in SECTIONS:
        if args.only and name not in args.only:
            continue
        result = section(args)
        result.print()
        done.append(result)
    path = harness.write_json("digest", info, done, repeat=args.repeat)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
