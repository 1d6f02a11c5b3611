"""Session.context() keeps a marker's certification between calls: what it keeps, and when it decides afresh."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlite_edit import tamper
from test_loop import _grown, _stretch

import compactstore as cs
from compactstore.resolver import SummaryItem


def test_a_kept_certification_serves_what_was_proven_and_a_fresh_store_finds_a_change(tmp_path: Path) -> None:
    """A second context() serves the content proven by the first, not a body changed since; a fresh store refuses it."""
    path = tmp_path / "kept.db"
    with cs.open(str(path)) as store:
        s = store.session("loop")
        digests, _ = _grown(s)
        s.mark()
        first = s.context()
        assert first.mode == "certified"
        fact = _a_retained_fact(s)
        tamper(path, "UPDATE events SET body = CAST(? AS BLOB) WHERE pos = ?", (b'{"kind":"turn"}', fact))
        # The log under the marker cannot change without a seal failing, so the certification,
        # proven once against the checkpoint root, stands: the content is the proven one.
        again = s.context()
        assert again.mode == "certified" and again.digest == first.digest
        _stretch(s, 50, fail=False)  # the tail is read and proven at every call
        grown = s.context()
        assert grown.mode == "certified" and grown.size == s.size and grown.context[: len(first.context)] == first.context
    with cs.open(str(path)) as store, pytest.raises(cs.IntegrityError):
        store.session("loop").context()


def test_a_redaction_decides_the_context_afresh(store: cs.Store) -> None:
    """A redaction in the digest's span drops the kept certification: the context is decided again and falls back."""
    s = store.session("loop")
    digests, _ = _grown(s)
    s.mark()
    assert s.context().mode == "certified"
    s.redact([_a_retained_fact(s)], "personal data")
    r = s.context()
    assert r.mode == "fallback" and r.marker == -1 and r.reasons
    assert not any(isinstance(i, SummaryItem) for i in r.context)


def _a_retained_fact(s: cs.Session) -> int:
    """Return the position of a negative fact the session's digest retains (through its first L1 child)."""
    return next(x.pos for n in s.nodes() if n.tier == 1 for x in n.negative_facts)


def _spilling(s: cs.Session, turns: int) -> None:
    """Play ``turns`` turns that re-bind keys an open obligation needs, so that compaction spills them."""
    policy = cs.CompactionPolicy(every=12, roll_up_every=3, summarizer=lambda records: f"{len(records)} events")
    for t in range(turns):
        s.extend([cs.Turn("user", f"turn {t}"),
                  cs.ToolResult(f"c{t}", f"ERROR {t}", ok=False, status="failed") if t % 3 == 0 else cs.Turn("assistant", "ok"),
                  cs.Binding(key=f"k{t % 4}", value=f"v-{t}")])
        if t == 2:
            s.extend([cs.Obligation(name="restore", needs=["k0", "k1", "k2", "k3"])])
        s.maintain(policy)


def test_a_cold_context_proves_what_its_rules_read_in_one_batch_however_many_spills(tmp_path: Path) -> None:
    """A fresh store's context() reads a digest's spill sources in batches: its subtree-root reads do not grow with the session."""
    path = tmp_path / "cold.db"
    calls = []
    for turns in (120, 240):
        with cs.open(str(path)) as store:
            _spilling(store.session(f"s{turns}"), turns)
        with cs.open(str(path)) as store:
            s = store.session(f"s{turns}")
            backend = store.backend
            hashes = backend.hashes
            counted: list[int] = []

            def spy(sid: int, coords: list[tuple[int, int]]) -> list[bytes]:
                counted.append(len(coords))
                return hashes(sid, coords)

            backend.hashes = spy  # type: ignore[method-assign]
            got = s.context()
            assert got.mode == "certified" and any(i.spills for i in got.context if isinstance(i, SummaryItem))
            spills = sum(len(i.spills) for i in got.context if isinstance(i, SummaryItem))
            calls.append((spills, len(counted)))
    (few, before), (many, after) = calls
    # A digest carries the spills of the values still live (four keys), not every spill ever made.
    assert 0 < few and 0 < many <= 4 * 4 and after <= before + 2, calls
