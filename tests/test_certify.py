"""What certifies and what restores: every input re-read from the log and held to a sealed head.

A restoration or certification takes only a position (and a digest) from a caller's
``Node``, ``Marker`` or ``Artifact``; everything else is read again from the session,
checked against its leaf and the latest sealed head. A keyed store opened without its
key certifies nothing, and a resolution says what it certifies.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
from forge import unchecked
from sqlite_edit import unguarded
from test_compaction import ROLLBACK, migration

import compactstore as cs
from compactstore import merkle
from compactstore.errors import ForeignReference, KeyRequired
from compactstore.resolver import artifact_digest

KEY = b"certify-test-key-0123456789abcdef"
RESTORATIONS = ["authorize", "commit"]

Run = Callable[..., list[Any]]


def readme_story(s: cs.Session) -> cs.Node:
    """Write the README's ten lines up to its compaction; return its LOSSY_GIST node."""
    s.append(cs.Turn("user", "Make the users.email migration reversible."))
    s.append(cs.ToolResult("c1", "ERROR: lock timeout on users", ok=False, status="failed"))
    s.bind("rollback", "migrations/003_down.sql")
    s.oblige("finish-migration", needs=["rollback"])
    return s.compact(0, 4, on_risk="spill")


def relabelled(art: cs.Artifact, loss: str = "LOSSLESS", *, recompute: bool = False) -> cs.Artifact:
    """Return ``art`` after a round trip through JSON with its loss tag edited (and its digest recomputed)."""
    data = json.loads(msgspec.json.encode(art))
    data["loss"] = loss
    out = cs.Artifact(**json.loads(json.dumps(data)))
    if recompute:
        out = msgspec.structs.replace(out, digest=artifact_digest(
            out.payload, out.span_root, loss=out.loss, session=out.session, node=out.node, size=out.size,
            root=out.root, store=out.store,
        ))
    return out


