"""The demo: a coding agent's session, compacted, marked, resumed, refused and tampered with.

``compactstore demo`` plays it on the embedded default (one SQLite file) and leaves the
store behind for the other commands to inspect. A tick clock stamps the events, so
every root and digest it prints is the same on every run.

The story: an agent makes the ``users.email`` migration reversible. Its
dry run fails, the user rejects backfilling in place, it writes a rollback script that
exists nowhere else, and it opens an obligation that will need that script. The gate
refuses to compact the span away until the script is spilled; L1 and L2 nodes are
written, a marker certifies, and a resume loads one summary node in place of the raw
span. Then a careless summary drops the user's rejection: its marker is refused, and
forged into the log anyway it resumes as a fallback to the raw checkpoint. An
``authorize`` on a lossy artifact is refused, and the audit finds a binding that a
compaction swallowed before anyone needed it. Last, an attacker edits a copy of the
file, and ``verify`` catches it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Protocol

import msgspec

from . import events as ev
from .errors import (
    CompactionInvariantError,
    CompactStoreError,
    IntegrityError,
    InvalidArgument,
    MarkerInvalid,
    ReconstructionUnsoundError,
)
from .events import Binding, HandleOpened, Obligation, ToolCall, ToolResult, Turn
from .merkle import leaf_hash
from .resolver import RawItem
from .store import Session, Store
from .store import open as open_store

SESSION = "migration-42"
ROLLBACK = "migrations/003_down.sql"
SNAPSHOT = "snap-users-2026-01-01T0000Z"
FIRST = "Make the users.email migration reversible: we must be able to roll back on Friday."

class Say(Protocol):
    """Prints one line of the story; ``style`` is "title", "step", "ok", "bad", "dim" or None."""

    def __call__(self, text: str, style: str | None = None, /) -> None: ...


def plain(text: str, style: str | None = None) -> None:
    """Print a line of the story, ignoring its style."""
    print(text)


def _brief(text: str) -> str:
    # Digests are 64 hex digits; 16 identify them in a story.
    return re.sub(r"\b([0-9a-f]{16})[0-9a-f]{48}\b", r"\1…", text)


def work(s: Session) -> dict[str, int]:
    """Log the agent's first stretch of work; return the positions the story points at."""
    s.append(Turn("user", FIRST))  # 0
    s.append(Turn("assistant", "Looking at the schema and the existing migrations first."))
    s.append(ToolCall("c1", "list_files", {"path": "migrations/"}))
    s.append(ToolResult("c1", ["001_init.sql", "002_users.sql"]))
    s.bind("tables", ["users", "orders"], regenerable=True, how="psql -c '\\dt'")
    dry_run = s.append(ToolCall("c2", "run_sql", {"sql": "ALTER TABLE users ADD COLUMN email_new text",
                                                  "dry_run": True}))
    failed = s.append(ToolResult("c2", "ERROR: lock timeout on relation users after 5s", ok=False, status="failed"))
    plan = s.append(Turn("assistant", "Plan: add email_new, then backfill it in place with one UPDATE."))
    rejected = s.append(Turn("user", "No. Do not backfill in place: users has 40M rows and that UPDATE locks it.",
                             status="rejected"))
    s.append(Turn("assistant", "Then expand/contract: a new column, a batched backfill, a sync trigger.",
                  supersedes=plan.pos))
    s.append(ToolCall("c3", "write_file", {"path": "migrations/003_up.sql"}))
    s.append(ToolResult("c3", "wrote 41 lines"))
    s.append(ToolCall("c4", "write_file", {"path": ROLLBACK}))
    s.append(ToolResult("c4", "wrote 12 lines"))
    rollback = s.bind("rollback", ROLLBACK)  # written in a scratch worktree: it exists only here
    snapshot = s.bind("snapshot", SNAPSHOT)  # no step needs it yet
    obligation = s.oblige("finish-migration", needs=["rollback", "tables"])
    s.append(HandleOpened(handle="psql-1", resource="subprocess", detail="psql app_staging"))  # 17
    s.append(ToolCall("c5", "run_sql", {"sql": "\\i migrations/003_up.sql", "target": "staging"}))
    s.append(ToolResult("c5", "ALTER TABLE\nCREATE TRIGGER"))
    batches = s.append(Turn("assistant", "Staging is expanded; backfilling in batches of 10k rows."))
    s.append(ToolCall("c6", "run_sql", {"sql": "CALL backfill_email(10000)", "target": "staging"}))
    s.append(ToolResult("c6", "ERROR: deadlock detected", ok=False, status="failed"))
    s.append(Turn("assistant", "Deadlock with the sync trigger: batches of 1k rows, in id order.",
                  supersedes=batches.pos))
    s.append(ToolCall("c7", "run_sql", {"sql": "CALL backfill_email(1000)", "target": "staging"}))
    s.append(ToolResult("c7", "backfilled 40112003 rows"))
    s.append(Turn("user", "Good. Production on Friday, not before."))
    s.append(ToolCall("c8", "run_tests", {"suite": "migrations", "target": "staging"}))  # still running
    s.append(Turn("assistant", "The migration tests are running against staging."))  # 28
    return {"dry_run": dry_run.pos, "failed": failed.pos, "rejected": rejected.pos, "rollback": rollback.pos,
            "snapshot": snapshot.pos, "obligation": obligation.pos, "split": obligation.pos + 1}


