#!/usr/bin/env python3
"""Append throughput: compactstore against plain inserts of the same rows, and against log size.

    python benchmarks/append.py [--repeat N] [--quick] [--scale N] [--before PATH]

Part 1, same durability: 1 KiB turns appended through ``Session.extend`` (1,000 per
call) and ``Session.append`` (one per call), each at ``synchronous=NORMAL`` (the default)
and at ``synchronous=FULL`` (``durable=True``), against plain ``sqlite3`` inserting the
very same rows (same bytes, leaves included, same STRICT table and indexes) in the same
transactions at the same ``synchronous`` level. Everything compactstore does beyond the
insert (validation, canonical encoding, leaf hashing, tree nodes, the sealed head) is in
the ratio. ``--before PATH`` adds, in the same rounds, ``Session.extend`` and
``Session.append`` with compactstore's native calls routed through another build of the
extension (see ``native.py``): what a change to the native core costs or saves here.

Part 2, log size: append throughput in sessions that already hold 10,000, 100,000 and
1,000,000 events (``--quick``: 10,000, 30,000 and 100,000; ``--scale N``: up to N), the
stores appended to in alternation; plain ``sqlite3`` tables of the same sizes beside
them. Building the 1,000,000-event session takes a few minutes:

    python benchmarks/append.py                     # the full measurement
    python benchmarks/append.py --quick             # what `make bench` runs

Part 3, PostgreSQL: the same against plain psycopg 3, in a database named by
``--pg-url`` or ``COMPACTSTORE_BENCH_PG_URL`` (on loopback, whose user may create
schemas), or in a throwaway cluster that ``--pg-temp`` starts as ``tests/pg.py`` does
(``fsync`` on, the server's defaults: durable commits; ``--pg-temp nofsync`` for the
tests' settings, where round trips dominate):

    python benchmarks/append.py --only postgres --pg-temp

Writes benchmarks/results/append.json.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Goal, Method, Section, Stat, interleaved, rate, ratio, seconds  # noqa: E402
from plain import CLOCK_START, PlainPostgres, PlainSQLite, PlainWithHeads, turns  # noqa: E402

import compactstore as cs  # noqa: E402
from native import other_build, via  # noqa: E402

BATCH = 1000
#: Transactions per timed round of the batched modes: WAL checkpoints land in one of a few commits.
ROUND_BATCHES = 3
SMALL = 10_000
PG_ENV = "COMPACTSTORE_BENCH_PG_URL"

def durability_rows(repeat: int, singles: int, before: ModuleType | None = None) -> Section:
    """Compare batched and single appends with plain sqlite3 at NORMAL and FULL (and another native build's)."""
    section = Section(
        "Appends vs plain sqlite3 at the same durability (WAL)",
        ("mode", "method", "rows/round", "min", "median", "max", "rows/s", "vs plain"),
    )
    tmp = tempfile.mkdtemp(prefix="cs-bench-append-")
    opened: list[Any] = []
    try:
        work = turns(BATCH)
        ones = work[:singles]
        modes: list[harness.Mode] = []
        for sync, durable in (("NORMAL", False), ("FULL", True)):
            for kind in ("batched", "single"):
                tag = f"{kind}-{sync}"
                store = cs.open(os.path.join(tmp, f"cs-{tag}.db"), clock=cs.events.tick_clock(CLOCK_START, 1),
                                durable=durable)
                plain = PlainSQLite(os.path.join(tmp, f"plain-{tag}.db"), sync)
                opened += [store, plain]
                s = store.session("bench")
                # The other build's store: its own file, written only through that build.
                other = cs.open(os.path.join(tmp, f"cs-before-{tag}.db"), clock=cs.events.tick_clock(CLOCK_START, 1),
                                durable=durable)
                opened.append(other)
                b = other.session("bench")
                if kind == "batched":
                    def plain_fn(p: PlainSQLite = plain) -> float:
                        return _plain_batches(p, work)

                    def cs_fn(s: cs.Session = s) -> None:
                        for _ in range(ROUND_BATCHES):
                            s.extend(work)

                    label = f"batched 1,000 per transaction, synchronous={sync}"
                    batched: list[tuple[str, harness.Method]] = [("plain sqlite3 executemany", plain_fn)]
                    if before is not None:
                        batched.append(("compactstore Session.extend (before)", via(before, lambda b=b, f=cs_fn: f(b))))
                    modes.append((label, BATCH * ROUND_BATCHES, [*batched, ("compactstore Session.extend", cs_fn)]))
                else:
                    floor = PlainWithHeads(os.path.join(tmp, f"heads-{tag}.db"), sync)
                    opened.append(floor)

                    def plain_fn(p: PlainSQLite = plain) -> float:
                        rows = p.rows_for(ones)
                        t0 = time.perf_counter()
                        for row in rows:
                            p.insert((row,))
                        return time.perf_counter() - t0

                    def floor_fn(p: PlainSQLite = floor) -> float:
                        return plain_fn(p)

                    def cs_fn(s: cs.Session = s) -> None:
                        for e in ones:
                            s.append(e)

                    label = f"one per transaction, synchronous={sync}"
                    single: list[tuple[str, harness.Method]] = [("plain sqlite3 single-row commit", plain_fn),
                                                                ("the same with our head row (bare)", floor_fn)]
                    if before is not None:
                        single.append(("compactstore Session.append (before)", via(before, lambda b=b, f=cs_fn: f(b))))
                    modes.append((label, singles, [*single, ("compactstore Session.append", cs_fn)]))
        harness.versus_reference(section, modes, repeat, {
            "batched 1,000 per transaction, synchronous=NORMAL", "one per transaction, synchronous=FULL"})
    finally:
        for o in opened:
            o.close()
        shutil.rmtree(tmp, ignore_errors=True)
    section.notes.append("1 KiB turns (1,024 random bytes, base64), about 1.4 KB stored per row; "
                         "the plain side inserts the same bytes into the same STRICT table and indexes")
    section.notes.append(f"goals: batched at NORMAL (the default) and one durable append per call (FULL), each >= "
                         f"{harness.WRITE_GOAL} of plain; one per call at NORMAL is context: with no fsync the plain "
                         "commit is pure CPU, and ours adds the encoding, leaf and node hashes, head seal and index on top")
    section.notes.append("'the same with our head row (bare)': plain's commit plus the head row compactstore writes "
                         "with it, by bare sqlite3 with the head's values made beforehand: the most any cut of "
                         "compactstore's Python work could reach with this schema")
    return section


def _plain_batches(p: PlainSQLite, work: list[cs.Turn], count: int = ROUND_BATCHES) -> float:
    """Insert ``count`` batches of ``work``, rows prepared outside the timing; return the seconds."""
    batches = [p.rows_for(work) for _ in range(count)]
    t0 = time.perf_counter()
    for rows in batches:
        p.insert(rows)
    return time.perf_counter() - t0


def _grow(session: cs.Session, plain: PlainSQLite, size: int, work: list[cs.Turn]) -> float:
    """Append ``work`` in batches until both logs hold ``size`` events; return the seconds spent."""
    t0 = time.perf_counter()
    while session.size < size:
        n = min(len(work), size - session.size)
        session.extend(work[:n])
    while plain.pos < size:
        n = min(len(work), size - plain.pos)
        plain.insert(plain.rows_for(work[:n]))
    return time.perf_counter() - t0


def scale_rows(repeat: int, sizes: list[int], singles: int) -> Section:
    """Compare append throughput in sessions of every size in ``sizes``, appended to in alternation."""
    small, big = sizes[0], sizes[-1]
    section = Section(
        f"Append throughput against log size: {', '.join(f'{n:,}' for n in sizes)} events in one session",
        ("mode", "method", "rows/round", "min", "median", "max", "rows/s", f"vs at {small:,}"),
    )
    tmp = tempfile.mkdtemp(prefix="cs-bench-scale-")
    opened: list[Any] = []
    try:
        work = turns(BATCH)
        ones = work[:singles]
        logs = {}
        for size in sizes:
            store = cs.open(os.path.join(tmp, f"cs-{size}.db"), clock=cs.events.tick_clock(CLOCK_START, 1))
            plain = PlainSQLite(os.path.join(tmp, f"plain-{size}.db"), "NORMAL")
            opened += [store, plain]
            s = store.session("bench")
            built = _grow(s, plain, size, work)
            logs[size] = (s, plain)
            print(f"  built {size:,} events in {built:.1f} s "
                  f"({harness.disk_bytes(os.path.join(tmp, f'cs-{size}.db')) / 1e6:,.0f} MB)", flush=True)

        # One transaction per round here: the sessions should stay near their sizes.
        # Each method is made from a size's pair of logs and times one of them.
        def plain_batch(s: cs.Session, p: PlainSQLite) -> Method:
            return lambda: _plain_batches(p, work, 1)

        def cs_batch(s: cs.Session, p: PlainSQLite) -> Method:
            def fn() -> None:
                s.extend(work)
            return fn

        def cs_single(s: cs.Session, p: PlainSQLite) -> Method:
            def fn() -> None:
                for e in ones:
                    s.append(e)
            return fn

        modes: list[tuple[str, int, str, Callable[[cs.Session, PlainSQLite], Method]]] = [
            ("batched 1,000 per transaction", BATCH, "compactstore Session.extend", cs_batch),
            ("batched 1,000 per transaction", BATCH, "plain sqlite3 executemany", plain_batch),
            ("one per transaction", singles, "compactstore Session.append", cs_single),
        ]
        for mode, n, name, make in modes:
            methods: list[tuple[str, Method]] = []
            for size in sizes:
                s, p = logs[size]
                methods.append((f"{name} at {size:,}", make(s, p)))
            got = interleaved(methods, harness.SHORT_ROUNDS * repeat)
            ref = Stat.of(got[methods[0][0]]).median
            for (label, _), size in zip(methods, sizes):
                st = Stat.of(got[label])
                section.rows.append((mode, label, f"{n:,}", seconds(st.min), seconds(st.median), seconds(st.max),
                                     rate(n / st.median), ratio(ref / st.median)))
                section.data.append({"mode": mode, "method": name, "size": size, "rows": n, **st.as_dict(),
                                     "rows_per_s": n / st.median, "vs_small": ref / st.median})
            if name.startswith("compactstore"):
                section.goals.append(Goal(
                    f"{name} at {big:,} / at {small:,}", ref / Stat.of(got[methods[-1][0]]).median, 0.9,
                    note="the goal is stated at 1,000,000" if big < 1_000_000 else ""))
        end = ", ".join(f"{size:,} -> {logs[size][0].size:,}" for size in sizes)
        section.notes.append(f"sessions grow while measured: {end}")
    finally:
        for o in opened:
            o.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return section


def _with_schema(url: str, schema: str) -> str:
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = " ".join([v for k, v in query if k == "options"] + [f"-csearch_path={schema}"])
    query = [(k, v) for k, v in query if k != "options"] + [("options", options)]
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


def postgres_rows(repeat: int, url: str, singles: int, local: bool = False) -> Section:
    """Compare compactstore on PostgreSQL with plain psycopg inserting the same rows.

    ``local``: the server runs on this machine (``--pg-temp``), so its backends' CPU time
    can be read from ``/proc``.
    """
    import psycopg

    section = Section(
        "PostgreSQL: appends vs plain psycopg at the same durability",
        ("mode", "method", "rows/round", "min", "median", "max", "rows/s", "vs plain"),
    )
    schema = f"cs_bench_{os.getpid()}_{secrets.token_hex(3)}"
    admin = psycopg.connect(url, autocommit=True)
    admin.execute(f"CREATE SCHEMA {schema}")
    scoped = _with_schema(url, schema)
    opened: list[Any] = []
    try:
        sync = admin.execute("SHOW synchronous_commit").fetchone()
        fsync = admin.execute("SHOW fsync").fetchone()
        server = admin.execute("SHOW server_version").fetchone()
        work = turns(BATCH)
        ones = work[:singles]
        store = cs.open(scoped, clock=cs.events.tick_clock(CLOCK_START, 1))
        plain_b = PlainPostgres(scoped, "plain_batched")
        plain_s = PlainPostgres(scoped, "plain_single")
        opened += [store, plain_b, plain_s]
        sb, ss = store.session("batched"), store.session("single")

        def plain_batch() -> float:
            rows = plain_b.rows_for(work)
            t0 = time.perf_counter()
            plain_b.insert(rows)
            return time.perf_counter() - t0

        def plain_single() -> float:
            rows = plain_s.rows_for(ones)
            t0 = time.perf_counter()
            for row in rows:
                plain_s.insert((row,))
            return time.perf_counter() - t0

        def cs_batch() -> None:
            sb.extend(work)

        def cs_single() -> None:
            for e in ones:
                ss.append(e)

        # What a single commit costs besides its wait for the disk: this process's CPU,
        # the server's (its client backends, the other side's idle meanwhile) and the WAL
        # it writes (a CPU-bound machine turns CPU into latency).
        costs: dict[str, list[tuple[float, float, float]]] = {"plain": [], "compactstore": []}

        def server_cpu() -> float:
            """Return the CPU seconds of the server's client backends but ours, or NaN if not local."""
            if not local:
                return float("nan")
            total = 0
            for (pid,) in admin.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
                                        "AND pid <> pg_backend_pid()").fetchall():
                try:
                    with open(f"/proc/{pid}/schedstat") as f:
                        total += int(f.read().split()[0])
                except (OSError, ValueError, IndexError):
                    return float("nan")
            return total / 1e9

        def costed(side: str, fn: Method) -> Callable[[], float]:
            def run() -> float:
                lsn = admin.execute("SELECT pg_current_wal_lsn()").fetchone()
                s0 = server_cpu()
                c0, t0 = time.process_time(), time.perf_counter()
                got = fn()
                elapsed = got if isinstance(got, float) else time.perf_counter() - t0
                cpu = time.process_time() - c0
                on_server = server_cpu() - s0
                wal = admin.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", lsn).fetchone()
                costs[side].append((cpu / singles, on_server / singles, float(wal[0]) / singles if wal else 0.0))
                return elapsed
            return run

        harness.versus_reference(section, [
            ("batched 1,000 per transaction", BATCH, [("plain psycopg executemany", plain_batch),
                                                      ("compactstore Session.extend", cs_batch)]),
            ("one per transaction", singles, [("plain psycopg single-row commit", costed("plain", plain_single)),
                                              ("compactstore Session.append", costed("compactstore", cs_single))]),
        ], repeat, {"batched 1,000 per transaction", "one per transaction"})
        per = {side: tuple(Stat.of([row[i] for row in got]).median for i in range(3)) for side, got in costs.items()}
        backends = (f"server CPU (its backends) {per['plain'][1] * 1e3:.2f} ms plain, "
                    f"{per['compactstore'][1] * 1e3:.2f} ms compactstore; " if local else "")
        section.notes.append(
            "one per transaction, per commit (medians, warm-up included): client CPU "
            f"{per['plain'][0] * 1e3:.2f} ms plain, {per['compactstore'][0] * 1e3:.2f} ms compactstore; {backends}"
            f"WAL {per['plain'][2]:,.0f} B plain, {per['compactstore'][2]:,.0f} B compactstore")
        section.notes.append(f"server {server[0] if server else '?'}, fsync={fsync[0] if fsync else '?'}, "
                             f"synchronous_commit={sync[0] if sync else '?'} (the same for both sides)")
    finally:
        for o in opened:
            try:
                o.close()
            except Exception:  # noqa: BLE001 - cleanup must go on
                pass
        admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        admin.close()
    return section


