"""Event types and their one canonical encoding.

Every event is a frozen msgspec Struct tagged by ``kind``. The canonical encoding is
JSON with struct fields and map keys sorted and default-valued fields omitted, so
the same event always gives the same bytes, and an optional field added in a later
version does not change the bytes (or the Merkle leaves) of events that do not use it.
Everything about an event except its storage coordinates (sequence number, session
position) lives inside those bytes, its timestamp and idempotency key included.
"""

from __future__ import annotations

import enum
from bisect import bisect_right
import itertools
import json
import math
import os
import time
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from operator import attrgetter, is_not
from typing import Any, Literal, TypeAlias, Union, cast

import msgspec

from .errors import InvalidArgument, InvalidEvent, shown

#: A JSON value: None, bool, int, float (finite), str, list, or dict with str keys.
JSON: TypeAlias = Any

Status = Literal["ok", "failed", "rejected", "superseded"]

#: A clock returns microseconds since the Unix epoch. Inject one for determinism.
Clock = Callable[[], int]

#: Bounds that keep one event well inside what SQLite and PostgreSQL store in a row.
MAX_EVENT_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 64


def system_clock() -> int:
    """Return the wall clock in microseconds since the Unix epoch."""
    return time.time_ns() // 1000


def tick_clock(start: int = 1_767_225_600_000_000, step: int = 1_000_000) -> Clock:
    """Return a deterministic clock: ``start``, then ``start + step``, and so on.

    The default start is 2026-01-01T00:00:00Z; the default step one second.
    """
    # A counter's __next__ runs in C: a Python closure cost a frame per stamped event.
    return itertools.count(start, step).__next__


# Every struct that is decoded from input forbids unknown fields: a misspelt or foreign
# field would otherwise be dropped without a word, and the event stored is not the one given.
# Not tracked by the cycle collector (gc=False), as a Record is not: an event holds JSON
# values, which cannot lead back to it (an event inside its own value is not JSON, and is
# refused), and the containers among them are tracked on their own. Tracking two events per
# appended item (the one given and the one stamped) cost an adapter's batch a full
# collection of the heap every few hundred calls.
class Event(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="kind",
            forbid_unknown_fields=True, gc=False):
    """Fields every event carries.

    Attributes:
        status: ``ok``, ``failed``, ``rejected`` or ``superseded``; None when not stated.
        supersedes: the position (in the same session) of the event this one replaces.
        ts: microseconds since the Unix epoch; stamped by the store's clock when None.
        idempotency_key: set by the store from ``append(..., idempotency_key=...)``.
        meta: free-form JSON the caller wants kept with the event.
        uses: the binding keys this step depends on (read by the audit, never from prose).
    """

    status: Status | None = None
    supersedes: int | None = None
    ts: int | None = None
    idempotency_key: str | None = None
    meta: dict[str, JSON] | None = None
    uses: list[str] | None = None

    @property
    def kind(self) -> str:
        """Return the event's kind tag (``turn``, ``tool_call``, ...)."""
        tag = type(self).__struct_config__.tag
        assert isinstance(tag, str)
        return tag


class Turn(Event, frozen=True, tag="turn"):
    """A conversational turn: ``role`` (user, assistant, system, ...) said ``content``."""

    role: str
    content: str
    name: str | None = None


class ToolCall(Event, frozen=True, tag="tool_call"):
    """A request to run tool ``name`` with ``args``; paired with its result by ``call_id``."""

    call_id: str
    name: str
    args: dict[str, JSON] = {}


class ToolResult(Event, frozen=True, tag="tool_result"):
    """The outcome of the tool call ``call_id``: its ``output`` and whether it was ``ok``."""

    call_id: str
    output: JSON = None
    ok: bool = True


class Binding(Event, frozen=True, tag="binding"):
    """A literal a later step may need (a commit id, a path, an exact error), under ``key``.

    A regenerable binding can be re-fetched (``how`` says how); a non-regenerable one
    exists only here, so compaction must keep it, spill it or refuse.
    """

    key: str
    value: JSON
    regenerable: bool = False
    how: str | None = None


class Obligation(Event, frozen=True, tag="obligation"):
    """An open commitment ``name`` that will need the bindings ``needs``."""

    name: str
    needs: list[str] = []


class Fulfilment(Event, frozen=True, tag="fulfilment"):
    """Closes the obligation ``name``."""

    name: str


Resource = Literal["file", "subprocess", "socket", "lock", "other"]


class HandleOpened(Event, frozen=True, tag="handle_opened"):
    """A file, subprocess or other resource ``handle`` was opened."""

    handle: str
    resource: Resource = "other"
    detail: str = ""


class HandleClosed(Event, frozen=True, tag="handle_closed"):
    """The resource ``handle`` was closed (or the subprocess exited)."""

    handle: str


class LossClass(str, enum.Enum):
    """What a summary node lost. Unknown or absent means LOSSY_LITERAL, the pessimistic default."""

    LOSSY_GIST = "LOSSY_GIST"
    LOSSY_LITERAL = "LOSSY_LITERAL"
    LOSSLESS = "LOSSLESS"


