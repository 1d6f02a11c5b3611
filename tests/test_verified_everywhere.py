"""Every path that decides, copies or serves reads as a plain read does: the sealed head under the key, and the witness."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlite_edit import edited
from test_witness import ATTACKS, _snapshot

import compactstore as cs
from compactstore import events as ev
from compactstore import merkle
from compactstore.cli import main
from compactstore.errors import KeyRequired, WitnessMismatch

KEY = b"the owner's key"
ROLLBACK = "migrations/003_down.sql"


def _history(s: cs.Session) -> tuple[cs.Node, cs.Marker]:
    """Log a rejection, a binding an open obligation needs, a compaction that spills it, and a marker."""
    s.append(cs.Turn("user", "Do NOT backfill in place.", status="rejected"))  # 0
    s.bind("rollback", ROLLBACK)  # 1
    s.oblige("finish", needs=["rollback"])  # 2
    s.append(cs.Turn("assistant", "Writing the down migration."))  # 3
    node = s.compact(0, 4, on_risk="spill")  # 4: the spill, 5: the node
    return node, s.mark(node)


def _forge(target: str, name: str, pos: int, event: ev.Event) -> None:
    """Rewrite the body at ``pos`` and its leaf, as someone holding the database but not the key can."""
    body = ev.encode(event)
    with edited(target) as run:
        (sid,) = run("SELECT id FROM sessions WHERE name = ?", name)[0]
        run("UPDATE events SET body = ?, leaf = ? WHERE session_id = ? AND pos = ?", body, merkle.leaf_hash(body), sid, pos)


def test_a_compaction_over_a_forged_body_is_refused_and_writes_nothing(target: str) -> None:
    """A raw body rewritten with its leaf: compact, roll_up and read_span refuse it as a plain read does; nothing is written."""
    with cs.open(target, key=KEY, clock=ev.tick_clock()) as store:
        s = store.session("m")
        s.append(cs.Turn("user", "Do NOT backfill in place.", status="rejected"))
        s.extend([cs.Turn("assistant", f"step {i}") for i in range(5)])
        size = s.size
    _forge(target, "m", 0, cs.Turn("user", "Backfill in place.", status="rejected"))
    with cs.open(target, key=KEY, clock=ev.tick_clock()) as store:
        s = store.session("m")
        for what, call in [("read", lambda: s.read(0)), ("read_span", lambda: s.view.read_span(0, size)),
                           ("compact", lambda: s.compact(0, size))]:  # fmt: skip
            with pytest.raises(cs.IntegrityError):
                call()
        assert s.size == size, what


def test_a_restoration_never_serves_a_forged_decision_as_certified(target: str) -> None:
    """A body rewritten with its leaf after its compaction: restore_span, resume and context refuse it."""
    with cs.open(target, key=KEY, clock=ev.tick_clock()) as store:
        node, marker = _history(store.session("m"))
    _forge(target, "m", 0, cs.Turn("user", "Backfill in place.", status="rejected"))
    with cs.open(target, key=KEY) as store:
        s = store.session("m")
        for call in (lambda: s.restore_span(node.pos), lambda: s.resume(marker, rehash=True), lambda: s.context()):
            with pytest.raises(cs.IntegrityError):
                call()


SIBLINGS: dict[str, Callable[[cs.Session, cs.Node, cs.Marker], object]] = {
    "lookup pos:path": lambda s, n, m: s.lookup("1:value"),
    "lookup key": lambda s, n, m: s.lookup("rollback"),
    "spilled": lambda s, n, m: s.spilled(n.spills[0].handle),
    "restore_span": lambda s, n, m: s.restore_span(n.pos),
    "sealed_head": lambda s, n, m: s.sealed_head(),
    "head": lambda s, n, m: s.head(),
    "proven": lambda s, n, m: s.view.proven(0),
    "read_span": lambda s, n, m: s.view.read_span(0, 4),
    "resume": lambda s, n, m: s.resume(m),
    "artifact": lambda s, n, m: s.artifact(n.pos),
    "inclusion_proof": lambda s, n, m: s.inclusion_proof(0),
    "consistency_proof": lambda s, n, m: s.consistency_proof(3),
}  # fmt: skip


@pytest.mark.parametrize("path", sorted(SIBLINGS))
@pytest.mark.parametrize("attack", ["fork", "snapshot-rollback"])
def test_every_path_refuses_a_store_that_left_its_witness_under_an_open_handle(
    target: str, tmp_path: Path, attack: str, path: str
) -> None:
    """lookup, spilled, restore_span, heads, proofs, resume and read_span raise WitnessMismatch as read does."""
    witness = str(tmp_path / "witness.json")
    with cs.open(target, key=KEY, clock=ev.tick_clock(), witness=witness) as store:
        node, marker = _history(store.session("agent-a"))
        store.session("agent-b").append(cs.Turn("user", "b"))
    snap = _snapshot(target)
    with cs.open(target, key=KEY, clock=ev.tick_clock(), witness=witness) as store:
        store.session("agent-a").extend([cs.Turn("user", f"later {i}") for i in range(4)])
    with cs.open(target, key=KEY, witness=witness) as store:
        s = store.session("agent-a")
        SIBLINGS[path](s, node, marker)  # intact: it passes
        ATTACKS[attack](target, KEY, snap)
        with pytest.raises(WitnessMismatch):
            SIBLINGS[path](s, node, marker)


def test_a_handle_writes_nothing_on_a_store_restored_under_it(target: str) -> None:
    """A backup copied back under an open handle: its next append is refused, nothing is written, and the store verifies."""
    with cs.open(target, clock=ev.tick_clock()) as store:
        s = store.session("m")
        s.extend([cs.Turn("user", f"t{i}") for i in range(3)])
        snap = _snapshot(target)
        s.extend([cs.Turn("user", f"u{i}") for i in range(3)])
        assert s.size == 6
        ATTACKS["snapshot-rollback"](target, None, snap)
        for write in (lambda: s.append(cs.Turn("user", "next")), lambda: s.extend([cs.Turn("user", "a"), cs.Turn("user", "b")])):
            with pytest.raises(cs.IntegrityError, match="replaced by another copy"):
                write()
    with cs.open(target) as store:
        assert store.session("m").size == 3 and store.verify().ok


def test_a_keyed_store_copies_only_with_its_key(tmp_path: Path) -> None:
    """copy() and `compactstore copy` read a keyed source only with its key (KeyRequired, exit 2 without it)."""
    src, dst, again = (str(tmp_path / n) for n in ("src.db", "dst.db", "again.db"))
    with cs.open(src, key=KEY, clock=ev.tick_clock()) as store:
        _history(store.session("m"))
    with cs.open(src) as source, cs.open(dst) as dest, pytest.raises(KeyRequired):
        cs.copy(source, dest)
    with cs.open(dst) as dest:
        assert dest.sessions() == []
    runner = CliRunner()
    refused = runner.invoke(main, ["copy", src, dst])
    assert refused.exit_code == 2 and "key" in refused.output
    done = runner.invoke(main, ["copy", src, again, "--src-key-env", "SRC_KEY", "--key-env", "DST_KEY"],
                         env={"SRC_KEY": KEY.decode(), "DST_KEY": KEY.decode()})
    assert done.exit_code == 0, done.output
    with cs.open(again, key=KEY) as store:
        assert store.verify().ok and store.session("m").context().mode == "certified"


def test_a_copy_to_another_key_with_markers_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Markers carry the source key's MAC: a destination with another key is refused up front, and holds nothing."""
    src, dst = str(tmp_path / "src.db"), str(tmp_path / "dst.db")
    with cs.open(src, key=KEY, clock=ev.tick_clock()) as store:
        _history(store.session("m"))
    with cs.open(src, key=KEY) as source, cs.open(dst, key=b"another key") as dest:
        with pytest.raises(cs.InvalidArgument) as info:
            cs.copy(source, dest)
        assert info.value.field == "dst" and dest.sessions() == []


