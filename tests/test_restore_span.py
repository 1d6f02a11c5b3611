"""Restoring the raw span a summary node covers: exactly the logged bodies, certified, or refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest

import compactstore as cs
from forge import unchecked
from sqlite_edit import unguarded
from compactstore import content, merkle
from compactstore.content import content_digest


def _fill(s: cs.Session, n: int = 40) -> None:
    """Append ``n`` turns with a failed tool call and a binding among them."""
    events: list[cs.Event] = [cs.Turn("user" if i % 2 else "assistant", f"turn {i}: " + "x" * (i * 7)) for i in range(n)]
    events[5] = cs.ToolCall("c1", "run_sql", {"sql": "SELECT 1"})
    events[6] = cs.ToolResult("c1", "ERROR: lock timeout", ok=False, status="failed")
    events[9] = cs.Binding(key="rollback", value="migrations/003_down.sql", regenerable=True)
    s.extend(events)


def _attack(target: str, *statements: tuple[str, tuple[Any, ...]]) -> None:
    """Run SQL as someone holding the database: the append-only triggers dropped first."""
    if "://" in target:
        import psycopg

        with psycopg.connect(target, autocommit=True) as conn:
            for table, name in conn.execute(
                "SELECT tgrelid::regclass::text, tgname FROM pg_trigger WHERE NOT tgisinternal"
            ).fetchall():
                conn.execute(f"DROP TRIGGER {name} ON {table}")
            for sql, args in statements:
                conn.execute(sql.replace("?", "%s"), args)  # type: ignore[arg-type]
        return
    conn = unguarded(target, isolation_level=None)
    for sql, args in statements:
        conn.execute(sql, args)
    conn.close()


@pytest.fixture
def compacted(open_store: Callable[..., cs.Store]) -> tuple[cs.Store, cs.Session, cs.Node]:
    """Return a store whose session has an L1 node over [3, 35) of 40 events."""
    store = open_store()
    s = store.session("run")
    _fill(s)
    return store, s, s.compact(3, 35)


def test_a_span_is_restored_exactly_and_certified_by_its_content_digest(
    compacted: tuple[cs.Store, cs.Session, cs.Node],
) -> None:
    """The bodies are the logged ones, in order; one digest over them matches the node's."""
    _, s, node = compacted
    logged = list(s.scan(3, 35))
    got = s.restore_span(node)
    assert got.certified_by == "content_digest" and (got.start, got.stop, got.node) == (3, 35, node.pos)
    assert got.bodies == [r.body for r in logged]
    assert got.events() == [r.event for r in logged]
    assert node.content_digest == content_digest(got.bodies)
    assert s.restore_span(node.pos) == got


def test_an_l2_node_restores_the_whole_raw_span_of_its_children(compacted: tuple[cs.Store, cs.Session, cs.Node]) -> None:
    """An L2 node's span is the raw span under its children, certified by its span root (a lossy L2 keeps no content digest)."""
    _, s, node = compacted
    top = s.roll_up([node, s.compact(35, 40)])
    got = s.restore_span(top)
    assert (got.start, got.stop, got.certified_by) == (3, 40, "span_root")
    assert got.bodies == [r.body for r in s.scan(3, 40)]


def test_a_lossless_node_restores_too_and_its_literals_are_in_the_bodies(open_store: Callable[..., cs.Store]) -> None:
    """Loss class does not matter to the raw log: a LOSSLESS node's span restores like any other."""
    s = open_store().session("run")
    _fill(s)
    node = s.compact(0, 12, loss=cs.LossClass.LOSSLESS, keep=cs.AUTO)
    got = s.restore_span(node)
    assert any(isinstance(e, cs.Binding) and e.value == "migrations/003_down.sql" for e in got.events())


