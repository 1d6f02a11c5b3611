"""The ``compactstore`` command.

Exit codes: 0 success, 1 verification failure (a copied root or leaf differs from the
source's), 2 bad usage (bad arguments, a store that cannot be opened, a destination
session that already holds events).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from .copy import CopyReport
from .copy import copy as copy_store
from .errors import CompactStoreError, IntegrityError
from .store import Store
from .store import open as open_store

EXIT_OK, EXIT_INTEGRITY, EXIT_USAGE = 0, 1, 2


def _is_url(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


def _display(target: str) -> str:
    if _is_url(target):
        from .backends.postgres import redact_url

        return redact_url(target)
    return target


def _check_target(target: str, role: str, must_exist: bool) -> None:
    if target == ":memory:":
        raise click.BadParameter("an in-memory store cannot be copied to or from", param_hint=role)
    if not _is_url(target) and must_exist and not os.path.exists(target):
        raise click.BadParameter(f"no such SQLite store: {target}", param_hint=role)


def _fail(as_json: bool, code: int, exc: CompactStoreError) -> None:
    hint = getattr(exc, "hint", None)
    if as_json:
        out: dict[str, Any] = {"ok": False, "error": type(exc).__name__, "message": str(exc)}
        if hint:
            out["hint"] = hint
        click.echo(json.dumps(out))
    else:
        click.echo(f"error: {exc}" + (f"\nhint: {hint}" if hint else ""), err=True)
    sys.exit(code)


@click.group()
def main() -> None:
    """Tamper-evident, compaction-aware memory for AI agents."""


@main.command("copy")
@click.argument("src")
@click.argument("dst")
@click.option("--session", "sessions", multiple=True, metavar="NAME",
              help="Copy only this session (repeatable). Default: every session.")
@click.option("--key-env", metavar="VAR",
              help="Read the destination's key from environment variable VAR (for a keyed destination).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def copy_command(src: str, dst: str, sessions: tuple[str, ...], key_env: str | None, as_json: bool) -> None:
    """Copy a store from SRC to DST, byte for byte, verifying every session's root on arrival.

    SRC and DST are SQLite paths or postgresql:// URLs. Every destination session must
    be empty. Exit status: 0 copied and verified, 1 a root or leaf differs from the
    source's, 2 bad usage.
    """
    _check_target(src, "SRC", must_exist=True)
    _check_target(dst, "DST", must_exist=False)
    key: str | None = None
    if key_env is not None:
        key = os.environ.get(key_env)
        if not key:
            raise click.BadParameter(f"environment variable {key_env} is unset or empty", param_hint="--key-env")
    source: Store | None = None
    dest: Store | None = None
    try:
        source = open_store(src)
        dest = open_store(dst, key=key)
        report = copy_store(source, dest, sessions=sessions or None)
    except IntegrityError as exc:
        _fail(as_json, EXIT_INTEGRITY, exc)
        return
    except CompactStoreError as exc:
        _fail(as_json, EXIT_USAGE, exc)
        return
    finally:
        for store in (source, dest):
            if store is not None:
                store.close()
    _print(report, src, dst, as_json)


def _print(report: CopyReport, src: str, dst: str, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({
            "ok": True,
            "src": _display(src),
            "dst": _display(dst),
            "events": report.events,
            "sessions": [{"name": c.name, "events": c.events, "root": c.root.hex()} for c in report.sessions],
        }))
        return
    for c in report.sessions:
        click.echo(f"{c.name}: {c.events} events, root {c.root.hex()}")
    click.echo(f"copied {len(report.sessions)} sessions, {report.events} events, every root verified")


if __name__ == "__main__":  # pragma: no cover - `python -m compactstore.cli`
    main()
