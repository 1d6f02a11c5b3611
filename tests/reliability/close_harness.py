"""Close a store while 8 threads, or 8 cancelled asyncio tasks, still use it; many rounds in one process.

Run as a script, so that a crash of the process (a segfault) is the caller's failure
and not a dead test run::

    python close_harness.py TARGET --mode threads --rounds 1000 --seed 1

Each round opens the store at TARGET, starts 8 workers that append, extend, read,
prove and list sessions in a loop, lets them run for a random few milliseconds and
closes the store under them. ``threads`` mode closes it from the main thread while
the worker threads run; ``asyncio`` mode runs each worker as a task calling the store
through ``asyncio.to_thread``, cancels them all with ``asyncio.wait_for`` and leaves
``async with CompactStoreSession(...)`` (which closes the store it opened) while their
threads are still inside the store. A worker must end with
:class:`~compactstore.errors.StoreClosed` or not at all. After the last round the store
is opened again: it must verify and hold every acknowledged append at the position
and leaf it was acknowledged with. The figures are printed as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import compactstore as cs

WORKERS = 8


@dataclass
class Figures:
    """What a campaign saw."""

    mode: str
    rounds: int = 0
    #: worker calls refused with StoreClosed (the close landed while they were running)
    refused: int = 0
    #: rounds in which the store was closed while at least one call was inside it
    closed_mid_call: int = 0
    acknowledged: int = 0
    #: anything but StoreClosed raised by a worker, a hang, or a check that failed
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


class Round:
    """One round's workers and what they acknowledged."""

    def __init__(self, store: cs.Store, rng: random.Random, figures: Figures,
                 acked: dict[tuple[str, int], bytes]) -> None:
        self.store = store
        self.rng = rng
        self.figures = figures
        self.acked = acked
        self.lock = threading.Lock()
        self.inside = 0
        self.stop = threading.Event()

    def call(self, k: int, step: int) -> None:
        """Make one call of worker ``k`` (its ``step``-th), recording what it acknowledges."""
        s = self.store.session(f"t{k}")
        with self.lock:
            self.inside += 1
        try:
            kind = step % 6
            if kind == 0:
                got = [s.append(cs.Turn("user", f"w{k} s{step}"))]
            elif kind == 1:
                got = s.extend([cs.ToolCall(f"c{step}", "run", {"k": k}), cs.ToolResult(f"c{step}", "ok")])
            elif kind == 2:
                size = s.size
                if size:
                    s.read(size - 1)
                    s.inclusion_proof(size - 1, size)
                got = []
            elif kind == 3:
                got = [s.append(cs.Turn("assistant", "x" * 200))]
            elif kind == 4:
                list(s.scan(max(0, s.size - 8)))
                self.store.sessions()
                got = []
            else:
                s.head()
                got = [s.bind(f"b{step % 3}", f"v{step}")]
            with self.lock:
                for r in got:
                    self.acked[(s.name, r.pos)] = r.leaf
                self.figures.acknowledged += len(got)
        finally:
            with self.lock:
                self.inside -= 1

    def thread_worker(self, k: int) -> None:
        """Call the store until it is closed; anything but StoreClosed is a failure."""
        step = 0
        while not self.stop.is_set():
            try:
                self.call(k, step)
            except cs.StoreClosed:
                with self.lock:
                    self.figures.refused += 1
                return
            except BaseException as exc:  # noqa: BLE001 - every other outcome is the finding
                with self.lock:
                    self.figures.failures.append(f"round {self.figures.rounds}: worker {k}: {exc!r}")
                return
            step += 1

    def call_once(self, k: int, step: int) -> None:
        """Make one call for an asyncio task, counting StoreClosed and recording anything else."""
        try:
            self.call(k, step)
        except cs.StoreClosed:
            with self.lock:
                self.figures.refused += 1
            raise
        except BaseException as exc:  # noqa: BLE001 - every other outcome is the finding
            with self.lock:
                self.figures.failures.append(f"round {self.figures.rounds}: task {k}: {exc!r}")
            raise

    def close_now(self) -> None:
        """Close the store, noting whether a call was inside it."""
        with self.lock:
            if self.inside:
                self.figures.closed_mid_call += 1
        self.store.close()


def threads_round(target: str, r: Round) -> None:
    """Close the store from this thread while 8 threads call it."""
    workers = [threading.Thread(target=r.thread_worker, args=(k,)) for k in range(WORKERS)]
    for w in workers:
        w.start()
    time.sleep(r.rng.uniform(0, 0.005))
    r.close_now()
    r.stop.set()
    for w in workers:
        w.join(60)
        if w.is_alive():
            r.figures.failures.append(f"round {r.figures.rounds}: a worker still runs 60 s after close")


async def asyncio_round(target: str, rng: random.Random, figures: Figures,
                        acked: dict[tuple[str, int], bytes]) -> None:
    """Cancel 8 tasks mid-call with ``wait_for``, then leave the adapter's ``async with``, which closes the store."""
    from compactstore.adapters.openai_agents import CompactStoreSession

    async with CompactStoreSession("agent", target) as agent:
        r = Round(agent.store, rng, figures, acked)

        async def task(k: int) -> None:
            step = 0
            while True:
                if k == 0:
                    await agent.add_items([{"role": "user", "content": f"turn {step}"}])
                else:
                    await asyncio.to_thread(r.call_once, k, step)
                step += 1

        try:
            await asyncio.wait_for(asyncio.gather(*(task(k) for k in range(WORKERS))),
                                   timeout=rng.uniform(0.001, 0.01))
        except TimeoutError:
            pass
        with r.lock:
            if r.inside:
                figures.closed_mid_call += 1
    # asyncio.run joins the worker threads after this returns; a StoreClosed they raise
    # is the answer to a cancelled await, which nobody reads.


def check(target: str, figures: Figures, acked: dict[tuple[str, int], bytes]) -> None:
    """Open the store again: it must verify and hold every acknowledged append as acknowledged."""
    with cs.open(target) as store:
        report = store.verify()
        if not report.ok:
            figures.failures.extend(f"verify: {p}" for p in report.problems[:10])
        for (name, pos), leaf in sorted(acked.items()):
            got = store.session(name).read(pos).leaf
            if got != leaf:
                figures.failures.append(f"{name} pos {pos}: leaf {got.hex()[:16]}, acknowledged {leaf.hex()[:16]}")


def campaign(target: str, mode: str, rounds: int, seed: int) -> Figures:
    """Run ``rounds`` rounds in ``mode`` against ``target`` and check the store after them."""
    rng = random.Random(seed)
    figures = Figures(mode)
    acked: dict[tuple[str, int], bytes] = {}
    started = time.monotonic()
    for _ in range(rounds):
        if mode == "threads":
            threads_round(target, Round(cs.open(target), rng, figures, acked))
        else:
            asyncio.run(asyncio_round(target, rng, figures, acked))
        figures.rounds += 1
    check(target, figures, acked)
    figures.seconds = round(time.monotonic() - started, 1)
    return figures


def main(argv: list[str]) -> int:
    """Run a campaign from the command line and print its figures as JSON; exit 1 on any failure."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target")
    p.add_argument("--mode", choices=["threads", "asyncio"], default="threads")
    p.add_argument("--rounds", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    figures = campaign(args.target, args.mode, args.rounds, args.seed)
    out: dict[str, Any] = asdict(figures)
    out["failures"] = figures.failures[:20]
    out["failure_count"] = len(figures.failures)
    print(json.dumps(out))
    return 1 if figures.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
