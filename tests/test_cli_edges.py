"""The command line at its edges: files that are no store, damaged stores, missing keys, forged rows."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from test_compaction import migration

import compactstore as cs
from compactstore import demo
from compactstore.cli import main
from forge import unchecked
from sqlite_edit import tamper


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    """Invoke the command with ``args``; exceptions only as exit codes."""
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def _files(path: Path) -> dict[str, bytes]:
    """Return every file of a SQLite store (the file, its -wal and -shm) with its bytes."""
    return {p.name: p.read_bytes() for p in path.parent.iterdir() if p.name.startswith(path.name)}


@pytest.fixture
def built(sqlite_target: str) -> str:
    """Return a SQLite store holding the migration story in session 'm', compacted and marked."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        s = st.session("m")
        migration(s)
        s.mark(s.compact(0, 8, on_risk="spill"))
    return sqlite_target


@pytest.mark.parametrize("command", [["verify"], ["show"], ["export"], ["audit"], ["resume"], ["proof", "inclusion", "0"]])
def test_an_empty_file_is_refused_and_left_empty(tmp_path: Path, command: list[str]) -> None:
    """A 0-byte file is not a store: every read-only command exits 2 saying so, and the file stays 0 bytes, alone."""
    empty = tmp_path / "empty.db"
    empty.touch()
    result = run(*command, "-s", str(empty))
    assert result.exit_code == 2, result.output
    assert "is not a compactstore store: the file is empty" in result.stderr
    assert _files(empty) == {"empty.db": b""}


def test_a_file_that_is_not_a_store_is_refused_and_left_untouched(tmp_path: Path) -> None:
    """A text file and another application's SQLite database: exit 2, a clear message, not a byte changed."""
    text = tmp_path / "notes.db"
    text.write_text("hello, this is not a database\n" * 10)
    other = tmp_path / "app.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.commit()
    conn.close()
    before = {**_files(text), **_files(other)}
    got = run("verify", "-s", str(text))
    assert got.exit_code == 2 and "notes.db is not a compactstore store: the file is not a SQLite database" in got.stderr
    got = run("show", "-s", str(other))
    assert got.exit_code == 2 and "app.db is not a compactstore store: the database holds other tables (users)" in got.stderr
    assert {**_files(text), **_files(other)} == before
    with pytest.raises(cs.NotAStore):  # the library does not write its schema into someone else's database either
        cs.open(str(other))
    assert {**_files(text), **_files(other)} == before


def test_open_with_create_false_opens_only_a_store(target: str, tmp_path: Path) -> None:
    """cs.open(target, create=False) refuses an empty target and creates nothing; once a store is there it opens."""
    where = target if target.startswith("postgresql") else str(tmp_path / "new.db")
    with pytest.raises(cs.NotAStore):
        cs.open(where, create=False)
    if not target.startswith("postgresql"):
        assert not os.path.exists(where)
    cs.open(where).close()
    with cs.open(where, create=False) as store:
        assert store.sessions() == []