def more_work(s: Session) -> dict[str, int]:
    """Log the second stretch: the user rejects dropping columns early; the snapshot becomes needed."""
    start = s.size
    s.append(Turn("user", "Also rename orders.email_addr the same way."))
    s.append(Turn("assistant", "Plan: expand/contract on orders too, then drop the old columns right away."))
    rejected = s.append(Turn("user", "Do not drop anything until the rollback window closes on Friday.",
                             status="rejected"))
    s.append(ToolCall("c9", "write_file", {"path": "migrations/004_up.sql"}))
    s.append(ToolResult("c9", "wrote 36 lines"))
    needs = s.oblige("restore-if-needed", needs=["snapshot"])
    s.append(Turn("assistant", "The orders migration is drafted; waiting on the users tests."))
    return {"start": start, "rejected": rejected.pos, "needs": needs.pos, "stop": s.size}


def prepare(path: str) -> None:
    """Remove the demo's own store at ``path`` from an earlier run; refuse to touch any other.

    Raises:
        InvalidArgument: ``path`` holds something the demo did not write.
    """
    if not os.path.exists(path):
        return
    try:
        with open_store(path) as store:
            names = store.sessions()
            ours = names == [SESSION] and getattr(store.session(SESSION).read(0).event, "content", None) == FIRST
    except CompactStoreError as exc:  # not a store at all: leave it alone
        raise InvalidArgument("store", f"{path} exists and is not a compactstore store",
                              hint="run the demo in another folder, or name another file with --store") from exc
    if not ours:
        raise InvalidArgument("store", f"{path} holds sessions the demo did not write ({', '.join(names)})",
                              hint="run the demo in another folder, or name another file with --store")
    for suffix in ("", "-wal", "-shm"):
        Path(path + suffix).unlink(missing_ok=True)


def tamper(path: str, pos: int, old: bytes, new: bytes) -> None:
    """Rewrite the body at ``pos`` in the SQLite file at ``path`` and recompute its leaf, as an attacker would.

    The log's triggers refuse UPDATE; whoever holds the file can drop them.
    """
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            conn.execute(f'DROP TRIGGER "{name}"')
        (body,) = conn.execute("SELECT body FROM events WHERE pos = ?", (pos,)).fetchone()
        forged = bytes(body).replace(old, new)
        conn.execute("UPDATE events SET body = ?, leaf = ? WHERE pos = ?", (forged, leaf_hash(forged), pos))
        conn.commit()
    finally:
        conn.close()


