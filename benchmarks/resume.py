#!/usr/bin/env python3
"""Resume and proofs against log size: does the cost grow as O(log n)?

    python benchmarks/resume.py [--repeat N] [--sizes 10000,30000,100000[,1000000]]

For each size n it builds one session of n events: a bulk of 1 KiB turns and answered
tool calls, then a 1,000-event span (mostly 1 KiB turns, with failed tool calls,
rejections, non-regenerable bindings and an open obligation that needs one of them), then
a short tail. It compacts the bulk and the span into two L1 nodes (spilling the binding
the obligation needs) and digests them into an L2 node, so a certified resume loads the
same small context whatever n is. Then it times, interleaved across the sizes:

* ``Session.mark(l2)``: marker emission with its three checks (closure, negative facts,
  anchoring), answered by the structural index and the stored tree;
* ``Session.resume(marker)`` for that certified marker (it re-hashes what it reads and
  returns, not the span the summary replaced), and for a raw-checkpoint marker
  (``mark_raw``), whose context is, by definition, every raw event;
* an inclusion proof served by the store and verified by ``merkle.verify_inclusion``;
* a consistency proof from about n/3 to now, with both tree heads, verified by
  ``merkle.verify_consistency``;
* certified restoration of the 1,000-event span: ``Session.restore_span(node)`` (the node
  proven in the sealed head, O(log n); the span's bodies read in one query and certified
  by one BLAKE3 against the node's content digest), against raw BLAKE3 over the same
  bytes in memory; and, for context, what it replaces: ``Session.scan`` of the span and
  ``merkle.span_root`` of its bodies (a Merkle rehash: one BLAKE3 call per leaf and per
  node). A note splits restore_span into its steps, each timed alone (medians, us) and,
  like every row, after a ``gc.collect()``: from cold CPU caches, so they add up to more
  than the whole; read them as shares.

The growth column is the median at n over the median at the smallest size (O(log n) would
keep it near 1; the goal is 1M / 10k <= 1.5). The 1,000,000-event session takes minutes to
build and each O(n) call there takes tens of seconds:

    python benchmarks/resume.py --sizes 10000,100000,1000000 --repeat 5

Writes benchmarks/results/resume.json.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, overload

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Goal, Section, Stat, interleaved, ratio, seconds  # noqa: E402
from plain import CLOCK_START, turns  # noqa: E402

import blake3  # noqa: E402

import compactstore as cs  # noqa: E402
from compactstore import merkle  # noqa: E402
from compactstore.content import content_digest  # noqa: E402
import msgspec  # noqa: E402


class NodeSpan(msgspec.Struct, frozen=True, tag="node", tag_field="kind"):
    """The fields of a summary node's body that a restoration reads."""

    start: int
    stop: int
    span_root: str
    content_digest: str | None = None


restore_fields = msgspec.json.Decoder(NodeSpan).decode


def void(_: object) -> None:
    """Drop a result: a timed method that returned a float would be taken as timing itself."""

SPAN = 1000
BLOCK = 1000
TAIL = 20
PROOFS_PER_ROUND = 200


def filler(i: int, texts: list[cs.Turn]) -> list[cs.Event]:
    """Return block ``i`` of the bulk of a session: 1 KiB turns and tool calls that succeed.

    The bulk holds no negative fact and leaves nothing open, so what a resume must load
    (the summary tier and what it retains) does not grow with the session.
    """
    out: list[cs.Event] = []
    while len(out) < BLOCK:
        j = len(out)
        if j % 10 == 9 and j + 2 <= BLOCK:  # a call and its result never straddle the block's end
            cid = f"f{i}-{j}"
            out += [cs.ToolCall(cid, "read_file", {"path": f"src/m{j}.py"}), cs.ToolResult(cid, f"{j} lines")]
        else:
            out.append(cs.Turn("assistant" if j % 2 else "user", texts[(i * BLOCK + j) % len(texts)].content))
    return out


