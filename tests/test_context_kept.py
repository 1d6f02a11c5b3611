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
        fact = digests[-1].negative_facts[0].pos
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
    s.redact([digests[-1].negative_facts[0].pos], "personal data")
    r = s.context()
    assert r.mode == "fallback" and r.marker == -1 and r.reasons
    assert not any(isinstance(i, SummaryItem) for i in r.context)
