"""Crash safety: writer processes on a durable SQLite store, killed with SIGKILL at random moments.

The harness and every check it makes after each kill are in ``crash_harness.py``. The
short campaign runs by default; ``--slow`` (or ``benchmarks/crash_campaign.py``) runs
the long one whose figures RELIABILITY.md records.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from crash_harness import Campaign


def _assert_clean(campaign: Campaign) -> None:
    f = campaign.figures
    print(f.summary())
    assert f.failures == [], "\n".join(f.failures[:10])
    assert (f.lost, f.duplicated, f.phantom) == (0, 0, 0), f.summary()


def test_killed_writers_lose_no_acknowledged_event(tmp_path: Path) -> None:
    """Two writers killed at random moments, 20 kills: the store opens and verifies after every one,
    every acknowledged operation is there exactly once, no node or marker is half-written, every
    marker resumes to the digest it gave before, and a cut-off idempotent append retried is there once."""
    campaign = Campaign(tmp_path, seed=20261130)
    figures = campaign.run(kills=20)
    _assert_clean(campaign)
    assert figures.kills_mid_op >= 10, figures.summary()  # most kills land inside an operation
    assert figures.acked_ops > 200 and figures.markers_checked > 20, figures.summary()


def test_killed_writers_lose_nothing_without_durable_either(tmp_path: Path) -> None:
    """durable=False (synchronous=NORMAL) promises the same against a process crash: 10 kills."""
    campaign = Campaign(tmp_path, seed=99, durable=False)
    campaign.run(kills=10)
    _assert_clean(campaign)


def test_writers_side_by_side_keep_every_session_sound(tmp_path: Path) -> None:
    """Four writers appending, compacting, digesting and marking on one file at once, no kill:
    nothing lost or doubled, every node's spills readable, every marker resumes as it did."""
    campaign = Campaign(tmp_path, seed=7, writers=4)
    campaign.calm(ops=120)
    _assert_clean(campaign)
    kinds = {line["kind"] for line in campaign.acked.values()}
    assert {"append", "idem", "extend", "bind", "oblige", "compact", "mark"} <= kinds, kinds


@pytest.mark.slow
def test_long_crash_campaign(tmp_path: Path) -> None:
    """The long campaign: 300 kills."""
    campaign = Campaign(tmp_path, seed=1)
    figures = campaign.run(kills=300)
    print(figures.summary())
    _assert_clean(campaign)
