"""Verification checks one state of the store, whatever another handle commits meanwhile.

The writers here are real: a thread appending through a second handle while the first
verifies, or a process of its own beside worker processes, which cannot share the
snapshot (:meth:`Backend.snapshot`) that gives verification its one state.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import compactstore as cs
from compactstore import verify


def _turns(n: int, tag: str = "t") -> list[cs.Event]:
    return [cs.Turn("user", f"{tag} {i}") for i in range(n)]


@contextmanager
def _appending(target: str, names: tuple[str, ...] = ("a",)) -> Iterator[Callable[[], int]]:
    """Append to ``names`` in turn through a handle of its own on a thread, until the block ends; yield the count so far."""
    stop, errors, done = threading.Event(), [], [0]

    def run() -> None:
        try:
            with cs.open(target) as other:
                sessions = [other.session(n) for n in names]
                while not stop.is_set():
                    sessions[done[0] % len(sessions)].extend(_turns(1 + done[0] % 3, "writer"))
                    done[0] += 1
                    time.sleep(0.001)  # commits all along, and a log that stays small
        except BaseException as exc:  # handed to the test below
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        while not done[0] and not errors and thread.is_alive():
            time.sleep(0.001)  # the writer is under way before the block starts
        yield lambda: done[0]
    finally:
        stop.set()
        thread.join()
    assert not errors, errors


def test_verify_reports_nothing_while_another_handle_appends(target: str) -> None:
    """verify() run again and again while a thread appends through another handle reports every time that all is well."""
    with cs.open(target) as st:
        st.session("a").extend(_turns(200))
        st.session("b").extend(_turns(50))
        reports = []
        with _appending(target, ("a", "b", "c")) as commits:
            before = commits()
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline or len(reports) < 3:
                reports.append(st.verify())
            during = commits() - before
        assert during > 0  # the writer did commit while verify ran
        assert all(r.ok for r in reports), [str(p) for r in reports for p in r.problems][:10]
        assert st.verify().ok


#: A writer in a process of its own: appends to session "a" until the file ``argv[2]`` exists.
_WRITER = """
import os, sys
import compactstore as cs
with cs.open(sys.argv[1]) as st:
    s, n = st.session("a"), 0
    while not os.path.exists(sys.argv[2]):
        s.append(cs.Turn("user", f"writer {n}"))
        n += 1
"""


def test_verify_with_worker_processes_reports_nothing_while_another_process_appends(
    target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verify(workers=2), whose workers read on connections of their own, is ok beside a writer too."""
    with cs.open(target) as st:
        s = st.session("a")
        for _ in range(3):
            s.extend(_turns(3000))  # chunks for the workers, and a part of one for this process
        monkeypatch.setattr(verify, "_TASK_CHUNKS", 1)  # a task per chunk: hand-overs while the writer runs
        stop = tmp_path / "stop"
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, target, str(stop)],
                                  env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        try:
            while st.backend.seq_bounds()[0] == 9000:  # the writer is under way
                assert writer.poll() is None, "the writer process ended"
                time.sleep(0.01)
            before = st.backend.seq_bounds()[0]
            reports = [st.verify(workers=2) for _ in range(2)]
            assert st.backend.seq_bounds()[0] > before
        finally:
            stop.touch()
            assert writer.wait(60) == 0
        assert all(r.ok and r.events >= 9000 for r in reports), [str(p) for r in reports for p in r.problems][:10]
        assert st.verify(workers=2) == st.verify(workers=1)


def test_verify_with_worker_processes_reports_nothing_when_another_handle_redacts_meanwhile(sqlite_target: str) -> None:
    """A redaction committed while verify() runs with workers is not reported as damage; the store verifies after it too.

    The redaction comes from the progress callback, once the first chunk is in: its position
    lies in a chunk the workers are handed later.
    """
    chunk = verify._CHUNK
    with cs.open(sqlite_target) as st, cs.open(sqlite_target) as other:
        s = st.session("a")
        for i in range(40):
            s.extend(_turns(chunk, f"c{i}"))
        fired: list[int] = []

        def progress(done: int, count: int) -> None:
            if not fired and done >= chunk:
                fired.append(done)
                other.session("a").redact([30 * chunk + 5], "gone")

        report = st.verify(workers=2, progress=progress)
        assert fired
        assert report.ok, [str(p) for p in report.problems]
        assert st.verify(workers=2).ok


