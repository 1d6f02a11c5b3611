"""Inside a snapshot of the store, reads show one state of it, whatever another handle commits meanwhile."""

from __future__ import annotations

import threading

import pytest

import compactstore as cs


def _turns(n: int, tag: str = "t") -> list[cs.Event]:
    return [cs.Turn("user", f"{tag} {i}") for i in range(n)]


def test_a_snapshot_does_not_see_what_another_handle_commits(target: str) -> None:
    """Inside snapshot(), reads show the store as of the first of them, though another handle commits."""
    with cs.open(target) as st, cs.open(target) as other:
        st.session("a").extend(_turns(5))
        backend = st.backend
        sid = backend.session_id("a")
        assert sid is not None
        with backend.snapshot():
            bounds, head = backend.seq_bounds(), backend.head(sid)
            other.session("a").extend(_turns(3, "other"))
            other.session("new").append(cs.Turn("user", "x"))
            assert backend.seq_bounds() == bounds and backend.head(sid) == head
            assert [r.pos for r in backend.rows(sid, 0, None, 2)] == list(range(5))
            assert [n for _, n in backend.sessions()] == ["a"]
            with backend.snapshot():  # nested: the same state
                assert backend.seq_bounds() == bounds
        assert backend.seq_bounds()[0] == 9
        assert st.verify().ok


def test_a_snapshot_on_sqlite_makes_a_writer_of_the_same_handle_wait(sqlite_target: str) -> None:
    """A thread appending through the handle that holds a snapshot waits for it to end, then commits; the store verifies."""
    with cs.open(sqlite_target) as st:
        s = st.session("a")
        s.extend(_turns(5))
        backend = st.backend
        errors: list[BaseException] = []

        def append() -> None:
            try:
                s.append(cs.Turn("user", "waited"))
            except BaseException as exc:
                errors.append(exc)

        writer = threading.Thread(target=append)
        with backend.snapshot():
            bounds = backend.seq_bounds()
            writer.start()
            writer.join(0.3)
            assert writer.is_alive() and not errors  # waiting, not refused
            assert backend.seq_bounds() == bounds
        writer.join()
        assert not errors, errors
        assert backend.seq_bounds()[0] == 6 and s.size == 6
        assert st.verify().ok


def test_a_write_inside_a_snapshot_on_sqlite_is_refused_and_the_snapshot_holds(sqlite_target: str) -> None:
    """An append from the thread holding the snapshot is refused; its reads still show the state they did."""
    with cs.open(sqlite_target) as st, cs.open(sqlite_target) as other:
        st.session("a").extend(_turns(5))
        backend = st.backend
        with backend.snapshot():
            bounds = backend.seq_bounds()
            with pytest.raises(cs.CompactStoreError, match="inside a snapshot"):
                st.session("a").append(cs.Turn("user", "x"))
            other.session("a").append(cs.Turn("user", "y"))
            assert backend.seq_bounds() == bounds
        assert backend.seq_bounds()[0] == 6
        assert st.verify().ok


def test_a_snapshot_of_a_closed_store_is_refused(target: str) -> None:
    """snapshot() on a closed backend raises StoreClosed, as every other call does."""
    st = cs.open(target)
    backend = st.backend
    st.close()
    with pytest.raises(cs.StoreClosed):
        with backend.snapshot():
            pass


def test_closing_inside_a_snapshot_ends_it(target: str) -> None:
    """A store closed from inside a snapshot leaves the context cleanly, and reads after it raise StoreClosed."""
    st = cs.open(target)
    st.session("a").extend(_turns(3))
    backend = st.backend
    with backend.snapshot():
        backend.seq_bounds()
        st.close()
        with pytest.raises(cs.StoreClosed):
            backend.seq_bounds()


def test_a_redaction_beside_another_handles_snapshot_does_not_wait_out_the_busy_timeout(sqlite_target: str) -> None:
    """The checkpoint after an erasure is best effort: a long read elsewhere delays it at most CHECKPOINT_WAIT_MS.

    The erasure itself commits, and the body is gone from every read after the snapshot ends.
    """
    import time

    from compactstore.backends import sqlite as sqlite_backend

    with cs.open(sqlite_target) as st, cs.open(sqlite_target) as other:
        st.session("a").extend(_turns(20))
        with st.backend.snapshot():
            st.backend.sessions()  # the snapshot's read transaction is open from here
            began = time.monotonic()
            other.session("a").redact([3], "gone")
            waited = time.monotonic() - began
        # A liveness bound, not a speed claim: without the short wait it is the 60 s busy timeout.
        assert waited < sqlite_backend.BUSY_TIMEOUT_MS / 1000 / 2
        assert st.session("a").read(3).kind == "redacted"
        assert st.verify().ok


