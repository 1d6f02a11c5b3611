"""``compactstore append``: JSON Lines events into a session, every line checked before any is written."""

from __future__ import annotations

import re
from bisect import bisect_left
import tempfile
from collections.abc import Iterator
from typing import IO, Literal

import click
import msgspec

from .. import events as ev
from .. import merkle
from ..copy import batches
from ..errors import InvalidEvent
from ..store import Record, Session
from ..structure import IndexRow
from ..store import open as open_store
from .app import (
    EXIT_REFUSED,
    EXIT_USAGE,
    Failure,
    emit,
    json_option,
    key_option,
    main,
    opened,
    reporting,
    store_option,
)

#: Input kept in memory while it is checked; beyond this it is spooled to a temporary file.
SPOOL_BYTES = 16 * 1024 * 1024

_AT_PATH = re.compile(r"\s*-\s*at `\$[^`]*`$")
_BATCH_INDEX = re.compile(r"^events\[(\d+)\]\.(.*)$")


def _bad(lineno: int, what: str, as_json: bool) -> Failure:
    return Failure(f"line {lineno}: {what}", EXIT_USAGE, error="InvalidEvent", as_json=as_json,
                   details={"line": lineno})


def parse_line(line: bytes, lineno: int, as_json: bool = False) -> ev.Event:
    """Return the event on one JSON Lines line, validated as an append would.

    Raises:
        Failure: exit 2, naming the line and what is wrong with it.
    """
    try:
        value = msgspec.json.decode(line)
    except msgspec.DecodeError as exc:
        raise _bad(lineno, f"not valid JSON: {exc}", as_json) from exc
    if not isinstance(value, dict):
        raise _bad(lineno, f"want one event as a JSON object, got {type(value).__name__}", as_json)
    kinds = ", ".join(sorted(ev.KINDS))
    kind = value.get("kind")
    if kind is None:
        raise _bad(lineno, f'the event has no "kind"; kinds are {kinds}', as_json)
    if not isinstance(kind, str) or kind not in ev.KINDS:
        raise _bad(lineno, f"unknown kind {kind!r}; kinds are {kinds}", as_json)
    try:
        event, _ = ev.canonical(ev.decode(line))
    except InvalidEvent as exc:
        field = "" if exc.field in ("event", "body") else f"{exc.field}: "
        raise _bad(lineno, f"{kind} event: {field}{_AT_PATH.sub('', exc.reason)}", as_json) from exc
    return event


class _Erased(msgspec.Struct, forbid_unknown_fields=True):
    by: int
    kind: Literal["redacted", "dropped"]
    leaf: str
    pos: int


class _ErasedLine(msgspec.Struct, forbid_unknown_fields=True):
    erased: _Erased


class _IndexLine(msgspec.Struct, forbid_unknown_fields=True):
    index: tuple[int, str, str, int, str]


#: What a replica line gives: an erased row (position, kind, eraser, leaf) or an index row.
ReplicaLine = tuple[int, str, int, bytes] | IndexRow


def replica_line(line: bytes, lineno: int, as_json: bool = False) -> ReplicaLine | None:
    """Return what a replica line of `compactstore export` holds (an erased row or an index row); None for an event line.

    Raises:
        Failure: exit 2, naming the line and what is wrong with it.
    """
    if not (line.startswith(b'{"erased":') or line.startswith(b'{"index":')):
        return None
    try:
        if line.startswith(b'{"erased":'):
            got = msgspec.json.decode(line, type=_ErasedLine).erased
            leaf = bytes.fromhex(got.leaf)
            if len(leaf) != 32 or not 0 <= got.pos < got.by:
                raise ValueError("want a 32-byte leaf in hex and 0 <= pos < by")
            return (got.pos, got.kind, got.by, leaf)
        return IndexRow(*msgspec.json.decode(line, type=_IndexLine).index)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        raise _bad(lineno, f"not a replica line of `compactstore export`: {exc}", as_json) from exc