def rich(rng: random.Random, texts: list[cs.Turn]) -> list[cs.Event]:
    """Return the compacted span: mostly 1 KiB turns, with failures, rejections and bindings."""
    out: list[cs.Event] = [
        cs.Binding(key="rollback", value="migrations/003_down.sql"),
        cs.Obligation(name="finish-migration", needs=["rollback"]),
    ]
    while len(out) < SPAN:
        j = len(out)
        r = rng.random()
        if r < 0.85:
            out.append(cs.Turn("assistant" if j % 2 else "user", texts[j % len(texts)].content))
        elif r < 0.93:
            cid = f"c{j}"
            ok = rng.random() > 0.3
            out += [cs.ToolCall(cid, "run_sql", {"sql": f"SELECT {j}"}),
                    cs.ToolResult(cid, f"{j} rows" if ok else "ERROR: lock timeout", ok=ok,
                                  status=None if ok else "failed")]
        elif r < 0.97:
            out.append(cs.Turn("user", f"No, not approach {j}.", status="rejected"))
        else:
            out.append(cs.Binding(key=f"commit-{j}", value=rng.randbytes(20).hex()))
    return out[:SPAN]


class _Window(Sequence[bytes]):
    """Entries ``[start, start + len(bodies))`` of a log, for ``merkle.span_root`` (which indexes from 0)."""

    def __init__(self, bodies: list[bytes], start: int) -> None:
        self.bodies, self.start = bodies, start

    def __len__(self) -> int:
        return self.start + len(self.bodies)

    @overload
    def __getitem__(self, i: int) -> bytes: ...
    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...
    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        if isinstance(i, slice):
            assert i.start >= self.start and i.step is None
            return self.bodies[i.start - self.start : i.stop - self.start]
        assert i >= self.start
        return self.bodies[i - self.start]


def span_root(bodies: list[bytes], start: int) -> bytes:
    """Return the span root of positions ``[start, start + len(bodies))`` from their bodies."""
    return merkle.span_root(_Window(bodies, start), start, start + len(bodies))