def test_a_copy_of_a_source_breaking_a_rule_writes_nothing(tmp_path: Path) -> None:
    """A source whose derived event breaks a rule is refused before the first batch: exit 1, the destination empty."""
    from forge import unchecked

    src, dst = str(tmp_path / "src.db"), str(tmp_path / "dst.db")
    with cs.open(src, clock=ev.tick_clock()) as store:
        s = store.session("m")
        s.extend([cs.Turn("user", f"t{i}") for i in range(1200)])
        s.append(cs.ToolResult("c1", "ERROR", ok=False, status="failed"))
        node = s.compact(1190, s.size, summary="s", negative_facts=[])  # drops the failure: admitted, never certified
        with unchecked():  # a marker certifying it anyway, written past admission
            s.append(cs.events.RecoveryMarker(size=s.size, root=s.head().root.hex(), node=node.pos,
                                              conditions=list(cs.rules.CONDITIONS), path=[node.pos]))
    result = CliRunner().invoke(main, ["copy", src, dst])
    assert result.exit_code == 1, result.output
    with cs.open(dst) as dest:
        assert dest.sessions() == []


def test_a_store_file_copied_whole_keeps_every_path_working(tmp_path: Path) -> None:
    """A store copied as a file (closed first) is the same store: every sibling path serves it."""
    src, dst = tmp_path / "src.db", tmp_path / "dst.db"
    with cs.open(str(src), key=KEY, clock=ev.tick_clock()) as store:
        node, marker = _history(store.session("m"))
    shutil.copyfile(src, dst)
    with cs.open(str(dst), key=KEY) as store:
        s = store.session("m")
        for call in SIBLINGS.values():
            call(s, node, marker)