def _lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line number, line)`` for every non-blank line."""
    for lineno, raw in enumerate(stream, 1):
        line = raw.strip()
        if line:
            yield lineno, line


def _check_all(stream: IO[bytes], spool: IO[bytes] | None, as_json: bool) -> tuple[int, bool]:
    """Check every line (copying it to ``spool`` when given); return the number of events, and whether it is a replica."""
    count = 0
    replica = False
    keys: dict[str, int] = {}
    for lineno, raw in enumerate(stream, 1):
        if spool is not None:
            spool.write(raw)
        line = raw.strip()
        if not line:
            continue
        got = replica_line(line, lineno, as_json)
        if got is not None:
            replica = True
            count += not isinstance(got, IndexRow)
            continue
        event = parse_line(line, lineno, as_json)
        key = event.idempotency_key
        if key is not None:
            if key in keys:
                raise _bad(lineno, f"idempotency key {key!r} is already used on line {keys[key]}", as_json)
            keys[key] = lineno
        count += 1
    return count, replica


def _replicate(session: Session, lines: Iterator[tuple[int, bytes]], batch: int, as_json: bool) -> int:
    """Write an export of a session with erased bodies into the empty ``session`` as it is; return the events written."""
    if session.size:
        raise Failure(f"session {session.name!r} holds {session.size} events: an export with erased bodies is written "
                      "only into an empty session, as it was", EXIT_USAGE, as_json=as_json)
    records: list[Record] = []
    erased: dict[int, int] = {}
    index: list[IndexRow] = []
    for lineno, line in lines:
        got = replica_line(line, lineno, as_json)
        if isinstance(got, IndexRow):
            index.append(got)
            continue
        pos = len(records)
        if got is None:
            event = parse_line(line, lineno, as_json)
            body = ev.encode(event)
            records.append(Record(session.name, 0, pos, event.kind, event, body, merkle.leaf_hash(body)))
            continue
        at, kind, by, leaf = got
        if at != pos:
            raise _bad(lineno, f"an erased row at pos {at} where the export is at pos {pos}", as_json)
        gone: ev.Event = ev.Redacted(by=by) if kind == "redacted" else ev.Dropped(by=by)
        records.append(Record(session.name, 0, pos, kind, gone, b"", leaf))
        erased[pos] = by
    index.sort(key=lambda r: r.pos)
    starts = [r.pos for r in index]
    for chunk in batches(records, erased, batch):
        lo, hi = chunk[0].pos, chunk[-1].pos + 1
        with reporting(as_json):
            session.replicate(chunk, {p: erased[p] for p in range(lo, hi) if p in erased},
                              index[bisect_left(starts, lo):bisect_left(starts, hi)])
    return len(records)


class _Batches:
    """Appends events batch by batch, mapping the store's errors back to line numbers."""

    def __init__(self, session: Session, as_json: bool) -> None:
        self.session = session
        self.as_json = as_json
        self.appended = 0
        self.present = 0
        self.first_line = 0

    def write(self, batch: list[tuple[int, ev.Event]]) -> None:
        events = [e for _, e in batch]
        before = self.session.size
        try:
            with reporting(self.as_json):
                records = self.session.extend(events, idempotency_keys=[e.idempotency_key for e in events])
        except Failure as failure:
            if failure.error in ("InvalidEvent", "ConflictError"):
                failure = self._locate(failure, batch)
            if self.appended or self.present:
                failure.hint = (
                    f"the {self.appended + self.present} events before line {batch[0][0]} were written by "
                    "earlier batches and stay (the log is append-only); this batch wrote nothing"
                )
            raise failure
        new = sum(1 for r in records if r.pos >= before)
        self.appended += new
        self.present += len(records) - new

    def _locate(self, failure: Failure, batch: list[tuple[int, ev.Event]]) -> Failure:
        field = str(failure.details.get("field", ""))
        lineno = batch[0][0]
        what = failure.message
        found = _BATCH_INDEX.match(field)
        if found:
            lineno = batch[int(found.group(1))][0]
            what = what.replace(f"events[{found.group(1)}].", "", 1)
        elif failure.error == "ConflictError":
            for n, e in batch:
                if e.idempotency_key is not None and repr(e.idempotency_key) in what:
                    lineno = n
                    break
        code = EXIT_REFUSED if failure.error == "ConflictError" else EXIT_USAGE
        return Failure(f"line {lineno}: {what}", code, error=failure.error, as_json=self.as_json,
                       details={**failure.details, "line": lineno})


