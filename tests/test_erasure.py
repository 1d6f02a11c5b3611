"""Erased bodies: a body erased or changed behind the store's back never certifies, and a redaction reaches every copy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from forge import unchecked
from sqlite_edit import unguarded

import compactstore as cs
from compactstore import events as ev

KEY = b"k" * 32
SECRET = "tok-7f3a-SECRET-91"


def _edit(target: str, sql: str, args: tuple[Any, ...]) -> None:
    """Run one statement on the store as someone holding the database: the append-only triggers dropped first."""
    if "://" in target:
        import psycopg

        with psycopg.connect(target, autocommit=True) as conn:
            for table, name in conn.execute(
                "SELECT tgrelid::regclass::text, tgname FROM pg_trigger WHERE NOT tgisinternal"
            ).fetchall():
                conn.execute(f"DROP TRIGGER {name} ON {table}")
            conn.execute(sql.replace("?", "%s"), args)  # type: ignore[arg-type]
        return
    conn = unguarded(target, isolation_level=None)
    conn.execute(sql, args)
    conn.close()


def _story(s: cs.Session) -> tuple[cs.Node, cs.Marker]:
    """Write a node that drops a rejection (0..4, spill at 5, node at 6) and plant a marker that certifies it."""
    s.append(cs.Turn("user", "Make the users.email migration reversible."))
    s.append(cs.Turn("user", "No, do not backfill in place.", status="rejected"))
    s.bind("rollback", "migrations/003_down.sql")
    s.oblige("finish-migration", needs=["rollback"])
    s.append(cs.Turn("assistant", "Writing the down migration."))
    node = s.compact(0, 5, on_risk="spill", negative_facts=[], summary="a reversible migration, in progress")
    with pytest.raises(cs.MarkerInvalid):
        s.mark(node)
    with unchecked():  # what a writer skipping the rules could have appended
        planted = s.mark(node)
    s.reconstruct(s.artifact(node), "plan", attempt="retry-1")  # an attempt at 8, which the retry guard reads
    return node, planted


TAMPERED = {"the dropped rejection": 1, "the needed binding": 2, "its spill": 5, "the earlier attempt": 8}


@pytest.mark.parametrize("key", [None, KEY], ids=["unkeyed", "keyed"])
@pytest.mark.parametrize("how", ["nulled", "nulled and marked redacted", "edited"])
@pytest.mark.parametrize("what", list(TAMPERED))
def test_a_body_changed_behind_the_stores_back_is_an_integrity_error(
    target: str, what: str, how: str, key: bytes | None
) -> None:
    """Resume (with and without rehash), mark and every restoration raise IntegrityError naming the position; none certifies."""
    pos = TAMPERED[what]
    with cs.open(target, key=key, clock=cs.events.tick_clock()) as st:
        s = st.session("run")
        node, planted = _story(s)
        sid = st.backend.session_id("run")
        body = s.read(pos).body
    where = "WHERE session_id = ? AND pos = ?"
    if how == "nulled":
        _edit(target, f"UPDATE events SET body = NULL {where}", (sid, pos))
    elif how == "nulled and marked redacted":
        _edit(target, f"UPDATE events SET body = NULL, kind = 'redacted', idem_key = NULL {where}", (sid, pos))
    else:
        _edit(target, f"UPDATE events SET body = ? {where}", (body.replace(b'"', b"'", 1) + b" ", sid, pos))
    with cs.open(target, key=key) as st:
        s = st.session("run")
        calls: dict[str, Any] = {
            "resume(rehash=True)": lambda: s.resume(planted, rehash=True),
            "resume": lambda: s.resume(planted),
            "mark": lambda: s.mark(node),
        }
        if pos < node.stop:
            calls["restore_span"] = lambda: s.restore_span(node)
        if what == "the needed binding":
            calls["lookup"] = lambda: s.lookup("rollback")
        if what == "the earlier attempt":  # after the marker: only the retry guard reads it
            calls = {"reconstruct": lambda: s.reconstruct(s.artifact(node), "plan", attempt="retry-1")}
        if what == "its spill":
            calls["spilled"] = lambda: s.spilled(node.spills[0].handle)
        size = s.size
        for name, call in calls.items():
            with pytest.raises(cs.IntegrityError) as caught:
                call()
                pytest.fail(f"{name} did not raise")
            assert (caught.value.session, caught.value.pos) == ("run", pos), name
        assert s.size == size
        assert not st.verify().ok


def _secret_story(s: cs.Session) -> tuple[cs.Node, cs.Marker]:
    """Write a secret into a turn, a call, a failed result and a binding; spill, summarize, mark and attempt with it."""
    s.append(cs.Turn("user", f"Deploy with the token {SECRET}."))
    s.append(cs.ToolCall("c1", "deploy", {"token": SECRET}))
    s.append(cs.ToolResult("c1", f"401 Unauthorized for {SECRET}", ok=False, status="failed"))
    s.bind("token", SECRET)
    s.oblige("deploy", needs=["token"])
    node = s.compact(0, 5, on_risk="spill")  # the extractive summary and the fact text quote it
    marker = s.mark(node)
    art = s.artifact(node)
    assert s.resume(marker).mode == "certified" and SECRET in msgspec.json.encode(art.payload).decode()
    assert s.spilled(node.spills[0].handle) == SECRET
    s.reconstruct(art, "plan", uses={"token": SECRET}, tool_results=[SECRET], attempt="deploy-1")
    return node, marker


def test_a_redaction_erases_every_copy_of_a_secret(target: str) -> None:
    """Spill, node (summary, fact text, artifact) and attempt are erased with the secret; verify passes, markers fall back."""
    with cs.open(target, clock=cs.events.tick_clock()) as st:
        s = st.session("run")
        node, marker = _secret_story(s)
        attempt = s.size - 1
        red = s.redact([0, 1, 2, 3], "a leaked credential")
        assert set(red.event.positions) == {0, 1, 2, 3, node.spills[0].source + 2, node.pos, attempt}  # type: ignore[attr-defined]
        with pytest.raises(cs.ReconstructionUnsoundError, match="redacted"):
            s.spilled(node.spills[0].handle)
        with pytest.raises(cs.InvalidArgument, match="not a summary node"):
            s.artifact(node.pos)
        for rehash in (False, True):
            res = s.resume(marker, rehash=rehash)
            assert res.mode == "fallback" and SECRET not in msgspec.json.encode(res.context).decode()
        assert s.lookup("token") is None
        assert not [r.pos for r in s.scan() if SECRET.encode() in r.body]
        report = st.verify()
        assert report.ok and report.redacted == len(red.event.positions), report.problems  # type: ignore[attr-defined]
        with pytest.raises(cs.MarkerInvalid):
            s.mark(node)
    if "://" not in target:  # every byte of the file and its write-ahead log
        for path in (Path(target), Path(target + "-wal")):
            if path.exists():
                assert SECRET.encode() not in path.read_bytes(), path


def test_a_redaction_that_leaves_a_copy_is_refused(store: cs.Store) -> None:
    """A redaction event appended by hand must list every derived copy of what it erases; else nothing is written."""
    s = store.session("run")
    _secret_story(s)
    size = s.size
    with pytest.raises(cs.InvalidEvent, match="quote"):
        s.append(ev.Redaction(positions=[3], reason="only the binding"))
    assert s.size == size and s.read(3).kind == "binding"


def test_redacting_a_dropped_rejection_never_makes_a_refused_node_certify(target: str) -> None:
    """A node refused for dropping an event stays refused, and its planted marker uncertified, after the event is redacted."""
    with cs.open(target, clock=cs.events.tick_clock()) as st:
        s = st.session("run")
        node, planted = _story(s)
        assert s.resume(planted).mode == "fallback"
        s.redact([1], "the user asked to forget it")
        assert s.read(node.pos).kind == "redacted"  # built from its span: erased with it
        with pytest.raises((cs.MarkerInvalid, cs.InvalidArgument)):
            s.mark(node.pos)
        for rehash in (False, True):
            res = s.resume(planted, rehash=rehash)
            assert res.mode == "fallback" and res.reasons


def test_a_lossless_compaction_over_a_redacted_binding_is_refused(store: cs.Store) -> None:
    """A redacted position is unknown, so no node over it can claim LOSSLESS; nothing is written."""
    s = store.session("run")
    s.append(cs.Turn("user", "Rotate the key."))
    s.bind("old_key_id", "kid-7f3a")
    s.append(cs.Turn("assistant", "Rotated."))
    s.redact([1], "secret id")
    size = s.size
    with pytest.raises(cs.CompactionInvariantError, match="redacted"):
        s.compact(0, 3, loss=cs.LossClass.LOSSLESS)
    assert s.size == size


def test_a_key_rebound_then_redacted_has_no_known_value(store: cs.Store) -> None:
    """A lookup does not serve an earlier value when a later, redacted position may have bound the key anew."""
    s = store.session("run")
    s.bind("token", "tok-old-0001")
    s.bind("token", "tok-new-0002")
    s.redact([1], "leaked")
    assert s.lookup("token") is None


#: Secrets whose every copy a summarizer may reword: re-spaced, JSON-escaped, a map key, a tool name.
REWORDED: dict[str, Callable[[str], ev.Event]] = {
    "two lines": lambda secret: cs.Turn("user", f"the password is\n{secret}\nnow"),
    "double space": lambda secret: cs.Turn("user", f"token  {secret}  end"),
    "backslash and quote": lambda secret: cs.ToolCall("c1", "login", {"pw": secret + '\\"x'}),
    "map key": lambda secret: cs.ToolResult("c1", {secret: "the key itself"}),
    "tool name": lambda secret: cs.ToolCall("c1", secret, {}),
}


@pytest.mark.parametrize("form", sorted(REWORDED))
def test_a_redaction_erases_every_node_built_from_the_secret_however_its_text_was_reworded(target: str, form: str) -> None:
    """Provenance, not text: an L1 over the secret and the digest over it are erased, and no byte of the secret stays."""
    secret = "hunter2-" + form.replace(" ", "-")
    with cs.open(target, clock=ev.tick_clock()) as st:
        s = st.session("run")
        s.extend([cs.Turn("user", "start"), REWORDED[form](secret), cs.Turn("assistant", "done")])
        a = s.compact(0, 3, summarizer=lambda records: " ".join(cs.events.encode_json(r.event) for r in records)[:1500])
        s.extend([cs.Turn("user", f"step {i}") for i in range(3)])
        b = s.compact(a.stop, s.size)
        digest = s.roll_up([a, b], summary="everything so far, with " + cs.events.encode_json(secret))
        s.mark()
        red = s.redact([1], "a leaked credential")
        assert {a.pos, digest.pos} <= set(red.event.positions) and b.pos not in red.event.positions  # type: ignore[attr-defined]
        assert not [r.pos for r in s.scan() if secret.encode() in r.body]
        assert st.verify().ok
    if "://" not in target:
        for path in (Path(target), Path(target + "-wal")):
            if path.exists():
                assert secret.encode() not in path.read_bytes(), path


def test_a_node_built_before_a_redaction_in_its_own_batch_is_refused(store: cs.Store) -> None:
    """A redaction and a node or spill built from what it erases, in one extend, are refused: nothing is written."""
    s = store.session("run")
    s.extend([cs.Turn("user", "the token is tok-123"), cs.Turn("assistant", "ok")])
    s.bind("token", "tok-123")
    s.oblige("use", needs=["token"])
    node = cs.compaction.compaction(s.view, s.size, 0, 3, on_risk="spill")
    size = s.size
    for later in (node, node[-1:]):
        with pytest.raises(cs.InvalidEvent, match="redaction before it"):
            s.extend([ev.Redaction(positions=[0, 2], reason="leak"), *later])
        assert s.size == size


def test_the_retry_guard_outlives_the_redaction_of_an_attempt_or_of_the_binding_it_quotes(store: cs.Store) -> None:
    """Erasing an attempt, or the binding it acted on, keeps its digests: a retry under its key acting on another value is refused."""
    s = store.session("run")
    s.bind("target", "prod-1")
    s.oblige("deploy", needs=["target"])
    s.append(cs.Turn("user", "deploy it"))
    node = s.compact(0, 3, keep=cs.AUTO, loss=cs.AUTO)
    art = s.artifact(node)
    s.reconstruct(art, "commit", attempt="deploy-7")
    attempt = s.size - 1
    red = s.redact([0], "rotate the target")  # the binding: the attempt acted on it, and goes with it
    assert attempt in red.event.positions  # type: ignore[attr-defined]
    (guard,) = red.event.guards  # type: ignore[attr-defined]
    assert guard.pos == attempt and guard.key == "deploy-7" and "prod-1" not in str(guard)
    with pytest.raises(cs.ReconstructionUnsoundError, match="another value"):
        s.append(cs.events.Attempt(key="deploy-7", operation="commit", literals={"target": "prod-2"}))
    again = s.append(cs.events.Attempt(key="deploy-7", operation="commit", literals={"target": "prod-1"}))
    with pytest.raises(cs.InvalidEvent, match="guards"):  # a redaction that drops the guard is refused
        s.append(ev.Redaction(positions=[again.pos], reason="again"))
