"""``compactstore verify``: re-hash the whole store (or one session), with a progress bar on a terminal."""

from __future__ import annotations

import click

from ..store import Store
from ..verify import Problem, VerifyReport
from .app import EXIT_REFUSED, emit, is_terminal, main, opened, pick_session, store_options

SHOWN = 20


def _run(store: Store, progress: bool) -> VerifyReport:
    if not progress:
        return store.verify()
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("verify"), BarColumn(), MofNCompleteColumn(), TextColumn("events"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task("verify", total=None)
        report = store.verify(progress=lambda done, total: bar.update(task, completed=done, total=total))
        bar.update(task, completed=report.events, total=max(report.events, 1))
    return report


def _problem(p: Problem) -> dict[str, object]:
    return {"session": p.session, "table": p.table, "pos": p.pos, "what": p.what}


@main.command("verify")
@store_options
@click.option("--progress/--no-progress", default=None,
              help="Show a progress bar on stderr. Default: only when stdout and stderr are a terminal.")
def verify_command(target: str, key_env: str | None, session_name: str | None, as_json: bool,
                   progress: bool | None) -> None:
    """Re-hash every body and rebuild every tree; check every subtree root, tree head and seal.

    With --session, report that session's problems (and store-wide ones) only; the
    whole store is still read. Exit status 0 when everything checks out, 1 when a
    problem is found. A keyed store needs its key (--key-env) for its seals to check.
    """
    with opened(target, key_env, as_json) as store:
        only = pick_session(store, session_name, target, as_json) if session_name else None
        report = _run(store, is_terminal() and not as_json if progress is None else progress)
        events = only.size if only else report.events
    problems = [p for p in report.problems if only is None or p.session in (only.name, None)]
    more = report.more if only is None else 0
    redacted = getattr(report, "redacted", 0) if only is None else None
    sessions = 1 if only else report.sessions
    ok = not problems and not more
    scope = f"session {only.name!r}" if only else f"{sessions} session{'s' * (sessions != 1)}"
    if ok:
        extra = f"; {redacted} redacted positions (erased by redaction events, not tampering)" if redacted else ""
        lines = [f"ok: {scope}, {events} events: every body, leaf, subtree root, tree head and seal checks out{extra}"]
    else:
        count = len(problems) + more
        lines = [f"FAILED: {count} problem{'s' * (count != 1)} in {scope}, {events} events"]
        lines += [f"  - {p}" for p in problems[:SHOWN]]
        if count > SHOWN:
            lines.append(f"  ... and {count - SHOWN} more (--json lists them)")
    emit(as_json, {"ok": ok, "sessions": sessions, "events": events, "problems": [_problem(p) for p in problems],
                   "more": more, "redacted": redacted}, lines)
    if not ok:
        raise click.exceptions.Exit(EXIT_REFUSED)