def test_verify_with_worker_processes_beside_a_writer_thread_of_another_handle_in_this_process(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verify(workers=2) while a thread of this process appends through another handle: every report is ok.

    Workers forked beside it could inherit a SQLite mutex the writer held at the fork and
    wait for ever; so on SQLite this process checks alone (no worker process runs, below),
    and on PostgreSQL the workers open the store to read only, taking no write lock.
    """
    with cs.open(target) as st, cs.open(target) as other:
        s = st.session("a")
        for _ in range(3):
            s.extend(_turns(3000))
        monkeypatch.setattr(verify, "_TASK_CHUNKS", 1)
        stop = threading.Event()
        failed: list[BaseException] = []

        def write() -> None:
            w, i = other.session("a"), 0
            try:
                while not stop.is_set():
                    w.extend(_turns(50, f"w{i}"))
                    i += 1
            except BaseException as exc:  # noqa: BLE001 - reported below
                failed.append(exc)

        thread = threading.Thread(target=write)
        thread.start()
        children: list[int] = []
        try:
            reports = [st.verify(workers=2, progress=lambda *_: children.append(len(multiprocessing.active_children())))
                       for _ in range(3)]
        finally:
            stop.set()
            thread.join()
        assert not failed, failed
        assert all(r.ok and r.events >= 9000 for r in reports), [str(p) for r in reports for p in r.problems][:10]
        if not target.startswith("postgres"):
            assert not any(children), "a worker process was forked beside a thread that uses SQLite"
        assert st.verify(workers=2) == st.verify(workers=1)


def test_verify_forks_workers_for_a_sqlite_store_when_no_other_thread_runs(sqlite_target: str) -> None:
    """The rule above takes workers away only where another thread runs: alone, verify(workers=2) forks them."""
    with cs.open(sqlite_target) as st:
        s = st.session("a")
        for _ in range(3):
            s.extend(_turns(3000))
        assert threading.active_count() == 1
        children: list[int] = []
        report = st.verify(workers=2, progress=lambda *_: children.append(len(multiprocessing.active_children())))
        assert report.ok and any(children)


#: verify(workers=2) again and again while a thread appends through another handle: prints "done" once all end.
_VERIFY_BESIDE_A_WRITER_THREAD = """
import sys, threading
import compactstore as cs
target = sys.argv[1]
with cs.open(target) as st, cs.open(target) as other:
    st.session("a").extend([cs.Turn("user", f"t {i}") for i in range(9000)])
    stop = threading.Event()
    def write():
        w = other.session("a")
        while not stop.is_set():
            w.extend([cs.Turn("user", "w")] * 50)
    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        for _ in range(5):
            assert st.verify(workers=2).ok
    finally:
        stop.set()
        thread.join()
print("done")
"""


def test_verify_asked_for_workers_beside_a_writer_thread_ends_every_time(sqlite_target: str) -> None:
    """verify(workers=2) while a thread of the process appends ends every time, ok (in a child, so a hang is bounded).

    A worker forked while that thread was inside SQLite waited for ever; on SQLite such a
    process now checks alone (the test above sees no worker process run).
    """
    # A liveness bound, far above the few seconds it takes: a stuck worker waits for ever.
    with subprocess.Popen([sys.executable, "-c", _VERIFY_BESIDE_A_WRITER_THREAD, sqlite_target],
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True) as child:
        try:
            out, err = child.communicate(timeout=180)
            assert child.returncode == 0 and out.strip() == "done", err[-2000:]
        except subprocess.TimeoutExpired:
            pytest.fail("verify(workers=2) beside a writer thread did not end within 180 s")
        finally:
            try:
                os.killpg(child.pid, signal.SIGKILL)  # the process and any worker it forked
            except ProcessLookupError:
                pass
            child.communicate()  # reaps it and closes its pipes
            for suffix in ("-wal", "-shm"):  # the writer's log grows while the snapshot holds it
                Path(sqlite_target + suffix).unlink(missing_ok=True)
