"""The retry guard: attempts under one idempotency key act on the same literals, atomically.

The earlier attempts are read and the new one recorded in one write transaction (the
attempt is admitted like any derived event), so the guard holds however the attempt
arrives: two processes racing, a direct append, a batch, the command line, a copy.
"""

from __future__ import annotations

import json
import multiprocessing
import queue
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_compaction import migration

import compactstore as cs
from compactstore.index import Index
from compactstore import resolver
from compactstore.cli import main
from compactstore.events import Attempt
from forge import unchecked


def _lossless(s: cs.Session) -> cs.Artifact:
    """Return the artifact of a LOSSLESS node over the migration story's first eight events."""
    return s.artifact(s.compact(0, 8, loss=cs.LossClass.LOSSLESS, keep=cs.AUTO))


@pytest.fixture
def session(store: cs.Store) -> cs.Session:
    """Return a session holding the migration story."""
    s = store.session("migration")
    migration(s)
    return s


def _attempts(s: cs.Session) -> list[Attempt]:
    return [r.event for r in s.scan() if isinstance(r.event, Attempt)]


# --- two writers racing ------------------------------------------------------------------


def _race(target: str, literal: str, gate: Any, results: Any) -> None:
    """Reconstruct under attempt key 'deploy' acting on ``literal``, after both writers read the earlier attempts."""
    real = resolver.reconstruct

    def held(*args: Any, **kwargs: Any) -> dict[str, Any]:
        # Both writers have read the earlier attempts (none) before either records its own:
        # the interleaving a guard that reads and writes in two transactions lets through.
        out = real(*args, **kwargs)
        gate.wait(timeout=60)
        return out

    resolver.reconstruct = held  # type: ignore[assignment]
    try:
        with cs.open(target) as st:
            s = st.session("migration")
            artifact = s.artifact(s.nodes()[0])
            s.reconstruct(artifact, "retry_idempotent", attempt="deploy", uses={"target": literal},
                          tool_results=[literal])
        results.put((literal, "ok"))
    except cs.ReconstructionUnsoundError as exc:
        results.put((literal, f"refused: {exc}"))
    except BaseException as exc:  # reported to the parent, which fails the test
        results.put((literal, f"error: {type(exc).__name__}: {exc}"))


def test_two_processes_racing_under_one_key_with_different_literals_cannot_both_succeed(target: str) -> None:
    """Two processes retry under one key with different literals, both past the read: the second commit is refused."""
    with cs.open(target, clock=cs.events.tick_clock()) as st:
        s = st.session("migration")
        migration(s)
        _lossless(s)
        size = s.size
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    gate = ctx.Barrier(2)
    procs = [ctx.Process(target=_race, args=(target, literal, gate, results)) for literal in ("prod-1", "prod-2")]
    for p in procs:
        p.start()
    got = []
    try:
        for _ in procs:
            got.append(results.get(timeout=120))
    except queue.Empty:
        pytest.fail(f"a writer did not report; got {got}")
    finally:
        for p in procs:
            p.join(timeout=60)
    outcomes = sorted(o.split(":")[0] for _, o in got)
    assert outcomes == ["ok", "refused"], got
    winner = next(lit for lit, o in got if o == "ok")
    with cs.open(target) as st:
        s = st.session("migration")
        attempts = _attempts(s)
        assert [a.literals["target"] for a in attempts] == [winner]
        assert s.size == size + 1
        assert st.verify().ok


# --- the guard's memory --------------------------------------------------------------------


def test_an_attempt_with_no_literal_does_not_reset_the_guard(session: cs.Session) -> None:
    """An attempt that acted on no literal leaves the literals earlier attempts used binding on later ones."""
    lossless = _lossless(session)
    session.reconstruct(lossless, "retry_idempotent", attempt="deploy", uses={"target": "prod-1"},
                        tool_results=["prod-1"])
    bare = cs.Artifact(cs.LossClass.LOSSY_GIST, {"summary": "deploying", "literals": {}}, None)
    session.reconstruct(bare, "plan", attempt="deploy")
    assert _attempts(session)[-1].literals == {}
    size = session.size
    with pytest.raises(cs.ReconstructionUnsoundError, match="earlier attempt used 'prod-1'"):
        session.reconstruct(lossless, "retry_idempotent", attempt="deploy", uses={"target": "prod-2"},
                            tool_results=["prod-2"])
    with pytest.raises(cs.ReconstructionUnsoundError, match="earlier attempt used 'prod-1'"):
        session.append(Attempt(key="deploy", operation="commit", literals={"target": "prod-2"}))
    assert session.size == size
    session.reconstruct(lossless, "retry_idempotent", attempt="deploy", uses={"target": "prod-1"},
                        tool_results=["prod-1"])
    assert session.size == size + 1


