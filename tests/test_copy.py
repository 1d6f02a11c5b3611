"""Copying stores between backends (`compactstore.copy` and `compactstore copy`), verified on arrival."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner
from test_compaction import migration
from test_retention import _maintained, _turn

import compactstore as cs
from compactstore.cli import main


def _fill(target: str, key: bytes | None = None) -> None:
    """Write a store with several sessions, keyed appends, compaction and a marker."""
    with cs.open(target, key=key, clock=cs.events.tick_clock()) as st:
        s = st.session("migration")
        migration(s)
        s.mark(s.compact(0, 8, on_risk="preserve"))
        for name in ("beta", "alpha"):
            t = st.session(name)
            t.extend([cs.Turn("user", f"{name} {i}") for i in range(23)])
            t.append(cs.ToolCall("c1", "grep", {"q": name}), idempotency_key=f"{name}-k")
            t.append(cs.ToolResult("c1", [name], status="ok"))


def _snapshot(target: str) -> dict[str, list[tuple[int, str, bytes, bytes]]]:
    with cs.open(target) as st:
        return {n: [(r.pos, r.kind, r.body, r.leaf) for r in st.session(n).scan()] for n in st.sessions()}


@pytest.fixture
def other(target: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """Return an empty store on the other backend than ``target`` (SQLite when PostgreSQL is absent)."""
    if target.startswith("postgresql://"):
        return str(tmp_path / "other.db")
    return str(request.getfixturevalue("pg_url"))


def test_copy_there_and_back_keeps_every_byte(target: str, other: str, tmp_path: Path) -> None:
    """A copy to the other backend and back holds the same bodies, leaves and roots, and verifies."""
    _fill(target)
    back = str(tmp_path / "back.db")
    with cs.open(target) as src, cs.open(other) as dst:
        report = cs.copy(src, dst, batch=7)
        assert [c.name for c in report.sessions] == ["alpha", "beta", "migration"]
        assert report.events == sum(c.events for c in report.sessions) == 25 + 25 + 13
        for c in report.sessions:
            assert c.root == src.session(c.name).head().root == dst.session(c.name).head().root
        assert dst.verify().ok
    with cs.open(other) as src, cs.open(back) as dst:
        cs.copy(src, dst)
    assert _snapshot(target) == _snapshot(other) == _snapshot(back)


def test_copy_refuses_a_destination_session_with_events_and_writes_nothing(target: str, tmp_path: Path) -> None:
    """If any destination session already has events, nothing at all is copied."""
    _fill(target)
    dst_path = str(tmp_path / "dst.db")
    with cs.open(target) as src, cs.open(dst_path) as dst:
        dst.session("beta").append(cs.Turn("user", "already here"))
        with pytest.raises(cs.InvalidArgument, match="'beta' \\(1 events\\)") as info:
            cs.copy(src, dst)
        assert info.value.field == "dst"
        assert dst.sessions() == ["beta"] and dst.session("beta").size == 1


def test_copy_selected_sessions_with_progress(target: str, tmp_path: Path) -> None:
    """Only the named sessions are copied, and progress is reported per batch."""
    _fill(target)
    seen: list[tuple[str, int, int]] = []
    with cs.open(target) as src, cs.open(str(tmp_path / "dst.db")) as dst:
        report = cs.copy(src, dst, sessions=["beta"], batch=10, progress=lambda *a: seen.append(a))
        assert dst.sessions() == ["beta"] and report.events == 25
        with pytest.raises(cs.InvalidArgument, match="'nope'"):
            cs.copy(src, dst, sessions=["nope"])
    assert seen == [("beta", 10, 25), ("beta", 20, 25), ("beta", 25, 25)]


def test_copy_into_a_keyed_store_needs_its_key(target: str, tmp_path: Path) -> None:
    """A keyed destination is sealed under its key; without the key the copy is refused, and so are markers MACed under another."""
    _fill(target)
    dst_path = str(tmp_path / "keyed.db")
    cs.open(dst_path, key=b"dst key").close()
    with cs.open(target) as src, cs.open(dst_path) as dst:
        with pytest.raises(cs.CompactStoreError, match="keyed"):
            cs.copy(src, dst)
        assert dst.sessions() == []
    with cs.open(target) as src, cs.open(dst_path, key=b"dst key") as dst:
        with pytest.raises(cs.InvalidArgument, match="'migration' hold markers") as info:
            cs.copy(src, dst)
        assert info.value.field == "dst" and dst.sessions() == []
        cs.copy(src, dst, sessions=["alpha", "beta"])  # no markers: sealed under the destination's key
        assert dst.check_head(dst.session("alpha").head()) and dst.verify().ok


def test_redacted_and_retained_sessions_are_carried_leaf_for_leaf(target: str, other: str, tmp_path: Path) -> None:
    """A session with dropped and redacted bodies is copied as it is, there and back: same rows, roots, context, markers and refusals."""
    with cs.open(target, clock=cs.events.tick_clock()) as st:
        s = _maintained(st, 60)
        assert s.retain() is not None
        last_turn = max(r.pos for r in s.scan() if r.kind == "turn")
        s.redact([last_turn], "forget it")
        _turn(s, 60)
        s.maintain(cs.CompactionPolicy())
        st.session("plain").extend([cs.Turn("user", f"plain {i}") for i in range(9)])
    back = str(tmp_path / "back.db")
    with cs.open(target) as src, cs.open(other) as dst:
        report = cs.copy(src, dst, batch=5)
        assert [c.name for c in report.sessions] == ["agent", "plain"]
        a, b = src.session("agent"), dst.session("agent")
        assert a.head().root == b.head().root and dst.verify().ok
        assert msgspec.json.encode(a.context().as_messages("chat")) == msgspec.json.encode(b.context().as_messages("chat"))
        markers = [r.pos for r in a.scan() if r.kind == "marker"]
        assert [a.resume(p).digest for p in markers] == [b.resume(p).digest for p in markers]
        dropped = [r.pos for r in a.scan() if r.kind == "dropped"]
        assert dropped
        for session in (a, b):
            with pytest.raises(cs.errors.BodyDroppedError) as info:
                session.read(dropped[0])
            assert info.value.pos == dropped[0]
            assert session.read(last_turn).kind == "redacted"
        b.append(cs.Turn("user", "the copy goes on"))  # the copy is a live session, not an archive
        assert dst.verify().ok
    with cs.open(target) as src, cs.open(back) as dst:
        cs.copy(src, dst, batch=1000)
        assert dst.verify().ok
    assert _snapshot(target) == _snapshot(back)


def test_a_redaction_during_the_copy_fails_it_loudly(sqlite_target: str, tmp_path: Path) -> None:
    """A body erased by an event past the size the copy took (a redaction during it) is IntegrityError naming the position."""
    with cs.open(sqlite_target) as src, cs.open(str(tmp_path / "dst.db")) as dst:
        beta = src.session("beta")
        beta.extend([cs.Turn("user", f"beta {i}") for i in range(2100)])  # more than one read of the scan

        def redact_once(name: str, done: int, total: int) -> None:
            if done == 500:
                beta.redact([2080], "forget it")

        with pytest.raises(cs.IntegrityError, match="past the copied size") as info:
            cs.copy(src, dst, batch=500, progress=redact_once)
        assert info.value.pos == 2080 and dst.session("beta").size == 2000 and dst.verify().ok


def _tamper(path: str) -> None:
    conn = sqlite3.connect(path)
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("UPDATE events SET body = CAST(replace(CAST(body AS TEXT), 'beta 5', 'beta 6') AS BLOB) WHERE pos = 5")
    conn.commit()
    conn.close()


def test_a_tampered_source_fails_on_arrival(sqlite_target: str, tmp_path: Path) -> None:
    """A source body changed behind the store's back gives a different leaf: IntegrityError, naming it."""
    _fill(sqlite_target)
    _tamper(sqlite_target)
    with cs.open(sqlite_target) as src, cs.open(str(tmp_path / "dst.db")) as dst:
        with pytest.raises(cs.IntegrityError) as info:
            cs.copy(src, dst, sessions=["beta"])
    assert info.value.session == "beta" and info.value.pos == 5


