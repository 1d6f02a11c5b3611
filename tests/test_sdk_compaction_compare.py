"""CompactStoreSession against the SDK's own compacting session, small: the SDK's real classes, a local endpoint."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

pytest.importorskip("agents", reason="the test extra (openai-agents) is not installed")
pytest.importorskip("agents.memory.openai_responses_compaction_session",
                    reason="this openai-agents has no OpenAIResponsesCompactionSession")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import sdk_compaction  # noqa: E402


def test_the_compacted_contexts_differ_where_it_matters(tmp_path: Path) -> None:
    """Both feed valid Responses input; only ours keeps every failure and rejection findable, certified, after a restart."""
    r = asyncio.run(sdk_compaction.compare(60, str(tmp_path), repeat=1))
    ours, sdk, restart = r["ours"], r["sdk"], r["restart"]
    negatives = r["failed"] + r["rejected"]
    assert r["failed"] >= 8 and r["rejected"] >= 5
    # The SDK's own code ran: it decided, called the endpoint through the real client, replaced its history.
    assert r["compaction_calls"] >= 10 and sdk["opaque_items"] == 1
    assert ours["invalid"] == 0 and sdk["invalid"] == 0
    # Both compact: neither feeds back every item it was given.
    assert ours["items"] < r["items_added"] and sdk["items"] < r["items_added"]
    # Ours: every failed and rejected call is named in the fed context or in its summaries' retained facts,
    # and the store still holds each; the SDK's compaction folds them into an item no one can read back.
    assert ours["negatives_retained"] == ours["negatives_stored"] == negatives
    assert sdk["negatives_retained"] < negatives and sdk["negatives_stored"] < negatives
    assert ours["rejected_fed"] == r["rejected"]
    # The literal an open obligation needs is fed verbatim by ours.
    assert ours["live_fed"] >= 1
    assert ours["mode"] == "certified" and ours["verified"]
    # A restart gives both the same context; only ours still has the raw conversation.
    assert restart["ours_same"] and restart["sdk_same"] and restart["ours_mode"] == "certified"
    assert restart["ours_raw_items"] >= r["items_added"] > restart["sdk_raw_items"]