def run(path: str = "compactstore.db", say: Say = plain, command: str = "compactstore") -> dict[str, Any]:
    """Play the demo into a new store at ``path`` (a SQLite file); return its results.

    ``command`` is how the closing lines spell the command line (``.venv/bin/compactstore``
    when it is not on ``PATH``).

    Raises:
        InvalidArgument: ``path`` exists and was not written by the demo.
    """
    prepare(path)
    out: dict[str, Any] = {"store": path, "session": SESSION}
    say("compactstore demo: a coding agent makes a schema migration reversible", "title")
    say(f"store {path} (SQLite), session {SESSION!r}; every event is a leaf of the session's Merkle tree", "dim")
    with open_store(path, clock=ev.tick_clock()) as store:
        _story(store, say, out)
        report = store.verify()
        s = store.session(SESSION)
        head = s.head()
        out.update(size=head.size, root=head.root.hex(), verified=report.ok)
    _tampering(path, out, say)
    say("")
    say(f"Left {path}: session {SESSION!r}, {head.size} events, root {head.root.hex()[:16]}…, verify ok: "
        f"{report.ok}. Look at it:", "step")
    where = "" if path == "compactstore.db" else f" -s {path}"
    width = len(command) + len(where) + 28
    for line, what in (
        ("show", "the session as a picture (--html session.html for a page)"),
        (f"resume {out['certified']['marker']} --context", "what a resumed agent loads"),
        ("verify", "re-hash everything"),
        ("audit", "the binding lost to a compaction"),
        (f"proof inclusion {out['rejected']}", "prove the rejection is in the tree"),
    ):
        say(f"  {command + ' ' + line + where:<{width}} {what}")
    return out


def _story(store: Store, say: Say, out: dict[str, Any]) -> None:
    s = store.session(SESSION)
    at = work(s)
    say("")
    say(f"1. The agent works: {s.size} events", "step")
    notes = {at["failed"]: "failed", at["rejected"]: "rejected", at["rollback"]: "binding", at["obligation"]: "open"}
    for pos, note in notes.items():
        say(f"   pos {pos:>2}  {note:<9} {_line(s.read(pos).event)}")
    say(f"   root at size {s.size}: {s.head().root.hex()[:16]}…")

    split = at["split"]
    say("")
    say(f"2. The gate, before a lossy compaction of [0, {split})", "step")
    try:
        s.compact(0, split)
    except CompactionInvariantError as exc:
        say(f"   refused: {exc}".replace(f"compacting [0, {split}) would lose what open obligations need: ", ""),
            "bad")
    raw_stop = s.size
    first = s.compact(0, split, on_risk="spill")
    (ref,) = first.spills
    say(f"   spilled: L1 node {first.pos} over [0, {split}), {first.loss.value}; {ref.key!r} spilled to "
        f"{ref.handle}, digest {ref.digest[:16]}…", "ok")
    second = s.compact(split, raw_stop)
    top = s.roll_up([first, second])
    say(f"   L1 node {second.pos} over [{split}, {raw_stop}); L2 node {top.pos} digests both: "
        f"{len(top.negative_facts)} negative facts and {len(top.unresolved)} open items carried")

    say("")
    say("3. Markers, checked at emission", "step")
    marker = s.mark(top)
    say(f"   marker {marker.pos} -> L2 node {top.pos}: certified ({', '.join(marker.conditions)})", "ok")
    res = s.resume(marker)
    summaries = sum(1 for i in res.context if not isinstance(i, RawItem))
    say(f"   resume {marker.pos}: {res.mode}; {summaries} summary node stands for {raw_stop} raw events; "
        f"digest {res.digest.hex()[:16]}…", "ok")
    say(f"   the spilled binding comes back exact, checked against the tree: {ref.handle} = {s.spilled(ref.handle)}")
    out["certified"] = {"marker": marker.pos, "node": top.pos, "mode": res.mode, "digest": res.digest.hex()}

    later = more_work(s)
    careless = "User asked to extend the migration to orders; agent planned it."
    say("")
    say(f"4. A summary that drops a negative fact ({later['stop'] - later['start']} more events)", "step")
    node = s.compact(later["start"], later["stop"], summary=careless, negative_facts=[])
    say(f"   L1 node {node.pos} over [{node.start}, {node.stop}): \"{careless}\"")
    try:
        s.mark(node)
    except MarkerInvalid as exc:
        for v in exc.violations:
            say(f"   marker refused: {v}", "bad")
    size = s.size
    try:
        s.append(ev.RecoveryMarker(size=size, root=s.head(size).root.hex(), node=node.pos,
                                   conditions=["closure", "negative_facts", "anchoring"], path=[node.pos]))
    except MarkerInvalid:
        say("   appended by hand as a marker event instead: refused the same way, nothing written", "bad")
    forged = s.mark_raw()
    fallback = s.resume(forged.pos)
    say(f"   a raw-checkpoint marker {forged.pos} is always safe: resume gives {fallback.mode}", "ok")
    for reason in fallback.reasons:
        say(f"     because {_clip(reason, 96)}")
    say(f"     context: the {len(fallback.context)} raw events up to checkpoint {fallback.size}, verified "
        f"against its root; digest {fallback.digest.hex()[:16]}…")
    out["fallback"] = {"marker": forged.pos, "node": node.pos, "mode": fallback.mode,
                       "digest": fallback.digest.hex(), "reasons": fallback.reasons}

    say("")
    say("5. Restoration needs exact literals", "step")
    artifact = s.artifact(top)
    s.reconstruct(artifact, "plan")
    say(f"   plan from L2 node {top.pos} ({top.loss.value}): allowed, the summary serves as a prior")
    try:
        s.reconstruct(artifact, "authorize")
    except ReconstructionUnsoundError as exc:
        say(f"   authorize from it: refused: {_brief(str(exc))}", "bad")
        out["authorize"] = str(exc)
    for f in s.audit():
        say(f"   audit: binding {f.key!r} (pos {f.binding_pos}) was compacted away by node {f.node}, then needed "
            f"{f.steps_later} steps later at pos {f.needed_at} by {f.via}", "bad")
        out["audit"] = msgspec.to_builtins(f)
    out["rejected"] = at["rejected"]