def test_cli_copies_to_the_other_backend_and_reports_json(target: str, other: str) -> None:
    """`compactstore copy SRC DST --json` copies, verifies and prints the roots."""
    _fill(target)
    result = CliRunner().invoke(main, ["copy", target, other, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["ok"] is True and out["events"] == 63
    with cs.open(other) as dst:
        assert {s["name"]: s["root"] for s in out["sessions"]} == {
            n: dst.session(n).head().root.hex() for n in dst.sessions()
        }
    again = CliRunner().invoke(main, ["copy", target, other, "--json"])
    assert again.exit_code == 2 and json.loads(again.stdout)["error"] == "InvalidArgument"


def test_cli_exit_codes(sqlite_target: str, tmp_path: Path) -> None:
    """Exit 1 on a verification failure, 2 on bad usage; plain output names what was copied."""
    runner = CliRunner()
    missing = runner.invoke(main, ["copy", str(tmp_path / "absent.db"), str(tmp_path / "d.db")])
    assert missing.exit_code == 2 and "no such SQLite store" in missing.output
    assert runner.invoke(main, ["copy", ":memory:", str(tmp_path / "d.db")]).exit_code == 2
    assert runner.invoke(main, ["copy", sqlite_target]).exit_code == 2
    assert runner.invoke(main, ["copy", sqlite_target, str(tmp_path / "d.db"), "--key-env", "CS_NO_SUCH_VAR"]).exit_code == 2
    _fill(sqlite_target)
    ok = runner.invoke(main, ["copy", sqlite_target, str(tmp_path / "ok.db"), "--session", "alpha"])
    assert ok.exit_code == 0 and "alpha: 25 events, root " in ok.stdout and "copied 1 sessions" in ok.stdout
    _tamper(sqlite_target)
    bad = runner.invoke(main, ["copy", sqlite_target, str(tmp_path / "bad.db")])
    assert bad.exit_code == 1 and "does not match its leaf" in bad.stderr  # found as the source is read


def test_cli_runs_as_the_installed_console_script(sqlite_target: str, tmp_path: Path) -> None:
    """The `compactstore` script on the virtualenv's PATH copies a store and exits 0."""
    script = Path(sys.executable).with_name("compactstore")
    assert script.exists(), "reinstall the package: the console script is missing"
    _fill(sqlite_target, key=b"src key")
    dst = str(tmp_path / "copy.db")
    done = subprocess.run([str(script), "copy", sqlite_target, dst, "--json", "--src-key-env", "CS_SRC", "--key-env",
                           "CS_KEY"], capture_output=True, text=True, env={"CS_SRC": "src key", "CS_KEY": "src key", "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["events"] == 63
    with cs.open(dst, key="src key") as st:
        assert st.verify().ok
    usage = subprocess.run([str(script), "copy"], capture_output=True, text=True)
    assert usage.returncode == 2 and "Missing argument" in usage.stderr