class Fact(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """A negative fact a node retains: the event at ``pos`` failed, was rejected or superseded."""

    pos: int
    status: Status
    text: str = ""


class Item(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """A ``tool_call``, ``handle`` or ``obligation`` opened at ``pos``: open at a node's boundary, or closed in its span."""

    pos: int
    kind: Literal["tool_call", "handle", "obligation"]
    id: str


class Excerpt(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """A literal kept verbatim: ``value`` is field ``path`` of the event at ``pos``."""

    pos: int
    path: str
    value: JSON = None


class Lost(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """A literal of a node's span that the node neither keeps nor states: field ``path`` of the ``kind`` event at ``pos``.

    ``key`` names a binding's key when the literal is a binding's value. A position
    whose body was redacted is listed once, with kind ``redacted`` and no path: what it
    held is unknown. The value itself is not repeated: ``Session.lookup("pos:path")``
    reads it from the log.
    """

    pos: int
    path: str
    kind: str
    key: str | None = None


class SpillRef(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """A binding spilled to the store: ``Session.spilled(handle)`` returns its exact value."""

    handle: str
    key: str
    source: int
    digest: str


class Summary(Event, frozen=True, tag="node"):
    """A summary node: tier 1 over raw positions, tier 2 over contiguous tier-1 nodes.

    ``span_root`` (hex) is the root of raw positions ``[start, stop)``, which ties the
    node to exactly the events it replaced. ``content_digest`` (hex), when present, is
    one BLAKE3 over those events' bodies (see :func:`compactstore.compaction.content_digest`),
    so the span can be restored and certified with one hash instead of a Merkle rehash;
    absent, it is omitted from the body, so nodes written without it keep their bytes.

    ``resolved`` lists the items opened before ``start`` and closed inside the span: a
    resumed context shows their opening raw and only the node can say they were closed.
    Empty, it is omitted from the body, so nodes written without it keep their bytes.
    """

    tier: int
    start: int
    stop: int
    span_root: str
    summary: str
    loss: LossClass = LossClass.LOSSY_LITERAL
    children: list[int] = []
    negative_facts: list[Fact] = []
    unresolved: list[Item] = []
    resolved: list[Item] = []
    kept: list[Excerpt] = []
    spills: list[SpillRef] = []
    contract: str | None = None
    content_digest: str | None = None


class Spill(Event, frozen=True, tag="spill"):
    """The exact value of binding ``key`` (first bound at ``source``), stored outside any summary."""

    key: str
    value: JSON
    source: int
    digest: str


class RecoveryMarker(Event, frozen=True, tag="marker"):
    """A pointer plus a promise: resume from summary node ``node`` at raw checkpoint ``size``/``root``.

    ``node`` is None for a raw-checkpoint marker. ``conditions`` lists what was
    certified at emission; ``path`` the node positions whose digests were checked.

    ``cover``, when not empty, lists the nodes the pointer resolves to, in span order,
    ``node`` first: the newest session digest, the L1 nodes after it; the raw events
    outside their spans complete the context up to the checkpoint. Empty, the cover is
    ``node`` alone, and it is omitted from the body, so markers written without it keep
    their bytes.
    """

    size: int
    root: str
    node: int | None = None
    mac: str | None = None
    conditions: list[str] = []
    path: list[int] = []
    cover: list[int] = []


class Attempt(Event, frozen=True, tag="attempt"):
    """The literals an operation acted on, under the attempt's idempotency ``key``."""

    key: str
    operation: str
    literals: dict[str, JSON] = {}


class Guard(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """What a redaction keeps of an attempt it erases, so that the retry guard outlives it.

    Attributes:
        pos: the attempt's position.
        key: its idempotency key.
        literals: the digest of each literal it acted on (see :func:`compactstore.rules.value_digest`), by name.
    """

    pos: int
    key: str
    literals: dict[str, str] = {}


class Redaction(Event, frozen=True, tag="redaction"):
    """Erases the bodies at ``positions`` (their leaves stay, so the tree still verifies), for ``reason``.

    ``guards`` keeps, of each attempt it erases, the digests of the literals it acted on:
    a later retry under its key is still held to them. Empty, it is omitted from the body.
    """

    positions: list[int]
    reason: str
    guards: list[Guard] = []


class Redacted(Event, frozen=True, tag="redacted"):
    """What reading a redacted position gives: the event is gone, the position of its eraser remains.

    Never stored: the store returns it in place of an erased body.
    """

    by: int


class Span(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """The positions ``[start, stop)``."""

    start: int
    stop: int


class SpanSet:
    """The positions of sorted, disjoint ``spans``, as a container: membership in O(log n), iteration in order."""

    def __init__(self, spans: Sequence[Span]) -> None:
        self.starts = [s.start for s in spans]
        self.stops = [s.stop for s in spans]

    def __contains__(self, pos: object) -> bool:
        if type(pos) is not int:
            return False
        i = bisect_right(self.starts, pos) - 1
        return i >= 0 and pos < self.stops[i]

    def __iter__(self) -> Iterator[int]:
        for start, stop in zip(self.starts, self.stops):
            yield from range(start, stop)

    def __len__(self) -> int:
        return sum(b - a for a, b in zip(self.starts, self.stops))


class Retention(Event, frozen=True, tag="retention"):
    """Drops the raw bodies at ``spans``, which the cover of certified ``marker`` stands for; their leaves stay.

    Only raw conversation (turns, tool calls, tool results) inside the cover's spans is
    dropped, never what a rule or a resumed context reads again (see
    :func:`compactstore.rules.droppable`). ``index_digest`` is the digest of the
    structural index's rows at those positions, which still give their facts:
    ``verify`` holds the rows to it, as it holds bodies to their leaves.
    """

    marker: int
    spans: list[Span]
    index_digest: str


class Dropped(Event, frozen=True, tag="dropped"):
    """What reading a dropped position gives: its body was dropped by the retention event at ``by``.

    Never stored: the store returns it in place of a dropped body.
    """

    by: int


#: What reading a position whose body is gone gives: a redaction's or a retention's placeholder.
ERASED: tuple[type[Event], ...] = (Redacted, Dropped)


def erases(event: Event) -> tuple[Container[int], str]:
    """Return the positions ``event`` erases and how (``redacted`` or ``dropped``); nothing for any other kind.

    A redaction erases the positions it lists, a retention those its spans hold.
    """
    if isinstance(event, Redaction):
        return frozenset(event.positions), "redacted"
    if isinstance(event, Retention):
        return SpanSet(event.spans), "dropped"
    return frozenset(), ""


class GraphState(Event, frozen=True, tag="graph_state"):
    """Holds snapshot ``id`` of an agent framework's graph state in namespace ``ns``, taken after ``parent``.

    LangGraph calls such a snapshot a checkpoint; here a checkpoint is a raw tree
    checkpoint (a session's size and root). ``value`` is the snapshot as the framework
    encoded it; the store keeps it verbatim and never interprets it.
    """

    id: str
    ns: str = ""
    parent: str | None = None
    value: JSON = None


class Write(Event, frozen=True, tag="write"):
    """A ``value`` that task ``task`` wrote to ``channel``, pending against graph state ``checkpoint``.

    ``idx`` orders one task's writes (a framework may reserve negative ones for special
    channels), ``path`` names where the task ran, ``ns`` the graph state's namespace.
    ``checkpoint`` keeps LangGraph's name for the id.
    """

    checkpoint: str
    task: str
    channel: str
    idx: int = 0
    path: str = ""
    ns: str = ""
    value: JSON = None


#: Every event type, in one tagged union: the canonical decoder accepts these only.
EVENT_TYPES: tuple[type[Event], ...] = (
    Turn,
    ToolCall,
    ToolResult,
    Binding,
    Obligation,
    Fulfilment,
    HandleOpened,
    HandleClosed,
    Summary,
    Spill,
    RecoveryMarker,
    Attempt,
    Redaction,
    GraphState,
    Write,
    Retention,
)
#: Kinds the store derives from other events; the rest are raw (L0) events.
DERIVED_KINDS: frozenset[str] = frozenset({"node", "spill", "marker", "attempt", "redaction", "retention"})
KINDS: frozenset[str] = frozenset(str(t.__struct_config__.tag) for t in EVENT_TYPES)

#: Text fields that identify something, and so must not be empty.
_REQUIRED_TEXT: dict[type[Event], tuple[str, ...]] = {
    Turn: ("role",),
    ToolCall: ("call_id", "name"),
    ToolResult: ("call_id",),
    Binding: ("key",),
    Obligation: ("name",),
    Fulfilment: ("name",),
    HandleOpened: ("handle",),
    HandleClosed: ("handle",),
    Spill: ("key",),
    Attempt: ("key", "operation"),
    Redaction: ("reason",),
    GraphState: ("id",),
    Write: ("checkpoint",),
}

#: Fields whose default is None, per event type.
_OPTIONAL: dict[type[Event], tuple[str, ...]] = {
    t: tuple(
        f for f, d in zip(t.__struct_fields__, (msgspec.NODEFAULT,) * (len(t.__struct_fields__) - len(t.__struct_defaults__)) + t.__struct_defaults__)
        if d is None
    )
    for t in EVENT_TYPES
}

_encoder = msgspec.json.Encoder(order="sorted")
_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(Union[EVENT_TYPES])  # noqa: UP007


def encode(event: Event) -> bytes:
    """Return the canonical bytes of ``event``. Does not validate; see :func:`canonical`."""
    return _encoder.encode(event)


def encode_json(value: JSON) -> str:
    """Return the canonical JSON text of a plain value (sorted keys)."""
    return _encoder.encode(value).decode()


def decode(body: bytes) -> Event:
    """Decode one event from its JSON bytes (canonical, or a line written by hand).

    Strict: a field the event's kind does not have, or a key given twice in one JSON
    object, is refused rather than dropped or overwritten.

    What :func:`check_entry` refuses is refused here too: an imported line enters as an
    appended event does. (:func:`decode_canonical` reads what a store already holds.)

    Raises:
        InvalidEvent: the bytes are not a valid event of a registered kind; ``field``
            names the unknown field, the repeated key or the bad value.
    """
    event = decode_canonical(body)
    # Canonical bytes hold each key once, so only bytes that are not the event's own
    # encoding (a hand-written line) need the slower look for a repeated key.
    if _encoder.encode(event) != body:
        check_unique_keys(body)
    check_entry(event, body)
    return event


def decode_canonical(body: bytes) -> Event:
    """Decode a body the store wrote, as :func:`decode` does, but without looking for a key given twice.

    For stored bodies, whose bytes are bound to their leaves: a body holding a repeated
    key is not the canonical encoding of any event, which ``Store.verify`` reports. Use
    :func:`decode` for bytes from anywhere else. The entry rules (:func:`check_entry`)
    are not applied: a body stored before them stays readable, and appending it again
    (a copy) is refused as any new event would be.

    Raises:
        InvalidEvent: the bytes are not a valid event of a registered kind.
    """
    try:
        event: Event = _decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise InvalidEvent(_field_of(str(exc)), str(exc)) from exc
    except msgspec.DecodeError as exc:
        raise InvalidEvent("body", str(exc)) from exc
    except RecursionError as exc:
        raise InvalidEvent("body", "nested too deeply to decode") from exc
    # What append() refuses, decoding refuses too: an imported line is held to the same rules.
    _check_rules(event)
    return event


#: One decoder per kind: a body whose kind is known decodes in one pass, where the union
#: decoder first skips to the ``kind`` key (sorted after ``content``) and parses again.
_DECODERS_BY_KIND: dict[str, msgspec.json.Decoder[Any]] = {
    t.__struct_config__.tag: msgspec.json.Decoder(t) for t in EVENT_TYPES  # type: ignore[misc]
}


def canonical_of_kind(body: bytes, kind: object) -> Event | None:
    """Return the event whose canonical encoding is exactly ``body`` and whose kind is ``kind``, else None.

    What :func:`decode_canonical` returns for such a body, decoded in one pass: a store
    reading a row knows its kind. None says only that the body is not such an encoding
    (not canonical, another kind, not valid, or breaking a rule): :func:`decode_canonical`
    then says what it is.
    """
    decoder = _DECODERS_BY_KIND.get(kind) if isinstance(kind, str) else None
    if decoder is None:
        return None
    try:
        event: Event = decoder.decode(body)
        _check_rules(event)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError, InvalidEvent):
        return None
    # The encoding holds the kind tag: equal bytes are a body the union decoder reads the same.
    return event if _encoder.encode(event) == body else None


class _RepeatedKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return out


def check_unique_keys(body: bytes) -> None:
    """Refuse JSON ``body`` if one of its objects gives a key twice (a decoder would keep one of them silently).

    Raises:
        InvalidEvent: naming the repeated key (or ``body``, for bytes that are not JSON).
    """
    try:
        json.loads(body, object_pairs_hook=_unique_pairs)
    except _RepeatedKey as exc:
        raise InvalidEvent(exc.key, "given twice in one JSON object") from None
    except (ValueError, RecursionError) as exc:  # msgspec read it; this parser is stricter on nothing we keep
        raise InvalidEvent("body", f"not valid JSON: {exc}") from None


def canonical(event: Event) -> tuple[Event, bytes]:
    """Validate ``event`` and return it in canonical form with its bytes.

    The returned event equals what decoding the bytes gives (tuples become lists, and
    so on), so ``encode(returned) == bytes`` holds. An event whose fields already hold
    exactly those values is returned as given, sharing its lists and dicts.

    Raises:
        InvalidEvent: naming the field and why; for example ``args.x``: not finite, or
            ``call_id``: holds a NUL character (see :func:`check_entry`).
    """
    plain = _PLAIN.get(type(event))
    if plain is not None and plain(event):
        # Every field already holds exactly what decoding its bytes would give, and the
        # rules hold, so the validating decode could only hand back an equal event: skip it.
        body = _encode_checked(event)
    else:
        event, body = _canonical_by_decoding(event)
    check_entry(event, body)
    return event, body


class Prepared(msgspec.Struct, gc=False):
    """An event validated and encoded for appending: what a store hashes and inserts."""

    event: Event
    body: bytes
    key: str | None
    #: whether the store stamped ``ts`` (then a retry's comparison ignores it)
    stamped: bool


def prepare(events: Sequence[Event], clock: Clock, other: Callable[[int, Event], Prepared]) -> list[Prepared]:
    """Return each of ``events`` validated, stamped and encoded for appending without an idempotency key.

    An event of a registered type with neither ``ts`` nor a key gets ``ts=clock()`` and
    then is :func:`canonical`; ``other(i, event)`` prepares every other one (or refuses
    it). Events are taken in order, so the clock is read in the same order either way,
    and not past a refused event. When every event is of that kind (the common case),
    the batch is stamped and encoded by :func:`encode_plain`, without a bytecode loop per event.
    Each event is read once, from a copy of the list taken before the clock runs: a
    clock (Python code) that changes the caller's list changes nothing here.

    Raises:
        InvalidEvent: naming the field, as ``events[i].field`` when there are several.
    """
    given = list(events)
    batch, n = len(given) > 1, len(given)
    # The system clock read in place: a call of a Python function per event cost as much as the check.
    read, scale = (time.time_ns, 1000) if clock is system_clock else (clock, 1)
    replace = msgspec.structs.replace
    if n == 1:  # one append: the batch's maps and loop would cost more than the event
        if _unplain(given[0]):
            return [other(0, given[0])]
        bodies, stamps, taken, stop = encode_plain(given, 0, read, scale)
        if stop:
            stamped = replace(taken[0], ts=stamps[0])
            check_entry(stamped, bodies[0])  # its one stamp is read, as canonical() would read it
            return [Prepared(stamped, bodies[0], None, True)]
        return [_one(0, taken[0], lambda: stamps[0], False, other)]
    # A batch the entry rules may refuse goes event by event, so that the clock is not
    # read past the refused one: the batch pass stamps every event it encodes.
    if not (_REGISTERED.issuperset(map(type, given)) and not any(map(is_not, map(_TS, given), repeat(None)))
            and not any(map(is_not, map(_KEY, given), repeat(None)))) or _may_refuse(given):
        return [_one(i, e, clock, batch, other) for i, e in enumerate(given)]
    out: list[Prepared] = []
    start = 0
    while start < n:
        bodies, stamps, taken, stop = encode_plain(given, start, read, scale)
        out += map(Prepared, [replace(e, ts=t) for e, t in zip(taken, stamps)], bodies, repeat(None), repeat(True))
        if stop < n:  # its stamp is read already
            out.append(_one(stop, taken[-1], lambda: stamps[-1], batch, other))
        start = stop + 1
    return out


def _unplain(event: object) -> bool:
    """Whether :func:`prepare` leaves ``event`` to its caller: not registered, or carrying a stamp or a key."""
    return type(event) not in _REGISTERED or event.ts is not None or event.idempotency_key is not None  # type: ignore[attr-defined]


def _one(i: int, event: Event, stamp: Callable[[], object], batch: bool,
         other: Callable[[int, Event], Prepared]) -> Prepared:
    """Prepare ``event``, the ``i``-th of its batch, the slow way.

    ``other`` takes it when it is not :func:`prepare`'s to stamp; else :func:`canonical`
    writes it, stamped ``stamp()``, as the decoder reads it back, or refuses it.
    """
    if _unplain(event):
        return other(i, event)
    try:
        canon, body = canonical(msgspec.structs.replace(event, ts=stamp()))
    except InvalidEvent as exc:
        if not batch:
            raise
        raise InvalidEvent(f"events[{i}].{exc.field}", exc.reason) from exc
    return Prepared(canon, body, None, True)


def encode_plain(
    events: list[Event], start: int, clock: Clock, scale: int = 1
) -> tuple[list[bytes], list[int], list[Event], int]:
    """Stamp and encode ``events[start:]`` in order, up to the first that is not plain.

    Each event's stamp is ``clock() // scale``, read just before the event is taken from
    the list, and its ``ts`` in the bytes. Plain: of a registered type, with no ``ts`` or
    idempotency key of its own, whose every field (with the stamp) already holds exactly
    what decoding its bytes would give, within :data:`MAX_EVENT_BYTES`; the bytes are
    those :func:`canonical` gives. Returns the bytes of the plain events, the stamps
    read and the events read (the last of each the first other event's, when there is
    one) and that event's index (``len(events)`` when all are plain).

    Natively, in one call, when the extension is built (it may stop at more events than
    the reference, never give other bytes); else by the checks of ``_PLAIN`` and msgspec.
    """
    # The native encoder reads an exact list from a position in it; anything else the reference reads.
    if _NATIVE is not None and type(events) is list and start >= 0:
        made: tuple[list[bytes], list[int], list[Event], int] = _NATIVE.encode(events, start, clock, scale)
        return made
    return _encode_plain_reference(events, start, clock, scale)


def _encode_plain_reference(
    events: list[Event], start: int, clock: Clock, scale: int
) -> tuple[list[bytes], list[int], list[Event], int]:
    """:func:`encode_plain` by the checks of ``_PLAIN`` and msgspec: what the native encoder is held to."""
    if scale < 1:
        raise ValueError(f"scale must be at least 1, got {scale}")
    bodies: list[bytes] = []
    stamps: list[int] = []
    read: list[Event] = []
    i = start
    while i < len(events):
        stamps.append(clock() if scale == 1 else clock() // scale)  # a clock's odd value is canonical()'s to refuse
        read.append(given := events[i])
        check, body = _PLAIN.get(type(given)), None
        if check is not None and given.ts is None and given.idempotency_key is None:
            event = msgspec.structs.replace(given, ts=stamps[-1])
            if check(event):
                try:
                    body = _encoder.encode(event)
                except (TypeError, UnicodeEncodeError, OverflowError):
                    body = None
        if body is None or len(body) > MAX_EVENT_BYTES:
            return bodies, stamps, read, i
        bodies.append(body)
        i += 1
    return bodies, stamps, read, i


def _canonical_by_decoding(event: Event) -> tuple[Event, bytes]:
    """Return what :func:`canonical` returns, found the slow way: copy into exact types, encode, then a validating decode."""
    cls = type(event)
    if cls not in _REGISTERED:
        raise InvalidEvent("event", f"expected a registered event type, got {cls.__name__}")
    # Every field is copied into exact types first, typed ones too: the decoder below
    # would take bytes written as base64, or a datetime written as text, for a str.
    trail: list[str] = []
    fields = {}
    for name in cls.__struct_fields__:
        trail.append(name)
        fields[name] = _exact(getattr(event, name), trail, 0)
        trail.pop()
    supersedes = fields["supersedes"]
    if type(supersedes) is int and supersedes < 0:
        raise InvalidEvent("supersedes", f"must be a position >= 0, got {shown(supersedes)}")
    body = _encode_checked(msgspec.structs.replace(event, **fields))
    decoded = decode_canonical(body)
    # JSON turns NaN and infinities into null: a typed optional field that held one
    # decodes as None. Refuse it rather than store a body that is not canonical.
    for name in _OPTIONAL[cls]:
        if getattr(decoded, name) is None and getattr(event, name) is not None:
            raise InvalidEvent(name, f"not a valid value: {shown(getattr(event, name))}")
    # A value equal to its field's default only once decoded (a tuple for a list) was
    # not omitted by the first encoding: the canonical bytes are those of the decoded event.
    again = _encoder.encode(decoded)
    return decoded, again


#: What msgspec raises on a value it cannot write: a type it does not encode (a str
#: subclass, say), a lone surrogate, an int too long for decimal, a value holding itself.
_UNWRITABLE = (TypeError, ValueError, OverflowError, RecursionError)


def _encode_checked(event: Event) -> bytes:
    try:
        body = _encoder.encode(event)
    except _UNWRITABLE as exc:
        raise _unwritable(event, exc) from exc
    if len(body) > MAX_EVENT_BYTES:
        raise InvalidEvent("event", f"encodes to {len(body)} bytes, more than the limit of {MAX_EVENT_BYTES}")
    return body


def _unwritable(event: Event, exc: BaseException) -> InvalidEvent:
    """Return the refusal of ``event``, which the encoder could not write, naming the first field it cannot write alone."""
    reason = "nested too deep, or holds itself" if isinstance(exc, RecursionError) else str(exc)
    for name in event.__struct_fields__:
        try:
            _encoder.encode(getattr(event, name))
        except _UNWRITABLE:
            return InvalidEvent(name, reason)
    return InvalidEvent("event", reason)


# --- the entry rules: what both backends store alike ------------------------------
#
# PostgreSQL text cannot hold a NUL character, and its B-tree indexes take at most about
# 2,700 bytes a row; SQLite takes both. The events' strings reach text columns and indexes
# (a binding key, a call id, a handle, an obligation, a failed tool's exact output as a
# negative fact's text, an idempotency key), so the rules are stated on the event, once,
# where every event enters: whichever backend stores it, the same event is taken or
# refused with the same InvalidEvent.

#: The most UTF-8 bytes a name may have: what a key, an id or a handle names is found by
#: equality in an index, so a name bounds the cost of each look-up (a look-up per need
#: compares against the names stored) and fits a PostgreSQL index row.
MAX_NAME_BYTES = 1024

#: The fields that hold names, besides ``idempotency_key`` and ``uses`` (every event's),
#: per event type; a list field's every item is one. Every other str field is text.
_NAMED: dict[type[Event], tuple[str, ...]] = {
    Turn: (), ToolCall: ("call_id",), ToolResult: ("call_id",), Binding: ("key",),
    Obligation: ("name", "needs"), Fulfilment: ("name",), HandleOpened: ("handle",),
    HandleClosed: ("handle",), Summary: (), Spill: ("key",), RecoveryMarker: (), Attempt: ("key",),
    Redaction: (), GraphState: (), Write: (), Retention: (),
}
NAMES: dict[type[Event], tuple[str, ...]] = {t: ("idempotency_key", "uses", *extra) for t, extra in _NAMED.items()}

#: How a NUL character is written in JSON: the one spelling it has (a backslash first).
_NUL = b"\\u0000"


def check_entry(event: Event, body: bytes) -> None:
    """Refuse ``event`` (encoded as ``body``) if a string in it holds a NUL character, or a name is too long.

    No string of an event, key or value, at any depth, holds a NUL; no name (:data:`NAMES`)
    has more than :data:`MAX_NAME_BYTES` bytes of UTF-8. ``body`` answers for the common
    case in one scan: without a backslash it holds no NUL, and no name is longer than it.

    Raises:
        InvalidEvent: naming the field (or the path in it).
    """
    if b"\\" in body and _NUL in body:
        found = _nul_at(msgspec.to_builtins(event), [])
        if found is not None:
            raise InvalidEvent(found[1:], "holds a NUL character: no backend stores it alike "
                               "(PostgreSQL text cannot hold one)")
    if len(body) > MAX_NAME_BYTES:
        name = _long_name(event)
        if name is not None:
            raise InvalidEvent(name, f"a name of more than {MAX_NAME_BYTES} bytes of UTF-8")


def _too_long(name: str) -> bool:
    return len(name) > MAX_NAME_BYTES or (len(name) * 4 > MAX_NAME_BYTES and len(name.encode()) > MAX_NAME_BYTES)


def _long_name(event: Event) -> str | None:
    """Return the field of ``event`` (a valid one) holding a name of more than MAX_NAME_BYTES bytes, else None."""
    for field in NAMES.get(type(event), ()):
        value = getattr(event, field)
        if type(value) is str and _too_long(value):
            return field
        if type(value) is list:
            for i, item in enumerate(value):
                if type(item) is str and _too_long(item):
                    return f"{field}[{i}]"
    return None


def _may_refuse(events: list[Event]) -> bool:
    """Return whether :func:`check_entry` may refuse one of ``events`` (or they cannot all be encoded): one C pass over them."""
    try:
        lines = _encoder.encode_lines(events)
    except _UNWRITABLE:
        return True
    if b"\\" in lines and _NUL in lines:
        return True
    if len(lines) <= MAX_NAME_BYTES:
        return False
    parts = lines.split(b"\n")  # a newline in a string is written escaped
    if max(map(len, parts)) <= MAX_NAME_BYTES:
        return False
    return any(_long_name(e) is not None for e, line in zip(events, parts) if len(line) > MAX_NAME_BYTES)


def _check_rules(event: Event) -> None:
    # What the types cannot say: identifying text is not empty, a superseded position exists.
    for name in _REQUIRED_TEXT.get(type(event), ()):
        if not getattr(event, name):
            raise InvalidEvent(name, "must not be empty")
    if event.supersedes is not None and event.supersedes < 0:
        raise InvalidEvent("supersedes", f"must be a position >= 0, got {shown(event.supersedes)}")


# --- the fast path: events whose fields are already plain ---------------------------
#
# canonical() decodes the bytes it encoded because msgspec encodes without checking
# types: Turn(role=5) encodes fine, and only the decoder refuses it. For a field whose
# value is already of exactly the type the decoder would produce (a str, not a str
# subclass; a list of str, not a tuple; finite floats; ints msgspec reads back as the
# same int), decoding can only give an equal value. _PLAIN checks exactly that, with no
# coercion; whatever it does not accept goes the slow way, which refuses or
# canonicalizes it as before.

_STR, _INT, _BOOL, _LITERAL, _STR_LIST, _INT_LIST, _JSON_DICT, _JSON = range(8)
#: Ints the decoder reads back as the same int (beyond them msgspec's JSON grows floats or refuses).
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1

#: Per field: its name, its check, whether None is allowed, a literal's values, and its
#: default when that is an object of its own (not None, not a factory), else None.
_Plan = tuple[tuple[str, int, bool, frozenset[str], object], ...]


def _field_check(t: msgspec.inspect.Type) -> tuple[int, frozenset[str]] | None:
    """Return the fast check for a field of type ``t``, or None when there is none."""
    unconstrained = all(getattr(t, a, None) is None for a in ("min_length", "max_length", "pattern", "gt", "ge",
                                                                "lt", "le", "multiple_of"))
    if not unconstrained:
        return None
    if isinstance(t, msgspec.inspect.StrType):
        return _STR, frozenset()
    if isinstance(t, msgspec.inspect.IntType):
        return _INT, frozenset()
    if isinstance(t, msgspec.inspect.BoolType):
        return _BOOL, frozenset()
    if isinstance(t, msgspec.inspect.LiteralType) and all(type(v) is str for v in t.values):
        return _LITERAL, frozenset(v for v in t.values if isinstance(v, str))
    if isinstance(t, msgspec.inspect.ListType) and isinstance(t.item_type, msgspec.inspect.StrType):
        return (_STR_LIST, frozenset()) if _field_check(t.item_type) else None
    if isinstance(t, msgspec.inspect.ListType) and isinstance(t.item_type, msgspec.inspect.IntType):
        return (_INT_LIST, frozenset()) if _field_check(t.item_type) else None
    if (isinstance(t, msgspec.inspect.DictType) and isinstance(t.key_type, msgspec.inspect.StrType)
            and isinstance(t.value_type, msgspec.inspect.AnyType) and _field_check(t.key_type)):
        return _JSON_DICT, frozenset()
    if isinstance(t, msgspec.inspect.AnyType):
        return _JSON, frozenset()
    return None


def _plan_of(cls: type[Event]) -> _Plan | None:
    """Return the fast checks of every field of ``cls``, or None when one field has none."""
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    plan = []
    for field in info.fields:
        t, nullable = field.type, False
        if isinstance(t, msgspec.inspect.UnionType):
            rest = [m for m in t.types if not isinstance(m, msgspec.inspect.NoneType)]
            if len(rest) != 1 or len(t.types) != 2:
                return None
            t, nullable = rest[0], True
        check = _field_check(t)
        if check is None:
            return None
        own = field.default if field.default not in (msgspec.NODEFAULT, None) else None
        plan.append((field.name, check[0], nullable or check[0] == _JSON, check[1], own))
    return tuple(plan)


#: What each fast check refuses, as an expression over the field's value ``v``.
_REFUSES = {
    _STR: "type(v) is not str",
    _INT: "type(v) is not int or not _INT_MIN <= v <= _INT_MAX",
    _BOOL: "type(v) is not bool",
    _LITERAL: "type(v) is not str or v not in {values}",
    _STR_LIST: "type(v) is not list or not all(type(x) is str for x in v)",
    _INT_LIST: "type(v) is not list or not all(type(x) is int and _INT_MIN <= x <= _INT_MAX for x in v)",
    _JSON_DICT: "type(v) is not dict or not _plain_json(v, 0)",
    _JSON: "not _plain_json(v, 0)",
}


def _plain_check(cls: type[Event], plan: _Plan) -> Callable[[Event], bool]:
    """Return a function telling whether a ``cls`` holds exactly what decoding it would give, and keeps the rules.

    The plan's checks are written out as one function per type: a loop over the plan
    cost more than the encoding it saves on a turn.

    msgspec omits a field whose value *is* its default object, and writes one that only
    equals it (a ``"other"`` built at run time): equal events would get different bytes.
    Such a value is not plain; the slow way, which encodes the decoded event, omits it.
    """
    env: dict[str, Any] = {"_plain_json": _plain_json, "_INT_MIN": _INT_MIN, "_INT_MAX": _INT_MAX}
    lines = [f"def plain_{cls.__name__}(e):"]
    for i, (name, check, nullable, values, default) in enumerate(plan):
        env[f"values_{i}"], env[f"default_{i}"] = values, default
        refuses = _REFUSES[check].format(values=f"values_{i}")
        lines.append(f"    v = e.{name}")
        lines.append(f"    if v is not None and ({refuses}): return False" if nullable
                     else f"    if v is None or {refuses}: return False")
        if default is not None:
            lines.append(f"    if v == default_{i} and v is not default_{i}: return False")
    # What the rules refuse goes the slow way too, which refuses it in the same words.
    lines += [f"    if not e.{name}: return False" for name in _REQUIRED_TEXT.get(cls, ())]
    lines.append("    if e.supersedes is not None and e.supersedes < 0: return False")
    lines.append("    return True")
    exec("\n".join(lines), env)  # noqa: S102 - the source is built from field names and the table above
    fn: Callable[[Event], bool] = env[f"plain_{cls.__name__}"]
    return fn


#: Leaf types that are plain whatever their value, and the one type of a plain key.
_FLAT, _KEYS = frozenset({str, bool, type(None)}), frozenset({str})


def _plain_json(value: object, depth: int) -> bool:
    """Return whether ``value`` is JSON of exactly the types decoding gives, within MAX_DEPTH."""
    if depth > MAX_DEPTH:
        return False
    t = type(value)
    if t is str or t is bool or value is None:
        return True
    if t is int:
        return _INT_MIN <= value <= _INT_MAX  # type: ignore[operator]
    if t is float:
        return math.isfinite(value)  # type: ignore[arg-type]
    # A list or dict of str, bool and None (most of what agents store) is tested in C,
    # by type, without a call per item; its items are one level down, so only above MAX_DEPTH.
    if t is list:
        if depth < MAX_DEPTH and _FLAT.issuperset(map(type, value)):  # type: ignore[call-overload]
            return True
        for v in value:  # type: ignore[attr-defined]
            if not _plain_json(v, depth + 1):
                return False
        return True
    if t is dict:
        if (depth < MAX_DEPTH and _KEYS.issuperset(map(type, value))  # type: ignore[call-overload]
                and _FLAT.issuperset(map(type, value.values()))):  # type: ignore[attr-defined]
            return True
        for k, v in value.items():  # type: ignore[attr-defined]
            if type(k) is not str or not _plain_json(v, depth + 1):
                return False
        return True
    return False


#: The fast check per event type; a type absent here (Summary: enums, nested structs) always goes the slow way.
_PLANS: dict[type[Event], _Plan] = {t: p for t in EVENT_TYPES if (p := _plan_of(t)) is not None}
_PLAIN: dict[type[Event], Callable[[Event], bool]] = {t: _plain_check(t, p) for t, p in _PLANS.items()}


#: The registered event types: the only ones :func:`prepare` takes itself.
_REGISTERED = frozenset(EVENT_TYPES)
_TS, _KEY = attrgetter("ts"), attrgetter("idempotency_key")

# How the native encoder leaves a field out (msgspec's omit_defaults): never (no default),
# when None, when it is the default object, when an empty list or dict (a factory default).
_OMIT_NEVER, _OMIT_NONE, _OMIT_OBJECT, _OMIT_EMPTY_LIST, _OMIT_EMPTY_DICT = range(5)


def _native_plan(cls: type[Event], plan: _Plan) -> list[bytes | tuple[object, ...]] | None:
    """Return the parts of ``cls``'s encoding in the order msgspec writes them, for the native encoder."""
    config = cls.__struct_config__
    if not isinstance(config.tag_field, str) or not isinstance(config.tag, str):
        return None
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    required = _REQUIRED_TEXT.get(cls, ())
    parts: list[tuple[str, bytes | tuple[object, ...]]] = [
        (config.tag_field, _encoder.encode(config.tag_field) + b":" + _encoder.encode(config.tag))
    ]
    for field, (name, check, nullable, values, own) in zip(info.fields, plan, strict=True):
        if field.default_factory in (list, dict):
            omit = _OMIT_EMPTY_LIST if field.default_factory is list else _OMIT_EMPTY_DICT
        elif field.default_factory is not msgspec.NODEFAULT:
            return None
        elif field.default is msgspec.NODEFAULT:
            omit = _OMIT_NEVER
        else:
            omit = _OMIT_NONE if field.default is None else _OMIT_OBJECT
        key = _encoder.encode(field.encode_name) + b":"
        parts.append((field.encode_name, (name, key, check, nullable, sorted(values), omit, own, name in required,
                                          name == "supersedes", name == "ts", name == "idempotency_key")))
    parts.sort(key=lambda part: part[0])  # order="sorted": by name, code point order
    return [part for _, part in parts]


def _native_encoder() -> Any:
    """Return the native encoder of plain events (``native.Encoder``), or None on the pure path."""
    if os.environ.get("COMPACTSTORE_PURE", "") not in ("", "0"):
        return None
    try:
        from .native import Encoder
    except ImportError:  # a source tree whose extension is not built
        return None
    plans = [(t, parts) for t, plan in _PLANS.items() if (parts := _native_plan(t, plan)) is not None]
    return Encoder(plans, MAX_EVENT_BYTES, MAX_DEPTH)


#: Encodes a batch of plain events in one call, each as msgspec does; None on the pure path.
_NATIVE = _native_encoder()


#: Python's default bound on an int's decimal digits (``sys.int_info.default_max_str_digits``):
#: a process left at the default can neither write nor read a longer one, whatever this one allows.
_INT_DIGITS = 4300
_INT_BOUND = 10**_INT_DIGITS


#: The nested value types an event holds besides JSON: the parts of a summary node.
_PARTS: frozenset[type] = frozenset({Fact, Item, Excerpt, SpillRef, Guard, Span})


def _exact(value: object, trail: list[str], depth: int) -> object:
    """Return ``value`` copied into exactly the types decoding its JSON gives, or raise InvalidEvent naming where.

    What is checked is what is then encoded: a dict or list is read by its own storage
    (what msgspec writes), never by methods a subclass may override to show something
    else, and the copy, not the caller's object, goes on. Refused: NaN and infinities
    (JSON would store null), ints of more than 4,300 digits, keys that are not str,
    nesting deeper than MAX_DEPTH, and every other type (bytes would be stored as
    base64, a datetime as text: not what was given). ``trail`` is the path so far, kept
    as parts so that a refusal, not every value, pays for spelling it.
    """
    if depth > MAX_DEPTH:
        raise InvalidEvent("".join(trail), f"nested deeper than {MAX_DEPTH}")
    kind = type(value)
    if value is None or kind is str or kind is bool:
        return value
    if kind is int:
        if not -_INT_BOUND < cast(int, value) < _INT_BOUND:
            raise InvalidEvent("".join(trail), f"an int of more than {_INT_DIGITS} digits")
        return value
    if kind is float:
        if not math.isfinite(cast(float, value)):
            raise InvalidEvent("".join(trail), f"not a finite number: {shown(value)}")
        return value
    # type(), never isinstance(), which asks the object's own __class__.
    if issubclass(kind, dict):
        out: dict[str, object] = {}
        for k, v in dict.items(cast(dict[object, object], value)):
            if type(k) is not str:
                raise InvalidEvent("".join(trail), f"keys must be str, got {type(k).__name__} {shown(k)}")
            trail.append(f".{k}")
            out[k] = _exact(v, trail, depth + 1)
            trail.pop()
        return out
    if issubclass(kind, list | tuple):
        items: Iterator[object] = (list.__iter__(cast(list[object], value)) if issubclass(kind, list)
                                   else tuple.__iter__(cast(tuple[object, ...], value)))
        copy: list[object] = []
        for i, v in enumerate(items):
            trail.append(f"[{i}]")
            copy.append(_exact(v, trail, depth + 1))
            trail.pop()
        return copy
    if kind in _PARTS:
        # A summary node's fact, item, excerpt or spill reference: its fields, as the
        # decoder reads the object it is written as.
        parts: dict[str, object] = {}
        for name in cast(type[msgspec.Struct], kind).__struct_fields__:
            trail.append(f".{name}")
            parts[name] = _exact(getattr(value, name), trail, depth + 1)
            trail.pop()
        return parts
    if issubclass(kind, enum.Enum):
        # A str, int or float enum (IntEnum, StrEnum, ...) whose member equals its value
        # (by the built-in type's own comparison: the enum's may say anything) is written
        # as that value, and reads back equal to what was given. A plain Enum's member, or
        # one unequal to its value, is refused.
        base = next((t for t in (float, int, str) if issubclass(kind, t)), None)
        plain = _exact(value.value, trail, depth) if base is not None else None  # type: ignore[attr-defined]
        if base is not None and type(plain) is base and base.__eq__(value, plain) is True:  # type: ignore[operator]
            return plain
    # bytes, sets, datetimes, UUIDs...: msgspec would store a string or list in their
    # place; a subclass of str, int or float that is no enum it does not encode at all.
    raise InvalidEvent("".join(trail), f"not a JSON value: {kind.__name__}")


def exact_json(field: str, value: object) -> JSON:
    """Return ``value`` copied into exact JSON types (see :func:`_exact`), or raise InvalidEvent naming ``field`` or the path in it."""
    return _exact(value, [field], 0)


def _nul_at(value: object, trail: list[str]) -> str | None:
    """Return the path of the first str in ``value`` (an exact copy) holding a NUL character, key or value, else None."""
    if type(value) is str:
        return "".join(trail) if "\x00" in value else None
    if type(value) is dict:
        for k, v in value.items():
            if "\x00" in k:  # the map holding the key: the key itself cannot be spelt in a path
                return "".join(trail)
            trail.append(f".{k}")
            found = _nul_at(v, trail)
            trail.pop()
            if found is not None:
                return found
    elif type(value) is list:
        for i, v in enumerate(value):
            trail.append(f"[{i}]")
            found = _nul_at(v, trail)
            trail.pop()
            if found is not None:
                return found
    return None


def _field_of(message: str) -> str:
    # msgspec says "... - at `$.args.x`"; report the path without the `$.`, and an
    # unknown field ("Object contains unknown field `x`") by its own name.
    marker = "at `$"
    path = message.split(marker, 1)[1].split("`", 1)[0].lstrip(".") if marker in message else ""
    unknown = "unknown field `"
    if unknown in message:
        name = message.split(unknown, 1)[1].split("`", 1)[0]
        return f"{path}.{name}" if path else name
    return path or "event"


# Not tracked by the cycle collector (gc=False): a record holds strings, ints, bytes and
# an event of JSON values, none of which can lead back to it, and tracking a batch's
# thousand records cost the append several collections.
class Record(msgspec.Struct, frozen=True, gc=False):
    """One stored event.

    Attributes:
        session: the session's name.
        seq: the global sequence number (order of commit across sessions).
        pos: the position in the session, gapless from 0.
        kind: the event's kind tag.
        event: the decoded event.
        body: exactly the bytes hashed: the event's canonical encoding.
        leaf: ``H(0x00 || body)``.
    """

    session: str
    seq: int
    pos: int
    kind: str
    event: Event
    body: bytes
    leaf: bytes


class TreeHead(msgspec.Struct, frozen=True):
    """The root of a session's tree at ``size``, with a MAC when the store is keyed."""

    session: str
    size: int
    root: bytes
    mac: bytes | None = None


# --- arguments ---------------------------------------------------------------------
#
# Every public entry point checks its arguments with these, one function per kind of
# argument, so that each kind is refused the same way wherever it is taken: a bool is not
# a position, a str is not a list of str, None is not a value.

#: The largest position or size: what SQLite and PostgreSQL keep in a signed 64-bit integer.
MAX_POSITION = 2**63 - 1


def as_int(field: str, value: object) -> int:
    """Return ``value``, which must be an int and not a bool (its range is the caller's to check).

    Raises:
        InvalidArgument: naming ``field``.
    """
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(field, f"want an int, got {shown(value)}")
    return int(value)


def as_position(field: str, value: object) -> int:
    """Return ``value`` as a position or size: an int (not a bool) in ``[0, 2**63)``.

    Raises:
        InvalidArgument: naming ``field``.
    """
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_POSITION:
        raise InvalidArgument(field, f"want an int position in [0, 2**63), got {shown(value)}")
    return int(value)


#: Digits of the largest position (2**63 - 1): a longer number names none, and is never
#: read (``int`` of thousands of digits is slow, and past 4,300 a bare ValueError).
POSITION_DIGITS = 19
#: A position is spelt in ASCII digits only: ``str.isdigit`` also takes ``'²'``, which
#: ``int`` refuses, and ``int`` reads ``'٣'`` as 3, so a handle could name a position in two spellings.
_DIGITS = frozenset("0123456789")


def position_in(text: str) -> int | None:
    """Return the position ``text`` spells in ASCII decimal (1 to 19 digits, at most 2**63 - 1), or None when it spells none."""
    if not 0 < len(text) <= POSITION_DIGITS or not _DIGITS.issuperset(text):
        return None
    n = int(text)
    return n if n <= MAX_POSITION else None


def as_position_text(field: str, text: str) -> int:
    """Return the position ``text`` spells (see :func:`position_in`).

    Raises:
        InvalidArgument: naming ``field``: not 1 to 19 ASCII digits, or past 2**63 - 1.
    """
    pos = position_in(text)
    if pos is None:
        raise InvalidArgument(field, f"want a position in ASCII decimal, at most {MAX_POSITION}, got {shown(text, 40)}")
    return pos


def names_position(name: str) -> bool:
    """Return whether ``name`` reads as ``pos:path``: ASCII digits, then a colon (``'²:v'`` does not: it is a key)."""
    head, colon, _ = name.partition(":")
    return bool(colon) and bool(head) and _DIGITS.issuperset(head)


def split_position(field: str, name: str) -> tuple[int, str] | None:
    """Return ``(pos, path)`` when ``name`` reads as ``pos:path`` (:func:`names_position`), else None.

    Raises:
        InvalidArgument: naming ``field``: the digits spell no position (more than 19, or past 2**63 - 1).
    """
    if not names_position(name):
        return None
    head, _, path = name.partition(":")
    return as_position_text(field, head), path


def as_flag(field: str, value: object) -> bool:
    """Return ``value``, which must be ``True`` or ``False`` (not 0, 1, None or a str).

    Raises:
        InvalidArgument: naming ``field``.
    """
    if not isinstance(value, bool):
        raise InvalidArgument(field, f"want True or False, got {shown(value)}")
    return value


def as_text(field: str, value: object, *, empty: bool = False) -> str:
    """Return ``value`` as text: a str of valid Unicode, not empty unless ``empty``.

    Raises:
        InvalidArgument: naming ``field``.
    """
    if not isinstance(value, str):
        raise InvalidArgument(field, f"want a str, got {type(value).__name__}")
    if not value and not empty:
        raise InvalidArgument(field, "must not be empty")
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise InvalidArgument(field, f"not valid Unicode text: {exc.reason} at {exc.start}") from None
    return value


def as_list(field: str, value: object) -> list[Any]:
    """Return ``value`` as a list.

    Raises:
        InvalidArgument: naming ``field``: a str or bytes (it would be split into
            characters), a mapping (it would be taken for its keys) or a value that is
            not iterable.
    """
    if isinstance(value, str | bytes | bytearray | memoryview | Mapping) or not isinstance(value, Iterable):
        raise InvalidArgument(field, f"want a list, got {type(value).__name__}")
    return list(value)


def as_texts(field: str, value: object) -> list[str]:
    """Return ``value`` as a list of non-empty str (``field[i]`` names a bad item).

    Raises:
        InvalidArgument: naming ``field`` or the bad item.
    """
    items = as_list(field, value)
    for i, item in enumerate(items):
        as_text(f"{field}[{i}]", item)
    return items


def as_json(field: str, value: object) -> JSON:
    """Return ``value`` copied into exact JSON types: finite numbers, str keys, at most MAX_DEPTH deep.

    A dict or list subclass is read by its own storage, as the encoder reads it, and
    the copy is what the caller goes on with: what was checked is what is used.

    Raises:
        InvalidArgument: naming ``field`` or the path inside it.
    """
    try:
        return exact_json(field, value)
    except InvalidEvent as exc:
        raise InvalidArgument(exc.field, exc.reason) from None


def as_json_map(field: str, value: object) -> dict[str, JSON]:
    """Return ``value``, a mapping of str to JSON values, copied into a dict of exact JSON types.

    Raises:
        InvalidArgument: naming ``field``, or the key whose value is not JSON.
    """
    if issubclass(type(value), dict):
        copied = as_json(field, value)
        assert type(copied) is dict
        return copied
    if not isinstance(value, Mapping):
        raise InvalidArgument(field, f"want a mapping of str to JSON values, got {type(value).__name__}")
    out = dict(value)
    for key in out:
        if type(key) is not str:
            raise InvalidArgument(field, f"keys must be str, got {type(key).__name__} {shown(key)}")
    copied = as_json(field, out)
    assert type(copied) is dict
    return copied


def as_callable(field: str, value: object) -> Callable[..., Any]:
    """Return ``value``, which must be callable.

    Raises:
        InvalidArgument: naming ``field``.
    """
    if not callable(value):
        raise InvalidArgument(field, f"want a callable, got {type(value).__name__}")
    return value