@contextmanager
def _pg_server(url: str | None, temp: str | None) -> Iterator[str]:
    """Yield ``url``, or the URL of a throwaway cluster (``temp``: "fsync" or "nofsync") stopped afterwards."""
    if not temp:
        assert url is not None
        yield url
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    # tests/pg.py: on the path only once the line above has run, so mypy does not see it.
    from pg import TempServer, find_bin_dir  # type: ignore[import-not-found]

    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise SystemExit("--pg-temp: no initdb/pg_ctl on PATH or under /usr/lib/postgresql/*/bin")
    server = TempServer(bin_dir, durable=temp == "fsync")
    try:
        yield server.start()
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    """Run every part, print its table and write benchmarks/results/append.json."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed rounds per row (default 7, at least 5)")
    parser.add_argument("--quick", action="store_true",
                        help="log-size part at 10,000, 30,000 and 100,000 events (default 10,000, 100,000, 1,000,000)")
    parser.add_argument("--scale", type=int, help="events in the largest session (10,000 and 100,000 come with it)")
    parser.add_argument("--singles", type=int, default=100, help="single appends per timed round (default 100)")
    parser.add_argument("--only", nargs="*", choices=["durability", "scale", "postgres"], help="run only these parts")
    parser.add_argument("--pg-url", help=f"PostgreSQL database for part 3 (default: ${PG_ENV})")
    parser.add_argument("--pg-temp", nargs="?", const="fsync", choices=["fsync", "nofsync"],
                        help="run part 3 in a throwaway cluster started for it (default fsync on)")
    parser.add_argument("--before", metavar="PATH",
                        help="another build of compactstore.native: part 1 also times it (see native.py)")
    args = parser.parse_args(argv)
    before = other_build(args.before) if args.before else None
    if args.scale:
        sizes = sorted({SMALL, min(100_000, args.scale), args.scale})
    else:
        sizes = [SMALL, 30_000, 100_000] if args.quick else [SMALL, 100_000, 1_000_000]
    info = harness.machine()
    harness.print_machine(info, args.repeat)
    sections = []
    parts: tuple[tuple[str, Callable[[], Section]], ...] = (
        ("durability", lambda: durability_rows(args.repeat, args.singles, before)),
        ("scale", lambda: scale_rows(args.repeat, sizes, args.singles)),
    )
    for name, part in parts:
        if args.only and name not in args.only:
            continue
        result = part()
        result.print()
        sections.append(result)
    url = args.pg_url or os.environ.get(PG_ENV)
    if args.only and "postgres" not in args.only:
        pass
    elif url or args.pg_temp:
        with _pg_server(url, args.pg_temp) as where:
            result = postgres_rows(args.repeat, where, args.singles, local=bool(args.pg_temp))
        result.print()
        sections.append(result)
    else:
        print(f"\n(PostgreSQL part skipped: give --pg-temp, --pg-url or {PG_ENV} to run it)")
    path = harness.write_json("append", info, sections, repeat=args.repeat, sizes=sizes, before=args.before)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
