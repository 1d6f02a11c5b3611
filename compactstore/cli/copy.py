"""``compactstore copy``: copy a store to another, any backend to any backend, verified on arrival."""

from __future__ import annotations

import os

import click

from ..copy import CopyReport
from ..copy import copy as copy_store
from ..errors import CompactStoreError, IntegrityError
from ..store import Store
from ..store import open as open_store
from .app import EXIT_REFUSED, EXIT_USAGE, Failure, display, emit, is_url, json_option, main, read_key


def _check_target(target: str, role: str, must_exist: bool) -> None:
    if target == ":memory:":
        raise click.BadParameter("an in-memory store cannot be copied to or from", param_hint=role)
    if not is_url(target) and must_exist and not os.path.exists(target):
        raise click.BadParameter(f"no such SQLite store: {target}", param_hint=role)


@main.command("copy")
@click.argument("src")
@click.argument("dst")
@click.option("--session", "sessions", multiple=True, metavar="NAME",
              help="Copy only this session (repeatable). Default: every session.")
@click.option("--src-key-env", metavar="VAR",
              help="Read the source's key from environment variable VAR (a keyed source is read only with it).")
@click.option("--key-env", metavar="VAR",
              help="Read the destination's key from environment variable VAR (for a keyed destination).")
@json_option
def copy_command(src: str, dst: str, sessions: tuple[str, ...], src_key_env: str | None, key_env: str | None,
                 as_json: bool) -> None:
    """Copy a store from SRC to DST, byte for byte, verifying every session's root on arrival.

    SRC and DST are SQLite paths or postgresql:// URLs. Every destination session must
    be empty. A keyed source is read only with its key (--src-key-env), each leaf proven
    in its sealed heads; a keyed destination takes markers only from a source with the
    same key. Nothing is written unless the source's derived events keep every rule.
    Exit status: 0 copied and verified; 1 the source does not verify (a leaf, root, seal
    or rule), or it changed during the copy; 2 bad usage (a missing key, another key for
    a source with markers, a destination that holds the sessions).
    """
    _check_target(src, "SRC", must_exist=True)
    _check_target(dst, "DST", must_exist=False)
    src_key, key = read_key(src_key_env), read_key(key_env)
    source: Store | None = None
    dest: Store | None = None
    try:
        source = open_store(src, key=src_key, create=False)
        dest = open_store(dst, key=key)
        report = copy_store(source, dest, sessions=sessions or None)
    except IntegrityError as exc:
        raise Failure.of(exc, EXIT_REFUSED, as_json) from exc
    except CompactStoreError as exc:
        raise Failure.of(exc, EXIT_USAGE, as_json) from exc
    finally:
        for store in (source, dest):
            if store is not None:
                store.close()
    _print(report, src, dst, as_json)


def _print(report: CopyReport, src: str, dst: str, as_json: bool) -> None:
    emit(as_json, {
        "ok": True,
        "src": display(src),
        "dst": display(dst),
        "events": report.events,
        "sessions": [{"name": c.name, "events": c.events, "root": c.root.hex()} for c in report.sessions],
    }, [f"{c.name}: {c.events} events, root {c.root.hex()}" for c in report.sessions]
       + [f"copied {len(report.sessions)} sessions, {report.events} events, every root verified"])
