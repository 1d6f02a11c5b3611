"""Upgrading a store made by an earlier release to this release's schema, in place.

What is kept: every event's bytes, leaf, subtree, head and seal; a migration never
writes to the log tables' rows. What it changes: the derived tables (the structural
index gains the rows the new schema derives) and the schema's triggers and functions,
then the version in ``meta``. Each step from one version to the next is one transaction
that holds writers off, so a migration stopped at any point leaves the store wholly at
one version or the next; on SQLite a copy of the file is written first.

This release reads schema :data:`SCHEMA_VERSION` and migrates stores from each version
in :data:`MIGRATES_FROM`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import msgspec

from . import index
from .backends import SCHEMA_VERSION, Backend
from .errors import CompactStoreError
from .structure import IndexRow

#: The schema versions a store can be migrated from, oldest first.
MIGRATES_FROM: tuple[str, ...] = ("5",)

#: What each step does, by the version it reaches (for reports and ``--dry-run``).
STEPS: dict[str, tuple[str, ...]] = {
    "6": (
        "add the trigger that makes a head follow the head it extends",
        "add the structural index's snapshots of open items every 64 positions",
    ),
}


class Migration(msgspec.Struct, frozen=True):
    """What a migration did (or, in a dry run, would do).

    Attributes:
        source: the schema version the store was at.
        target: the schema version it is at now (``source`` after a dry run).
        steps: each step, as ``"5 -> 6: what"``.
        rows: index rows added, per session name.
        backup: the SQLite copy written before the first step (None: none was written).
        dry_run: every step ran and was rolled back.
    """

    source: str
    target: str
    steps: list[str]
    rows: dict[str, int]
    backup: str | None
    dry_run: bool


def version_of(backend: Backend) -> str | None:
    """Return the schema version the store records (None when it records none)."""
    return backend.meta().get("schema_version")


def needed(version: str | None) -> bool:
    """Return whether a store at ``version`` is one this release migrates (older, and known)."""
    return version in MIGRATES_FROM


def where(target: str) -> str:
    """Return ``target`` as it is fit to print: a URL's password masked."""
    from .backends import is_postgres

    if is_postgres(target):
        from .backends.postgres import redact_url

        return redact_url(target)
    return target


def command(target: str) -> str:
    """Return the command that migrates the store at ``target`` (a URL's password masked)."""
    shown = where(target)
    return f"compactstore migrate {shown!r}" if " " in shown else f"compactstore migrate {shown}"


def migrate(
    backend: Backend,
    target: str,
    *,
    dry_run: bool = False,
    backup: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Migration:
    """Bring the store behind ``backend`` (opened at ``target``) to :data:`SCHEMA_VERSION`.

    ``backup``: on SQLite, first copy the file to ``TARGET.schema-N.bak`` (N the version
    found; a number is added when that name is taken). ``progress(what)`` is called
    before each step. A store already at this release's schema is left as it is. A dry
    run runs the first step and rolls it back (each later step needs the one before).

    Raises:
        CompactStoreError: the store's schema is newer than this release's, or one this
            release cannot migrate.
        ConflictError: another migration moved the store meanwhile.
        IntegrityError: the store's index or layout is not what its version's code writes.
    """
    source = version_of(backend)
    if source == SCHEMA_VERSION:
        return Migration(source, source, [], {}, None, dry_run)
    if not needed(source):
        raise CompactStoreError(
            f"cannot migrate a store of schema {source!r}: this release reads {SCHEMA_VERSION!r} and migrates "
            f"from {', '.join(MIGRATES_FROM)}",
            hint="open it with the release that wrote it, and copy it out (compactstore copy)",
        )
    assert source is not None
    saved = None
    from .backends.sqlite import SQLiteBackend

    if backup and not dry_run and isinstance(backend, SQLiteBackend) and target != ":memory:":
        saved = _free_name(f"{target}.schema-{source}.bak")
        if progress is not None:
            progress(f"back up to {saved}")
        backend.backup(saved)
    names = {sid: name for sid, name in backend.sessions()}
    done: list[str] = []
    counts: dict[str, int] = {}
    version = source
    while version != SCHEMA_VERSION:
        to = str(int(version) + 1)
        for what in STEPS[to]:
            done.append(f"{version} -> {to}: {what}")
            if progress is not None:
                progress(done[-1])
        added: dict[int, int] = {}

        def derive() -> Sequence[tuple[int, Sequence[IndexRow]]]:
            out = []
            for sid in names:
                head = backend.head(sid)
                # A session with redactions reads its facts from the events, never the index.
                if head is None or backend.redactions(sid):
                    continue
                rows = index.missing_rows(backend, sid, head.size)
                added[sid] = len(rows)
                out.append((sid, rows))
            return out

        backend.upgrade(to, derive, commit=not dry_run)
        for sid, n in added.items():
            if n:
                counts[names[sid]] = counts.get(names[sid], 0) + n
        version = to
        if dry_run:
            break
    return Migration(source, source if dry_run else version, done, counts, saved, dry_run)


def _free_name(path: str) -> str:
    """Return ``path``, or ``path.N`` for the first N that names no file."""
    if not os.path.exists(path):
        return path
    n = 1
    while os.path.exists(f"{path}.{n}"):
        n += 1
    return f"{path}.{n}"