class Log:
    """One store holding one session of ``size`` events, its node, markers and span."""

    def __init__(self, tmp: str, size: int, texts: list[cs.Turn]) -> None:
        """Build the session, compact a 1,000-turn span near its end and emit its markers."""
        self.size = size
        self.path = os.path.join(tmp, f"resume-{size}.db")
        self.store = cs.open(self.path, clock=cs.events.tick_clock(CLOCK_START, 1))
        s = self.session = self.store.session("run")
        rng = random.Random(size)
        t0 = time.perf_counter()
        self.start = size - SPAN - TAIL
        self.stop = self.start + SPAN
        i = 0
        while s.size < self.start:
            s.extend(filler(i, texts)[: self.start - s.size])
            i += 1
        s.extend(rich(rng, texts))
        s.extend(texts[: size - s.size])
        self.build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        bulk = s.compact(0, self.start, summary=f"{self.start:,} turns of routine work, every call answered")
        self.node = s.compact(self.start, self.stop, on_risk="spill")
        self.top = s.roll_up([bulk, self.node], summary="the session so far")
        self.compact_s = time.perf_counter() - t0
        self.marker = s.mark(self.top)
        self.raw_marker = s.mark_raw()
        res = s.resume(self.marker)
        assert res.mode == "certified", res.reasons
        self.context = len(res.context)
        self.mb = harness.disk_bytes(self.path) / 1e6
        self.span_bodies = [r.body for r in s.scan(self.start, self.stop)]
        self.span_buf = b"".join(self.span_bodies)
        assert span_root(self.span_bodies, self.start) == self.node.span_root
        self.proof_pos = [rng.randrange(self.marker.size) for _ in range(PROOFS_PER_ROUND)]
        self.proof_bodies = [s.read(p).body for p in self.proof_pos]
        #: CPU seconds per proof of each timed round (``time.thread_time``), by operation
        self.cpu: dict[str, list[float]] = {"inclusion": [], "consistency": []}

    def mark(self) -> None:
        """Emit one more certified marker for the top node."""
        self.session.mark(self.top)

    def resume(self) -> None:
        """Resume from the certified marker."""
        assert self.session.resume(self.marker).mode == "certified"

    def resume_raw(self) -> None:
        """Resume from the raw-checkpoint marker."""
        assert self.session.resume(self.raw_marker).mode == "fallback"

    def inclusion(self) -> float:
        """Serve and verify PROOFS_PER_ROUND inclusion proofs; return seconds per proof."""
        s, size = self.session, self.marker.size
        c0, t0 = time.thread_time(), time.perf_counter()
        root = s.head(size).root
        for pos, body in zip(self.proof_pos, self.proof_bodies):
            assert merkle.verify_inclusion(body, pos, size, s.inclusion_proof(pos, size), root)
        self.cpu["inclusion"].append((time.thread_time() - c0) / PROOFS_PER_ROUND)
        return (time.perf_counter() - t0) / PROOFS_PER_ROUND

    def consistency(self) -> float:
        """Serve and verify PROOFS_PER_ROUND consistency proofs (with both heads); return seconds per proof."""
        s, new = self.session, self.marker.size
        c0, t0 = time.thread_time(), time.perf_counter()
        for k in range(PROOFS_PER_ROUND):
            old = new // 3 + k
            a, b = s.head(old), s.head(new)
            assert merkle.verify_consistency(old, new, a.root, b.root, s.consistency_proof(old, new))
        self.cpu["consistency"].append((time.thread_time() - c0) / PROOFS_PER_ROUND)
        return (time.perf_counter() - t0) / PROOFS_PER_ROUND

    def restore(self) -> None:
        """Restore the 1,000-turn span, certified by the node's content digest."""
        got = self.session.restore_span(self.node)
        assert got.certified_by == "content_digest" and len(got.bodies) == SPAN

    def restore_parts(self) -> dict[str, Callable[[], None]]:
        """Return restore_span's steps, each callable alone, to split its time."""
        s, store = self.session, self.store
        backend, sid, pos = store.backend, s.view.sid(), self.node.pos
        assert sid is not None
        head = backend.head(sid)
        assert head is not None
        row = backend.row(sid, pos)
        assert row is not None and row.body is not None
        bodies = backend.bodies(sid, self.start, self.stop)
        spans = merkle.inclusion_spans(pos, head.size)
        body: bytes = row.body

        def node_fields() -> None:
            merkle.leaf_hash(body)
            restore_fields(body)

        def head_seal() -> None:
            backend.head(sid)
            store.seal_head(s.name, head.size, head.root, head.prev, head.seqs)

        return {
            "node row": lambda: void(backend.row(sid, pos)),
            "node leaf + fields": node_fields,
            "head + seal": head_seal,
            "inclusion of the node": lambda: void(merkle.root_from_inclusion(
                row.leaf, pos, head.size, merkle.serve(spans, lambda c: backend.hashes(sid, c))
            )),
            "bodies (one query)": lambda: void(backend.bodies(sid, self.start, self.stop)),
            "content digest": lambda: void(content_digest(bodies)),  # type: ignore[arg-type]
        }

    def rehash(self) -> None:
        """Read the 1,000-turn span back and certify it by rebuilding its span root (the Merkle path)."""
        bodies = [r.body for r in self.session.scan(self.start, self.stop)]
        assert span_root(bodies, self.start) == self.node.span_root

    def raw(self) -> float:
        """Hash the span's bytes with BLAKE3 in memory (the reference); return seconds per hash."""
        buf, n = self.span_buf, 20
        t0 = time.perf_counter()
        for _ in range(n):
            blake3.blake3(buf).digest()
        return (time.perf_counter() - t0) / n


OPS: list[tuple[str, str, Callable[[Log], Callable[[], Any]]]] = [
    ("marker emission", "Session.mark(l2)", lambda log: log.mark),
    ("resume, certified", "Session.resume(marker)", lambda log: log.resume),
    ("resume, raw checkpoint", "Session.resume(raw marker)", lambda log: log.resume_raw),
    ("inclusion proof", "serve + verify, per proof", lambda log: log.inclusion),
    ("consistency proof", "2 heads + serve + verify, per proof", lambda log: log.consistency),
    ("restore 1,000-event span", "Session.restore_span(node)", lambda log: log.restore),
    ("restore 1,000-event span", "scan + span_root == node's (context)", lambda log: log.rehash),
    ("restore 1,000-event span", "raw BLAKE3 over its bytes (reference)", lambda log: log.raw),
]


def _short(n: int) -> str:
    return f"{n / 1_000_000:g}M" if n >= 1_000_000 else f"{n / 1000:g}k"


