"""The resume simulation's rolling mode, small: sessions compacted by a policy never resume divergent."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import resume_sim  # noqa: E402


@pytest.mark.parametrize("drop", [None, 0.05, 0.3], ids=["defaults", "drop-5%", "drop-30%"])
def test_rolling_compaction_resumes_never_diverge(drop: float | None, tmp_path: Path) -> None:
    """Sessions maintained by CompactionPolicy (with no argument too) and resumed by Session.context() act on nothing the log contradicts."""
    naive, ours, extra = resume_sim.simulate_rolling(drop, 2, 240, 40, 3, path=str(tmp_path))
    assert extra["l1"] >= 8 and extra["l2"] >= 1 and extra["markers"] >= 1, extra  # the loop ran: nodes, digests, markers
    assert ours.resumes == naive.resumes >= 8
    assert ours.divergent == 0, (ours, extra)
    assert ours.fallbacks < ours.resumes  # some resumes were certified, not all from the raw log
    if drop == 0.3:
        assert naive.divergent > 0  # the oracle sees what a summary that drops facts does to a trusting resumer


def test_dropping_summarizer_is_deterministic_and_drops() -> None:
    """The same records give the same text; at drop 1 a span's text states none of its facts."""
    import compactstore as cs

    with cs.open(":memory:", clock=cs.events.tick_clock()) as store:
        s = store.session("s")
        s.bind("k", "migrations/003_down.sql")
        s.append(cs.ToolCall("c1", "run_sql", {"n": 1}))
        s.append(cs.Turn("user", "No. Do not use approach A0.", status="rejected"))
        records = list(s.scan())
    full = resume_sim.DroppingSummarizer(0.0, "x")(records)
    assert full == resume_sim.DroppingSummarizer(0.0, "x")(records)
    assert "0: BOUND k = \"migrations/003_down.sql\"" in full and "UNRESOLVED tool_call:c1" in full
    assert "REJECTED" in full
    assert resume_sim.DroppingSummarizer(1.0, "x")(records).splitlines()[1:] == []
