"""``compactstore export``: a session as JSON Lines that `append` turns back into the same tree."""

from __future__ import annotations

import shutil
import tempfile

import click

from .. import merkle
from ..errors import IntegrityError, InvalidEvent
from .app import EXIT_REFUSED, Failure, emit, main, opened, pick_session, short, store_options

SPOOL_BYTES = 16 * 1024 * 1024


@main.command("export")
@store_options
@click.option("--output", "-o", default="-", type=click.Path(dir_okay=False, allow_dash=True),
              help="Write to this file instead of stdout; a summary is then printed.")
def export_command(target: str, key_env: str | None, session_name: str | None, as_json: bool, output: str) -> None:
    """Write a session's events as JSON Lines: each line is exactly the bytes its leaf hashes.

    Each line carries the event's timestamp and idempotency key, and summary nodes,
    spills and markers are exported like any event, so appending the output to an
    empty session (`compactstore append --session NAME FILE`) gives the same events
    at the same positions: the same leaves, and the same root at every size.

    Every line is checked against its stored leaf, and the leaves against the
    session's root, before anything is written: a session that does not verify is
    refused (exit 1), and so is a session with redacted positions, whose bodies are
    gone, so no re-append could give back the leaves its tree holds. Nothing is
    written then. With --output FILE a summary is printed (JSON with --json).
    """
    with opened(target, key_env, as_json) as store:
        session = pick_session(store, session_name, target, as_json)
        head = session.head()
        frontier = merkle.Frontier(algo="blake3")
        redacted: list[int] = []
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
            try:
                for record in session.scan(0, head.size):
                    frontier.append(record.leaf)
                    if not record.body:  # a canonical event is never empty: this body was erased
                        redacted.append(record.pos)
                        continue
                    if merkle.leaf_hash(record.body) != record.leaf:
                        raise Failure(f"pos {record.pos} of {session.name!r} does not match its leaf: the store "
                                      "was altered", EXIT_REFUSED, error="IntegrityError", as_json=as_json,
                                      hint="run `compactstore verify`")
                    spool.write(record.body + b"\n")
            except InvalidEvent as exc:
                raise Failure(f"an event of {session.name!r} does not decode: {exc.reason}", EXIT_REFUSED,
                              error="IntegrityError", as_json=as_json, hint="run `compactstore verify`") from exc
            except IntegrityError as exc:  # the read itself checks each body against its leaf
                raise Failure(f"{session.name!r}: {exc.args[0]}: the store was altered", EXIT_REFUSED,
                              error="IntegrityError", as_json=as_json, hint="run `compactstore verify`") from exc
            if frontier.size != head.size or frontier.root() != head.root:
                raise Failure(f"the leaves of {session.name!r} do not give its root {short(head.root)}…",
                              EXIT_REFUSED, error="IntegrityError", as_json=as_json, hint="run `compactstore verify`")
            if redacted:
                shown = ", ".join(map(str, redacted[:10])) + (", ..." if len(redacted) > 10 else "")
                raise Failure(
                    f"session {session.name!r} has {len(redacted)} redacted positions ({shown}): their bodies are "
                    "gone, so no export could be re-appended to the same leaves and roots",
                    EXIT_REFUSED, error="Redacted", as_json=as_json, details={"redacted": redacted},
                    hint="export the other sessions with --session",
                )
            spool.seek(0)
            with click.open_file(output, "wb") as out:
                shutil.copyfileobj(spool, out)
    if output != "-":
        emit(as_json, {"ok": True, "session": session.name, "events": head.size, "root": head.root.hex(),
                       "output": output},
             f"exported {head.size} events of {session.name!r} to {output}; root {head.root.hex()}")
