"""Every derived event is held to the rules at the one commit, whichever way it arrives."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner
from forge import unchecked
from test_compaction import migration

import compactstore as cs
from compactstore import compaction
from compactstore import events as ev
from compactstore.cli import main


def _bytes(path: str) -> str:
    """Return a digest of the store's files (the database and its write-ahead log)."""
    h = hashlib.sha256()
    for suffix in ("", "-wal"):
        p = Path(path + suffix)
        h.update(p.read_bytes() if p.exists() else b"")
    return h.hexdigest()


def _lossless_dropping_a_binding(s: cs.Session) -> ev.Summary:
    """Return an L1 node over [0, 8) that claims LOSSLESS and keeps no binding (migration() binds one there)."""
    node = compaction.compaction(s.view, s.size, 0, 8, on_risk="spill")[-1]
    assert isinstance(node, ev.Summary)
    return msgspec.structs.replace(node, loss=cs.LossClass.LOSSLESS, spills=[], contract=None)


def _rules_broken(s: cs.Session) -> list[tuple[str, ev.Event, type[Exception]]]:
    """Return derived events that each break one rule, with the typed error that refuses them."""
    size = s.size
    lossy = compaction.compaction(s.view, size, 0, 8, on_risk="spill")
    node = lossy[-1]
    assert isinstance(node, ev.Summary)
    return [
        ("LOSSLESS without its binding", _lossless_dropping_a_binding(s), cs.CompactionInvariantError),
        ("lossy without the needed binding (the gate)", msgspec.structs.replace(node, spills=[], contract=None),
         cs.CompactionInvariantError),
        ("a spill of another value", msgspec.structs.replace(lossy[0], value="elsewhere.sql"), cs.InvalidEvent),
        ("a marker over a node that is not there", ev.RecoveryMarker(
            size=size, root=s.head(size).root.hex(), node=size - 1, conditions=list(cs.markers.CONDITIONS),
            path=[size - 1]), cs.MarkerInvalid),
    ]


def test_a_derived_event_that_breaks_a_rule_is_refused_by_the_api_and_nothing_is_written(sqlite_target: str) -> None:
    """append and extend refuse each rule-breaking node, spill and marker with that rule's error; the file is unchanged."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as store:
        s = store.session("m")
        migration(s)
        cases = _rules_broken(s)
    before = _bytes(sqlite_target)
    for name, event, error in cases:
        with cs.open(sqlite_target) as store:
            s = store.session("m")
            with pytest.raises(error):
                s.append(event)
            with pytest.raises(error):
                s.extend([cs.Turn("user", "more"), event])
        assert _bytes(sqlite_target) == before, name


def test_an_l2_claiming_lossless_over_lossy_children_is_refused(store: cs.Store) -> None:
    """Loss-class monotonicity holds for an L2 appended by hand as for roll_up."""
    s = store.session("m")
    migration(s)
    a, b = s.compact(0, 8, on_risk="spill"), s.compact(8, 11)
    size = s.size
    l2 = compaction.roll_up(s.view, size, [a, b])[-1]
    with pytest.raises(cs.CompactionInvariantError, match="cannot be LOSSLESS"):
        s.append(msgspec.structs.replace(l2, loss=cs.LossClass.LOSSLESS))
    assert s.size == size
    assert s.append(l2).pos == size  # the same node as built keeps the rules


def test_the_cli_append_refuses_a_rule_breaking_node_and_writes_nothing(sqlite_target: str, tmp_path: Path) -> None:
    """`compactstore append` of a node that claims LOSSLESS while dropping a binding exits 1 and leaves the file as it was."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as store:
        s = store.session("m")
        migration(s)
        line = ev.encode(_lossless_dropping_a_binding(s)).decode()
    before = _bytes(sqlite_target)
    lines = tmp_path / "events.jsonl"
    lines.write_text(line + "\n")
    result = CliRunner().invoke(main, ["append", str(lines), "-s", sqlite_target, "--session", "m"])
    assert result.exit_code == 1, result.output
    assert "LOSSLESS" in result.output
    assert _bytes(sqlite_target) == before


def test_copy_from_a_doctored_store_refuses_the_node_the_rules_refuse(tmp_path: Path) -> None:
    """A node that entered a store by a writer that skips the rules does not enter a copy of it: nothing is copied."""
    src, dst = str(tmp_path / "src.db"), str(tmp_path / "dst.db")
    with cs.open(src, clock=cs.events.tick_clock()) as store:
        s = store.session("m")
        migration(s)
        with unchecked():
            s.append(_lossless_dropping_a_binding(s))
    with cs.open(src) as a, cs.open(dst) as b:
        with pytest.raises(cs.IntegrityError, match="breaks a rule"):
            cs.copy(a, b)
        assert b.session("m").size == 0


def test_a_marker_as_a_sessions_first_event_is_admitted(store: cs.Store) -> None:
    """A raw-checkpoint marker at size 0 opens a session: admission reads no stored log for it."""
    s = store.session("empty")
    assert s.mark_raw().pos == 0 and s.resume(0).mode == "fallback"


def test_verify_reports_each_rule_broken_by_a_stored_derived_event(store: cs.Store) -> None:
    """Each rule-breaking event planted by a writer that skips admission is a verify() problem at its position."""
    s = store.session("m")
    migration(s)
    cases = _rules_broken(s)
    assert store.verify().ok
    planted = []
    with unchecked():
        for _, event, _ in cases:
            planted.append(s.append(event).pos)
    report = store.verify()
    assert not report.ok
    found = sorted(p.pos for p in report.problems if p.what.startswith("breaks a rule") and p.session == "m")
    assert found == planted, [str(p) for p in report.problems]


def test_verify_passes_what_compact_roll_up_and_mark_write(store: cs.Store) -> None:
    """The rules verify() re-runs are the ones admission ran: a session built through the API has no rule problem."""
    s = store.session("m")
    migration(s)
    a, b = s.compact(0, 8, on_risk="spill"), s.compact(8, 11)
    s.mark(s.roll_up([a, b]))
    s.mark_raw()
    assert [p for p in store.verify().problems] == []