def test_retry_idempotent_needs_an_attempt_key(session: cs.Session) -> None:
    """retry_idempotent without an attempt key (or, in the pure function, without prior) is a typed error."""
    lossless = _lossless(session)
    size = session.size
    with pytest.raises(cs.InvalidArgument) as info:
        session.reconstruct(lossless, "retry_idempotent", uses={"target": "prod-1"}, tool_results=["prod-1"])
    assert info.value.field == "attempt"
    with pytest.raises(cs.InvalidArgument) as info:
        cs.reconstruct(lossless, "retry_idempotent", session.lookup)
    assert info.value.field == "prior"
    assert session.size == size
    assert cs.reconstruct(lossless, "retry_idempotent", session.lookup, prior={}) == lossless.payload


# --- whichever way the attempt arrives ---------------------------------------------------------


@pytest.mark.parametrize("way", ["append", "extend", "batch"])
def test_an_attempt_appended_directly_is_held_to_the_earlier_ones(session: cs.Session, way: str) -> None:
    """An attempt appended or extended by hand is admitted only if it agrees with the earlier attempts under its key."""
    session.append(Attempt(key="deploy", operation="commit", literals={"target": "prod-1", "n": 1}))
    size = session.size
    other = Attempt(key="deploy", operation="retry_idempotent", literals={"target": "prod-2"})
    with pytest.raises(cs.ReconstructionUnsoundError, match="'x'" if way == "batch" else "'target'"):
        if way == "append":
            session.append(other)
        elif way == "extend":
            session.extend([cs.Turn("user", "again"), other])
        else:
            session.extend([Attempt(key="fresh", operation="commit", literals={"x": 1}),
                            Attempt(key="fresh", operation="commit", literals={"x": 1.0})])
    assert session.size == size
    # Same literals, a literal of its own, or another key: admitted.
    session.extend([Attempt(key="deploy", operation="commit", literals={"target": "prod-1", "extra": True}),
                    Attempt(key="other", operation="commit", literals={"target": "prod-2"})])
    with pytest.raises(cs.ReconstructionUnsoundError, match="'extra'"):
        session.append(Attempt(key="deploy", operation="commit", literals={"extra": False}))


def test_an_attempt_line_on_the_command_line_is_held_to_the_earlier_ones(target: str, tmp_path: Path) -> None:
    """`compactstore append` of a conflicting attempt exits 1 and writes nothing."""
    first = {"kind": "attempt", "key": "deploy", "operation": "commit", "literals": {"target": "prod-1"}}
    second = {**first, "literals": {"target": "prod-2"}}
    runner = CliRunner()
    ok = runner.invoke(main, ["append", "-s", target, "--session", "s"], input=json.dumps(first) + "\n")
    assert ok.exit_code == 0, ok.output
    refused = runner.invoke(main, ["append", "-s", target, "--session", "s"], input=json.dumps(second) + "\n")
    assert refused.exit_code == 1 and "earlier attempt used 'prod-1'" in refused.stderr, refused.stderr
    with cs.open(target) as st:
        assert [a.literals for a in _attempts(st.session("s"))] == [{"target": "prod-1"}]


def test_a_copy_refuses_conflicting_attempts(target: str, tmp_path: Path) -> None:
    """A source log holding two conflicting attempts under one key (written past the rules) is not copied."""
    src = str(tmp_path / "forged.db")
    with cs.open(src, clock=cs.events.tick_clock()) as st:
        s = st.session("s")
        s.append(Attempt(key="deploy", operation="commit", literals={"target": "prod-1"}))
        with unchecked():
            s.append(Attempt(key="deploy", operation="commit", literals={"target": "prod-2"}))
    with cs.open(src) as a, cs.open(target) as b, pytest.raises(cs.IntegrityError, match="breaks a rule"):
        cs.copy(a, b)
    with cs.open(target) as b:
        assert b.session("s").size == 0


def test_the_index_lists_the_attempts_under_a_key_before_a_position(store: cs.Store) -> None:
    """The index names the attempts under a key before a position, in order; an erased one still guards, by its digests."""
    s = store.session("s")
    s.append(cs.Turn("user", "deploy"))
    first = s.append(Attempt(key="deploy", operation="commit", literals={"target": "prod-1"}))
    s.append(cs.Turn("user", "again"))
    second = s.append(Attempt(key="other", operation="commit"))
    sid = store.backend.session_id("s")
    assert sid is not None
    index = Index(store.backend, sid)
    assert index.attempt_positions("deploy", s.size) == [first.pos]
    assert index.attempt_positions("other", s.size) == [second.pos]
    assert index.attempt_positions("other", second.pos) == []
    assert s.view.facts().attempts("deploy") == [(first.pos, first.event)]
    s.redact([first.pos], "forget")
    guard = cs.rules.guard_of(first.pos, first.event)  # type: ignore[arg-type]
    assert s.view.facts().attempts("deploy") == [(first.pos, guard)] and "prod-1" not in str(guard)
    # The redaction kept the digests of what the erased attempt acted on: a retry is still held to them.
    with pytest.raises(cs.ReconstructionUnsoundError, match="another value"):
        s.append(Attempt(key="deploy", operation="commit", literals={"target": "prod-2"}))
    s.append(Attempt(key="deploy", operation="commit", literals={"target": "prod-1"}))
