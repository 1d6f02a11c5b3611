"""Closing a store under load: ``Store.close()`` waits for the calls in flight, then refuses new ones.

The rounds run in a subprocess (``close_harness.py``), so that a crash of the process
(closing a SQLite connection under another thread's statement segfaults it) fails the
test instead of killing the test run. The short campaigns run by default; ``--slow``
runs 1,000 rounds of each, whose figures RELIABILITY.md records.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import compactstore as cs
from compactstore import index

HARNESS = Path(__file__).with_name("close_harness.py")


def _campaign(target: str, mode: str, rounds: int, seed: int = 1) -> dict[str, object]:
    """Run the harness in a subprocess and return its figures; a crash or a failure fails the test."""
    got = subprocess.run([sys.executable, str(HARNESS), target, "--mode", mode, "--rounds", str(rounds),
                          "--seed", str(seed)], capture_output=True, text=True, timeout=1800)
    assert got.returncode == 0, f"exit {got.returncode} (a negative one is the signal that killed it)\n" \
                                f"{got.stdout[-2000:]}\n{got.stderr[-4000:]}"
    figures: dict[str, object] = json.loads(got.stdout.splitlines()[-1])
    print(figures)
    return figures


@pytest.mark.parametrize("mode", ["threads", "asyncio"])
def test_closing_a_store_under_eight_workers_never_crashes(target: str, mode: str) -> None:
    """Closing the store under 8 writing threads, or under 8 asyncio tasks cancelled by wait_for, 25 rounds:
    the process survives, every worker ends with StoreClosed or not at all, and the store verifies after."""
    f = _campaign(target, mode, 25)
    assert f["failure_count"] == 0 and f["rounds"] == 25
    assert f["closed_mid_call"], f  # the close did land while calls were inside the store
    if mode == "threads":
        assert f["refused"], f  # and the threads, still looping, were refused


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["threads", "asyncio"])
def test_long_close_campaign(target: str, mode: str) -> None:
    """The same, 1,000 rounds: 0 crashes, 0 failures."""
    f = _campaign(target, mode, 1000)
    assert f["failure_count"] == 0 and f["rounds"] == 1000


def test_a_closed_store_refuses_every_call_with_store_closed(store: cs.Store) -> None:
    """After close(), a read, an append and a verify raise StoreClosed (a ValueError); closing twice is fine."""
    s = store.session("a")
    s.append(cs.Turn("user", "hi"))
    store.close()
    store.close()
    for call in (lambda: s.append(cs.Turn("user", "again")), lambda: s.read(0), store.sessions, store.verify):
        with pytest.raises(cs.StoreClosed) as caught:
            call()
        assert isinstance(caught.value, ValueError) and caught.value.hint


def test_close_waits_for_a_write_in_flight(store: cs.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write whose transaction is open when close() is called commits, and close() returns after it."""
    s = store.session("a")
    inside, release = threading.Event(), threading.Event()
    done: list[object] = []
    extend = index.extend

    def slow_index(*args: object) -> None:
        inside.set()  # the index rows are written inside the write transaction
        release.wait(10)
        extend(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(index, "extend", slow_index)
    writer = threading.Thread(target=lambda: done.append(s.append(cs.Turn("user", "x"))))
    writer.start()
    assert inside.wait(10)
    closer = threading.Thread(target=store.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()  # waiting for the write
    release.set()
    writer.join(10)
    closer.join(10)
    assert not closer.is_alive() and len(done) == 1
    with pytest.raises(cs.StoreClosed):
        s.size
