"""``compactstore migrate``: bring a store made by an earlier release to this release's schema."""

from __future__ import annotations

import click

from .. import migrate as migrations
from ..backends import SCHEMA_VERSION, open_backend
from ..errors import CompactStoreError, NotAStore
from .app import EXIT_REFUSED, EXIT_USAGE, Failure, display, emit, json_option, key_option, main, opened, store_option


@main.command("migrate")
@store_option
@key_option
@json_option
@click.argument("path", required=False, metavar="[PATH|URL]")
@click.option("--dry-run", is_flag=True, help="Run the first step and roll it back: nothing is written.")
@click.option("--no-backup", is_flag=True, help="On SQLite, do not copy the file to PATH.schema-N.bak first.")
def migrate_command(target: str, key_env: str | None, as_json: bool, path: str | None, dry_run: bool,
                    no_backup: bool) -> None:
    """Upgrade the store (PATH, or --store) to this release's schema, keeping every event, leaf, head and seal.

    Each step runs in one transaction that holds writers off: stopped at any point, the
    store is wholly at the old version or the new. On SQLite the file is copied first.
    Then the store is verified, and every node or marker that a rule tightened since
    no longer certifies is listed (the migration still completes). Exit status 0 when
    the store is at this release's schema and verifies, 1 when it does not verify.
    """
    target = path or target
    if target == ":memory:":
        raise Failure("--store :memory: keeps nothing between commands: name a file or a postgresql:// URL",
                      as_json=as_json)
    try:
        backend = open_backend(target, durable=True, create=False)
    except NotAStore as exc:
        raise Failure(str(exc), as_json=as_json, error="NotAStore", hint=exc.hint) from exc
    except CompactStoreError as exc:
        raise Failure.of(exc, EXIT_USAGE, as_json) from exc
    lines: list[str] = []
    try:
        done = migrations.migrate(backend, target, dry_run=dry_run, backup=not no_backup,
                                  progress=None if as_json else lambda what: click.echo(f"  {what}", err=True))
    except CompactStoreError as exc:
        raise Failure.of(exc, EXIT_REFUSED, as_json) from exc
    finally:
        backend.close()
    data: dict[str, object] = {"source": done.source, "target": done.target, "steps": done.steps, "rows": done.rows,
                               "backup": done.backup, "dry_run": done.dry_run}
    if done.source == SCHEMA_VERSION:
        lines.append(f"{display(target)} is at schema {SCHEMA_VERSION} already: nothing to do")
    elif dry_run:
        lines.append(f"dry run: {display(target)} would go from schema {done.source} to {SCHEMA_VERSION}; "
                     "the first step ran and was rolled back")
    else:
        lines.append(f"migrated {display(target)} from schema {done.source} to {done.target}"
                     + (f"; the file before is at {done.backup}" if done.backup else ""))
    if dry_run:
        emit(as_json, data, lines)
        return
    with opened(target, key_env, as_json) as store:
        report = store.verify()
    # A stored node or marker that a rule tightened since no longer certifies: it is named,
    # and the store is still the store it was. Anything else is damage.
    tightened = [p for p in report.problems if p.what.startswith("breaks a rule")]
    damaged = [str(p) for p in report.problems if p not in tightened]
    data.update(verified=not damaged and not report.more, problems=damaged, tightened=[str(p) for p in tightened])
    if damaged or report.more:
        lines.append(f"FAILED: {len(damaged) + report.more} problems:")
        lines += [f"  - {p}" for p in damaged[:20]]
    else:
        lines.append(f"ok: {report.sessions} sessions, {report.events} events verify")
    if tightened:
        lines.append(f"{len(tightened)} stored events no longer certify under this release's rules "
                     "(resume falls back past them):")
        lines += [f"  - {p}" for p in tightened[:20]]
    emit(as_json, data, lines)
    if damaged or report.more:
        raise SystemExit(EXIT_REFUSED)