def _tampering(path: str, out: dict[str, Any], say: Say) -> None:
    pos = out["rejected"]
    say("")
    say("6. Tampering, on a copy in a temporary folder", "step")
    with tempfile.TemporaryDirectory(prefix="compactstore-demo-") as tmp:
        copy = os.path.join(tmp, "tampered.db")
        shutil.copyfile(path, copy)
        tamper(copy, pos, b'"content":"No. Do not backfill', b'"content":"OK. Go on, backfill')
        say(f"   an attacker with the file turns the user's rejection (pos {pos}) into a go-ahead and "
            "recomputes its leaf")
        with open_store(copy) as store:
            report = store.verify()
            count = len(report.problems) + report.more
            say(f"   verify the copy: {'ok' if report.ok else 'FAILED'}, {count} problems; the first two:",
                "bad" if not report.ok else "ok")
            for p in report.problems[:2]:
                say(f"     - {p}")
            try:
                store.session(SESSION).resume(out["certified"]["marker"])
            except IntegrityError as exc:
                say(f"   resume {out['certified']['marker']} on the copy: refused: {exc}", "bad")
        out["tampered"] = {"ok": report.ok, "problems": count}
    ok = out["verified"]
    say(f"   verify {path} itself: {'ok' if ok else 'FAILED'}, {out['size']} events", "ok" if ok else "bad")


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _line(event: ev.Event) -> str:
    if isinstance(event, Binding):
        return f"{event.key} = {event.value} (non-regenerable: it exists only here)"
    if isinstance(event, Obligation):
        return f"obligation {event.name!r} needs {' and '.join(event.needs)}"
    if isinstance(event, ToolResult):
        return _clip(f"dry run {event.call_id}: {event.output}", 72)
    if isinstance(event, Turn):
        return _clip(f"{event.role}: {event.content}", 72)
    return event.kind
