"""The `compactstore` command, through click's runner: every subcommand, its output, its exit codes."""

from __future__ import annotations

import json
import os
import re
import sqlite3
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from test_compaction import migration

import compactstore as cs
from forge import unchecked
from sqlite_edit import tamper
from compactstore.cli import main

CLI_DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"

LINES = [
    {"kind": "turn", "role": "user", "content": "Make the migration reversible."},
    {"kind": "tool_call", "call_id": "c1", "name": "run_sql", "args": {"sql": "ALTER TABLE users ADD x int"}},
    {"kind": "tool_result", "call_id": "c1", "output": "ERROR: lock timeout", "ok": False, "status": "failed"},
    {"kind": "binding", "key": "rollback", "value": "migrations/003_down.sql", "idempotency_key": "b1"},
    {"kind": "obligation", "name": "finish", "needs": ["rollback"]},
]


def run(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
    """Invoke the command with ``args``, without letting exceptions escape as anything but exit codes."""
    return CliRunner().invoke(main, list(args), input=input, env=env, catch_exceptions=False)


def jsonl(lines: list[dict[str, object]]) -> str:
    return "".join(json.dumps(x) + "\n" for x in lines)


def _commands(group: click.Group, prefix: str = "compactstore") -> list[tuple[str, click.Command]]:
    out = []
    for name, command in sorted(group.commands.items()):
        out.append((f"{prefix} {name}", command))
        if isinstance(command, click.Group):
            out += _commands(command, f"{prefix} {name}")
    return out


@pytest.fixture
def built(target: str) -> str:
    """Return a store holding the migration story in session 'm', compacted and marked."""
    with cs.open(target, clock=cs.events.tick_clock()) as st:
        s = st.session("m")
        migration(s)
        s.mark(s.compact(0, 8, on_risk="spill"))
    return target


@pytest.fixture
def sqlite_built(sqlite_target: str) -> str:
    """Return a SQLite store holding the migration story in session 'm', compacted and marked."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        s = st.session("m")
        migration(s)
        s.mark(s.compact(0, 8, on_risk="spill"))
    return sqlite_target


# --- the command as a whole -----------------------------------------------------------------


def test_every_subcommand_has_help_and_is_in_the_cli_doc() -> None:
    """Each subcommand has help text, `--help` works, and docs/cli.md names it as `compactstore NAME`."""
    readme = CLI_DOC.read_text()
    commands = _commands(main)
    assert {name.split()[1] for name, _ in commands} >= {
        "demo", "append", "compact", "roll-up", "mark", "resume", "verify", "proof", "audit", "show", "export", "copy"}
    for name, command in commands:
        assert (command.help or "").strip(), f"{name} has no help text"
        result = run(*name.split()[1:], "--help")
        assert result.exit_code == 0 and "Usage:" in result.output, name
        assert re.search(rf"\b{re.escape(name)}\b", readme), f"docs/cli.md does not mention `{name}`"


def test_usage_errors_exit_2() -> None:
    """Unknown subcommands and options are click's usage errors: exit 2."""
    assert run("nope").exit_code == 2
    assert run("verify", "--nope").exit_code == 2
    assert run("mark").exit_code == 2  # neither NODE nor --raw


def test_a_missing_store_is_bad_input_and_is_not_created(tmp_path: Path) -> None:
    """Every command that reads a store refuses a missing file with exit 2, and creates nothing."""
    missing = str(tmp_path / "absent.db")
    for args in (["show"], ["verify"], ["audit"], ["resume"], ["export"], ["compact", "0", "1"], ["roll-up", "3"],
                 ["mark", "3"], ["proof", "inclusion", "0"], ["proof", "consistency", "0"]):
        result = run(*args, "-s", missing)
        assert result.exit_code == 2, args
        assert f"error: no store at {missing}" in result.stderr, args
        assert len(result.stderr.strip().splitlines()) <= 2, args  # the message and a hint
    assert not os.path.exists(missing)
    got = json.loads(run("verify", "-s", missing, "--json").stdout)
    assert got["ok"] is False and "no store" in got["message"]


def test_the_store_comes_from_the_environment(sqlite_built: str) -> None:
    """$COMPACTSTORE_STORE names the store when --store is not given."""
    result = run("verify", env={"COMPACTSTORE_STORE": sqlite_built})
    assert result.exit_code == 0 and "ok: 1 session" in result.stdout


def test_the_session_defaults_to_the_only_one(sqlite_built: str) -> None:
    """With several sessions, --session is required and the message lists them."""
    with cs.open(sqlite_built) as st:
        st.session("other").append(cs.Turn("user", "hi"))
    result = run("audit", "-s", sqlite_built)
    assert result.exit_code == 2 and "holds 2 sessions ('m', 'other')" in result.stderr
    assert run("audit", "-s", sqlite_built, "--session", "m").exit_code == 0
    nope = run("audit", "-s", sqlite_built, "--session", "nope")
    assert nope.exit_code == 2 and "no session 'nope'" in nope.stderr


# --- append and export ------------------------------------------------------------------------


def test_append_reads_json_lines_from_a_file_and_from_stdin(target: str, tmp_path: Path) -> None:
    """Events from a file or stdin land in order, and the root is the library's for the same events."""
    source = tmp_path / "events.jsonl"
    source.write_text(jsonl(LINES[:3]) + "\n")  # a blank line is skipped
    first = run("append", str(source), "-s", target, "--session", "s", "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["appended"] == 3
    second = run("append", "-", "-s", target, "--session", "s", input=jsonl(LINES[3:]))
    assert second.exit_code == 0 and "appended 2 events to 's' (positions 3..4)" in second.stdout
    with cs.open(target) as st:
        s = st.session("s")
        assert [r.kind for r in s.scan()] == ["turn", "tool_call", "tool_result", "binding", "obligation"]
        assert s.read(3).event.idempotency_key == "b1"
        assert s.read(2).event == cs.ToolResult("c1", "ERROR: lock timeout", ok=False, status="failed",
                                                ts=s.read(2).event.ts)


def test_append_is_idempotent_per_key_and_refuses_a_reused_key(sqlite_target: str) -> None:
    """Appending the same keyed line twice writes it once; a different event under that key exits 1."""
    line = jsonl([{**LINES[0], "ts": 1, "idempotency_key": "k1"}])
    assert run("append", "-s", sqlite_target, "--session", "s", input=line).exit_code == 0
    again = run("append", "-s", sqlite_target, "--session", "s", input=line)
    assert again.exit_code == 0 and "appended 0 events" in again.stdout and "1 were already there" in again.stdout
    other = jsonl([{**LINES[0], "content": "something else", "ts": 1, "idempotency_key": "k1"}])
    conflict = run("append", "-s", sqlite_target, "--session", "s", input=other)
    assert conflict.exit_code == 1 and "refused: line 1: idempotency key 'k1'" in conflict.stderr
    with cs.open(sqlite_target) as st:
        assert st.session("s").size == 1


@pytest.mark.parametrize(("line", "message"), [
    ('{"kind": "turn", "role": "user", "content": "x"', "line 3: not valid JSON"),
    ('{"kind": "tool", "name": "x"}', "line 3: unknown kind 'tool'; kinds are"),
    ('{"role": "user", "content": "x"}', 'line 3: the event has no "kind"'),
    ('["turn"]', "line 3: want one event as a JSON object, got list"),
    ('{"kind": "turn", "role": "user", "content": 3}', "line 3: turn event: content: Expected `str`, got `int`"),
    ('{"kind": "turn", "role": "user"}', "line 3: turn event: Object missing required field `content`"),
    ('{"kind": "turn", "role": "", "content": "x"}', "line 3: turn event: role: must not be empty"),
    ('{"kind": "turn", "role": "u", "content": "x", "idempotency_key": "b1"}',
     "line 3: idempotency key 'b1' is already used on line 2"),
])
def test_bad_input_names_its_line_exits_2_and_writes_nothing(sqlite_target: str, line: str, message: str) -> None:
    """Malformed JSON, unknown kinds and bad fields: one clear line, exit 2, no store created, nothing written."""
    text = jsonl([LINES[0], LINES[3]]) + line + "\n" + jsonl(LINES[4:])
    result = run("append", "-s", sqlite_target, "--session", "s", input=text)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {message}"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not os.path.exists(sqlite_target)
    with cs.open(sqlite_target) as st:  # into an existing store: nothing written either
        st.session("s").append(cs.Turn("user", "already here"))
    assert run("append", "-s", sqlite_target, "--session", "s", input=text).exit_code == 2
    with cs.open(sqlite_target) as st:
        assert st.session("s").size == 1 and st.sessions() == ["s"]


def test_a_batch_that_fails_a_log_check_writes_nothing_and_says_what_earlier_batches_wrote(sqlite_target: str) -> None:
    """A supersedes naming a later position fails its batch; the batches before it stay, as the message says."""
    lines = [{"kind": "turn", "role": "user", "content": f"step {i}"} for i in range(5)]
    lines[3] = {**lines[3], "supersedes": 7}
    result = run("append", "-s", sqlite_target, "--session", "s", "--batch", "2", input=jsonl(lines))
    assert result.exit_code == 2
    assert "error: line 4: invalid supersedes: must name an earlier position (< 3), got 7" in result.stderr
    assert "the 2 events before line 3 were written by earlier batches" in result.stderr
    with cs.open(sqlite_target) as st:
        assert st.session("s").size == 2


def test_append_into_a_keyed_store_needs_the_key(sqlite_target: str) -> None:
    """A keyed store takes appends only with --key-env; an unset variable is a usage error."""
    cs.open(sqlite_target, key="secret").close()
    line = jsonl(LINES[:1])
    refused = run("append", "-s", sqlite_target, "--session", "s", input=line)
    assert refused.exit_code == 2 and "keyed" in refused.stderr
    assert run("append", "-s", sqlite_target, "--session", "s", "--key-env", "CS_UNSET_VAR", input=line).exit_code == 2
    ok = run("append", "-s", sqlite_target, "--session", "s", "--key-env", "CS_KEY", input=line,
             env={"CS_KEY": "secret"})
    assert ok.exit_code == 0
    assert run("verify", "-s", sqlite_target, "--key-env", "CS_KEY", env={"CS_KEY": "secret"}).exit_code == 0


def test_export_round_trips_through_append_to_identical_roots(built: str, tmp_path: Path) -> None:
    """Exported lines appended to an empty session give the same bodies, leaves and root at every size."""
    exported = run("export", "-s", built)
    assert exported.exit_code == 0
    copy = str(tmp_path / "copy.db")
    assert run("append", "-", "-s", copy, "--session", "m", "--batch", "5", input=exported.stdout).exit_code == 0
    with cs.open(built) as a, cs.open(copy) as b:
        sa, sb = a.session("m"), b.session("m")
        assert [(r.body, r.leaf) for r in sa.scan()] == [(r.body, r.leaf) for r in sb.scan()]
        assert all(sa.head(n).root == sb.head(n).root for n in range(sa.size + 1))
        marker = next(r.pos for r in sa.scan() if r.kind == "marker")
        assert sa.resume(marker).digest == sb.resume(marker).digest
    to_file = run("export", "-s", built, "-o", str(tmp_path / "m.jsonl"), "--json")
    assert json.loads(to_file.stdout)["events"] == 14
    assert (tmp_path / "m.jsonl").read_text() == exported.stdout


def test_export_carries_erased_bodies_as_leaves_and_append_writes_them_back(built: str, tmp_path: Path) -> None:
    """A session with a redaction and a retention exports as a replica; appended to an empty session it has the same root, verifies and resumes alike."""
    with cs.open(built, clock=cs.events.tick_clock()) as st:
        s = st.session("m")
        for t in range(40):
            s.extend([cs.Turn("user", f"step {t} " + "x" * 100), cs.Turn("assistant", f"done {t}")])
            s.maintain(cs.CompactionPolicy())
        assert s.retain() is not None
        s.redact([max(r.pos for r in s.scan() if r.kind == "turn")], "forget the last step")
    exported = run("export", "-s", built)
    assert exported.exit_code == 0
    lines = exported.stdout.splitlines()
    assert any(line.startswith('{"erased":{"by":') and '"kind":"dropped"' in line for line in lines)
    assert any(line.startswith('{"erased":') and '"kind":"redacted"' in line for line in lines)
    copy = str(tmp_path / "copy.db")
    done = run("append", "-", "-s", copy, "--session", "m", "--batch", "7", "--json", input=exported.stdout)
    assert done.exit_code == 0, done.stderr
    with cs.open(built) as a, cs.open(copy) as b:
        sa, sb = a.session("m"), b.session("m")
        assert json.loads(done.stdout)["root"] == sa.head().root.hex() == sb.head().root.hex()
        assert [(r.kind, r.body, r.leaf) for r in sa.scan()] == [(r.kind, r.body, r.leaf) for r in sb.scan()]
        assert b.verify().ok
        marker = [r.pos for r in sa.scan() if r.kind == "marker"][-1]
        assert sa.resume(marker).digest == sb.resume(marker).digest
    again = run("append", "-", "-s", copy, "--session", "m", input=exported.stdout)
    assert again.exit_code == 2 and "only into an empty session" in again.stderr
    forged = exported.stdout.replace('"kind":"dropped"', '"kind":"redacted"', 1)
    bad = run("append", "-", "-s", str(tmp_path / "forged.db"), "--session", "m", input=forged)
    assert bad.exit_code == 1 and "pos" in bad.stderr, bad.stderr
    assert sqlite3.connect(tmp_path / "forged.db").execute("SELECT count(*) FROM events").fetchone() == (0,)
    dropped = next(json.loads(line)["erased"]["pos"] for line in lines if '"kind":"dropped"' in line)
    extra = exported.stdout + json.dumps({"index": [dropped, "negative", "failed", dropped, "a fact never stated"]}) + "\n"
    bad = run("append", "-", "-s", str(tmp_path / "forged2.db"), "--session", "m", input=extra)
    assert bad.exit_code == 1 and "not those it recorded the digest of" in bad.stderr, bad.stderr


def test_export_refuses_a_tampered_session(sqlite_built: str) -> None:
    """A body that no longer matches its leaf is refused: the export would not round-trip."""
    conn = sqlite3.connect(sqlite_built)
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("UPDATE events SET body = CAST(replace(CAST(body AS TEXT), 'No.', 'OK.') AS BLOB) WHERE pos = 4")
    conn.commit()
    conn.close()
    result = run("export", "-s", sqlite_built)
    assert result.exit_code == 1 and "'m': event at pos 4 does not match its leaf" in result.stderr and result.stdout == ""


# --- compaction, markers, resume --------------------------------------------------------------


def test_compact_is_gated_and_spills_on_request(target: str) -> None:
    """The gate refuses (exit 1, naming the binding, hinting --on-risk); --on-risk spill writes the node."""
    with cs.open(target, clock=cs.events.tick_clock()) as st:
        migration(st.session("m"))
    refused = run("compact", "0", "8", "-s", target)
    assert refused.exit_code == 1
    assert "needs non-regenerable binding 'rollback' bound at pos 5" in refused.stderr
    assert "hint: rerun with --on-risk spill" in refused.stderr
    dry = run("compact", "0", "8", "-s", target, "--dry-run")
    assert dry.exit_code == 1
    assert run("compact", "0", "5", "-s", target, "--dry-run").exit_code == 0
    done = run("compact", "0", "8", "-s", target, "--on-risk", "spill", "--json")
    assert done.exit_code == 0
    node = json.loads(done.stdout)["node"]
    assert (node["tier"], node["start"], node["stop"], node["loss"]) == (1, 0, 8, "LOSSY_GIST")
    assert [s["key"] for s in node["spills"]] == ["rollback"]
    assert [f["pos"] for f in node["negative_facts"]] == [2, 4]
    bad = run("compact", "0", "99", "-s", target)
    assert bad.exit_code == 2 and "invalid span" in bad.stderr


def test_compact_loss_auto_is_as_strong_as_what_the_node_keeps(target: str, tmp_path: Path) -> None:
    """--loss AUTO gives LOSSY_LITERAL for a node that keeps little, LOSSLESS with --keep AUTO, as the library does."""
    with cs.open(target, clock=cs.events.tick_clock()) as st:
        migration(st.session("m"))
    # AUTO alone names every literal: mixed with a key it is bad usage, and nothing is written.
    mixed = run("compact", "0", "8", "-s", target, "--loss", "AUTO", "--keep", "AUTO", "--keep", "rollback")
    assert mixed.exit_code == 2 and "--keep" in mixed.stderr and "AUTO" in mixed.stderr
    # --keep AUTO keeps the rollback script the obligation needs: the gate has nothing to refuse.
    assert run("compact", "0", "8", "-s", target, "--dry-run").exit_code == 1
    dry = run("compact", "0", "8", "-s", target, "--keep", "AUTO", "--dry-run")
    assert dry.exit_code == 0 and "keeps every literal" in dry.stdout
    lossy = run("compact", "0", "5", "-s", target, "--loss", "AUTO", "--json")
    assert lossy.exit_code == 0 and json.loads(lossy.stdout)["node"]["loss"] == "LOSSY_LITERAL"
    done = run("compact", "5", "8", "-s", target, "--loss", "AUTO", "--keep", "AUTO", "--json")
    assert done.exit_code == 0, done.stderr
    node = json.loads(done.stdout)["node"]
    assert node["loss"] == "LOSSLESS" and node["spills"] == []
    assert {(k["pos"], k["path"]) for k in node["kept"]} >= {(5, "value"), (6, "value")}
    # The library, given the same log and the same arguments, writes the same node.
    with cs.open(str(tmp_path / "lib.db"), clock=cs.events.tick_clock()) as lib:
        s = lib.session("m")
        migration(s)
        s.compact(0, 5, loss=cs.AUTO)
        same = s.compact(5, 8, loss=cs.AUTO, keep=cs.AUTO)
    assert (same.pos, same.loss.value, same.span_root.hex()) == (node["pos"], node["loss"], node["span_root"])
    assert [(e.pos, e.path, e.value) for e in same.kept] == [(k["pos"], k["path"], k["value"]) for k in node["kept"]]
    # The default stays the library's: LOSSY_GIST.
    with cs.open(target) as st:
        assert st.session("m").size == node["pos"] + 1
    default = run("compact", "8", "11", "-s", target, "--json")
    assert default.exit_code == 0 and json.loads(default.stdout)["node"]["loss"] == "LOSSY_GIST"
    rolled = run("roll-up", str(json.loads(lossy.stdout)["node"]["pos"]), str(node["pos"]),
                 str(json.loads(default.stdout)["node"]["pos"]), "-s", target, "--loss", "AUTO", "--json")
    # A roll-up's AUTO is its default: the weakest of its children's (LOSSY_LITERAL here).
    assert rolled.exit_code == 0 and json.loads(rolled.stdout)["node"]["loss"] == "LOSSY_LITERAL"


def test_digest_mark_and_resume(sqlite_target: str) -> None:
    """L2 over two L1 nodes, a certified marker, and its resolution, as text and as JSON."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        migration(st.session("m"))
    assert run("compact", "0", "8", "-s", sqlite_target, "--on-risk", "preserve", "--keep", "2:output").exit_code == 0
    assert run("compact", "8", "11", "-s", sqlite_target).exit_code == 0
    l2 = run("roll-up", "11", "12", "-s", sqlite_target)
    assert l2.exit_code == 0 and "L2 node at pos 13 over [0, 11)" in l2.stdout
    marked = run("mark", "13", "-s", sqlite_target)
    assert marked.exit_code == 0 and "certified: closure, negative_facts, anchoring" in marked.stdout
    res = run("resume", "-s", sqlite_target, "--context")
    assert res.exit_code == 0 and "marker 14: certified" in res.stdout and "[0, 11) L2 node 13" in res.stdout
    data = json.loads(run("resume", "14", "-s", sqlite_target, "--json").stdout)
    with cs.open(sqlite_target) as st:
        lib = st.session("m").resume(14)
    assert data["digest"] == lib.digest.hex() and data["mode"] == "certified"
    assert data["context"][0]["item"] == "summary"


def test_a_marker_over_a_summary_that_drops_a_negative_fact_is_refused_and_forged_falls_back(sqlite_target: str) -> None:
    """mark exits 1 listing the violations; a forged marker resumes as fallback; --require-certified exits 1."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        s = st.session("m")
        migration(s)
        node = s.compact(0, 8, summary="agent explored approaches", negative_facts=[], on_risk="preserve")
    refused = run("mark", str(node.pos), "-s", sqlite_target)
    assert refused.exit_code == 1
    assert "  - negative_facts at pos 2: failed item dropped" in refused.stderr
    assert "hint: a raw-checkpoint marker is always safe" in refused.stderr
    as_json = json.loads(run("mark", str(node.pos), "-s", sqlite_target, "--json").stdout)
    assert as_json["error"] == "MarkerInvalid" and len(as_json["violations"]) == 2
    with cs.open(sqlite_target) as st:
        s = st.session("m")
        size = s.size
        with unchecked():  # a writer that skips the rules
            s.append(cs.events.RecoveryMarker(size=size, root=s.head(size).root.hex(), node=node.pos,
                                              conditions=["closure", "negative_facts", "anchoring"]))
    res = run("resume", "-s", sqlite_target)
    assert res.exit_code == 0 and "fallback" in res.stdout and "because: negative_facts at pos 2" in res.stdout
    strict = run("resume", "-s", sqlite_target, "--require-certified")
    assert strict.exit_code == 1 and "fallback mode" in strict.stderr
    raw = run("mark", "--raw", "--size", "5", "-s", sqlite_target)
    assert raw.exit_code == 0 and "raw-checkpoint marker" in raw.stdout


def test_resume_refuses_a_checkpoint_that_does_not_verify(sqlite_built: str) -> None:
    """A raw body changed under a marker: resume exits 1 with the integrity error."""
    tamper(sqlite_built, "UPDATE events SET body = CAST(replace(CAST(body AS TEXT), 'No.', 'OK.') AS BLOB) WHERE pos = 4")
    result = run("resume", "-s", sqlite_built)
    assert result.exit_code == 1 and result.stderr.startswith("refused: event at pos 4 does not match its leaf")


# --- verify, proofs, audit ------------------------------------------------------------------------


def test_verify_reports_ok_and_tampering(sqlite_built: str) -> None:
    """verify exits 0 on a clean store and 1 listing problems on a tampered one; no bar when not a terminal."""
    ok = run("verify", "-s", sqlite_built)
    assert ok.exit_code == 0 and ok.stdout.startswith("ok: 1 session, 14 events")
    assert "━" not in ok.output
    conn = sqlite3.connect(sqlite_built)
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("UPDATE events SET body = CAST(replace(CAST(body AS TEXT), 'No.', 'OK.') AS BLOB) WHERE pos = 4")
    conn.commit()
    conn.close()
    bad = run("verify", "-s", sqlite_built)
    assert bad.exit_code == 1 and re.match(r"FAILED: \d+ problems in 1 session, 14 events", bad.stdout)
    assert "'m' events pos 4: leaf does not match body" in bad.stdout
    data = json.loads(run("verify", "-s", sqlite_built, "--json", "--session", "m").stdout)
    assert data["ok"] is False and data["problems"][0]["pos"] == 4


def test_proofs_print_json_that_check_verifies_offline(built: str, tmp_path: Path) -> None:
    """Inclusion and consistency proofs check out with no store; altered ones and wrong roots exit 1."""
    proof = run("proof", "inclusion", "4", "-s", built)
    assert proof.exit_code == 0
    doc = json.loads(proof.stdout)
    assert doc["proof"] == "inclusion" and doc["pos"] == 4 and "No. Do not backfill" in doc["entry"]
    checked = run("proof", "check", input=proof.stdout)
    assert checked.exit_code == 0 and checked.stdout.startswith("ok: pos 4 is in the tree at size")
    assert "session 'm' is the proof's word (--key-env checks it by the head MAC)" in checked.stdout
    assert run("proof", "check", "--root", doc["root"], input=proof.stdout).exit_code == 0
    assert run("proof", "check", "--root", "ab" * 32, input=proof.stdout).exit_code == 1
    forged = dict(doc, entry=doc["entry"].replace("No.", "OK."))
    assert run("proof", "check", input=json.dumps(forged)).exit_code == 1
    moved = dict(doc, pos=5)
    assert run("proof", "check", input=json.dumps(moved)).exit_code == 1
    assert run("proof", "check", input="{}").exit_code == 2
    assert run("proof", "check", input=json.dumps(dict(doc, root="zz"))).exit_code == 2
    path = tmp_path / "c.json"
    assert run("proof", "consistency", "5", "-s", built, "-o", str(path)).exit_code == 0
    result = run("proof", "check", str(path), "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["proof"] == "consistency"
    bad = json.loads(path.read_text())
    bad["old_root"] = "00" * 32
    assert run("proof", "check", input=json.dumps(bad)).exit_code == 1
    assert run("proof", "inclusion", "99", "-s", built).exit_code == 2


def test_audit_exits_1_on_a_finding(sqlite_target: str) -> None:
    """A binding compacted away and needed later is reported; a clean session exits 0."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        s = st.session("s")
        s.append(cs.Turn("user", "prepare"))
        s.bind("rollback", "migrations/003_down.sql")
        s.append(cs.Turn("assistant", "written"))
    assert run("audit", "-s", sqlite_target).exit_code == 0
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        s = st.session("s")
        s.compact(0, 3)
        s.oblige("roll-back", needs=["rollback"])
    result = run("audit", "-s", sqlite_target)
    assert result.exit_code == 1
    assert "lost: binding 'rollback' (bound at pos 1) was compacted away by the lossy node at pos 3" in result.stdout
    assert json.loads(run("audit", "-s", sqlite_target, "--json").stdout)["findings"][0]["steps_later"] == 1


def test_copy_is_still_a_subcommand(sqlite_built: str, tmp_path: Path) -> None:
    """`compactstore copy` works next to the new subcommands."""
    result = run("copy", sqlite_built, str(tmp_path / "c.db"))
    assert result.exit_code == 0 and "every root verified" in result.stdout