def test_a_task_started_inside_a_postgres_snapshot_does_not_read_through_it_after_it_ends(pg_url: str) -> None:
    """A task created inside snapshot() that reads once the context has ended sees what is committed.

    The task's context is a copy of the one the snapshot ran in; the snapshot's connection
    went back to the pool when the context ended, and another thread's snapshot has it now.
    """
    import asyncio

    from compactstore.backends.postgres import _PINNED

    with cs.open(pg_url) as st:
        s = st.session("a")
        s.append(cs.Turn("user", "one"))
        backend = st.backend

        async def main() -> tuple[int, int]:
            go = asyncio.Event()

            async def reader() -> int:
                await go.wait()
                return s.size

            with backend.snapshot():
                assert s.size == 1
                held = _PINNED.get()[backend].conn
                task = asyncio.create_task(reader())
            entered, release = threading.Event(), threading.Event()

            def other() -> None:  # another thread's snapshot (a verify(), say) on the connection the first one held
                for _ in range(20):
                    with backend.snapshot():
                        if _PINNED.get()[backend].conn is held:
                            backend.seq_bounds()
                            entered.set()
                            release.wait(10)
                            return

            thread = threading.Thread(target=other)
            thread.start()
            try:
                assert entered.wait(10)
                s.append(cs.Turn("user", "two"))
                now = s.size
                go.set()
                return now, await task
            finally:
                release.set()
                thread.join()

        now, seen = asyncio.run(main())
        assert now == 2
        assert seen == 2, "the task read through another thread's snapshot"


def test_a_write_inside_a_snapshot_is_refused_on_either_backend(target: str) -> None:
    """An append from the thread holding the snapshot is refused, and the store is left as it was, on SQLite and PostgreSQL alike.

    Were it to commit, the thread's own reads in the snapshot would not find the event
    the append just returned.
    """
    with cs.open(target) as st:
        s = st.session("a")
        s.extend(_turns(2))
        with st.backend.snapshot():
            st.backend.seq_bounds()
            with pytest.raises(cs.CompactStoreError, match="inside a snapshot"):
                s.append(cs.Turn("user", "inside"))
        assert s.size == 2


def test_a_task_s_own_snapshot_opened_inside_another_keeps_its_state_after_the_outer_one_ends(target: str) -> None:
    """A task created inside snapshot() that opens a snapshot of its own reads one state until its own context ends.

    The outer context ending first (it belongs to another task) must not end the task's
    snapshot: its reads still show the state they did, and a write from it is still refused.
    """
    import asyncio

    with cs.open(target) as st, cs.open(target) as other:
        s = st.session("a")
        s.extend(_turns(5))
        backend = st.backend

        async def main() -> tuple[tuple[int, int, int], tuple[int, int, int], str]:
            started, go = asyncio.Event(), asyncio.Event()

            async def task() -> tuple[tuple[int, int, int], tuple[int, int, int], str]:
                try:
                    snapshot = backend.snapshot()
                    snapshot.__enter__()
                except cs.CompactStoreError:
                    # SQLite: the handle's one connection holds the other task's read
                    # transaction; a snapshot of the task's own is refused, not nested in it.
                    started.set()
                    return (0, 0, 0), (0, 0, 0), "refused at entry"
                try:
                    first = backend.seq_bounds()
                    started.set()
                    await go.wait()
                    second = backend.seq_bounds()
                    try:
                        s.append(cs.Turn("user", "inside the task's snapshot"))
                        wrote = "accepted"
                    except cs.CompactStoreError:
                        wrote = "refused"
                finally:
                    snapshot.__exit__(None, None, None)
                return first, second, wrote

            with backend.snapshot():
                backend.seq_bounds()
                running = asyncio.create_task(task())
                await started.wait()
            other.session("a").extend(_turns(3, "other"))
            go.set()
            return await running

        first, second, wrote = asyncio.run(main())
        if wrote == "refused at entry":
            assert not target.startswith("postgres"), target  # PostgreSQL gives the task a transaction of its own
            return
        assert second == first, f"the task's snapshot saw {first}, then {second}"
        assert wrote == "refused"


def test_another_task_of_the_thread_does_not_read_or_write_through_a_task_s_snapshot(target: str) -> None:
    """A task that opened no snapshot, running while another task of its thread holds one, is not inside it.

    Its read shows what another handle has committed (or is refused, as its own snapshot
    would be on SQLite), never the holder's state; its append is not refused as one made
    inside a snapshot.
    """
    import asyncio

    with cs.open(target) as st, cs.open(target) as other:
        st.session("a").append(cs.Turn("user", "one"))

        async def main() -> tuple[object, str]:
            inside, go = asyncio.Event(), asyncio.Event()

            async def holder() -> None:
                with st.backend.snapshot():
                    st.backend.seq_bounds()
                    inside.set()
                    await go.wait()

            held = asyncio.create_task(holder())
            try:
                await inside.wait()
                other.session("a").append(cs.Turn("user", "two"))
                try:
                    seen: object = st.backend.seq_bounds()[0]
                except cs.CompactStoreError:
                    seen = "refused"
                try:
                    st.session("b").append(cs.Turn("user", "b"))
                    wrote = "accepted"
                except cs.CompactStoreError as exc:
                    wrote = str(exc)
                return seen, wrote
            finally:
                go.set()
                await held

        seen, wrote = asyncio.run(main())
        assert seen in (2, "refused"), f"the task read the other task's snapshot: {seen} events"
        assert "inside a snapshot" not in wrote, wrote
