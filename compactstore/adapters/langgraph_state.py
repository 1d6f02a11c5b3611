"""How the LangGraph saver stores a checkpoint in a ``graph_state`` event, and how it reads it back.

A ``graph_state`` event's ``value`` holds:

- ``thread``: the thread id;
- ``checkpoint``: LangGraph's checkpoint without its channel values, as plain JSON when
  JSON carries it exactly, else :data:`Packed`;
- ``metadata``: the checkpoint metadata, :data:`Packed`, only when JSON cannot carry it
  exactly (else it is the event's ``meta``, readable);
- ``blobs``: for each channel in ``new_versions``, ``[version, *stored]``: ``stored`` is
  :data:`Stored`, or ``["empty", ""]`` when the channel has no value;
- ``deltas``, when a list value is stored as appended to an earlier one: for each such
  channel, the positions of the earlier events whose parts, joined in order, precede
  the part stored here.

A channel whose version did not change is not stored again: it is read from the
earlier event that stored that version. A list that extends the list this process last
stored for the channel (a message history, typically) stores only the elements
appended; after :data:`MAX_CHAIN` parts it is stored whole again, so one read costs a
bounded number of rows.
"""

from __future__ import annotations

import base64
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from blake3 import blake3
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .. import events as ev
from ..errors import IntegrityError
from ..events import encode_json
from ..store import Record, Session
from .tail import read_many

__all__ = [
    "MAX_CHAIN",
    "ChannelEncoder",
    "Encoded",
    "Packed",
    "StateCodec",
    "Stored",
    "Tip",
    "blob_keys",
    "copied_value",
    "is_plain",
    "parts",
    "spread_over",
    "with_whole",
]

#: A value through serde: ``[type, base64 of the bytes]``, as ``serde.dumps_typed`` gave them.
Packed = list[str]
#: A stored channel value or write: ``[value]`` when it is plain JSON and the serializer
#: is the default one (serde would give it back equal), else :data:`Packed`. The length
#: tells them apart, whatever type names a serializer uses.
Stored = list[Any]
#: Events a list channel's value may be spread over (a full one, then appended parts)
#: before a graph state stores it whole again: bounds the rows one read costs.
MAX_CHAIN = 32
#: The int range msgpack (so the default serializer) carries: beyond it serde decides.
_INTS = (-(2**63), 2**64)
#: Leaf types that are plain whatever their value, and the one type of a plain key.
_FLAT, _KEYS = frozenset({str, bool, type(None)}), frozenset({str})
#: What a channel named in ``new_versions`` but holding no value stores.
_EMPTY = ["empty", ""]


def is_plain(value: object, depth: int = 0, *, msgpack: bool = False) -> bool:
    """Return whether ``value`` survives a JSON round trip exactly (as the store encodes it).

    With ``msgpack``, also whether the default serializer's msgpack round trip gives it
    back equal (ints within 64 bits).
    """
    if depth > 32:
        return False
    kind = type(value)
    if value is None or kind is str or kind is bool:
        return True
    if kind is int:
        return not msgpack or _INTS[0] <= value < _INTS[1]  # type: ignore[operator]
    if kind is float:
        return value == value and value not in (float("inf"), float("-inf"))
    # A list or dict of str, bool and None (most messages) is tested in C, by type,
    # without a call per item; its items are one level down, so only above the depth limit.
    if kind is list:
        if depth < 32 and _FLAT.issuperset(map(type, value)):  # type: ignore[call-overload]
            return True
        for v in value:  # type: ignore[attr-defined]
            # Strings, the usual leaves, without a call each: this runs on every write.
            if type(v) is not str and not is_plain(v, depth + 1, msgpack=msgpack):
                return False
        return True
    if kind is dict:
        if (depth < 32 and _KEYS.issuperset(map(type, value))  # type: ignore[call-overload]
                and _FLAT.issuperset(map(type, value.values()))):  # type: ignore[attr-defined]
            return True
        for k, v in value.items():  # type: ignore[attr-defined]
            if type(k) is not str or (type(v) is not str and not is_plain(v, depth + 1, msgpack=msgpack)):
                return False
        return True
    return False