def test_a_truncated_file_does_not_verify(built: str) -> None:
    """A store file cut short: verify exits 1 ("does not verify"), not 2 (bad usage)."""
    data = Path(built).read_bytes()
    for suffix in ("-wal", "-shm"):
        Path(built + suffix).unlink(missing_ok=True)
    Path(built).write_bytes(data[: len(data) // 2])
    result = run("verify", "-s", built)
    assert result.exit_code == 1, result.output
    assert "does not verify" in result.stderr and "damaged" in result.stderr
    as_json = json.loads(run("verify", "-s", built, "--json").stdout)
    assert as_json["ok"] is False and as_json["error"] == "IntegrityError"


@pytest.mark.parametrize("recompute_leaf", [False, True])
def test_proof_inclusion_refuses_an_event_the_tree_does_not_hold(built: str, tmp_path: Path, recompute_leaf: bool) -> None:
    """A body changed (its leaf recomputed or not) gets no proof (exit 1, no file written); an intact event's proof checks.

    With the leaf recomputed, the stored tree no longer gives the sealed root: a proof
    built from it would fail `proof check`, so none is written.
    """
    out = tmp_path / "proof.json"
    if recompute_leaf:
        demo.tamper(built, 4, b"No.", b"OK.")
    else:
        tamper(built, "UPDATE events SET body = CAST(replace(CAST(body AS TEXT), 'No.', 'OK.') AS BLOB) WHERE pos = 4")
    refused = run("proof", "inclusion", "4", "-s", built, "-o", str(out))
    assert refused.exit_code == 1, refused.output
    assert ("is not in the tree of the sealed head" if recompute_leaf else "does not match its leaf") in refused.stderr
    assert not out.exists()
    if not recompute_leaf:  # a recomputed leaf breaks every proof that passes through it: those are refused too
        assert run("proof", "inclusion", "3", "-s", built, "-o", str(out)).exit_code == 0
        assert run("proof", "check", str(out)).exit_code == 0


def test_a_dry_run_honours_on_risk(built: str) -> None:
    """--dry-run --on-risk spill reports what it would spill (exit 0); without --on-risk the gate refuses (exit 1)."""
    with cs.open(built) as st:
        s = st.session("m")
        s.bind("token", "tok-123")
        s.oblige("use-token", needs=["token"])
        size = s.size
    start = size - 2
    assert run("compact", str(start), str(size), "-s", built, "--dry-run").exit_code == 1
    spill = run("compact", str(start), str(size), "-s", built, "--dry-run", "--on-risk", "spill")
    assert spill.exit_code == 0, spill.output
    assert "rerun with" not in spill.output and "would spill binding 'token'" in spill.stdout
    data = json.loads(run("compact", str(start), str(size), "-s", built, "--dry-run", "--on-risk", "preserve",
                          "--json").stdout)
    assert data["ok"] and [r["key"] for r in data["at_risk"]] == ["token"]
    with cs.open(built) as st:
        assert st.session("m").size == size  # a dry run writes nothing


def test_a_keyed_store_without_its_key_is_a_usage_error_not_a_tamper_alarm(sqlite_target: str) -> None:
    """Without --key-env: exit 2, "this store is keyed; pass --key-env", no seal alarm; verify() reports one problem."""
    with cs.open(sqlite_target, key="secret") as st:
        s = st.session("a")
        for i in range(4):
            s.append(cs.Turn("user", f"step {i}"))
    for command in (["verify"], ["show"], ["proof", "inclusion", "0"]):
        got = run(*command, "-s", sqlite_target)
        assert got.exit_code == 2 and "this store is keyed; pass --key-env" in got.stderr, got.output
        assert "seal" not in got.output.replace("seals its tree heads", "")
    with cs.open(sqlite_target) as st:
        report = st.verify()
    assert not report.ok and [p.what for p in report.problems] == ["the store is keyed: open it with its key"]
    ok = run("verify", "-s", sqlite_target, "--key-env", "CS_KEY", env={"CS_KEY": "secret"})
    assert ok.exit_code == 0


@pytest.fixture
def forged(sqlite_target: str) -> str:
    """Return a store with a marker planted past the rules: it claims every condition over a node that drops a failure."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        s = st.session("m")
        migration(s)
        node = s.compact(0, 8, summary="agent explored approaches", negative_facts=[], on_risk="preserve")
        size = s.size
        with unchecked():
            s.append(cs.events.RecoveryMarker(size=size, root=s.head(size).root.hex(), node=node.pos,
                                              conditions=["closure", "negative_facts", "anchoring"]))
    return sqlite_target


def test_show_refuses_a_store_that_does_not_verify_unless_told(forged: str) -> None:
    """A store holding a forged marker: show exits 1 saying the store does not verify; --no-verify draws it, marked unverified."""
    refused = run("show", "-s", forged)
    assert refused.exit_code == 1 and "does not verify" in refused.stderr and "breaks a rule" in refused.stderr
    as_json = json.loads(run("show", "-s", forged, "--json").stdout)
    assert as_json["ok"] is False and as_json["problems"]
    drawn = run("show", "-s", forged, "--json", "--no-verify")
    assert drawn.exit_code == 0 and json.loads(drawn.stdout)["verified"] is False


def test_the_page_never_labels_a_forged_marker_certified(forged: str, tmp_path: Path) -> None:
    """The page drawn anyway says the forged marker claims its conditions, which do not hold, never that they were certified."""
    page = tmp_path / "p.html"
    assert run("show", "-s", forged, "--no-verify", "--html", str(page)).exit_code == 0
    html = page.read_text()
    assert "claims closure, negative_facts, anchoring, which do not hold now" in html
    assert "certified at emission: closure, negative_facts, anchoring" not in html


def test_verify_names_the_latest_head_of_a_truncated_session(sqlite_target: str) -> None:
    """Events cut from a session's end: verify names the latest head's real size, not the last one the log reaches."""
    with cs.open(sqlite_target) as st:
        st.session("a").extend([cs.Turn("user", str(i)) for i in range(5)])
    tamper(sqlite_target, "DELETE FROM events WHERE pos >= 3")
    result = run("verify", "-s", sqlite_target)
    assert result.exit_code == 1
    assert "latest head is at size 5, but the log has 3 events" in result.stdout
    assert "latest head is at size 0" not in result.stdout


def test_show_no_verify_draws_a_session_whose_latest_head_seal_was_altered(sqlite_target: str) -> None:
    """--no-verify draws a session whose sealed head no longer verifies, as it draws one holding a forged marker."""
    with cs.open(sqlite_target) as st:
        st.session("a").extend([cs.Turn("user", "hi"), cs.Turn("assistant", "hello")])
    tamper(sqlite_target, "UPDATE heads SET seal = zeroblob(32) WHERE size = 2")
    assert run("show", "-s", sqlite_target, "--session", "a").exit_code == 1
    drawn = run("show", "-s", sqlite_target, "--session", "a", "--json", "--no-verify")
    assert drawn.exit_code == 0, drawn.output
    assert json.loads(drawn.stdout)["size"] == 2