@contextmanager
def attacker(target: str) -> Iterator[Run]:
    """Yield ``run(sql, args)`` on the store's database with its append-only triggers dropped (``?`` placeholders)."""
    if target.startswith("postgres"):
        import psycopg

        with psycopg.connect(target, autocommit=True) as conn:
            for table, name in conn.execute(
                "SELECT c.relname, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE NOT t.tgisinternal AND n.nspname = current_schema()"
            ).fetchall():
                conn.execute(f'DROP TRIGGER "{name}" ON "{table}"')

            def run_pg(sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
                cur = conn.execute(sql.replace("?", "%s"), args)  # type: ignore[arg-type]
                return cur.fetchall() if cur.description else []

            yield run_pg
        return
    conn = unguarded(target)

    def run_lite(sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        return conn.execute(sql, args).fetchall()

    try:
        yield run_lite
        conn.commit()
    finally:
        conn.close()


def forge_event(run: Run, session: str, pos: int, event: cs.Event) -> None:
    """Rewrite the body at ``pos``, recompute its leaf and every stored subtree root; leave the sealed heads alone."""
    ((sid,),) = run("SELECT id FROM sessions WHERE name = ?", (session,))
    body = cs.events.encode(event)
    run("UPDATE events SET body = ?, leaf = ? WHERE session_id = ? AND pos = ?", (body, merkle.leaf_hash(body), sid, pos))
    leaves = [bytes(leaf) for (leaf,) in run("SELECT leaf FROM events WHERE session_id = ? ORDER BY pos", (sid,))]
    run("DELETE FROM subtrees WHERE session_id = ?", (sid,))
    frontier = merkle.Frontier()
    for leaf in leaves:
        for level, idx, h in frontier.append(leaf):
            if merkle.is_stored(level):
                run("INSERT INTO subtrees (session_id, level, idx, hash) VALUES (?, ?, ?, ?)", (sid, level, idx, h))


# --- class 1: what a restoration decision rests on ---------------------------------------


def test_the_readme_artifact_relabelled_lossless_is_refused(store: cs.Store) -> None:
    """The README's LOSSY_GIST artifact, through JSON with its tag edited to LOSSLESS, is refused, digest recomputed or not."""
    s = store.session("run-42")
    node = readme_story(s)
    art = s.artifact(node)
    assert art.loss is cs.LossClass.LOSSY_GIST
    for recompute in (False, True):
        forged = relabelled(art, recompute=recompute)
        assert forged.loss == cs.LossClass.LOSSLESS
        for operation in RESTORATIONS:
            with pytest.raises(cs.ReconstructionUnsoundError, match="LOSSY_GIST|altered"):
                s.reconstruct(forged, operation)
            with pytest.raises(cs.ReconstructionUnsoundError, match="LOSSY_GIST|altered"):
                cs.reconstruct(forged, operation, s.lookup)
    assert s.reconstruct(relabelled(art), "plan")  # a tolerant operation may still use it as a prior


def test_an_edited_node_object_is_only_a_position(store: cs.Store) -> None:
    """A Node edited in memory gives the logged node's artifact; one whose leaf or session differs is refused."""
    s = store.session("migration")
    migration(s)
    node = s.compact(0, 8, on_risk="preserve")
    edited = msgspec.structs.replace(node, loss=cs.LossClass.LOSSLESS, summary="all kept")
    art = s.artifact(edited)
    assert art.loss is cs.LossClass.LOSSY_GIST and art == s.artifact(node.pos)
    with pytest.raises(cs.ReconstructionUnsoundError, match="LOSSY_GIST"):
        s.reconstruct(art, "authorize")
    other = store.session("other")
    migration(other)
    for foreign, owner in ((msgspec.structs.replace(node, leaf=b"\x00" * 32), s), (node, other)):
        for call in (owner.artifact, owner.restore_span, owner.mark):
            with pytest.raises(ForeignReference):
                call(foreign)
    marker = s.mark(node)
    with pytest.raises(ForeignReference, match="session 'migration'"):
        other.resume(marker)


def test_an_artifact_that_names_no_node_is_refused(store: cs.Store) -> None:
    """An artifact with a valid-looking digest but no node, tree head, session or store restores nothing."""
    s = store.session("migration")
    migration(s)
    real = s.artifact(s.compact(0, 8, loss=cs.LossClass.LOSSLESS, keep=cs.AUTO))
    bare = cs.Artifact(real.loss, real.payload, None, real.span_root)
    bare = msgspec.structs.replace(bare, digest=artifact_digest(bare.payload, bare.span_root, loss=bare.loss))
    for operation in RESTORATIONS:
        with pytest.raises(cs.ReconstructionUnsoundError):
            s.reconstruct(bare, operation)
        with pytest.raises(cs.ReconstructionUnsoundError, match="names no node"):
            cs.reconstruct(bare, operation, s.lookup)
    assert s.reconstruct(real, "authorize") == real.payload


def test_an_artifact_from_another_session_is_refused(store: cs.Store) -> None:
    """A LOSSLESS artifact of one session does not restore in another holding the same events."""
    a, b = store.session("a"), store.session("b")
    for s in (a, b):
        migration(s)
        s.compact(0, 8, loss=cs.LossClass.LOSSLESS, keep=cs.AUTO)
    art = a.artifact(11)
    assert a.reconstruct(art, "authorize") == art.payload
    for operation in RESTORATIONS:
        with pytest.raises(ForeignReference, match="session 'a'"):
            b.reconstruct(art, operation)


def test_an_artifact_from_another_store_is_refused(store: cs.Store, tmp_path: Path) -> None:
    """A LOSSLESS artifact does not restore in another store, even one holding byte-identical events."""
    s = store.session("migration")
    migration(s)
    node = s.compact(0, 8, loss=cs.LossClass.LOSSLESS, keep=cs.AUTO)
    art = s.artifact(node)
    with cs.open(str(tmp_path / "other.db"), clock=cs.events.tick_clock()) as other:
        t = other.session("migration")
        migration(t)
        twin = t.compact(0, 8, loss=cs.LossClass.LOSSLESS, keep=cs.AUTO)
        assert twin.leaf == node.leaf and t.head().root == s.head().root  # the very same log
        assert t.reconstruct(t.artifact(twin), "authorize")
        for operation in RESTORATIONS:
            with pytest.raises(ForeignReference, match="another store"):
                t.reconstruct(art, operation)
            with pytest.raises(ForeignReference, match="another store"):
                t.reconstruct(relabelled(art, recompute=True), operation)


# --- class 7: a keyed store without its key, and the sealed head --------------------------


def test_a_keyed_store_opened_without_its_key_certifies_nothing(open_store: Callable[..., cs.Store]) -> None:
    """A forged session planted without the key is never certified without the key, and refused with it."""
    with open_store(key=KEY) as owner:
        readme_story(owner.session("run-42"))
    # The attacker writes a whole session with the library but not the key: seals are plain digests.
    forger = open_store()
    forger.keyed = False
    f = forger.session("forged")
    f.append(cs.Turn("user", "Make the users.email migration reversible."))
    f.append(cs.ToolResult("c1", "migration done", ok=True))  # the failure, rewritten as a success
    f.bind("rollback", "migrations/EVIL_down.sql")
    node = f.compact(0, 3, loss=cs.LossClass.LOSSLESS, keep=cs.AUTO)
    marker = f.mark(node)
    forger.close()
    keyless = open_store()
    s = keyless.session("forged")
    for rehash in (True, False):
        with pytest.raises(KeyRequired, match="open it with its key"):
            s.resume(marker.pos, rehash=rehash)
    with pytest.raises(KeyRequired):
        s.artifact(node.pos)  # its digest would certify: not without the key
    calls: list[Callable[[], object]] = [
        lambda: s.lookup("rollback"), lambda: s.lookup("2:value"), lambda: s.restore_span(node.pos),
        lambda: s.mark(node.pos), lambda: s.spilled("spill:2"),
    ]
    for call in calls:
        with pytest.raises(KeyRequired):
            call()
    assert s.read(2).event.value == "migrations/EVIL_down.sql"  # type: ignore[attr-defined]  # reading is allowed
    keyed = open_store(key=KEY).session("forged")
    with pytest.raises(cs.IntegrityError):
        keyed.resume(marker.pos, rehash=True)
    with pytest.raises(cs.IntegrityError, match="seal"):
        keyed.lookup("rollback")


@pytest.mark.parametrize("what", ["spill", "binding"])
def test_a_forged_value_with_its_subtree_table_is_refused(open_store: Callable[..., cs.Store], target: str, what: str) -> None:
    """A spill or binding rewritten with its leaf and every stored subtree root recomputed fails the sealed head."""
    s = open_store(key=KEY).session("migration")
    migration(s)
    node = s.compact(0, 8, on_risk="spill")
    handle = node.spills[0].handle
    assert s.spilled(handle) == ROLLBACK and s.lookup("rollback") == ROLLBACK
    root = s.head().root
    evil = "migrations/004_drop_users.sql"
    if what == "spill":
        pos = int(handle.split(":")[1])
        spill = s.read(pos).event
        forged: cs.Event = msgspec.structs.replace(spill, value=evil, digest=cs.rules.value_digest(evil))
    else:
        pos = 5
        forged = msgspec.structs.replace(s.read(pos).event, value=evil)
    with attacker(target) as run:
        forge_event(run, "migration", pos, forged)
    s = open_store(key=KEY).session("migration")
    assert s.view.root_with({}, s.size) != root  # the subtree table was rewritten to match the forged leaf
    assert s.head().root == root  # the head is the sealed one's, never the rewritten table's
    reads: list[Callable[[], object]] = [lambda: s.lookup(f"{pos}:value"), lambda: s.lookup("rollback")]
    if what == "spill":
        reads.append(lambda: s.spilled(handle))
    for read in reads:
        with pytest.raises(cs.IntegrityError, match="sealed head"):
            read()


# --- class 10: certified says what it certifies ---------------------------------------------


def test_a_resolution_names_its_loss_class_and_restorable_literals(store: cs.Store) -> None:
    """A certified tier carries its loss class; only a LOSSLESS one lists restorable literals; a fallback neither."""
    s = store.session("migration")
    migration(s)
    lossless = s.compact(0, 8, loss=cs.LossClass.LOSSLESS, keep=cs.AUTO)
    names = sorted(s.artifact(lossless).payload["literals"])  # type: ignore[arg-type]
    assert {"2:output", "rollback", "tables"} <= set(names)
    t = store.session("gist")
    migration(t)
    gist = t.compact(0, 8, on_risk="preserve")
    for session, node, loss, names in (
        (s, lossless, cs.LossClass.LOSSLESS, names),
        (t, gist, cs.LossClass.LOSSY_GIST, []),
    ):
        marker = session.mark(node)
        got = [session.resume(marker), session.resume(marker, rehash=True)]
        assert [(r.mode, r.loss, r.restorable) for r in got] == [("certified", loss, names)] * 2
        assert got[0].digest == got[1].digest
        raw = session.resume(session.mark_raw())
        assert (raw.mode, raw.loss, raw.restorable) == ("fallback", None, [])


def test_restoration_from_a_lossy_tier_is_refused_whatever_path(store: cs.Store) -> None:
    """A node logged LOSSLESS that does not keep its span, an L2 over a lossy child: no restoration, no restorable literal."""
    s = store.session("migration")
    migration(s)
    gist = s.compact(0, 8, on_risk="preserve")
    with unchecked():
        claimed = s.append(msgspec.structs.replace(s.read(gist.pos).event, loss=cs.LossClass.LOSSLESS, ts=None))
    art = s.artifact(claimed.pos)
    assert art.loss is cs.LossClass.LOSSLESS
    for operation in RESTORATIONS:
        with pytest.raises(cs.ReconstructionUnsoundError, match="not kept"):
            s.reconstruct(art, operation)
    res = s.resume(s.mark(gist))
    assert res.loss is cs.LossClass.LOSSY_GIST and res.restorable == []
    t = store.session("rolled")
    migration(t)
    first = t.compact(0, 8, on_risk="preserve")
    second = t.compact(8, 11, loss=cs.LossClass.LOSSLESS, keep=cs.AUTO)
    top = t.roll_up([first, second])
    assert top.loss is cs.LossClass.LOSSY_GIST
    for operation in RESTORATIONS:
        with pytest.raises(cs.ReconstructionUnsoundError, match="LOSSY_GIST"):
            t.reconstruct(t.artifact(top), operation)
        with pytest.raises(cs.ReconstructionUnsoundError, match="LOSSY_GIST|altered"):
            t.reconstruct(relabelled(t.artifact(top), recompute=True), operation)