def test_the_content_digest_changes_with_any_missing_extra_reordered_or_altered_body() -> None:
    """The digest's encoding is injective: no two different body lists share an input."""
    bodies = [b'{"a":1}', b'{"b":22}', b"", b'{"c":333}']
    base = content_digest(bodies)
    variants = [
        bodies[:-1], bodies[1:], [*bodies, b""], [bodies[0], b"", *bodies[1:]],
        [bodies[1], bodies[0], *bodies[2:]], [b'{"a":1}{"b":22}', b"", b'{"c":333}'],
        [b'{"a":1', b'}{"b":22}', *bodies[2:]], [b'{"a":2}', *bodies[1:]], [],
    ]
    assert len({base, *(content_digest(v) for v in variants)}) == len(variants) + 1
    assert content.content_digest_of([bodies[:1], [], bodies[1:]]) == base


@pytest.mark.parametrize(
    "tamper",
    [
        "a body byte, leaf kept",
        "a body and its leaf",
        "a missing event",
        "an extra event",
        "two events swapped",
        "the node's digest, leaf kept",
        "the node's digest and its leaf",
        "a body, with the node's digest and leaf recomputed to match",
    ],
)
def test_a_tampered_span_or_node_is_refused(
    compacted: tuple[cs.Store, cs.Session, cs.Node], target: str, tamper: str
) -> None:
    """Every change to the span's rows or to the node's own row refuses the restoration."""
    store, s, node = compacted
    sid = store.backend.session_id("run")
    body = s.read(20).body
    bad = body.replace(b"turn 20", b"turn 2O")
    other = s.read(21)
    node_body = s.read(node.pos).body
    forged = node_body.replace(node.content_digest.hex().encode(), content_digest([bad]).hex().encode())
    # A node that certifies the altered span: only its inclusion in the sealed head refuses it.
    span = [bad if r.pos == 20 else r.body for r in s.scan(3, 35)]
    matching = node_body.replace(node.content_digest.hex().encode(), content_digest(span).hex().encode())
    where = "WHERE session_id = ? AND pos = ?"
    attacks: dict[str, list[tuple[str, tuple[Any, ...]]]] = {
        "a body byte, leaf kept": [(f"UPDATE events SET body = ? {where}", (bad, sid, 20))],
        "a body and its leaf": [(f"UPDATE events SET body = ?, leaf = ? {where}", (bad, merkle.leaf_hash(bad), sid, 20))],
        "a missing event": [(f"DELETE FROM events {where}", (sid, 20))],
        "an extra event": [
            (f"UPDATE events SET body = ?, leaf = ? {where}", (body, merkle.leaf_hash(body), sid, 21)),
            (f"UPDATE events SET body = ?, leaf = ? {where}", (other.body, other.leaf, sid, 22)),
        ],
        "two events swapped": [
            (f"UPDATE events SET body = ?, leaf = ? {where}", (other.body, other.leaf, sid, 20)),
            (f"UPDATE events SET body = ?, leaf = ? {where}", (body, merkle.leaf_hash(body), sid, 21)),
        ],
        "the node's digest, leaf kept": [(f"UPDATE events SET body = ? {where}", (forged, sid, node.pos))],
        "the node's digest and its leaf": [
            (f"UPDATE events SET body = ?, leaf = ? {where}", (forged, merkle.leaf_hash(forged), sid, node.pos))
        ],
        "a body, with the node's digest and leaf recomputed to match": [
            (f"UPDATE events SET body = ? {where}", (bad, sid, 20)),
            (f"UPDATE events SET body = ?, leaf = ? {where}", (matching, merkle.leaf_hash(matching), sid, node.pos)),
        ],
    }
    store.close()
    _attack(target, *attacks[tamper])
    with cs.open(target) as again:
        with pytest.raises(cs.IntegrityError):
            again.session("run").restore_span(node.pos)


