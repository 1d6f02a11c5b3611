"""Redaction: deletion in an append-only log erases bodies, keeps leaves, and is never certified."""

from __future__ import annotations

import sqlite3

import pytest
from test_compaction import ROLLBACK, migration

import compactstore as cs
from compactstore import merkle


@pytest.fixture
def session(store: cs.Store) -> cs.Session:
    """Return a session holding the migration story."""
    s = store.session("migration")
    migration(s)
    return s


def test_redacted_positions_read_as_gone_and_the_tree_still_verifies(store: cs.Store, session: cs.Session) -> None:
    """Bodies are erased, leaves and heads stay, verify() counts them as redacted."""
    before = session.head()
    bodies = [r.body for r in session.scan()]
    red = session.redact([4, 1], "user asked to forget")
    assert red.event.positions == [1, 4] and red.kind == "redaction"  # type: ignore[attr-defined]
    got = session.read(4)
    assert got.kind == "redacted" and got.body == b""
    assert got.event == cs.events.Redacted(by=red.pos)
    scanned = {r.pos: r.event for r in session.scan() if r.kind == "redacted"}
    assert scanned == {1: cs.events.Redacted(by=red.pos), 4: cs.events.Redacted(by=red.pos)}
    assert session.head(before.size) == before
    proof = session.inclusion_proof(4, before.size)
    assert merkle.verify_inclusion(bodies[4], 4, before.size, proof, before.root)
    report = store.verify()
    assert report.ok and report.redacted == 2


def test_bad_redactions_write_nothing(session: cs.Session) -> None:
    """Out-of-range, repeated and already-redacted positions are refused."""
    size = session.size
    for positions in ([], [99], [2, 2]):
        with pytest.raises(cs.InvalidEvent):
            session.redact(positions, "x")
    assert session.size == size
    session.redact([2], "x")
    with pytest.raises(cs.InvalidEvent, match="already redacted"):
        session.redact([2, 3], "again")
    assert session.read(3).kind == "turn"


def test_a_redacted_literal_cannot_be_restored_or_certified(session: cs.Session) -> None:
    """A node whose kept excerpt was redacted is erased with it and no longer certifies; its literal is gone from the log."""
    node = session.compact(0, 8, loss=cs.LossClass.LOSSLESS, keep=cs.AUTO)
    art = session.artifact(node)
    marker = session.mark(node)
    assert session.resume(marker).mode == "certified"
    assert cs.reconstruct(art, "authorize", session.lookup)
    red = session.redact([5], "secret path")
    assert red.event.positions == [5, node.pos]  # type: ignore[attr-defined]
    res = session.resume(marker)
    assert res.mode == "fallback" and f"anchoring at pos {node.pos}: redacted: the node was erased with what it was built from" in res.reasons
    assert session.lookup("rollback") is None
    with pytest.raises(cs.ReconstructionUnsoundError, match="absent"):
        cs.reconstruct(art, "authorize", session.lookup)
    with pytest.raises(cs.MarkerInvalid):
        session.mark(node)


def test_redaction_erases_the_idempotency_key_too(session: cs.Session) -> None:
    """A key can carry the data being forgotten, so it goes with the body; a retry appends anew."""
    r = session.append(cs.Turn("user", "card 4242"), idempotency_key="card-4242")
    session.redact([r.pos], "PII")
    again = session.append(cs.Turn("user", "card 4242"), idempotency_key="card-4242")
    assert again.pos == r.pos + 2


def test_the_database_allows_only_redaction_as_an_update(target: str) -> None:
    """Erasing an unrecorded body, or changing anything else, is refused by the triggers."""
    if "://" in target:
        pytest.skip("checks the SQLite triggers directly")
    with cs.open(target) as st:
        st.session("s").extend([cs.Turn("user", "a"), cs.Turn("user", "b")])
        st.session("s").redact([0], "x")
    conn = sqlite3.connect(target)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("UPDATE events SET body = NULL, kind = 'redacted' WHERE pos = 1")  # the trigger lets this through
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("UPDATE events SET leaf = x'00' WHERE pos = 0")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("DELETE FROM redactions")
    conn.close()


def test_forged_redactions_are_reported(target: str) -> None:
    """An attacker who erases a body without a redaction event is caught by verify()."""
    if "://" in target:
        pytest.skip("edits the SQLite file directly")
    with cs.open(target) as st:
        st.session("s").extend([cs.Turn("user", "a"), cs.Turn("user", "b"), cs.Turn("user", "c")])
    conn = sqlite3.connect(target)
    conn.execute("INSERT INTO redactions VALUES (1, 1, 2)")
    conn.execute("UPDATE events SET body = NULL, kind = 'redacted' WHERE pos = 1")  # the trigger lets this through
    conn.commit()
    conn.close()
    with cs.open(target) as st:
        report = st.verify()
    assert not report.ok and {p.table for p in report.problems} == {"redactions"}