@main.command("append")
@click.argument("source", type=click.Path(exists=True, dir_okay=False, allow_dash=True), default="-")
@store_option
@key_option
@click.option("--session", "session_name", required=True, metavar="NAME", help="The session to append to.")
@click.option("--batch", default=1000, show_default=True, type=click.IntRange(min=1),
              help="Events per transaction.")
@json_option
def append_command(source: str, target: str, key_env: str | None, session_name: str, batch: int,
                   as_json: bool) -> None:
    """Append the events in SOURCE (a JSON Lines file, or - for stdin) to a session.

    One event per line, in the canonical JSON that `compactstore export` writes, e.g.
    {"kind":"turn","role":"user","content":"hi"}. Blank lines are skipped. An event
    without "ts" is stamped with the current time; one with an "idempotency_key" the
    session already holds for the same event is not written again.

    Every line is checked before anything is written: malformed JSON, an unknown kind,
    a field the kind does not have, a key given twice in one object, a bad field, or an
    idempotency key used twice in the input is reported with its line number, exits 2,
    and writes nothing (the store is not even created). The events are
    then written in batches of --batch, one transaction each. A check that needs the
    log itself (a "supersedes" naming a later position; an idempotency key the session
    holds for a different event, which exits 1) fails its whole batch, which writes
    nothing; earlier batches stay written, since the log is append-only, and the
    message says how many.

    An export of a session with redacted or dropped bodies (its erased rows as
    {"erased": ...} lines, its index rows as {"index": ...} lines) is written into an
    empty session as it is: the present events' bytes, the erased rows' leaves, the
    records of what erased them and the index rows, so the copy has the source's root.
    """
    with open_store(":memory:") as scratch:  # checks the name before anything is created
        with reporting(as_json):
            scratch.session(session_name)
    stream = click.open_file(source, "rb")
    spool: IO[bytes] | None = None
    try:
        if source == "-":
            spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
        count, replica = _check_all(stream, spool, as_json)
        if count == 0:
            emit(as_json, {"ok": True, "session": session_name, "appended": 0, "already_present": 0},
                 f"no events in {'stdin' if source == '-' else source}; nothing written")
            return
        if spool is not None:
            spool.seek(0)
            reread: IO[bytes] = spool
        else:
            stream.seek(0)
            reread = stream
        with opened(target, key_env, as_json, create=True) as store:
            session = store.session(session_name)
            first = session.size
            writer = _Batches(session, as_json)
            if replica:
                writer.appended = _replicate(session, _lines(reread), batch, as_json)
            pending: list[tuple[int, ev.Event]] = []
            for lineno, line in [] if replica else _lines(reread):
                pending.append((lineno, parse_line(line, lineno, as_json)))
                if len(pending) == batch:
                    writer.write(pending)
                    pending = []
            if pending:
                writer.write(pending)
            head = session.head()
    finally:
        if spool is not None:
            spool.close()
        stream.close()
    last = first + writer.appended - 1
    where = f" (positions {first}..{last})" if writer.appended else ""
    again = f"; {writer.present} were already there" if writer.present else ""
    emit(as_json, {
        "ok": True, "session": session_name, "appended": writer.appended, "already_present": writer.present,
        "size": head.size, "root": head.root.hex(),
    }, f"appended {writer.appended} events to {session_name!r}{where}{again}; root {head.root.hex()} at size {head.size}")
