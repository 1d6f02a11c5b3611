"""``compactstore audit``: the structural signal that a lossy compaction destroyed a needed binding."""

from __future__ import annotations

import click

from .app import EXIT_REFUSED, emit, main, opened, pick_session, reporting, store_options


@main.command("audit")
@store_options
def audit_command(target: str, key_env: str | None, session_name: str | None, as_json: bool) -> None:
    """Find each non-regenerable binding a lossy compaction swallowed and a later step needed.

    The failure the gate prevents shows up steps after a compaction, at the first step
    that needs the lost literal; this finds it afterwards, from event fields alone
    (obligations' needs and events' uses), never from prose. Exit status 1 when there
    is a finding.
    """
    with opened(target, key_env, as_json) as store:
        session = pick_session(store, session_name, target, as_json)
        with reporting(as_json):
            findings = session.audit()
    lines = [
        f"lost: binding {f.key!r} (bound at pos {f.binding_pos}) was compacted away by the lossy node at pos "
        f"{f.node} and needed {f.steps_later} steps later, at pos {f.needed_at}, by {f.via}"
        for f in findings
    ] or [f"no findings in {session.name!r}: every binding a later step needed stayed reachable "
          "(in the raw log, kept verbatim or spilled)"]
    emit(as_json, {"ok": not findings, "session": session.name, "findings": [
        {"node": f.node, "key": f.key, "binding_pos": f.binding_pos, "needed_at": f.needed_at,
         "steps_later": f.steps_later, "via": f.via} for f in findings]}, lines)
    if findings:
        raise click.exceptions.Exit(EXIT_REFUSED)
