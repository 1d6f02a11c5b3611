"""Crash safety: writer processes on a durable SQLite store, killed with SIGKILL at random moments.

Each writer runs a mixed workload (appends, idempotent appends, batches, bindings and
obligations, compactions that spill, L2 digests, recovery markers, raw markers) and
reports to its parent, through a pipe, every operation it begins (``B``) and every
operation that returned (``A``, written and flushed after the call returns). The
parent kills the writers at random moments and then checks the store:

- it opens and ``verify()`` is clean;
- every acknowledged operation is present exactly once, where it was acknowledged;
- nothing is present that was never begun, and nothing twice (an operation cut off
  by the kill is there once or not at all);
- no compaction or marker is half-written: every node's spills exist and return the
  value they stand for, every marker's node exists and is a summary node;
- every marker resumes to the digest it gave before the kill;
- an idempotent append cut off by the kill, retried by the next writer with the same
  key, is there exactly once.

Run as a script, this module is the writer: ``crash_harness.py worker PATH WID SEED RETRIES``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import compactstore as cs

SHARED = "shared"
BATCH_KINDS = ("turn", "call", "failed")


def _own(wid: int) -> str:
    return f"own-{wid}"


def _event(kind: str, op: str, i: int | None = None) -> cs.Event:
    meta: dict[str, Any] = {"op": op} if i is None else {"op": op, "i": i}
    if kind == "call":
        return cs.ToolCall(f"c-{op}-{i}", "run_sql", {"sql": f"SELECT {len(op)}", "op": op}, meta=meta)
    if kind == "failed":
        return cs.ToolResult(f"c-{op}-{i}", f"ERROR {op}", ok=False, status="failed", meta=meta)
    return cs.Turn("user", f"step {op}", meta=meta)


# --- the writer ---------------------------------------------------------------------


def worker(path: str, wid: int, seed: int, retries: list[dict[str, Any]], limit: int = 0, durable: bool = True) -> None:
    """Run the mixed workload on ``path`` until killed (or for ``limit`` operations)."""
    rng = random.Random(seed)
    out = sys.stdout

    def emit(line: dict[str, Any]) -> None:
        out.write(json.dumps(line, separators=(",", ":")) + "\n")
        out.flush()

    st = cs.open(path, durable=durable)
    own = st.session(_own(wid))
    shared = st.session(SHARED)
    emit({"t": "ready"})
    for spec in retries:  # idempotent appends cut off by the last kill: retry them first
        emit({"t": "B", **spec})
        rec = st.session(spec["session"]).append(_event("turn", spec["op"]), idempotency_key=spec["key"])
        emit({"t": "A", "op": spec["op"], "kind": "idem", "session": spec["session"], "pos": rec.pos})
    nodes = own.nodes()
    l1_stop = max((n.stop for n in nodes if n.tier == 1), default=0)
    undigested = [n for n in nodes if n.tier == 1 and n.start >= max((m.stop for m in nodes if m.tier == 2), default=0)]
    bindings = [r.event.key for r in own.scan() if r.kind == "binding"]  # type: ignore[attr-defined]
    latest_node: int | None = nodes[-1].pos if nodes else None
    n = 0
    while not limit or n < limit:
        n += 1
        op = f"{wid}.{seed}.{n}"
        r = rng.random()
        s = own if rng.random() < 0.7 else shared
        if r < 0.30:
            emit({"t": "B", "op": op, "kind": "append", "session": s.name})
            rec = s.append(_event("turn", op))
            emit({"t": "A", "op": op, "kind": "append", "session": s.name, "pos": rec.pos})
        elif r < 0.40:
            key = f"k-{op}"
            emit({"t": "B", "op": op, "kind": "idem", "session": s.name, "key": key})
            rec = s.append(_event("turn", op), idempotency_key=key)
            emit({"t": "A", "op": op, "kind": "idem", "session": s.name, "pos": rec.pos})
        elif r < 0.55:
            batch = [_event(rng.choice(BATCH_KINDS), op, i) for i in range(rng.randint(2, 6))]
            emit({"t": "B", "op": op, "kind": "extend", "session": s.name, "n": len(batch)})
            recs = s.extend(batch)
            emit({"t": "A", "op": op, "kind": "extend", "session": s.name, "pos": [x.pos for x in recs]})
        elif r < 0.65:
            key = f"b-{op}"
            emit({"t": "B", "op": op, "kind": "bind", "session": own.name, "key": key})
            rec = own.bind(key, {"path": f"migrations/{op}.sql", "n": n}, regenerable=rng.random() < 0.3)
            bindings.append(key)
            emit({"t": "A", "op": op, "kind": "bind", "session": own.name, "pos": rec.pos})
        elif r < 0.72:
            needs = rng.sample(bindings, min(len(bindings), rng.randint(0, 2)))
            emit({"t": "B", "op": op, "kind": "oblige", "session": own.name, "name": f"o-{op}"})
            rec = own.oblige(f"o-{op}", needs=needs)
            emit({"t": "A", "op": op, "kind": "oblige", "session": own.name, "pos": rec.pos})
        elif r < 0.84:
            stop = own.size
            if stop - l1_stop < 2:
                continue
            start = l1_stop if rng.random() < 0.8 else rng.randint(l1_stop, stop - 2)
            emit({"t": "B", "op": op, "kind": "compact", "session": own.name, "start": start, "stop": stop})
            node = own.compact(start, stop, on_risk="spill")
            l1_stop = stop
            undigested.append(node)
            latest_node = node.pos
            emit({"t": "A", "op": op, "kind": "compact", "session": own.name, "pos": node.pos,
                  "start": start, "stop": stop, "spills": [x.handle for x in node.spills]})
        elif r < 0.88:
            run = _contiguous_tail(undigested)
            if len(run) < 2:
                continue
            emit({"t": "B", "op": op, "kind": "digest", "session": own.name})
            node = own.roll_up(run)
            undigested = []
            latest_node = node.pos
            emit({"t": "A", "op": op, "kind": "digest", "session": own.name, "pos": node.pos,
                  "start": node.start, "stop": node.stop})
        elif r < 0.96:
            if latest_node is None:
                continue
            emit({"t": "B", "op": op, "kind": "mark", "session": own.name, "node": latest_node})
            try:
                marker = own.mark(latest_node)
            except cs.MarkerInvalid:
                marker = own.mark_raw()
            digest = own.resume(marker).digest.hex()
            emit({"t": "A", "op": op, "kind": "mark", "session": own.name, "pos": marker.pos,
                  "node": marker.node, "digest": digest})
        else:
            emit({"t": "B", "op": op, "kind": "mark_raw", "session": s.name})
            marker = s.mark_raw(rng.randint(0, s.size) if rng.random() < 0.3 else None)
            digest = s.resume(marker).digest.hex()
            emit({"t": "A", "op": op, "kind": "mark_raw", "session": s.name, "pos": marker.pos, "digest": digest})


def _contiguous_tail(nodes: list[cs.Node]) -> list[cs.Node]:
    run: list[cs.Node] = []
    for node in reversed(nodes):
        if run and node.stop != run[0].start:
            break
        run.insert(0, node)
    return run


# --- the parent ---------------------------------------------------------------------


@dataclass
class Figures:
    """What a campaign measured."""

    kills: int = 0
    kills_mid_op: int = 0
    kills_before_ready: int = 0
    cut_off: Counter[str] = field(default_factory=Counter)
    acked_ops: int = 0
    acked_events: int = 0
    retried: int = 0
    markers_checked: int = 0
    lost: int = 0
    server_crashes: int = 0
    duplicated: int = 0
    phantom: int = 0
    stores: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    def summary(self) -> str:
        cut = ", ".join(f"{k} {v}" for k, v in sorted(self.cut_off.items()))
        return (
            f"kills {self.kills} ({self.kills_mid_op} with an operation in flight: {cut}; "
            f"{self.kills_before_ready} while opening the store); "
            f"server crashes {self.server_crashes}; stores {self.stores}; acknowledged operations {self.acked_ops} ({self.acked_events} events); "
            f"idempotent retries {self.retried}; marker resumes checked {self.markers_checked}; "
            f"lost {self.lost}, duplicated {self.duplicated}, phantom {self.phantom}; "
            f"failures {len(self.failures)}; {self.seconds:.1f} s"
        )


@dataclass
class _Writer:
    wid: int
    proc: subprocess.Popen[str]
    lines: list[str]
    reader: threading.Thread
    err: Path
    ready: threading.Event


class Campaign:
    """Rounds of writers killed at random moments, each followed by the full check."""

    def __init__(self, workdir: Path | str, *, seed: int = 0, writers: int = 2, max_delay: float = 0.8,
                 max_events: int = 300, startup_kills: float = 0.1,
                 new_target: Callable[[], str] | None = None, durable: bool = True) -> None:
        """Prepare a campaign on stores under ``workdir`` (a directory, or a PostgreSQL URL factory).

        Each writer is killed at a random moment up to ``max_delay`` seconds after it has
        opened the store, or, with probability ``startup_kills``, while it opens it. A
        new store is started once a session holds more than ``max_events`` events, at a
        fresh SQLite file, or at what ``new_target()`` returns (a PostgreSQL URL).
        """
        self.workdir = Path(workdir)
        self.new_target = new_target
        self.rng = random.Random(seed)
        self.writers = writers
        self.max_delay = max_delay
        self.max_events = max_events
        self.startup_kills = startup_kills
        self.durable = durable
        self.figures = Figures()
        self._new_store()

    def _new_store(self) -> None:
        self.figures.stores += 1
        self.target = self.new_target() if self.new_target else str(self.workdir / f"crash-{self.figures.stores}.db")
        self.acked: dict[str, dict[str, Any]] = {}
        self.begun: dict[str, dict[str, Any]] = {}
        self.markers: dict[tuple[str, int], str] = {}
        self.retries: dict[int, list[dict[str, Any]]] = {}
        self.retry_ops: set[str] = set()

    def _spawn(self, wid: int, limit: int = 0) -> _Writer:
        err = self.workdir / f"writer-{wid}.err"
        specs = self.retries.pop(wid, [])
        self.retry_ops |= {spec["op"] for spec in specs}
        with err.open("w") as errfile:
            proc = subprocess.Popen(
                [sys.executable, __file__, "worker", self.target, str(wid), str(self.rng.randrange(1 << 30)),
                 json.dumps(specs), str(limit), "durable" if self.durable else "normal"],
                stdout=subprocess.PIPE, stderr=errfile, text=True,
            )
        lines: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if not ready.is_set() and '"ready"' in line:
                    ready.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        return _Writer(wid, proc, lines, reader, err, ready)

    def round(self) -> None:
        """Start the writers, kill each at a random moment, then check the store."""
        t0 = time.perf_counter()
        ws = [self._spawn(w) for w in range(self.writers)]
        plan = [(self.rng.random() < self.startup_kills, self.rng.uniform(0.0, self.max_delay)) for _ in ws]
        ready_at: dict[int, float] = {}
        alive = set(range(len(ws)))
        while alive:
            now = time.perf_counter()
            for i in sorted(alive):
                w, (at_start, delay) = ws[i], plan[i]
                if i not in ready_at and w.ready.is_set():
                    ready_at[i] = now
                due = t0 + delay * 0.5 if at_start else (ready_at[i] + delay if i in ready_at else None)
                if w.proc.poll() is not None:
                    alive.discard(i)
                elif due is not None and now >= due:
                    os.kill(w.proc.pid, signal.SIGKILL)
                    alive.discard(i)
                elif now - t0 > 60:
                    os.kill(w.proc.pid, signal.SIGKILL)
                    alive.discard(i)
                    self.figures.failures.append(f"writer {w.wid} never became ready")
            time.sleep(0.002)
        self._collect(ws, killed=True)
        self.figures.kills += len(ws)
        self.check()
        if self._largest() > self.max_events:
            self._new_store()

    def crash_server(self, stop: Callable[[], None], start: Callable[[], None]) -> None:
        """Start the writers, crash the database server under them at a random moment, restart it, check.

        The writers lose their connections; they are then killed, and the check runs
        against the restarted server.
        """
        ws = [self._spawn(w) for w in range(self.writers)]
        for w in ws:
            if not w.ready.wait(60):
                self.figures.failures.append(f"writer {w.wid} never became ready")
        time.sleep(self.rng.uniform(0.05, self.max_delay))
        stop()
        time.sleep(0.2)
        for w in ws:
            if w.proc.poll() is None:
                os.kill(w.proc.pid, signal.SIGKILL)
        for w in ws:
            w.proc.wait()
            w.reader.join()
            assert w.proc.stdout is not None
            w.proc.stdout.close()
            self._absorb(w)
        self.figures.kills += len(ws)
        self.figures.server_crashes += 1
        start()
        self.check()
        if self._largest() > self.max_events:
            self._new_store()

    def calm(self, ops: int) -> None:
        """Run the writers side by side for ``ops`` operations each, with no kill, then check."""
        ws = [self._spawn(w, ops) for w in range(self.writers)]
        self._collect(ws, killed=False)
        self.check()

    def _collect(self, ws: list[_Writer], *, killed: bool) -> None:
        for w in ws:
            w.proc.wait()
            w.reader.join()
            assert w.proc.stdout is not None
            w.proc.stdout.close()
            if w.proc.returncode != (-signal.SIGKILL if killed else 0):
                self.figures.failures.append(
                    f"writer {w.wid} exited {w.proc.returncode}: {w.err.read_text()[-3000:]}"
                )
            self._absorb(w)

    def _absorb(self, w: _Writer) -> None:
        inflight: dict[str, Any] | None = None
        if not any('"ready"' in raw for raw in w.lines):
            self.figures.kills_before_ready += 1
        for raw in w.lines:
            try:
                line = json.loads(raw)
            except ValueError:
                continue  # a line cut by the kill: not an acknowledgement
            if line["t"] == "B":
                inflight = line
                self.begun[line["op"]] = line
            elif line["t"] == "A":
                inflight = None
                self.acked[line["op"]] = line
                self.figures.acked_ops += 1
                pos = line.get("pos")
                self.figures.acked_events += len(pos) if isinstance(pos, list) else 1
                if line["kind"] in ("mark", "mark_raw"):
                    self.markers[(line["session"], line["pos"])] = line["digest"]
                if line["op"] in self.retry_ops:
                    self.retry_ops.discard(line["op"])
                    self.figures.retried += 1
        if inflight is not None:
            self.figures.kills_mid_op += 1
            self.figures.cut_off[inflight["kind"]] += 1
            if inflight["kind"] == "idem":
                self.retries.setdefault(w.wid, []).append(
                    {"op": inflight["op"], "kind": "idem", "session": inflight["session"], "key": inflight["key"]}
                )

    def _largest(self) -> int:
        with cs.open(self.target) as st:
            return max((st.session(n).size for n in st.sessions()), default=0)

    def _fail(self, what: str) -> None:
        self.figures.failures.append(f"store {self.figures.stores} after kill {self.figures.kills}: {what}")

    def check(self) -> None:
        """Check every guarantee against what the writers acknowledged."""
        try:
            st = cs.open(self.target, durable=True)
        except cs.CompactStoreError as exc:
            if not self.acked:
                return  # killed before the store was created: nothing was acknowledged
            self._fail(f"the store does not open: {exc}")
            return
        with st:
            report = st.verify()
            if not report.ok:
                self._fail(f"verify: {[str(p) for p in report.problems[:5]]}")
            self._check_events(st)
            self._check_derived(st)

    def _check_events(self, st: cs.Store) -> None:
        found: dict[str, list[tuple[str, int]]] = {}
        for name in st.sessions():
            for r in st.session(name).scan():
                e = r.event
                op = None
                if e.meta and "op" in e.meta:
                    op = e.meta["op"]
                elif isinstance(e, cs.Binding) and e.key.startswith("b-"):
                    op = e.key[2:]
                elif isinstance(e, cs.Obligation) and e.name.startswith("o-"):
                    op = e.name[2:]
                if op is not None:
                    found.setdefault(op, []).append((name, r.pos))
        for op, line in self.acked.items():
            if line["kind"] in ("compact", "digest", "mark", "mark_raw"):
                continue
            want = line["pos"] if isinstance(line["pos"], list) else [line["pos"]]
            got = sorted(p for s, p in found.get(op, []) if s == line["session"])
            if not got:
                self.figures.lost += 1
                self._fail(f"acknowledged {line['kind']} {op} is missing (was at {line['session']}:{want})")
            elif got != want:
                self.figures.duplicated += len(got) > len(want)
                self._fail(f"acknowledged {line['kind']} {op} at {line['session']}:{got}, acknowledged at {want}")
        for op, where in found.items():
            if op not in self.acked and op not in self.begun:
                self.figures.phantom += 1
                self._fail(f"{op} is stored at {where} but was never begun")
            elif op not in self.acked:
                n = self.begun[op].get("n", 1)
                if len(where) != n:
                    self.figures.duplicated += 1
                    self._fail(f"{op}, cut off by a kill, is stored {len(where)} times for {n} events: {where}")

    def _check_derived(self, st: cs.Store) -> None:
        for name in st.sessions():
            s = st.session(name)
            for r in s.scan():
                if r.kind == "node":
                    node = cs.Node.from_record(r)
                    for ref in node.spills:
                        try:
                            value = s.spilled(ref.handle)
                            source = s.read(ref.source).event
                            if not isinstance(source, cs.Binding) or source.value != value:
                                self._fail(f"{name}:{r.pos} spill {ref.handle} does not hold its binding's value")
                        except cs.CompactStoreError as exc:
                            self._fail(f"{name}:{r.pos} spill {ref.handle} is not readable: {exc}")
                elif r.kind == "marker":
                    m = cs.Marker.from_record(r)
                    if m.node is not None and (m.node >= r.pos or s.read(m.node).kind != "node"):
                        self._fail(f"{name}:{r.pos} marker names node {m.node}, which is no summary node")
                    digest = s.resume(m).digest.hex()
                    self.figures.markers_checked += 1
                    known = self.markers.setdefault((name, r.pos), digest)
                    if known != digest:
                        self._fail(f"{name}:{r.pos} marker resumes to {digest[:16]}…, {known[:16]}… before the kill")
        for op, line in self.acked.items():
            if line["kind"] in ("compact", "digest"):
                s = st.session(line["session"])
                r = s.read(line["pos"])
                if r.kind != "node" or (r.event.start, r.event.stop) != (line["start"], line["stop"]):  # type: ignore[attr-defined]
                    self._fail(f"acknowledged {line['kind']} {op} is not the node at {line['session']}:{line['pos']}")
                elif line["kind"] == "compact" and [x.handle for x in cs.Node.from_record(r).spills] != line["spills"]:
                    self._fail(f"acknowledged compaction {op} lost its spills")
            elif line["kind"] in ("mark", "mark_raw") and st.session(line["session"]).read(line["pos"]).kind != "marker":
                self._fail(f"acknowledged marker {op} is not at {line['session']}:{line['pos']}")

    def run(self, kills: int) -> Figures:
        """Run rounds until at least ``kills`` writers were killed; return the figures."""
        t0 = time.perf_counter()
        while self.figures.kills < kills:
            self.round()
        self.figures.seconds = time.perf_counter() - t0
        return self.figures


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "worker":
    worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5]), int(sys.argv[6]),
           sys.argv[7] == "durable")