def test_a_redacted_event_in_the_span_can_never_be_restored(compacted: tuple[cs.Store, cs.Session, cs.Node]) -> None:
    """A redaction erases a body the digest covers, and the node built from it even where it is
    not quoted (provenance, not wording): restoration is refused, naming the node."""
    _, s, node = compacted
    s.redact([30], "user asked to forget")  # its content is longer than the summary's line: not quoted
    assert s.read(node.pos).kind == "redacted"
    with pytest.raises(cs.ReconstructionUnsoundError, match=f"node at pos {node.pos} was redacted"):
        s.restore_span(node)


def test_a_node_quoting_a_redacted_event_is_erased_with_it(compacted: tuple[cs.Store, cs.Session, cs.Node]) -> None:
    """A node whose summary quotes a redacted turn goes with it: restoring from it is refused."""
    _, s, node = compacted
    s.redact([7], "user asked to forget")
    assert s.read(node.pos).kind == "redacted"
    with pytest.raises(cs.ReconstructionUnsoundError, match=f"node at pos {node.pos} was redacted"):
        s.restore_span(node)


def test_a_node_over_a_redacted_span_records_no_digest_and_still_refuses(open_store: Callable[..., cs.Store]) -> None:
    """Compacting over an erased body writes no content digest; restoring it is refused."""
    s = open_store().session("run")
    _fill(s)
    s.redact([4], "gone")
    node = s.compact(0, 20)
    assert node.content_digest is None and "content_digest" not in s.read(node.pos).body.decode()
    with pytest.raises(cs.ReconstructionUnsoundError):
        s.restore_span(node)


def test_a_node_without_a_content_digest_is_certified_by_rehashing_its_span(open_store: Callable[..., cs.Store]) -> None:
    """A node written before content digests (none in its body) falls back to the Merkle rehash."""
    store = open_store()
    s = store.session("run")
    _fill(s)
    root = s.span_root(3, 35).hex()
    with unchecked():  # the store refuses it now: a node over a whole span records its digest
        old = s.append(cs.events.Summary(tier=1, start=3, stop=35, span_root=root, summary="older node"))
    assert b"content_digest" not in old.body
    got = s.restore_span(old.pos)
    assert got.certified_by == "span_root" and got.bodies == [r.body for r in s.scan(3, 35)]


def test_a_node_with_a_false_content_digest_is_refused_at_append(open_store: Callable[..., cs.Store]) -> None:
    """Only a digest of the span's own bodies, matching its span root, enters the log."""
    s = open_store().session("run")
    _fill(s)
    bodies = [r.body for r in s.scan(3, 35)]
    root = s.span_root(3, 35).hex()
    size = s.size

    def node(**kw: Any) -> cs.events.Summary:
        fields: dict[str, Any] = {"tier": 1, "start": 3, "stop": 35, "span_root": root, "summary": "s",
                                  "content_digest": content_digest(bodies).hex()}
        return cs.events.Summary(**{**fields, **kw})

    for bad in (
        node(content_digest=content_digest(bodies[:-1]).hex()),
        node(content_digest="zz"),
        node(span_root=s.span_root(3, 34).hex()),
        node(stop=size + 5),
    ):
        with pytest.raises(cs.InvalidEvent):
            s.append(bad)
    assert s.size == size
    assert s.restore_span(s.append(node()).pos).certified_by == "content_digest"


def test_a_node_over_events_of_its_own_batch_is_checked_against_them(open_store: Callable[..., cs.Store]) -> None:
    """Re-appending an exported log in one batch keeps its content digests, and checks them."""
    src = open_store().session("src")
    _fill(src)
    node = src.compact(3, 35)
    records = list(src.scan())
    dst = open_store().session("dst")
    dst.extend([r.event for r in records])
    assert [r.body for r in dst.scan()] == [r.body for r in records]
    assert dst.restore_span(node.pos).bodies == [r.body for r in records[3:35]]
    wrong = msgspec.structs.replace(records[node.pos].event, content_digest=content_digest([]).hex())
    with pytest.raises(cs.InvalidEvent, match="content_digest"):
        open_store().session("dst2").extend([*(r.event for r in records[: node.pos]), wrong])


