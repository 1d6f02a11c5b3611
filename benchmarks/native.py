#!/usr/bin/env python3
"""Native hashing: the Merkle tree through compactstore.native against raw BLAKE3 and the pure reference.

    python benchmarks/native.py [--repeat N] [--before PATH]

Over random leaves of 1 KiB and 16 KiB it times, interleaved in one run (wall time, since
the native tree may use every core):

* raw BLAKE3 over all leaves as one buffer, single-threaded (``blake3(buf, max_threads=1)``):
  the reference of the goals; and the same on every core, for context;
* ``merkle.tree_root`` (native) and ``merkle_pure.tree_root`` (the pure reference);
* ``merkle.leaf_hashes`` native and pure: a store's batch of leaves in one call.

Then ``Frontier.extend`` throughput: a fresh frontier fed leaf hashes 1,000 per call with
``every=TILE_HEIGHT``, as ``Session.extend`` feeds it, native against pure.

Last, the canonical encoding of a batch: ``events.encode_plain`` over 1,000 turns of 1 KiB
(stamped by a tick clock, as ``Session.extend`` stamps them), through the native encoder
against the reference (the plain checks and msgspec), which must give the same bytes.

``--before PATH`` measures another build of the extension beside this one, in the same
rounds: every native row above is timed again with compactstore's native calls (merkle's
and the encoder's) routed through it. PATH is the built module, e.g. main's:

    mkdir /tmp/main && git archive main native | tar -x -C /tmp/main && (cd /tmp/main/native && cargo build --release)
    python benchmarks/native.py --before /tmp/main/native/target/release/libnative.so

Goal, in wall time: ``merkle.tree_root`` over 16 KiB leaves at least 1.5 times as fast as
raw single-threaded BLAKE3 over the same bytes (both cores may be used). Over 1 KiB leaves
it is measured against its bound: each leaf is a message of its own, which BLAKE3 hashes
block after block on one SIMD lane, where one long buffer fills sixteen lanes. Beside wall
time, CPU time: the work a method does (summed over its threads), which bounds its wall
time on idle cores. Writes benchmarks/results/native.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import SHORT_ROUNDS, Goal, Section, Stat, interleaved, rate, ratio, seconds  # noqa: E402

import blake3  # noqa: E402

from compactstore import events as ev  # noqa: E402
from compactstore import merkle_pure as pure  # noqa: E402
from compactstore import merkle  # noqa: E402
from plain import turns  # noqa: E402

# (label, leaf size in bytes, number of leaves, goal: tree_root / raw single-threaded BLAKE3, or None)
WORKLOADS: list[tuple[str, int, int, float | None]] = [("1 KiB leaves", 1024, 4096, None),
                                                       ("16 KiB leaves", 16 * 1024, 512, 1.5)]
FRONTIER_LEAVES, FRONTIER_BATCH = 100_000, 1000
ENCODE_TURNS = 1000
SEED = 20240601
CORES = os.cpu_count() or 1


def other_build(path: str) -> ModuleType:
    """Return another build of ``compactstore.native`` (say, main's), loaded from ``path`` beside this one."""
    # The module's init function is named for its last component: ``native``.
    spec = importlib.util.spec_from_file_location("before.native", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--before {path}: not an extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def routed(module: ModuleType | None) -> Iterator[None]:
    """Route compactstore's native calls (merkle's, and the canonical encoder's) through ``module`` while inside.

    None leaves them as they are. The encoder is built once per module from the plans
    ``compactstore.events`` builds its own from.
    """
    if module is None:
        yield
        return
    encoder = _ENCODERS.get(module.__name__)
    if encoder is None:
        plans = [(t, parts) for t, plan in ev._PLANS.items() if (parts := ev._native_plan(t, plan)) is not None]
        encoder = _ENCODERS[module.__name__] = module.Encoder(plans, ev.MAX_EVENT_BYTES, ev.MAX_DEPTH)
    saved = merkle.native, ev._NATIVE
    merkle.native, ev._NATIVE = module, encoder  # type: ignore[assignment]
    try:
        yield
    finally:
        merkle.native, ev._NATIVE = saved


_ENCODERS: dict[str, object] = {}


def via(module: ModuleType | None, fn: Callable[[], object]) -> Callable[[], object]:
    """Return ``fn`` run with compactstore's native calls routed through ``module`` (see :func:`routed`)."""

    def run() -> object:
        with routed(module):
            return fn()

    return run


def _timed(fn: Callable[[], object], cpu: list[float]) -> Callable[[], float]:
    """Return ``fn`` timing itself: wall seconds for the harness, CPU seconds appended to ``cpu``."""

    def timed() -> float:
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
        cpu.append(time.process_time() - c0)
        return wall

    return timed


def root_rows(repeat: int, before: ModuleType | None = None) -> Section:
    """Time tree roots and leaf batches against raw BLAKE3 (and another build's, when given), interleaved."""
    section = Section(
        "Merkle roots, native and pure, vs raw BLAKE3 over the same bytes",
        ("workload", "method", "MB", "min", "median", "max", "MB/s", "vs raw, wall", "CPU median", "vs raw, CPU",
         "CPU / wall"),
    )
    rng = random.Random(SEED)
    for label, leaf_size, count, goal in WORKLOADS:
        leaves = [rng.randbytes(leaf_size) for _ in range(count)]
        buf = b"".join(leaves)
        # Every method must give the right answer before its speed means anything.
        assert merkle.tree_root(leaves) == pure.tree_root(leaves)
        assert merkle.leaf_hashes(leaves) == pure.leaf_hashes(leaves)
        methods: list[tuple[str, Callable[[], object]]] = [
            ("raw BLAKE3, one buffer, 1 thread (reference)", lambda: blake3.blake3(buf, max_threads=1).digest()),
            ("raw BLAKE3, one buffer, every core", lambda: blake3.blake3(buf, max_threads=blake3.blake3.AUTO).digest()),
            (f"merkle.tree_root ({merkle.IMPLEMENTATION})", lambda: merkle.tree_root(leaves)),
            ("merkle_pure.tree_root", lambda: pure.tree_root(leaves)),
            (f"merkle.leaf_hashes ({merkle.IMPLEMENTATION})", lambda: merkle.leaf_hashes(leaves)),
            ("merkle_pure.leaf_hashes", lambda: pure.leaf_hashes(leaves)),
        ]
        if before is not None:
            with routed(before):
                assert merkle.tree_root(leaves) == methods[3][1]()
            methods += [("merkle.tree_root (before)", via(before, lambda: merkle.tree_root(leaves))),
                        ("merkle.leaf_hashes (before)", via(before, lambda: merkle.leaf_hashes(leaves)))]
        cpu: dict[str, list[float]] = {name: [] for name, _ in methods}
        got = interleaved([(name, _timed(fn, cpu[name])) for name, fn in methods], SHORT_ROUNDS * repeat)
        raw = Stat.of(got[methods[0][0]]).median
        raw_cpu = Stat.of(cpu[methods[0][0]]).median
        workload = f"{count} x {label}"
        for name, _ in methods:
            st, ct = Stat.of(got[name]), Stat.of(cpu[name])
            used = sum(cpu[name]) / sum(got[name])
            section.rows.append((workload, name, f"{len(buf) / 1e6:.2f}", seconds(st.min), seconds(st.median),
                                 seconds(st.max), rate(len(buf) / st.median / 1e6), ratio(raw / st.median),
                                 seconds(ct.median), ratio(raw_cpu / ct.median), f"{used:.2f}"))
            section.data.append({"workload": workload, "leaf_bytes": leaf_size, "leaves": count, "method": name,
                                 "bytes": len(buf), **st.as_dict(), "cpu": ct.as_dict(),
                                 "mb_per_s": len(buf) / st.median / 1e6, "vs_raw_blake3_1_thread": raw / st.median,
                                 "vs_raw_blake3_1_thread_cpu": raw_cpu / ct.median, "cpu_over_wall": used})
        name = methods[2][0]
        per_core = raw_cpu / Stat.of(cpu[name]).median
        bound = f"CPU time {per_core:.3g}: at most {per_core * CORES:.3g} on {CORES} idle cores"
        wall = raw / Stat.of(got[name]).median
        if goal is not None:
            section.goals.append(Goal(f"merkle.tree_root / raw BLAKE3 1 thread, {label}", wall, goal, note=bound))
        else:
            section.notes.append(f"merkle.tree_root / raw BLAKE3 1 thread, {label}: {wall:.3g} (no goal; {bound}: "
                                 "one message per leaf, its blocks one after another on one SIMD lane)")
    section.notes.append("vs raw: the median of raw BLAKE3 on 1 thread over the row's median, same bytes; wall "
                         "time is the goal, CPU time (every thread of the process) the work done for it")
    section.notes.append("CPU / wall: CPU seconds over wall seconds summed over the rounds: about 1 for one busy "
                         "core, up to the cores free; below 1, other processes had the cores")
    return section


def frontier_rows(repeat: int, before: ModuleType | None = None) -> Section:
    """Time Frontier.extend, native against pure, interleaved."""
    section = Section(
        f"Frontier.extend, {FRONTIER_BATCH:,} leaves per call, every={merkle.TILE_HEIGHT} (wall time)",
        ("leaves", "method", "calls", "min", "median", "max", "leaves/s", "vs pure"),
    )
    leaves = [os.urandom(32) for _ in range(FRONTIER_LEAVES)]
    batches = [leaves[i : i + FRONTIER_BATCH] for i in range(0, FRONTIER_LEAVES, FRONTIER_BATCH)]

    def feed(make: Callable[[], pure.Frontier]) -> Callable[[], bytes]:
        def run() -> bytes:
            f = make()
            for b in batches:
                f.extend(b, every=merkle.TILE_HEIGHT)
            return f.root()

        return run

    methods: list[tuple[str, Callable[[], object]]] = [
        ("merkle_pure.Frontier", feed(pure.Frontier)), (f"merkle.Frontier ({merkle.IMPLEMENTATION})", feed(merkle.Frontier))]
    if before is not None:
        methods.append(("merkle.Frontier (before)", via(before, feed(merkle.Frontier))))
    assert all(fn() == pure.root_of_leaves(leaves) for _, fn in methods)
    got = interleaved(methods, repeat)
    ref = Stat.of(got[methods[0][0]]).median
    for name, _ in methods:
        st = Stat.of(got[name])
        section.rows.append((f"{FRONTIER_LEAVES:,}", name, f"{len(batches)}", seconds(st.min), seconds(st.median),
                             seconds(st.max), rate(FRONTIER_LEAVES / st.median), ratio(ref / st.median)))
        section.data.append({"leaves": FRONTIER_LEAVES, "batch": FRONTIER_BATCH, "method": name, **st.as_dict(),
                             "leaves_per_s": FRONTIER_LEAVES / st.median, "vs_pure": ref / st.median})
    return section


def encode_rows(repeat: int, before: ModuleType | None = None) -> Section:
    """Time encode_plain over a batch of turns, native against the reference, interleaved."""
    section = Section(
        f"events.encode_plain, {ENCODE_TURNS:,} turns of 1 KiB per call (wall time)",
        ("turns", "method", "min", "median", "max", "turns/s", "vs reference"),
    )
    batch: list[ev.Event] = list(turns(ENCODE_TURNS))

    def encode(native: bool) -> Callable[[], None]:
        def run() -> None:
            clock = ev.tick_clock()
            if native:
                ev.encode_plain(batch, 0, clock)
            else:
                ev._encode_plain_reference(batch, 0, clock, 1)

        return run

    methods: list[tuple[str, Callable[[], object]]] = [
        ("reference (plain checks, msgspec)", encode(False)), ("native (native.Encoder)", encode(True))]
    if before is not None:
        methods.append(("native (before)", via(before, encode(True))))
    want = ev._encode_plain_reference(batch, 0, ev.tick_clock(), 1)
    for name, _ in methods[1:]:
        with routed(before if "before" in name else None):
            if ev.encode_plain(batch, 0, ev.tick_clock()) != want:
                raise SystemExit(f"{name} and the reference gave different bytes")
    got = interleaved(methods, repeat)
    ref = Stat.of(got[methods[0][0]]).median
    for name, _ in methods:
        st = Stat.of(got[name])
        section.rows.append((f"{ENCODE_TURNS:,}", name, seconds(st.min), seconds(st.median), seconds(st.max),
                             rate(ENCODE_TURNS / st.median), ratio(ref / st.median)))
        section.data.append({"turns": ENCODE_TURNS, "method": name, **st.as_dict(),
                             "turns_per_s": ENCODE_TURNS / st.median, "vs_reference": ref / st.median})
    return section


def main(argv: list[str] | None = None) -> int:
    """Run both parts, print their tables and write benchmarks/results/native.json."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed rounds per row (default 7, at least 5)")
    parser.add_argument("--before", metavar="PATH", help="another build of compactstore.native to time beside this one")
    args = parser.parse_args(argv)
    before = other_build(args.before) if args.before else None
    info = harness.machine()
    harness.print_machine(info, args.repeat)
    print(f"merkle:   {merkle.IMPLEMENTATION} implementation; blake3 (PyPI) {blake3.__version__}")
    if merkle.IMPLEMENTATION != "native":
        print("warning: compactstore.native is not in use (not built, or COMPACTSTORE_PURE=1): "
              "the 'merkle.' rows are the pure reference")
    if before is not None:
        print(f"before:   {args.before}")
    done = [root_rows(args.repeat, before), frontier_rows(args.repeat, before)]
    if merkle.IMPLEMENTATION == "native":  # the same switch (COMPACTSTORE_PURE) picks the encoder
        done.append(encode_rows(args.repeat, before))
    for section in done:
        section.print()
    path = harness.write_json("native", info, done, repeat=args.repeat, implementation=merkle.IMPLEMENTATION,
                              before=args.before)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
