"""Cross-backend identity: the same events with the same clock give the same bytes on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from test_compaction import migration

import compactstore as cs

pytest.importorskip("psycopg")

KEY = b"cross-backend key"
#: Names whose byte order differs from a locale's: case, accents, other scripts.
NAMES = ["migration", "Zeta", "alpha", "Émile", "ümlaut", "日本", "a b", "A"]


def _write(target: str) -> dict[str, Any]:
    """Write one history, with compaction, markers and resumes, and return everything observable."""
    out: dict[str, Any] = {}
    with cs.open(target, key=KEY, clock=cs.events.tick_clock()) as st:
        s = st.session("migration")
        migration(s)
        node = s.compact(0, 8, on_risk="preserve")
        s.append(cs.Turn("assistant", "after the compaction"))
        marker = s.mark(node)
        raw_marker = s.mark_raw()
        art = s.artifact(node)
        # Each store has its own identity, bound into its artifacts: all else is the same.
        assert art.store == st.store_id
        out["artifact"] = msgspec.structs.replace(art, store=None, digest=None)
        out["markers"] = [marker, raw_marker]
        out["resolutions"] = [s.resume(marker), s.resume(raw_marker)]
        for i, name in enumerate(NAMES[1:]):
            t = st.session(name)
            t.extend([cs.Turn("user", f"{name} {j}", meta={"j": j, "f": 0.5}) for j in range(i + 1)])
            t.append(cs.ToolCall(f"c{i}", "grep", {"b": [1, 2.5], "a": {"z": None, "y": True}}),
                     idempotency_key=f"key-{i}")
            t.append(cs.ToolResult(f"c{i}", {"lines": i}, ok=i % 2 == 0, status="ok" if i % 2 == 0 else "failed"))
        out["sessions"] = st.sessions()
        for name in out["sessions"]:
            sess = st.session(name)
            out[f"{name}/records"] = [(r.pos, r.kind, r.body, r.leaf) for r in sess.scan()]
            out[f"{name}/heads"] = [sess.head(n) for n in range(sess.size + 1)]
            assert all(st.check_head(h) for h in out[f"{name}/heads"])
            sid = st.backend.session_id(name)
            assert sid is not None
            out[f"{name}/stored_heads"] = st.backend.heads(sid, 0, 10_000)
            out[f"{name}/nodes"] = {
                level: st.backend.subtree_range(sid, level, 0, 1 << 40) for level in st.backend.subtree_counts(sid)
            }
            out[f"{name}/proofs"] = (sess.inclusion_proof(0), sess.consistency_proof(1))
        out["meta"] = {k: v for k, v in st.backend.meta().items() if k != "store_id"}
        report = st.verify()
        assert report.ok, report.problems
    return out


def test_same_events_same_clock_give_identical_bytes_on_sqlite_and_postgres(sqlite_target: str, pg_url: str) -> None:
    """Bodies, leaves, roots, heads and their MACs, stored seals, markers and resolution digests all match."""
    lite, pg = _write(sqlite_target), _write(pg_url)
    assert lite["sessions"] == sorted(NAMES)  # code-point order on both
    assert lite.keys() == pg.keys()
    for k in lite:
        assert lite[k] == pg[k], k
    assert [r.digest for r in lite["resolutions"]] == [r.digest for r in pg["resolutions"]]
    assert lite["resolutions"][0].mode == "certified"


@pytest.mark.parametrize("body_bytes", [1, 60_000, 70_000, 300_000])
def test_inline_and_binary_inserts_store_the_same_bytes_as_sqlite(sqlite_target: str, pg_url: str, body_bytes: int) -> None:
    """Batches below and above the inline limit store the very bytes, leaves, nodes and heads SQLite stores."""
    from compactstore.backends.postgres import INLINE_BYTES

    assert 60_000 < INLINE_BYTES < 70_000
    per = max(1, body_bytes // 40)
    batch = [cs.Turn("user", chr(65 + i % 26) * per, meta={"i": i}) for i in range(40)]
    keys = [f"k{i}" if i % 7 == 3 else None for i in range(40)]
    seen = []
    for target in (sqlite_target, pg_url):
        with cs.open(target, clock=cs.events.tick_clock()) as st:
            s = st.session("s")
            s.append(cs.Turn("user", "first"))
            s.extend(batch, idempotency_keys=keys)
            assert [r.pos for r in s.extend(batch, idempotency_keys=keys)][3] == 4  # keyed ones replay
            sid = st.backend.session_id("s")
            assert sid is not None and st.verify().ok
            seen.append(([(r.pos, r.kind, r.idem_key, r.leaf, r.body) for r in st.backend.rows(sid, 0, None, 1000)],
                         st.backend.heads(sid, 0, 1000), st.backend.subtree_range(sid, 4, 0, 1000)))
    assert seen[0] == seen[1]