def test_verify_reports_a_content_digest_that_does_not_match_its_span(
    open_store: Callable[..., cs.Store], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node whose digest slipped past the append check (older code, a rewrite) is reported."""
    store = open_store()
    s = store.session("run")
    _fill(s)
    with unchecked():
        bad = s.append(cs.events.Summary(tier=1, start=3, stop=35, span_root=s.span_root(3, 35).hex(), summary="s",
                                  content_digest=content_digest([]).hex()))
    report = store.verify()
    assert not report.ok
    assert [(p.table, p.pos) for p in report.problems] == [("events", bad.pos)]
    assert "content digest of [3, 35)" in report.problems[0].what
    with pytest.raises(cs.IntegrityError):
        s.restore_span(bad.pos)


def test_both_backends_restore_byte_identical_spans(sqlite_target: str, pg_url: str) -> None:
    """The same session on SQLite and PostgreSQL restores the same bodies under the same digest."""
    got = []
    for target in (sqlite_target, pg_url):
        with cs.open(target, clock=cs.events.tick_clock()) as store:
            s = store.session("run")
            _fill(s)
            node = s.compact(3, 35)
            r = s.restore_span(node)
            got.append((node.content_digest, node.span_root, r.bodies, r.certified_by))
    assert got[0] == got[1]


def test_a_keyed_store_needs_its_key_to_certify(tmp_path: Any) -> None:
    """Without the key the head's seal cannot be checked, so nothing is certified."""
    path = str(tmp_path / "keyed.db")
    with cs.open(path, key=b"k") as store:
        s = store.session("run")
        _fill(s)
        node = s.compact(3, 35)
        assert s.restore_span(node).certified_by == "content_digest"
    with cs.open(path) as store:
        with pytest.raises(cs.CompactStoreError, match="keyed"):
            store.session("run").restore_span(node.pos)


def test_restoring_what_is_not_a_node_is_refused(compacted: tuple[cs.Store, cs.Session, cs.Node]) -> None:
    """A position holding another kind of event, or none, is a bad argument."""
    _, s, _ = compacted
    with pytest.raises(cs.InvalidArgument):
        s.restore_span(2)
    with pytest.raises(cs.InvalidArgument):
        s.restore_span(10_000)
    with pytest.raises(cs.InvalidArgument):
        s.restore_span(-1)


def test_a_span_of_many_batches_is_restored_or_refused(open_store: Callable[..., cs.Store], target: str) -> None:
    """A span of many batches (600 KB here), hashed batch by batch as it is read, is restored
    exactly; a body altered in a late batch, or one redacted there, is refused."""
    store = open_store()
    s = store.session("run")
    s.extend([cs.Turn("user", f"turn {i}: " + "y" * 2000) for i in range(300)])
    node = s.compact(0, 300)
    got = s.restore_span(node)
    assert got.certified_by == "content_digest" and got.bodies == [r.body for r in s.scan(0, 300)]
    body = s.read(250).body
    sid = store.backend.session_id("run")
    store.close()
    _attack(target, ("UPDATE events SET body = ? WHERE session_id = ? AND pos = ?", (body.replace(b"y", b"z", 1), sid, 250)))
    with cs.open(target) as again:
        with pytest.raises(cs.IntegrityError, match="event at pos 250 does not match its leaf"):
            again.session("run").restore_span(node.pos)
    _attack(target, ("UPDATE events SET body = ? WHERE session_id = ? AND pos = ?", (body, sid, 250)))
    with cs.open(target) as again:
        s = again.session("run")
        assert s.restore_span(node.pos).bodies == got.bodies
        s.redact([260], "gone")
        with pytest.raises(cs.ReconstructionUnsoundError, match=f"node at pos {node.pos} was redacted"):
            s.restore_span(node.pos)
