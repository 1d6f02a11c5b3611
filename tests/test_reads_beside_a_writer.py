"""Reads and verification of an intact store while another handle commits: nothing is reported damaged.

Each test makes the other handle commit at one chosen moment of the read (between two
queries it makes), so the interleaving a concurrent writer produces now and then is
produced every time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import compactstore as cs


def _turns(n: int, tag: str = "t") -> list[cs.Event]:
    return [cs.Turn("user", f"{tag} {i}") for i in range(n)]


def test_a_scan_to_the_end_is_not_refused_when_a_writer_commits_between_its_pages_and_the_head(
    sqlite_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head is read, a commit lands, the rows are read, another commit lands: the scan is still whole.

    The rows page holds the first commit's event, beyond the head read first, so the check
    reads the head again and finds the second commit's size; the scan then asks for
    positions it never read and raises as if one were missing.
    """
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st, cs.open(sqlite_target) as other:
        s, w = st.session("a"), other.session("a")
        s.extend(_turns(30))
        backend = st.backend
        real_rows = backend.rows
        commits = iter([1, 2])

        def rows(*args: Any) -> Iterator[Any]:
            # The writer commits around the first query only; a query made again reads what is there.
            first = next(commits, None)
            if first is not None:
                w.append(cs.Turn("user", f"writer {first}"))  # after the scan read the head
            got = list(real_rows(*args))
            if first is not None:
                w.append(cs.Turn("user", f"writer {next(commits)}"))  # after its page was read
            return iter(got)

        monkeypatch.setattr(backend, "rows", rows)
        records = list(s.scan())  # IntegrityError: position 31 is missing under the sealed head of size 32
        monkeypatch.undo()
        assert [r.pos for r in records] == list(range(len(records)))
        assert st.verify().ok


def test_verify_reports_nothing_when_a_writer_commits_while_it_reads_the_rows(
    sqlite_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit between verify's read of a chunk's rows and its read of the heads is not damage."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st, cs.open(sqlite_target) as other:
        s, w = st.session("a"), other.session("a")
        s.extend(_turns(30))
        backend = st.backend
        real_rows = backend.rows
        fired = []

        def rows(sid: int, start: int, *rest: Any) -> Iterator[Any]:
            got = list(real_rows(sid, start, *rest))
            if start == 0 and not fired:
                fired.append(True)
                w.append(cs.Turn("user", "writer"))  # verify has read the first chunk's rows, not yet its heads
            return iter(got)

        monkeypatch.setattr(backend, "rows", rows)
        report = st.verify()
        monkeypatch.undo()
        assert report.ok, [str(p) for p in report.problems]  # "head of size 31 beyond the log's 30 events"
        assert st.verify().ok


@pytest.mark.parametrize("same_handle", [False, True], ids=["another handle", "the same handle"])
def test_scans_beside_a_writer_thread_are_whole_and_never_refused(sqlite_target: str, same_handle: bool) -> None:
    """A writer thread appends while scans run: every scan yields positions 0.. in order and none is refused."""
    import threading
    import time

    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st, cs.open(sqlite_target) as other:
        s = st.session("a")
        s.extend(_turns(200))
        w = (st if same_handle else other).session("a")
        stop = threading.Event()
        failed: list[BaseException] = []

        def write() -> None:
            try:
                i = 0
                while not stop.is_set():
                    w.extend(_turns(1 + i % 7, f"w{i}"))
                    i += 1
            except BaseException as exc:  # noqa: BLE001 - reported by the test below
                failed.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        scans = 0
        try:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                positions = [r.pos for r in s.scan()]
                assert positions == list(range(len(positions))) and len(positions) >= 200
                scans += 1
        finally:
            stop.set()
            writer.join()
        assert not failed, failed
        assert scans > 0
        assert [r.pos for r in s.scan()] == list(range(s.size))
