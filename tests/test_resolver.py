"""Reconstruction: expansion may use a lossy artifact as a prior; restoration needs LOSSLESS and the log."""

from __future__ import annotations

import msgspec
import pytest
from test_compaction import ROLLBACK, migration

import compactstore as cs


@pytest.fixture
def session(store: cs.Store) -> cs.Session:
    """Return a session holding the migration story."""
    s = store.session("migration")
    migration(s)
    return s


@pytest.fixture
def lossy(session: cs.Session) -> cs.Artifact:
    """Return the artifact of a LOSSY_GIST node that kept the rollback script."""
    return session.artifact(session.compact(0, 8, on_risk="preserve"))


@pytest.fixture
def lossless(session: cs.Session) -> cs.Artifact:
    """Return the artifact of a LOSSLESS node over the same span."""
    return session.artifact(session.compact(0, 8, loss=cs.LossClass.LOSSLESS, keep=cs.AUTO))


def test_the_artifact_carries_loss_class_payload_and_digest(session: cs.Session, lossless: cs.Artifact) -> None:
    """An artifact names its literals by binding key (else ``pos:path``) and carries a digest over payload and span root."""
    assert lossless.loss is cs.LossClass.LOSSLESS
    assert lossless.payload["literals"] == {
        "0:content": "Make the users.email migration reversible.", "1:name": "run_sql", "1:args.dry_run": True,
        "1:args.sql": "ALTER TABLE users ADD email_new text", "2:output": "ERROR: lock timeout on users",
        "4:content": "No. Do not backfill in place.", "rollback": ROLLBACK, "tables": ["users", "orders"],
    }
    assert lossless.digest and lossless.span_root == session.span_root(0, 8).hex()


@pytest.mark.parametrize("operation", ["summarize", "plan", "brainstorm", "rank"])
def test_tolerant_operations_expand_a_lossy_artifact(session: cs.Session, lossy: cs.Artifact, operation: str) -> None:
    """Tolerant operations get the payload as a prior, whatever the loss class."""
    assert cs.reconstruct(lossy, operation, session.lookup) == lossy.payload


@pytest.mark.parametrize("operation", ["authorize", "commit", "emit_authoritative", "retry_idempotent"])
def test_restoration_on_a_lossy_artifact_is_refused(session: cs.Session, lossy: cs.Artifact, operation: str) -> None:
    """Restoration operations refuse LOSSY_GIST artifacts (a retry with no earlier attempt included)."""
    with pytest.raises(cs.ReconstructionUnsoundError, match="LOSSY_GIST"):
        cs.reconstruct(lossy, operation, session.lookup, prior={})


@pytest.mark.parametrize("tag", [None, "", "lossless", "LOSSY_LITERAL", 3])
def test_a_missing_or_unreadable_tag_is_treated_as_lossy_literal(session: cs.Session, lossless: cs.Artifact, tag: object) -> None:
    """Without a readable LOSSLESS tag the pessimistic default applies."""
    forged = msgspec.structs.replace(lossless, loss=tag)
    with pytest.raises(cs.ReconstructionUnsoundError, match="LOSSY_LITERAL"):
        cs.reconstruct(forged, "authorize", session.lookup)


def test_restoration_on_a_lossless_artifact_checks_every_literal(session: cs.Session, lossless: cs.Artifact) -> None:
    """A LOSSLESS artifact whose literals all match the log restores."""
    assert cs.reconstruct(lossless, "authorize", session.lookup) == lossless.payload
    assert session.lookup("rollback") == ROLLBACK and session.lookup("2:output") == "ERROR: lock timeout on users"
    assert session.lookup("nope") is None


def test_a_missing_digest_or_an_altered_payload_is_refused(session: cs.Session, lossless: cs.Artifact) -> None:
    """The digest must be present and must verify."""
    with pytest.raises(cs.ReconstructionUnsoundError, match="digest"):
        cs.reconstruct(msgspec.structs.replace(lossless, digest=None), "commit", session.lookup)
    literals = dict(lossless.payload["literals"], rollback="migrations/004_down.sql")  # type: ignore[arg-type]
    altered = dict(lossless.payload, literals=literals)
    with pytest.raises(cs.ReconstructionUnsoundError, match="altered"):
        cs.reconstruct(msgspec.structs.replace(lossless, payload=altered), "commit", session.lookup)


def test_a_literal_absent_from_or_different_in_the_durable_source_is_refused(lossless: cs.Artifact) -> None:
    """Every literal is re-checked against the durable source first."""
    with pytest.raises(cs.ReconstructionUnsoundError, match="'0:content' is absent"):
        cs.reconstruct(lossless, "commit", lambda name: None)
    durable = dict(lossless.payload["literals"], rollback="migrations/003_down_v2.sql")  # type: ignore[arg-type]
    with pytest.raises(cs.ReconstructionUnsoundError, match="corrupt"):
        cs.reconstruct(lossless, "commit", durable.get)


def test_unknown_operations_are_refused(session: cs.Session, lossless: cs.Artifact) -> None:
    """An operation of unknown class is not guessed at."""
    with pytest.raises(cs.ReconstructionUnsoundError, match="unknown operation"):
        cs.reconstruct(lossless, "deploy", session.lookup)


def test_an_invented_literal_is_refused(session: cs.Session, lossy: cs.Artifact) -> None:
    """A literal in neither the artifact nor this turn's tool results would be invented."""
    with pytest.raises(cs.ReconstructionUnsoundError, match="invented"):
        cs.reconstruct(lossy, "plan", session.lookup, uses={"commit_sha": "9f2c1e0"})
    got = cs.reconstruct(lossy, "plan", session.lookup, uses={"commit_sha": "9f2c1e0"}, tool_results=["9f2c1e0"])
    assert got == lossy.payload


def test_a_literal_contradicting_the_artifact_is_refused(session: cs.Session, lossless: cs.Artifact) -> None:
    """Acting on a value other than the artifact's literal is refused."""
    with pytest.raises(cs.ReconstructionUnsoundError, match="differs"):
        cs.reconstruct(lossless, "commit", session.lookup, uses={"rollback": "migrations/004_down.sql"})


def test_a_retry_that_reconstructs_a_different_literal_is_refused(session: cs.Session, lossless: cs.Artifact) -> None:
    """Attempts record their literals in the log; a retry under the same key must use the same ones."""
    first = session.reconstruct(lossless, "retry_idempotent", attempt="deploy-1", uses={"target": "prod-1"},
                                tool_results=["prod-1"])
    assert first == lossless.payload and session.read(session.size - 1).kind == "attempt"
    session.reconstruct(lossless, "retry_idempotent", attempt="deploy-1", uses={"target": "prod-1"},
                        tool_results=["prod-1"])
    size = session.size
    with pytest.raises(cs.ReconstructionUnsoundError, match="earlier attempt used 'prod-1'"):
        session.reconstruct(lossless, "retry_idempotent", attempt="deploy-1", uses={"target": "prod-2"},
                            tool_results=["prod-2"])
    assert session.size == size
    # Another attempt key is another operation.
    session.reconstruct(lossless, "retry_idempotent", attempt="deploy-2", uses={"target": "prod-2"},
                        tool_results=["prod-2"])


def test_authorize_on_a_lossy_node_is_refused_even_when_the_log_agrees(session: cs.Session, lossy: cs.Artifact) -> None:
    """The loss class, not the luck of the literals, decides restoration."""
    assert session.lookup("rollback") == lossy.payload["literals"]["rollback"]  # type: ignore[index]
    with pytest.raises(cs.ReconstructionUnsoundError):
        session.reconstruct(lossy, "authorize")