class StateCodec:
    """Encodes and decodes the values of graph state and write events through one serializer.

    Args:
        serde: LangGraph's serializer for the values JSON cannot carry (and for every
            value, when it is not the default one).
    """

    def __init__(self, serde: SerializerProtocol) -> None:
        self.serde = serde

    def pack(self, value: Any) -> Packed:
        """Return ``value`` through serde, as text."""
        kind, data = self.serde.dumps_typed(value)
        return [kind, base64.b64encode(data).decode("ascii")]

    def unpack(self, packed: Packed) -> Any:
        """Return the value :meth:`pack` packed."""
        return self.serde.loads_typed((packed[0], base64.b64decode(packed[1])))

    def store(self, value: Any) -> Stored:
        """Return ``value`` as a write or channel value is stored: itself when plain, else packed."""
        # Only with the default serializer, which gives plain JSON back equal: another
        # one (an encrypting one, say) must see every value.
        if type(self.serde) is JsonPlusSerializer and is_plain(value, msgpack=True):
            return [value]
        return self.pack(value)

    def load(self, stored: Stored) -> Any:
        """Return the value :meth:`store` stored."""
        return stored[0] if len(stored) == 1 else self.unpack(stored)

    def head(self, thread_id: str, snapshot: dict[str, Any],
             metadata: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Return the value of a graph state event without its channels, and its ``meta``.

        ``snapshot`` is the checkpoint without its channel values. Its structure (ids,
        versions, versions seen) stays readable JSON, as PostgresSaver keeps it;
        metadata JSON cannot carry exactly goes into the value, packed, and ``meta`` is
        then None.
        """
        value: dict[str, Any] = {"thread": thread_id,
                                 "checkpoint": snapshot if is_plain(snapshot) else self.pack(snapshot)}
        meta = dict(metadata)
        if not is_plain(meta):
            value["metadata"] = self.pack(metadata)
            return value, None
        return value, meta

    def snapshot(self, event: ev.GraphState) -> dict[str, Any]:
        """Return the checkpoint ``event`` holds, without its channel values."""
        got = event.value["checkpoint"]
        return dict(got) if isinstance(got, dict) else dict(self.unpack(got))

    def metadata(self, event: ev.GraphState) -> dict[str, Any]:
        """Return the checkpoint metadata ``event`` holds."""
        value = event.value if isinstance(event.value, dict) else {}
        if "metadata" in value:
            got = self.unpack(value["metadata"])
            return dict(got) if isinstance(got, dict) else {}
        return dict(event.meta or {})

    def elements(self, value: Any) -> memoryview | None:
        """Return the msgpack of a list value's elements, when it may be stored as an extension of an earlier one.

        Only with the default serializer: its msgpack encodes each element on its own, so
        a list whose element bytes start with an earlier list's holds those elements.
        """
        if type(value) is not list or type(self.serde) is not JsonPlusSerializer:
            return None
        kind, data = self.serde.dumps_typed(value)
        return _msgpack_elements(data) if kind == "msgpack" else None

    def channel(self, session: Session, records: dict[int, Record], at: int, ch: str) -> tuple[bool, Any]:
        """Return ``(True, value)`` of channel ``ch`` as the graph state at ``at`` stores it, ``(False, None)`` if empty.

        A list value may be spread over a chain of earlier events (a full value, then
        the parts appended to it): they are read (``records`` caches them) and joined.

        Raises:
            IntegrityError: a part of the chain is erased.
        """
        holder = records[at].event
        if not isinstance(holder, ev.GraphState):
            return False, None
        stored = holder.value["blobs"][ch][1:]
        chain = (holder.value.get("deltas") or {}).get(ch)
        if not chain:
            if len(stored) == 2 and stored[0] == _EMPTY[0]:
                return False, None
            return True, self.load(stored)
        missing = [p for p in chain if p not in records]
        if missing:
            records.update(read_many(session, missing))
        out: list[Any] = []
        for p in chain:
            part = records[p].event
            if not isinstance(part, ev.GraphState):  # erased under it: the log no longer holds the value
                raise IntegrityError(f"graph state at pos {at} of {session.name!r} reads channel {ch!r} "
                                     f"from pos {p}, which is erased", session=session.name, pos=p)
            out.extend(self.load(part.value["blobs"][ch][1:]))
        out.extend(self.load(stored))
        return True, out

    def channels(self, session: Session, records: dict[int, Record], holders: Mapping[str, int]) -> dict[str, Any]:
        """Return the value of each channel that ``holders`` maps to the position of the graph state storing it.

        Channels stored empty are left out.
        """
        values: dict[str, Any] = {}
        for ch, at in holders.items():
            found, got = self.channel(session, records, at, ch)
            if found:
                values[ch] = got
        return values

    def whole(self, session: Session, records: dict[int, Record], at: int, ch: str) -> Stored:
        """Return the blob of channel ``ch`` of the graph state at ``at``, holding its value whole."""
        event = records[at].event
        assert isinstance(event, ev.GraphState)
        blob = event.value["blobs"][ch]
        if ch not in (event.value.get("deltas") or {}):
            return list(blob)
        _, got = self.channel(session, records, at, ch)
        return [blob[0], *self.store(got)]


@dataclass(frozen=True)
class Tip:
    """The last list value this process stored for one channel: what a later one may extend."""

    #: its length, and the length and BLAKE3 digest of its msgpack elements
    count: int
    nbytes: int
    digest: bytes
    #: the positions whose parts, concatenated, give it (a full value first)
    chain: tuple[int, ...]

    def at(self, pos: int) -> Tip:
        """Return this tip once its last part is stored at ``pos``."""
        return Tip(self.count, self.nbytes, self.digest, (*self.chain, pos))

    def extended_by(self, count: int, elements: memoryview, prefix: bytes, live: Collection[int]) -> bool:
        """Return whether a list of ``count`` elements (``elements`` their msgpack) may be stored as appended to this.

        ``prefix`` is the digest of the first :attr:`nbytes` of ``elements``; ``live``
        the positions not erased.
        """
        # Msgpack elements are self-delimiting: equal leading bytes are equal leading elements.
        return (count > self.count and len(elements) > self.nbytes and len(self.chain) < MAX_CHAIN
                and prefix == self.digest and all(p in live for p in self.chain))


@dataclass(frozen=True)
class Encoded:
    """The channels of one checkpoint as an event stores them."""

    #: channel -> ``[version, *stored]``
    blobs: dict[str, list[Any]]
    #: channel -> the positions whose parts precede the part in ``blobs``
    deltas: dict[str, list[int]]
    #: channel -> the list value stored, as a :class:`Tip` whose chain lacks the event's own position
    tips: dict[str, Tip]

    def value(self, head: dict[str, Any]) -> dict[str, Any]:
        """Return the event value: ``head`` (see :meth:`StateCodec.head`) with the channels."""
        return {**head, "blobs": self.blobs, **({"deltas": self.deltas} if self.deltas else {})}


class ChannelEncoder:
    """Encodes the channels of one ``put``: the values ``new_versions`` names, lists as deltas where they may be.

    What does not depend on the log (the serialized values) is computed once, so a put
    that loses a race encodes again cheaply against the tips as they then stand.
    """

    def __init__(self, codec: StateCodec, values: dict[str, Any], new_versions: Mapping[str, Any]) -> None:
        self.codec = codec
        self.values = values
        self.versions = new_versions
        self._lists = {ch: got for ch in new_versions if ch in values
                       if (got := codec.elements(values[ch])) is not None}
        self._full: dict[str, Stored] = {}

    def encode(self, tips: Mapping[str, Tip], live: Collection[int]) -> Encoded:
        """Return the channels encoded, a list as appended to its channel's tip in ``tips`` where it extends it.

        ``live`` holds the positions not erased: a tip spread over an erased one is not extended.
        """
        out = Encoded({}, {}, {})
        for ch, version in self.versions.items():
            if ch not in self.values:
                out.blobs[ch] = [version, *_EMPTY]
            elif not self._delta(out, ch, version, tips.get(ch), live):
                out.blobs[ch] = [version, *self._whole(ch)]
        return out

    def _delta(self, out: Encoded, ch: str, version: Any, tip: Tip | None, live: Collection[int]) -> bool:
        """Record list channel ``ch`` in ``out`` as appended to ``tip`` if it extends it; return whether it does.

        Either way ``out.tips`` gets the tip the value leaves for a later put.
        """
        elements = self._lists.get(ch)
        if elements is None:
            return False
        count = len(self.values[ch])
        prefix, digest = _digests(elements, tip.nbytes if tip is not None else 0)
        if tip is None or not tip.extended_by(count, elements, prefix, live):
            out.tips[ch] = Tip(count, len(elements), digest, ())
            return False
        # Only what was appended since the value this process stored last.
        out.blobs[ch] = [version, *self.codec.store(self.values[ch][tip.count :])]
        out.deltas[ch] = list(tip.chain)
        out.tips[ch] = Tip(count, len(elements), digest, tip.chain)
        return True

    def _whole(self, ch: str) -> Stored:
        if ch not in self._full:
            self._full[ch] = self.codec.store(self.values[ch])
        return self._full[ch]


def _digests(elements: memoryview, nbytes: int) -> tuple[bytes, bytes]:
    """Return the BLAKE3 digests of the first ``nbytes`` of ``elements`` and of all of them."""
    hasher = blake3(elements[:nbytes])
    prefix = hasher.digest()
    hasher.update(elements[nbytes:])
    return prefix, hasher.digest()


def _msgpack_elements(data: bytes) -> memoryview | None:
    """Return the elements of the msgpack array ``data`` (past its header), or None if it is not one."""
    if not data:
        return None
    first = data[0]
    if 0x90 <= first <= 0x9F:
        return memoryview(data)[1:]
    if first == 0xDC:
        return memoryview(data)[3:]
    if first == 0xDD:
        return memoryview(data)[5:]
    return None


def blob_keys(value: Any) -> list[tuple[str, str]]:
    """Return ``(channel, version as JSON)`` of each channel value a graph state event's ``value`` stores."""
    blobs = (value.get("blobs") or {}) if isinstance(value, dict) else {}
    return [(ch, encode_json(blob[0])) for ch, blob in blobs.items()]


def parts(value: Any) -> set[int]:
    """Return the positions of the earlier events a graph state event's ``value`` reads list parts from."""
    deltas = (value.get("deltas") or {}) if isinstance(value, dict) else {}
    return {p for chain in deltas.values() for p in chain}


def spread_over(value: dict[str, Any], positions: Collection[int]) -> list[str]:
    """Return the channels of a graph state event's ``value`` that read a part from one of ``positions``."""
    return [ch for ch, chain in (value.get("deltas") or {}).items() if not set(chain).isdisjoint(positions)]


def with_whole(value: dict[str, Any], whole: Mapping[str, Stored]) -> dict[str, Any]:
    """Return a graph state event's ``value`` holding the blobs ``whole``, no longer read from earlier events."""
    out = {k: v for k, v in value.items() if k != "deltas"}
    out["blobs"] = {**(value.get("blobs") or {}), **whole}
    deltas = {ch: chain for ch, chain in (value.get("deltas") or {}).items() if ch not in whole}
    if deltas:
        out["deltas"] = deltas
    return out


def copied_value(codec: StateCodec, session: Session, record: Record, thread_id: str,
                 moved: Mapping[int, int]) -> dict[str, Any]:
    """Return the value of graph state ``record`` as copied to thread ``thread_id``.

    ``moved`` maps the positions already copied to their target positions: a list part
    read from one of them is read from its copy; a list spread over a position not
    copied is stored whole.
    """
    event = record.event
    assert isinstance(event, ev.GraphState)
    value: dict[str, Any] = {**event.value, "thread": thread_id}
    deltas: dict[str, list[int]] = value.pop("deltas", None) or {}
    kept = {ch: [moved[p] for p in chain] for ch, chain in deltas.items() if all(p in moved for p in chain)}
    if len(kept) < len(deltas):
        own = {record.pos: record}
        value["blobs"] = {ch: codec.whole(session, own, record.pos, ch) if ch in deltas and ch not in kept
                          else blob for ch, blob in value["blobs"].items()}
    if kept:
        value["deltas"] = kept
    return value