def resume_rows(repeat: int, sizes: list[int]) -> Section:
    """Time every operation at every size, interleaved across sizes."""
    base = sizes[0]
    growth = [f"{_short(n)} / {_short(base)}" for n in sizes[1:]]
    section = Section(
        "Resume and proofs against log size",
        ("operation", "method", "events", "min", "median", "max", f"growth vs {base:,}"),
    )
    tmp = tempfile.mkdtemp(prefix="cs-bench-resume-")
    logs: list[Log] = []
    try:
        texts = turns(BLOCK)
        for n in sizes:
            log = Log(tmp, n, texts)
            logs.append(log)
            print(f"  built {n:,} events in {log.build_s:.1f} s ({log.mb:,.0f} MB); two compactions and "
                  f"a digest took {log.compact_s:.2f} s; a certified resume loads {log.context} items", flush=True)
        medians: dict[tuple[str, str], dict[int, float]] = {}
        for op, method, make in OPS:
            methods = [(f"{n}", make(log)) for n, log in zip(sizes, logs)]
            # Building each log already ran mark and resume once: the O(n) rows need no warm-up round.
            got = interleaved(methods, repeat, warmup=0 if op.startswith(("marker", "resume")) else 1)
            medians[(op, method)] = {}
            for n in sizes:
                st = Stat.of(got[f"{n}"])
                medians[(op, method)][n] = st.median
                g = st.median / Stat.of(got[f"{base}"]).median
                section.rows.append((op, method, f"{n:,}", seconds(st.min), seconds(st.median), seconds(st.max),
                                     ratio(g)))
                section.data.append({"operation": op, "method": method, "size": n, **st.as_dict(), "growth": g})
        for op, method, _ in OPS:
            if method.startswith("raw") or method.endswith("(context)"):
                continue
            for n, label in zip(sizes[1:], growth):
                g = medians[(op, method)][n] / medians[(op, method)][base]
                target = 1.5
                if op == "resume, raw checkpoint":
                    continue  # its context is every raw event: O(n) by definition
                section.goals.append(Goal(f"{op} growth {label}", g, target, higher_is_better=False,
                                          note="goal stated as 1M / 10k" if n < 1_000_000 else ""))
        for kind in ("inclusion", "consistency"):
            # The warm-up round's CPU time is dropped, as the harness drops its wall time.
            cpu = [Stat.of(log.cpu[kind][1:]).median for log in logs]
            section.notes.append(f"{kind} proof, CPU time per proof (time.thread_time, medians): " + ", ".join(
                f"{n:,} {c * 1e6:,.0f} us" for n, c in zip(sizes, cpu)) + "; growth " + ", ".join(
                f"{label} {c / cpu[0]:.2f}" for label, c in zip(growth, cpu[1:])))
        for n in sizes:
            ours = medians[("restore 1,000-event span", "Session.restore_span(node)")][n]
            rehash = medians[("restore 1,000-event span", "scan + span_root == node's (context)")][n]
            raw = medians[("restore 1,000-event span", "raw BLAKE3 over its bytes (reference)")][n]
            section.goals.append(Goal(f"certified restoration / raw BLAKE3 at {n:,}", raw / ours, 0.5))
            section.notes.append(f"at {n:,}: the Merkle rehash path (scan + span_root) / raw BLAKE3 = {raw / rehash:.3f}")
        for n, log in zip(sizes, logs):
            steps = log.restore_parts()
            got = interleaved(list(steps.items()), repeat * 5)
            raw = medians[("restore 1,000-event span", "raw BLAKE3 over its bytes (reference)")][n]
            section.notes.append(f"at {n:,}: restore_span's steps alone (cold caches: shares, not a sum), medians: " + ", ".join(
                f"{k} {Stat.of(v).median * 1e6:,.0f} us" for k, v in got.items()) + f"; raw BLAKE3 {raw * 1e6:,.0f} us")
        span_mb = len(logs[0].span_buf) / 1e6
        section.notes.append(f"the restored span is {SPAN:,} events (mostly 1 KiB turns), {span_mb:.2f} MB of bodies; "
                             "markers appended by the emission rows grow each session by one event per call")
    finally:
        for log in logs:
            log.store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return section


def main(argv: list[str] | None = None) -> int:
    """Run the measurement, print its table and write benchmarks/results/resume.json."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds per row (default 5)")
    parser.add_argument("--sizes", default="10000,30000,100000",
                        help="comma-separated session sizes (default 10000,30000,100000)")
    args = parser.parse_args(argv)
    sizes = sorted(int(x) for x in args.sizes.split(","))
    info = harness.machine()
    harness.print_machine(info, args.repeat)
    section = resume_rows(args.repeat, sizes)
    section.print()
    path = harness.write_json("resume", info, [section], repeat=args.repeat, sizes=sizes)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
