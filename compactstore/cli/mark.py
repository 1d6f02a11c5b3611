"""``compactstore mark`` and ``compactstore resume``: recovery markers, checked at emission and at resume."""

from __future__ import annotations

from typing import Any

import click
import msgspec

from ..errors import MarkerInvalid
from ..markers import Marker
from ..resolver import RawItem, Resolution, SummaryItem
from ..store import Session
from ..structure import text_of
from .app import EXIT_REFUSED, Failure, emit, main, opened, pick_session, reporting, short, store_options

MARK_HINT = "a raw-checkpoint marker is always safe: compactstore mark --raw"


def marker_data(m: Marker) -> dict[str, Any]:
    """Return a marker as plain JSON data."""
    return {"pos": m.pos, "node": m.node, "size": m.size, "root": m.root.hex(), "conditions": m.conditions,
            "path": m.path, "mac": m.mac.hex() if m.mac else None}


@main.command("mark")
@click.argument("node", type=int, required=False)
@click.option("--raw", is_flag=True, help="Emit a raw-checkpoint marker instead (resumes in fallback mode).")
@click.option("--size", type=int, help="With --raw: the checkpoint size. Default: now.")
@store_options
def mark_command(node: int | None, raw: bool, size: int | None, target: str, key_env: str | None,
                 session_name: str | None, as_json: bool) -> None:
    """Emit a recovery marker pointing at the summary node at position NODE.

    The three conditions are checked first: closure (every item open at the node's
    boundary is listed as UNRESOLVED), negative-fact retention (every failed, rejected
    or superseded event of its span is retained, and every earlier event it
    supersedes) and anchoring (every digest on its path matches the log; every needed
    non-regenerable binding is kept or spilled).
    A failed condition refuses the marker (exit 1), naming each violation, and writes
    nothing.
    """
    if raw == (node is not None):
        raise click.UsageError("give either NODE or --raw")
    if size is not None and not raw:
        raise click.UsageError("--size goes with --raw")
    with opened(target, key_env, as_json) as store:
        session = pick_session(store, session_name, target, as_json)
        with reporting(as_json, {MarkerInvalid: MARK_HINT}):
            marker = session.mark_raw(size) if raw else session.mark(node)
    if marker.node is None:
        text = f"raw-checkpoint marker at pos {marker.pos}: size {marker.size}, root {short(marker.root)}…"
    else:
        text = (f"marker at pos {marker.pos} -> node {marker.node}, checkpoint size {marker.size}, root "
                f"{short(marker.root)}…; certified: {', '.join(marker.conditions)}")
    emit(as_json, {"ok": True, "marker": marker_data(marker)}, text)


def resolution_data(res: Resolution) -> dict[str, Any]:
    """Return a resolution as plain JSON data (hashes in hex)."""
    return {
        "session": res.session, "marker": res.marker, "mode": res.mode, "size": res.size, "root": res.root.hex(),
        "reasons": res.reasons, "digest": res.digest.hex(), "context": msgspec.to_builtins(res.context),
    }


def context_lines(res: Resolution) -> list[str]:
    """Return the resolution's context, one item a line."""
    lines = []
    for item in res.context:
        if isinstance(item, SummaryItem):
            lines.append(f"  [{item.start}, {item.stop}) L{item.tier} node {item.pos} {item.loss.value}: "
                         + " ".join(item.summary.split())[:100])
        elif isinstance(item, RawItem):
            lines.append(f"  {item.pos}: {text_of(item.event)[:110]}")
    return lines


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' * (n != 1)}"


def _latest_marker(session: Session) -> int | None:
    found = None
    for r in session.scan():
        if r.kind == "marker":
            found = r.pos
    return found


@main.command("resume")
@click.argument("marker", type=int, required=False)
@click.option("--context", "show_context", is_flag=True, help="Also print the context, one item a line.")
@click.option("--require-certified", is_flag=True, help="Exit 1 unless the marker resumes certified.")
@store_options
def resume_command(marker: int | None, show_context: bool, require_certified: bool, target: str,
                   key_env: str | None, session_name: str | None, as_json: bool) -> None:
    """Resume from the marker at position MARKER (default: the latest) and say how and why.

    Certified: every condition holds again over the raw log up to the marker's
    checkpoint, and the context is the summary tier. Fallback: the context is exactly
    the raw events up to the checkpoint, and the reasons say which condition failed.
    A summary is never patched. The digest is the same for the same marker every time.
    A checkpoint that does not verify is a refusal (exit 1).
    """
    with opened(target, key_env, as_json) as store:
        session = pick_session(store, session_name, target, as_json)
        with reporting(as_json):  # finding the latest marker reads, and checks, every body
            pos = marker if marker is not None else _latest_marker(session)
        if pos is None:
            raise Failure(f"session {session.name!r} holds no marker", as_json=as_json,
                          hint="emit one with `compactstore mark NODE` or `compactstore mark --raw`")
        with reporting(as_json):
            res = session.resume(pos)
    summaries = sum(1 for i in res.context if isinstance(i, SummaryItem))
    lines = [
        f"marker {res.marker}: {res.mode} (checkpoint size {res.size}, root {short(res.root)}…)",
        *(f"  {'why' if res.mode == 'certified' else 'because'}: {r}" for r in res.reasons),
        f"  context: {_count(summaries, 'summary node')} and {_count(len(res.context) - summaries, 'raw event')}"
        f" for the {res.size} logged events up to the checkpoint",
        f"  digest: {res.digest.hex()}",
    ]
    if show_context:
        lines += context_lines(res)
    failed = require_certified and res.mode != "certified"
    emit(as_json, {"ok": not failed, **resolution_data(res)}, lines)
    if failed:
        if not as_json:
            click.echo(f"refused: marker {res.marker} resumes in fallback mode (--require-certified)", err=True)
        raise click.exceptions.Exit(EXIT_REFUSED)
