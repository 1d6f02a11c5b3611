"""An end-to-end run on the embedded default: log a short agent session, prove, tamper, catch.

Leaves one store, ./demo.db, for inspection (sqlite-utils, Datasette); the tampered
copy lives in a temporary folder.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from pathlib import Path

import compactstore as cs
from compactstore import merkle

STORE = Path("demo.db")


def short(h: bytes) -> str:
    return h.hex()[:16]


def main() -> None:
    for leftover in (STORE, Path("demo.db-wal"), Path("demo.db-shm")):
        leftover.unlink(missing_ok=True)  # the demo's own store, rebuilt on every run
    with cs.open(str(STORE), clock=cs.tick_clock()) as store:
        s = store.session("migration-42")
        s.extend(
            [
                cs.Turn("user", "Make the users.email migration reversible."),
                cs.ToolCall("c1", "run_sql", {"sql": "ALTER TABLE users ADD email_new text", "dry_run": True}),
                cs.ToolResult("c1", "ERROR: column email_new already exists", ok=False, status="failed"),
                cs.Turn("assistant", "Plan: add column, then backfill."),
                cs.Turn("user", "No: do not backfill in place.", status="rejected"),
                cs.Turn("assistant", "Rollback script kept at migrations/003_down.sql"),
            ]
        )
        retry = s.append(cs.ToolCall("c2", "run_sql", {"sql": "BEGIN"}), idempotency_key="c2")
        again = s.append(cs.ToolCall("c2", "run_sql", {"sql": "BEGIN"}), idempotency_key="c2")
        print(f"session {s.name!r}: {s.size} events; the retried append returned pos {again.pos} again")
        assert retry == again

        head = s.head()
        print(f"tree head   size {head.size}  root {short(head.root)}")
        bodies = [r.body for r in s.scan()]
        proof = s.inclusion_proof(2)
        ok = merkle.verify_inclusion(bodies[2], 2, head.size, proof, head.root)
        print(f"inclusion   pos 2 (the failed dry run) in size {head.size}: {len(proof)} hashes, verifies offline: {ok}")
        old = s.head(4)
        ok = merkle.verify_consistency(4, head.size, old.root, head.root, s.consistency_proof(4))
        print(f"consistency size 4 -> {head.size}: verifies offline: {ok}")
        print(f"span root   [1, 3) = {short(s.span_root(1, 3))}")

        try:
            s.append(cs.ToolCall("c3", "run_sql", {"rows": float("nan")}))
        except cs.InvalidEvent as exc:
            print(f"refused     {exc} (nothing written; size still {s.size})")
        report = store.verify()
        print(f"verify      ok={report.ok}, {report.events} events in {report.sessions} session(s)")

    with tempfile.TemporaryDirectory() as tmp:
        forged = Path(tmp) / "tampered.db"
        shutil.copyfile(STORE, forged)
        conn = sqlite3.connect(forged)
        conn.execute("DROP TRIGGER events_no_update")  # as an attacker with the file would
        conn.execute("UPDATE events SET body = CAST(replace(CAST(body AS TEXT), 'No:', 'OK:') AS BLOB) WHERE pos = 4")
        conn.commit()
        conn.close()
        with cs.open(str(forged)) as store:
            report = store.verify()
        print(f"tampered copy: verify ok={report.ok}; first problems:")
        for problem in report.problems[:3]:
            print(f"  - {problem}")
    print(f"store left at ./{STORE} for inspection")


if __name__ == "__main__":
    main()
