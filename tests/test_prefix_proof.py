"""Scattered reads that would read most of the tree's leaves prove the rest of it once, and nothing they return changes.

A cold resume reads events all over a session (every negative fact a digest retains).
A multi-proof per read reads every leaf of each stored tile holding a row; when that is
half the unproven tree or more, the handle reads the leaves of the rest in one range
and proves them against the sealed head, so every later read is a comparison. These
tests hold that path to the same answers as the per-row proofs: the same rows, the same
roots, and forged rows refused by position, whether or not the forgery is among the
rows read.
"""

from __future__ import annotations

import msgspec
import pytest

import compactstore as cs
from compactstore import merkle
from sqlite_edit import unguarded

N = 400


def _write(target: str) -> None:
    with cs.open(target, clock=cs.events.tick_clock()) as st:
        s = st.session("a")
        s.extend([cs.Turn("user", f"turn {i}", status="failed" if i % 3 == 0 else None) for i in range(N)])


def _forge(target: str, pos: int) -> None:
    """Rewrite the event at ``pos`` with a well-formed body and its recomputed leaf, as anyone holding the file can."""
    conn = unguarded(target)
    (sid,) = conn.execute("SELECT id FROM sessions WHERE name = 'a'").fetchone()
    (body,) = conn.execute("SELECT body FROM events WHERE session_id = ? AND pos = ?", (sid, pos)).fetchone()
    event = cs.events.decode(bytes(body))
    _, forged = cs.events.canonical(msgspec.structs.replace(event, ts=(event.ts or 0) + 1))
    conn.execute("UPDATE events SET leaf = ?, body = ? WHERE session_id = ? AND pos = ?",
                 (merkle.leaf_hash(forged), forged, sid, pos))
    conn.commit()
    conn.close()


def _leaf_reads(st: cs.Store, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Record each leaf-reading call of the store's backend from here on, by verb and hashes returned (spied, not replaced)."""
    got: list[tuple[str, int]] = []
    backend = st.backend
    hashes, leaves = backend.hashes, backend.leaves

    def spy_hashes(sid: int, coords: list[tuple[int, int]]) -> list[bytes]:
        got.append(("hashes", len(coords)))
        return hashes(sid, coords)

    def spy_leaves(sid: int, start: int, stop: int) -> list[bytes]:
        out = leaves(sid, start, stop)
        got.append(("leaves", len(out)))
        return out

    monkeypatch.setattr(backend, "hashes", spy_hashes)
    monkeypatch.setattr(backend, "leaves", spy_leaves)
    return got


SCATTERED = list(range(0, N, 3))  # a row in every stored tile: the multi-proof would read them all


def test_scattered_rows_prove_the_rest_once_then_reads_compare(sqlite_target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first scattered prefetch reads the rest's leaves in one range; later reads anywhere read no leaf."""
    _write(sqlite_target)
    with cs.open(sqlite_target) as st:
        s = st.session("a")
        want = {r.pos: r.event for r in s.scan(verify=False)}
        got = _leaf_reads(st, monkeypatch)
        reader = s.view.reader(N)
        reader.prefetch(SCATTERED)
        assert ("leaves", N) in got  # the whole tree's leaves in one range
        assert sum(n for verb, n in got if verb == "hashes") <= 16  # and no tile read for a multi-proof
        assert all(reader(p) == want[p] for p in SCATTERED)
        before = len(got)
        other = s.view.reader(N)
        other.prefetch(range(1, N, 2))
        assert len(got) == before  # every later read compares
        assert all(other(p) == want[p] for p in range(1, N, 2))


def test_a_forged_row_among_the_rows_read_is_refused_by_its_position(sqlite_target: str) -> None:
    """The range proof fails, and the rows' own multi-proof names the first row read whose proof fails.

    That is a row of the forged one's stored tile: the proofs of a tile's rows share
    its leaves, and an unstored level cannot tell which of them was edited.
    """
    _write(sqlite_target)
    _forge(sqlite_target, 99)
    with cs.open(sqlite_target) as st:
        with pytest.raises(cs.IntegrityError) as caught:
            st.session("a").view.reader(N).prefetch(SCATTERED)
        assert caught.value.session == "a"
        assert caught.value.pos is not None and caught.value.pos >> merkle.TILE_HEIGHT == 99 >> merkle.TILE_HEIGHT
        assert f"pos {caught.value.pos} " in str(caught.value)
        with pytest.raises(cs.IntegrityError, match="pos 99"):
            st.session("a").view.reader(N).prefetch([99])


def test_a_forged_row_outside_the_rows_read_does_not_refuse_them(sqlite_target: str) -> None:
    """A forgery the rows read do not depend on leaves them readable and unchanged; reading it is refused."""
    _write(sqlite_target)
    _forge(sqlite_target, 302)  # in a tile below the rows read
    with cs.open(sqlite_target) as st:
        s = st.session("a")
        far = [p for p in SCATTERED if p >= 320]
        want = {r.pos: r.event for r in s.scan(320, N, verify=False)}
        reader = s.view.reader(N)
        reader.prefetch(far)
        assert all(reader(p) == want[p] for p in far)
        with pytest.raises(cs.IntegrityError, match="pos 302"):
            s.view.reader(N).prefetch([*far, 302])


def test_root_with_from_proven_leaves_is_the_stored_trees(sqlite_target: str) -> None:
    """After the range proof, root_with over many given leaves answers as from stored roots: the true root, or not when one is wrong."""
    _write(sqlite_target)
    with cs.open(sqlite_target) as st:
        leaves = {r.pos: r.leaf for r in st.session("a").scan(verify=False)}
        cold = st.session("a").view.root_with(leaves, N)
    with cs.open(sqlite_target) as st:
        s = st.session("a")
        s.view.reader(N).prefetch(SCATTERED)
        for size in (N, N - 1, 257, 256):
            given = {p: leaves[p] for p in range(0, size, 2)}
            assert s.view.root_with(given, size) == merkle.root_of_leaves([leaves[p] for p in range(size)])
            wrong = {**given, 0: merkle.leaf_hash(b"not this")}
            assert s.view.root_with(wrong, size) != s.view.root_with(given, size)
        assert s.view.root_with(leaves, N) == cold == s.head().root
