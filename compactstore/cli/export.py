"""``compactstore export``: a session as JSON Lines that `append` turns back into the same tree."""

from __future__ import annotations

import json
import shutil
import tempfile
from typing import IO

import click
import msgspec

from .. import merkle, render
from ..errors import IntegrityError, InvalidEvent
from ..events import DERIVED_KINDS, Dropped, Record, Redacted
from ..index import Index
from ..resolver import RawItem
from ..store import Session
from .app import EXIT_REFUSED, Failure, emit, main, opened, pick_session, short, store_options

SPOOL_BYTES = 16 * 1024 * 1024


def erased_line(record: Record) -> bytes:
    """Return the export line of an erased row: its position, its leaf, and what erased it (redacted or dropped, by which event)."""
    event = record.event
    by = event.by if isinstance(event, (Redacted, Dropped)) else -1
    return msgspec.json.encode({"erased": {"by": by, "kind": record.kind, "leaf": record.leaf.hex(), "pos": record.pos}})


def _conversation(session: Session, context: bool) -> list[render.Message]:
    """Return the session as chat messages: its whole raw log, or what a resumed agent loads now."""
    if context:
        return session.context().as_messages("chat")
    raw = [RawItem(r.pos, r.event) for r in session.scan() if r.kind not in DERIVED_KINDS]
    return render.messages(raw, "chat")


def _write_chat(store_sessions: list[Session], context: bool, out: IO[bytes]) -> None:
    for session in store_sessions:
        line = json.dumps({"messages": _conversation(session, context)}, ensure_ascii=False, separators=(",", ":"))
        out.write(line.encode() + b"\n")


@main.command("export")
@store_options
@click.option("--output", "-o", default="-", type=click.Path(dir_okay=False, allow_dash=True),
              help="Write to this file instead of stdout; a summary is then printed.")
@click.option("--format", "fmt", type=click.Choice(["events", "chat-jsonl"]), default="events", show_default=True,
              help="events: the stored bytes, to re-append; chat-jsonl: chat messages, one conversation per line.")
@click.option("--context", "current", is_flag=True,
              help="With chat-jsonl: each session's current context (what a resumed agent loads), not its whole log.")
def export_command(target: str, key_env: str | None, session_name: str | None, as_json: bool, output: str,
                   fmt: str, current: bool) -> None:
    """Write a session's events as JSON Lines: each line is exactly the bytes its leaf hashes.

    With --format chat-jsonl, write each session (the one --session names, else every
    session) as one line, {"messages": [...]}: chat-completions messages (system, user,
    assistant with tool_calls, tool), as OpenAI's fine-tuning and eval tooling reads
    them. Its whole raw log, or with --context its current context: the certified
    summaries' note first, then the raw events since. Every event is read through the
    verified reads; redacted positions are left out.

    Each line carries the event's timestamp and idempotency key, and summary nodes,
    spills and markers are exported like any event, so appending the output to an
    empty session (`compactstore append --session NAME FILE`) gives the same events
    at the same positions: the same leaves, and the same root at every size.

    A session with redacted or dropped bodies is exported as a replica: each erased
    row as {"erased": {"by", "kind", "leaf", "pos"}} (its leaf, and the event that
    erased it), then its structural index rows as {"index": [pos, rel, key, num,
    text]}; `compactstore append` writes such an export into an empty session as it
    is, so the copy verifies, with the same root.

    Every line is checked against its stored leaf, and the leaves against the
    session's root, before anything is written: a session that does not verify is
    refused (exit 1), and nothing is written then. With --output FILE a summary is printed (JSON with --json).
    """
    if current and fmt != "chat-jsonl":
        raise Failure("--context goes with --format chat-jsonl", as_json=as_json)
    if fmt == "chat-jsonl":
        with opened(target, key_env, as_json) as store:
            chosen = ([pick_session(store, session_name, target, as_json)] if session_name
                      else [store.session(n) for n in store.sessions()])
            with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
                try:
                    _write_chat(chosen, current, spool)
                except IntegrityError as exc:
                    raise Failure(f"{exc.args[0]}: the store was altered", EXIT_REFUSED, error="IntegrityError",
                                  as_json=as_json, hint="run `compactstore verify`") from exc
                spool.seek(0)
                with click.open_file(output, "wb") as out:
                    shutil.copyfileobj(spool, out)
        if output != "-":
            emit(as_json, {"ok": True, "sessions": [s.name for s in chosen], "output": output, "format": fmt},
                 f"exported {len(chosen)} conversation{'s' * (len(chosen) != 1)} to {output}")
        return
    with opened(target, key_env, as_json) as store:
        session = pick_session(store, session_name, target, as_json)
        head = session.head()
        frontier = merkle.Frontier(algo="blake3")
        erased = 0
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
            try:
                for record in session.scan(0, head.size):
                    frontier.append(record.leaf)
                    if not record.body:  # a canonical event is never empty: this body was erased
                        erased += 1
                        spool.write(erased_line(record) + b"\n")
                        continue
                    if merkle.leaf_hash(record.body) != record.leaf:
                        raise Failure(f"pos {record.pos} of {session.name!r} does not match its leaf: the store "
                                      "was altered", EXIT_REFUSED, error="IntegrityError", as_json=as_json,
                                      hint="run `compactstore verify`")
                    spool.write(record.body + b"\n")
                if erased:
                    sid = store.backend.session_id(session.name)
                    assert sid is not None  # it holds erased rows
                    for row in Index(store.backend, sid).rows_in(0, head.size):
                        spool.write(msgspec.json.encode({"index": list(row)}) + b"\n")
            except InvalidEvent as exc:
                raise Failure(f"an event of {session.name!r} does not decode: {exc.reason}", EXIT_REFUSED,
                              error="IntegrityError", as_json=as_json, hint="run `compactstore verify`") from exc
            except IntegrityError as exc:  # the read itself checks each body against its leaf
                raise Failure(f"{session.name!r}: {exc.args[0]}: the store was altered", EXIT_REFUSED,
                              error="IntegrityError", as_json=as_json, hint="run `compactstore verify`") from exc
            if frontier.size != head.size or frontier.root() != head.root:
                raise Failure(f"the leaves of {session.name!r} do not give its root {short(head.root)}…",
                              EXIT_REFUSED, error="IntegrityError", as_json=as_json, hint="run `compactstore verify`")
            spool.seek(0)
            with click.open_file(output, "wb") as out:
                shutil.copyfileobj(spool, out)
    if output != "-":
        emit(as_json, {"ok": True, "session": session.name, "events": head.size, "root": head.root.hex(),
                       "output": output},
             f"exported {head.size} events of {session.name!r} to {output}; root {head.root.hex()}")
