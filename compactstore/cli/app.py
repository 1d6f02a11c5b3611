"""The command group and what every subcommand shares: the store option, errors, output.

Exit codes, the same for every subcommand:

- 0: done (verified, certified, copied, appended, ...).
- 1: a refusal or a verification failure: the gate refused a compaction, a marker
  failed a condition, a restoration was unsound, an idempotency key was reused for a
  different event, the store or a proof does not verify, the audit found a lost binding.
- 2: bad usage or bad input: unknown options, malformed JSON Lines, an unknown event
  kind, a store or session that does not exist. Nothing is written.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import click

from ..errors import (
    CompactionInvariantError,
    CompactStoreError,
    ConflictError,
    IntegrityError,
    MarkerInvalid,
    NotAStore,
    ReconstructionUnsoundError,
    SchemaOutdatedError,
)
from ..backends import is_postgres
from ..store import Session, Store
from ..store import open as open_store

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
DEFAULT_STORE = "compactstore.db"
STORE_ENV = "COMPACTSTORE_STORE"
WITNESS_ENV = "COMPACTSTORE_WITNESS"
#: Where ``--witness`` leaves its value for :func:`opened` (a click context's ``meta``).
_WITNESS = "compactstore.witness"

#: Errors that mean "the store said no" (exit 1) rather than "the input is wrong" (exit 2).
REFUSALS: tuple[type[CompactStoreError], ...] = (
    IntegrityError,
    MarkerInvalid,
    CompactionInvariantError,
    ReconstructionUnsoundError,
    ConflictError,
)

F = TypeVar("F", bound=Callable[..., Any])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="compactstore")
def main() -> None:
    """Tamper-evident, compaction-aware memory for AI agents.

    Every command takes the store as --store/-s: a SQLite file (default
    compactstore.db in the current folder, or $COMPACTSTORE_STORE) or a
    postgresql:// URL. Start with `compactstore demo`, then `compactstore show`.

    Exit status: 0 ok, 1 a refusal or a verification failure, 2 bad usage or bad
    input (nothing is written).
    """


class Failure(click.ClickException):
    """A refusal (exit 1) or bad input (exit 2), shown as one line, or as JSON with --json.

    Attributes:
        error: the error's name (the exception class, or ``BadInput``).
        hint: what the user can do about it.
        details: more lines (plain) or fields (JSON): violations, risks, problems.
    """

    def __init__(
        self,
        message: str,
        code: int = EXIT_USAGE,
        *,
        error: str = "BadInput",
        hint: str | None = None,
        as_json: bool = False,
        details: dict[str, Any] | None = None,
        lines: list[str] | None = None,
    ) -> None:
        super().__init__(message)
        self.exit_code = code  # type: ignore[misc]  # click declares it on the class; ours varies
        self.error = error
        self.hint = hint
        self.as_json = as_json
        self.details = details or {}
        self.lines = lines or []

    @classmethod
    def of(cls, exc: CompactStoreError, code: int, as_json: bool, *, hint: str | None = None) -> Failure:
        """Return the failure that reports library error ``exc`` with exit status ``code``."""
        details: dict[str, Any] = {}
        lines: list[str] = []
        violations = getattr(exc, "violations", None)
        if violations:
            details["violations"] = [str(v) for v in violations]
            lines = [str(v) for v in violations]
        risks = getattr(exc, "risks", None)
        if risks:
            details["risks"] = [str(r) for r in risks]
        for name in ("field", "session", "pos"):
            value = getattr(exc, name, None)
            if value is not None:
                details[name] = value
        return cls(str(exc), code, error=type(exc).__name__, hint=hint or exc.hint, as_json=as_json,
                   details=details, lines=lines)

    def show(self, file: IO[Any] | None = None) -> None:
        """Print the failure: JSON on stdout with --json, else ``error: ...`` on stderr."""
        if self.as_json:
            out: dict[str, Any] = {"ok": False, "error": self.error, "message": self.message, **self.details}
            if self.hint:
                out["hint"] = self.hint
            click.echo(json.dumps(out))
            return
        word = "refused" if self.exit_code == EXIT_REFUSED else "error"
        click.echo(f"{word}: {self.message}", err=True)
        for line in self.lines:
            click.echo(f"  - {line}", err=True)
        if self.hint:
            click.echo(f"hint: {self.hint}", err=True)


@contextmanager
def reporting(as_json: bool, hints: dict[type[CompactStoreError], str] | None = None) -> Iterator[None]:
    """Turn library errors into failures: refusals exit 1, everything else 2."""
    try:
        yield
    except REFUSALS as exc:
        hint = next((h for t, h in (hints or {}).items() if isinstance(exc, t)), None)
        raise Failure.of(exc, EXIT_REFUSED, as_json, hint=hint) from exc
    except CompactStoreError as exc:
        hint = next((h for t, h in (hints or {}).items() if isinstance(exc, t)), None)
        raise Failure.of(exc, EXIT_USAGE, as_json, hint=hint) from exc


# --- options -------------------------------------------------------------------------


def store_option(f: F) -> F:
    """Add ``--store/-s`` and ``--witness``."""
    return click.option(
        "--store", "-s", "target", default=DEFAULT_STORE, show_default=True, envvar=STORE_ENV, show_envvar=True,
        metavar="PATH|URL", help="The store: a SQLite file or a postgresql:// URL.",
    )(witness_option(f))


def _keep_witness(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.meta[_WITNESS] = value


def witness_option(f: F) -> F:
    """Add ``--witness`` (every command that opens the store with :func:`opened` uses it)."""
    return click.option(
        "--witness", metavar="PATH", envvar=WITNESS_ENV, show_envvar=True, expose_value=False,
        callback=_keep_witness,
        help="A file outside the store holding each session's latest head: a store restored "
        "to an older copy, truncated or forked is refused.",
    )(f)


def key_option(f: F) -> F:
    """Add ``--key-env``."""
    return click.option(
        "--key-env", metavar="VAR",
        help="Read the store's key from environment variable VAR (for a keyed store).",
    )(f)


def json_option(f: F) -> F:
    """Add ``--json``."""
    return click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")(f)


def session_option(f: F) -> F:
    """Add ``--session`` (default: the store's only session)."""
    return click.option(
        "--session", "session_name", metavar="NAME",
        help="The session. Default: the store's only session.",
    )(f)


def store_options(f: F) -> F:
    """Add ``--store``, ``--key-env``, ``--session`` and ``--json``."""
    return store_option(key_option(session_option(json_option(f))))


# --- stores and sessions ---------------------------------------------------------------


def is_url(target: str) -> bool:
    """Return whether ``target`` names a PostgreSQL store."""
    return is_postgres(target)


def display(target: str) -> str:
    """Return ``target`` fit to print: a URL's password is masked."""
    if not is_url(target):
        return target
    try:
        parts = urlsplit(target)
        password = parts.password
    except ValueError:
        return "postgresql://…"
    if password is None:
        return target
    user, host = parts.netloc.rsplit("@", 1)
    return urlunsplit(parts._replace(netloc=f"{user.split(':', 1)[0]}:***@{host}"))


def read_key(key_env: str | None) -> str | None:
    """Return the key held in environment variable ``key_env``, or None when no variable is named."""
    if key_env is None:
        return None
    key = os.environ.get(key_env)
    if not key:
        raise click.BadParameter(f"environment variable {key_env} is unset or empty", param_hint="--key-env")
    return key


KEY_HINT = "pass --key-env VAR, naming the environment variable that holds the store's key"
NO_STORE_HINT = "run `compactstore demo` to make one, or name yours with --store or $COMPACTSTORE_STORE"


@contextmanager
def opened(target: str, key_env: str | None, as_json: bool, *, create: bool = False) -> Iterator[Store]:
    """Open the store at ``target``; unless ``create``, only an existing store, and nothing is created.

    A keyed store needs its key here, for every command: without it every seal would
    look forged, and nothing could be certified, proven against a sealed head or written.

    Raises:
        Failure: exit 2 for ``:memory:``, a missing or empty file, a target that is no
            store, or a keyed store without ``--key-env``; exit 1 for a damaged file
            (it does not verify).
    """
    if target == ":memory:":
        raise Failure("--store :memory: keeps nothing between commands: name a file or a postgresql:// URL",
                      as_json=as_json)
    key = read_key(key_env)
    ctx = click.get_current_context(silent=True)
    witness = ctx.meta.get(_WITNESS) if ctx is not None else None
    try:
        store = open_store(target, key=key, create=create, witness=witness)
    except NotAStore as exc:
        missing = exc.reason == "no such file"
        hint = exc.hint if "other tables" in exc.reason else NO_STORE_HINT  # the file is left as it was
        raise Failure(f"no store at {exc.target}" if missing else str(exc), as_json=as_json, error="NotAStore",
                      hint=hint) from exc
    except SchemaOutdatedError as exc:
        raise Failure(str(exc), EXIT_REFUSED, error=type(exc).__name__, hint=exc.hint, as_json=as_json) from exc
    except IntegrityError as exc:
        raise Failure(f"the store {display(target)} does not verify: {exc}", EXIT_REFUSED, error=type(exc).__name__,
                      hint=exc.hint, as_json=as_json) from exc
    except CompactStoreError as exc:
        raise Failure.of(exc, EXIT_USAGE, as_json) from exc
    try:
        if store.keyed and not store.has_key:
            raise Failure(f"this store is keyed; pass --key-env: {display(target)} seals its tree heads with a key",
                          error="KeyRequired", hint=KEY_HINT, as_json=as_json)
        yield store
    finally:
        store.close()


def pick_session(store: Store, name: str | None, target: str, as_json: bool) -> Session:
    """Return the session ``name``, or the store's only session when ``name`` is None.

    Raises:
        Failure: exit 2 when there is no such session, or no single default.
    """
    names = store.sessions()
    listed = ", ".join(repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
    if name is None:
        if len(names) == 1:
            return store.session(names[0])
        if not names:
            raise Failure(f"the store {display(target)} holds no sessions", as_json=as_json,
                          hint="append events with `compactstore append --session NAME FILE`")
        raise Failure(f"the store {display(target)} holds {len(names)} sessions ({listed}): name one with --session",
                      as_json=as_json)
    if name not in names:
        raise Failure(f"no session {name!r} in {display(target)}" + (f"; it holds {listed}" if names else ""),
                      as_json=as_json)
    return store.session(name)


def emit(as_json: bool, data: dict[str, Any], text: str | list[str]) -> None:
    """Print ``data`` as JSON with --json, else ``text``."""
    if as_json:
        click.echo(json.dumps(data))
        return
    for line in [text] if isinstance(text, str) else text:
        click.echo(line)


def short(h: bytes | str, n: int = 16) -> str:
    """Return the first ``n`` hex digits of a hash."""
    return (h.hex() if isinstance(h, bytes) else h)[:n]


def is_terminal() -> bool:
    """Return whether both stdout and stderr are terminals (not piped, not captured)."""
    return sys.stdout.isatty() and sys.stderr.isatty()
