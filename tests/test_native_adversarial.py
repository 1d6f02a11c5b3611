"""Adversarial tests of the native core (``compactstore.native``) against the pure references.

The promise under test: for EVERY input the native path gives the reference's bytes, or
declines/refuses as the reference does (declining *more* is allowed for the JSON encoder),
and it never crashes, aborts, panics into Python, hangs or reads memory it does not own.

The rule that keeps the two paths alike: native code reads only what it sees as Python
would (an exact list or tuple, exact bytes, sizes within u64) and raises TypeError,
ValueError or OverflowError for anything else, and ``compactstore.merkle`` (or
``events.encode_plain``) then asks the reference. Everything that might take the
interpreter down runs in a subprocess.
"""

from __future__ import annotations

import array
import itertools
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import pytest
from blake3 import blake3
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from compactstore import content as C
from compactstore import events as E
from compactstore import merkle as M
from compactstore import merkle_pure as P

native: Any = M.native
pytestmark = pytest.mark.skipif(
    native is None or E._NATIVE is None, reason="compactstore.native is not in use (not built, or COMPACTSTORE_PURE=1)"
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H32 = [bytes([i]) * 32 for i in range(256)]


def run_py(code: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter of this venv (so a crash cannot take the test run down)."""
    full_env = {**os.environ, "RUST_BACKTRACE": "0", **(env or {})}
    full_env.pop("COMPACTSTORE_PURE", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout,
        cwd=ROOT, env=full_env,
    )


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """``("ok", value)`` or ``("raised", exception type)``; a BaseException that is not an Exception is re-raised."""
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as exc:  # noqa: BLE001 - the refusal itself is compared
        return ("raised", type(exc))


# =====================================================================================
# 1. The canonical JSON encoder (json.rs) against events._encode_plain_reference
# =====================================================================================

SPECIAL_CHARS = [
    '"', "\\", "/", "\x00", "\x01", "\x07", "\x08", "\t", "\n", "\x0b", "\x0c", "\r", "\x1b", "\x1f", "\x20",
    "\x7f", "\x80", "\u00ff", "\u0100", "\u07ff", "\u0800", "\u2028", "\u2029", "\ufeff", "\ufffe", "\uffff",
    "\ud800", "\udbff", "\udc00", "\udfff", "\U00010000", "\U0001f600", "\U0010ffff", "é", "ß", "中",
]

any_char = st.one_of(
    st.sampled_from(SPECIAL_CHARS),
    st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()),  # lone surrogates included
)


@st.composite
def boundary_text(draw: st.DrawFn) -> str:
    """A long run of clean ASCII with one or two special characters around 16-byte (SSE) boundaries."""
    n = draw(st.sampled_from([0, 1, 14, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 127, 128, 129, 255, 256, 1000]))
    s = list("abcdefghijklmnopqrstuvwxyz0123456789"[i % 36] for i in range(n))
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, n))
        s.insert(at, draw(st.sampled_from(SPECIAL_CHARS)))
    return "".join(s)


texts = st.one_of(st.text(any_char, max_size=24), boundary_text(), st.text(max_size=6))


class StrSub(str):
    pass


class IntSub(int):
    pass


class ListSub(list):  # type: ignore[type-arg]
    pass


class DictSub(dict):  # type: ignore[type-arg]
    pass


class BadEq(str):
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("__eq__")

    def __hash__(self) -> int:
        raise RuntimeError("__hash__")


edge_ints = st.one_of(
    st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**32, 2**53, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**63 + 1,
                     2**64 - 2, 2**64 - 1, 2**64, 2**65, -(2**63), -(2**63) + 1, -(2**63) - 1, -(2**64), 10**30]),
    st.integers(-(2**66), 2**66),
)

scalars = st.one_of(
    st.none(), st.booleans(), edge_ints, texts,
    st.sampled_from([0.0, -0.0, 1.5, 1e300, float("nan"), float("inf")]),
    texts.map(StrSub), st.integers(-3, 3).map(IntSub), st.binary(max_size=3),
)


def _json_children(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keys = st.one_of(texts, st.sampled_from(["", "a", "A", "é", "\U0001f600", "\uffff", "\ue000", "\U00010000", "b\x00"]))
    return st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(keys, children, max_size=5),
        st.lists(children, max_size=3).map(tuple),
        st.lists(children, max_size=2).map(ListSub),
        st.dictionaries(keys, children, max_size=2).map(DictSub),
        st.dictionaries(st.one_of(st.integers(0, 3), keys.map(StrSub)), children, max_size=2),
    )


json_any = st.recursive(scalars, _json_children, max_leaves=16)


def nested(depth: int, leaf: object = 1) -> object:
    value: object = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


deep_json = st.tuples(st.integers(60, 68), st.sampled_from([1, "s", [], {}, None, 1.5])).map(lambda t: nested(*t))


def _value_for(t: Any) -> st.SearchStrategy[Any]:
    import msgspec.inspect as mi

    if isinstance(t, mi.UnionType):
        return st.one_of(*(_value_for(m) for m in t.types))
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.StrType):
        return texts
    if isinstance(t, mi.IntType):
        return edge_ints
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.LiteralType):
        return st.one_of(st.sampled_from(t.values), st.sampled_from(t.values).map(lambda v: "".join(list(v))))
    if isinstance(t, mi.ListType):
        return st.lists(_value_for(t.item_type), max_size=4)
    if isinstance(t, mi.DictType):
        return st.dictionaries(texts, json_any, max_size=4)
    if isinstance(t, mi.EnumType):
        return st.sampled_from(list(t.cls))
    return st.one_of(json_any, deep_json)


@st.composite
def any_events(draw: st.DrawFn) -> Any:
    """An event of any registered type (Summary included), every field valid-looking or anything at all."""
    cls = draw(st.sampled_from(E.EVENT_TYPES))
    kwargs = {}
    for field in msgspec.inspect.type_info(cls).fields:  # type: ignore[attr-defined]
        if field.name in ("ts", "idempotency_key"):
            if draw(st.integers(0, 9)) == 0:
                kwargs[field.name] = draw(st.one_of(st.integers(0, 5), st.text(max_size=2)))
            continue
        if not field.required and draw(st.booleans()):
            continue
        kwargs[field.name] = draw(json_any if draw(st.integers(0, 4)) == 0 else _value_for(field.type))
    return cls(**kwargs)


NO_SURROGATES = [c for c in SPECIAL_CHARS if not 0xD800 <= ord(c) <= 0xDFFF]
clean_char = st.one_of(st.sampled_from(NO_SURROGATES), st.characters(min_codepoint=0, max_codepoint=0x10FFFF))
clean_texts = st.one_of(st.text(clean_char, max_size=40), boundary_text().filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)))
clean_ints = st.one_of(st.integers(-(2**63), 2**64 - 1), st.sampled_from([0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)]))
clean_json = st.recursive(
    st.one_of(st.none(), st.booleans(), clean_ints, clean_texts),
    lambda children: st.one_of(st.lists(children, max_size=5), st.dictionaries(clean_texts, children, max_size=5)),
    max_leaves=25,
)


def _clean_for(t: Any, name: str) -> st.SearchStrategy[Any]:
    import msgspec.inspect as mi

    if isinstance(t, mi.UnionType):
        return st.one_of(*(_clean_for(m, name) for m in t.types))
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.StrType):
        return clean_texts.filter(bool) if name in {"role", "call_id", "name", "key", "handle", "operation", "reason", "id", "checkpoint"} else clean_texts
    if isinstance(t, mi.IntType):
        return st.integers(0, 2**64 - 1) if name == "supersedes" else clean_ints
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.ListType):
        return st.lists(_clean_for(t.item_type, ""), max_size=5)
    if isinstance(t, mi.DictType):
        return st.dictionaries(clean_texts, clean_json, max_size=5)
    return clean_json


@st.composite
def plain_events(draw: st.DrawFn) -> Any:
    """An event of a type the native encoder plans for, every field plain (what it should take), now and then one odd field."""
    cls = draw(st.sampled_from(list(E._PLANS)))
    kwargs = {}
    odd = draw(st.integers(0, 12))
    for k, field in enumerate(msgspec.inspect.type_info(cls).fields):  # type: ignore[attr-defined]
        if field.name in ("ts", "idempotency_key"):
            continue
        if not field.required and draw(st.booleans()):
            continue
        kwargs[field.name] = draw(json_any if k == odd else _clean_for(field.type, field.name))
    return cls(**kwargs)


stamps = st.one_of(edge_ints, st.sampled_from([True, False, None, 1.5, "x", IntSub(5)]))


def check_native_conforms(events: list[Any], start: int, readings: list[Any], scale: int = 1) -> None:
    """The native encoder takes a prefix of what the reference takes, with identical bytes and stamps."""
    try:
        got = E._NATIVE.encode(events, start, iter(readings).__next__, scale)
    except Exception as exc:  # noqa: BLE001
        got = exc
    try:
        want = E._encode_plain_reference(events, start, iter(readings).__next__, scale)
    except Exception as exc:  # noqa: BLE001
        want = exc
    if isinstance(want, BaseException) or isinstance(got, BaseException):
        assert type(got) is type(want), (got, want)
        return
    taken = got[3] - start
    assert got[3] <= want[3], (got, want)
    assert got[0] == want[0][:taken], (got[0], want[0])
    assert got[1] == want[1][: len(got[1])]
    assert all(a is b for a, b in zip(got[2], want[2]))
    for body, stamp, event in zip(got[0], got[1], got[2]):
        stamped = msgspec.structs.replace(event, ts=stamp)
        try:
            E.check_entry(stamped, body)
        except E.InvalidEvent as refused:
            # A NUL or a name too long: the encoder writes it, and prepare then refuses it by
            # the entry rule, as canonical() does, naming the same field.
            with pytest.raises(E.InvalidEvent) as info:
                E.canonical(stamped)
            assert info.value.field == refused.field
            continue
        # What native takes is the canonical encoding of the stamped event, and decodes back to it.
        canon, canon_body = E.canonical(stamped)
        assert canon_body == body
        assert E.decode(body) == canon


@given(st.lists(any_events(), min_size=1, max_size=5), st.lists(stamps, min_size=5, max_size=5), st.integers(0, 5))
@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
def test_encoder_never_gives_other_bytes_than_the_reference(events: list[Any], readings: list[Any], start: int) -> None:
    """Native bytes equal reference bytes for every event the native encoder takes, whatever the fields hold."""
    check_native_conforms(events, min(start, len(events)), readings)


@given(st.lists(plain_events(), min_size=1, max_size=6), st.lists(st.one_of(clean_ints, stamps), min_size=6, max_size=6),
       st.integers(0, 6))
@settings(max_examples=800, deadline=None, suppress_health_check=list(HealthCheck))
def test_encoder_plain_events_byte_for_byte(events: list[Any], readings: list[Any], start: int) -> None:
    """Mostly-plain events of every planned type (hostile unicode, edge ints, deep JSON): the native bytes are the reference's."""
    check_native_conforms(events, min(start, len(events)), readings)


@given(st.lists(st.tuples(texts, json_any), min_size=1, max_size=6))
@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
def test_encoder_strings_and_json_values_byte_for_byte(pairs: list[tuple[str, Any]]) -> None:
    """Turn.content / ToolResult.output / ToolCall.args with hostile text and JSON: prefix of the reference, same bytes."""
    events: list[Any] = []
    for text, value in pairs:
        events.append(E.Turn(role="r" + text, content=text, name=text or None))
        events.append(E.ToolResult(call_id="c", output=value))
        events.append(E.ToolCall(call_id="c", name="n", args={text: value}))
        events.append(E.Binding(key="k", value={text: value, text + "\x00": [value]}))
    check_native_conforms(events, 0, list(range(len(events))))


@given(st.dictionaries(texts, st.integers(0, 9), min_size=2, max_size=30))
@settings(max_examples=800, deadline=None)
def test_encoder_sorts_non_ascii_keys_as_msgspec_does(args: dict[str, int]) -> None:
    """Keys with astral, BMP-private-use and NUL characters sort as msgspec sorts them (code point order)."""
    reordered = dict(reversed(list(args.items())))
    check_native_conforms([E.ToolCall(call_id="c", name="n", args=args), E.ToolCall(call_id="c", name="n", args=reordered)],
                          0, [1, 2])


@pytest.mark.parametrize("depth", range(60, 70))
@pytest.mark.parametrize("leaf", [1, "s", [], {}, None, 1.5, [1], {"a": 1}])
def test_encoder_depth_limit_matches_reference(depth: int, leaf: object) -> None:
    for event in (E.ToolResult(call_id="c", output=nested(depth, leaf)), E.Turn(role="r", content="c", meta={"m": nested(depth, leaf)}),
                  E.ToolCall(call_id="c", name="n", args={"a": nested(depth, leaf)})):
        check_native_conforms([event], 0, [7])


def test_encoder_self_referential_json_declines_without_crashing() -> None:
    loop: list[Any] = []
    loop.append(loop)
    d: dict[str, Any] = {}
    d["d"] = d
    for event in (E.ToolResult(call_id="c", output=loop), E.ToolCall(call_id="c", name="n", args=d)):
        check_native_conforms([event], 0, [1])


@pytest.mark.parametrize("n", [-(2**63) - 1, -(2**63), -1, 0, 2**63 - 1, 2**63, 2**64 - 1, 2**64, True, False])
def test_encoder_int_edges_everywhere(n: int) -> None:
    events = [
        E.Turn(role="r", content="c", supersedes=n),
        E.Write(checkpoint="c", task="t", channel="ch", idx=n),
        E.Redaction(positions=[n, 0], reason="x"),
        E.RecoveryMarker(size=n, root="r", node=n, path=[n], cover=[n]),
        E.Spill(key="k", value=[n, {"n": n}], source=n, digest="d"),
    ]
    for e in events:
        check_native_conforms([e], 0, [n])
        check_native_conforms([e], 0, [5])


def test_encoder_defaults_built_at_run_time() -> None:
    """A default-equal value that is not the default object: both decline, or both take it the same way."""
    other = "".join(["oth", "er"])
    empty_list: list[str] = []
    events = [
        E.HandleOpened(handle="h", resource=other),  # type: ignore[arg-type]
        E.HandleOpened(handle="h", detail="".join([])),
        E.ToolResult(call_id="c", ok=True), E.ToolResult(call_id="c", ok=False),
        E.Binding(key="k", value=None, regenerable=False),
        E.Write(checkpoint="c", task="t", channel="ch", idx=int("0")),
        E.Write(checkpoint="c", task="t", channel="ch", idx=(10**30) - (10**30)),
        E.Obligation(name="o", needs=empty_list), E.Obligation(name="o", needs=ListSub()),
        E.ToolCall(call_id="c", name="n", args={}), E.ToolCall(call_id="c", name="n", args=DictSub()),
        E.Attempt(key="k", operation="o", literals={}),
    ]
    for e in events:
        check_native_conforms([e], 0, [1])


def test_encoder_size_limit_matches_reference() -> None:
    """Bodies right at, and one byte over, MAX_EVENT_BYTES."""
    base = E.encode(E.Turn(role="r", content="", ts=1))
    room = E.MAX_EVENT_BYTES - len(base)
    for extra in (room - 1, room, room + 1):
        check_native_conforms([E.Turn(role="r", content="a" * extra)], 0, [1])
    # Escapes grow the body: 1/6 of the limit in NULs escapes to just over it.
    check_native_conforms([E.Turn(role="r", content="\x00" * (E.MAX_EVENT_BYTES // 6 + 1))], 0, [1])


def test_encoder_unregistered_subclass_and_tampered_slots() -> None:
    class MyTurn(E.Turn, frozen=True, tag="turn"):
        pass

    t = E.Turn(role="r", content="c")
    forced = E.Turn(role="r", content="c")
    msgspec.structs.force_setattr(forced, "content", 5)
    forced2 = E.Turn(role="r", content="c")
    msgspec.structs.force_setattr(forced2, "meta", {"a": float("nan")})
    forced3 = E.ToolResult(call_id="c")
    msgspec.structs.force_setattr(forced3, "ok", 1)
    for e in (MyTurn(role="r", content="c"), forced, forced2, forced3, t):
        check_native_conforms([e, t], 0, [1, 2])


def test_encoder_values_whose_eq_and_hash_raise() -> None:
    """A str subclass whose __eq__/__hash__ raise, as a value, a key, a literal and a default-valued field."""
    bad = BadEq("other")
    for e in (E.Turn(role=bad, content="c"), E.HandleOpened(handle="h", resource=bad),  # type: ignore[arg-type]
              E.HandleOpened(handle="h", detail=bad), E.ToolResult(call_id="c", output=[bad]),
              E.Turn(role="r", content="c", status=bad)):  # type: ignore[arg-type]
        check_native_conforms([e], 0, [1])
    with pytest.raises(RuntimeError):
        {bad: 1}


def test_encoder_clock_that_rewrites_the_list_and_the_events() -> None:
    """The clock runs before each event is read: both paths read the same (rewritten) event."""
    for mode in range(6):
        def make() -> tuple[list[Any], Callable[[], int]]:
            evs: list[Any] = [E.Turn(role="r", content=str(i), meta={"i": [i]}) for i in range(4)]
            ticks = itertools.count(1)

            def clock() -> int:
                k = next(ticks)
                if mode == 0:
                    evs[k % 4] = E.ToolCall(call_id="c", name="n", args={"k": k})
                elif mode == 1:
                    evs[k % 4].meta["i"].append(1.5 if k == 3 else k)
                elif mode == 2:
                    msgspec.structs.force_setattr(evs[k % 4], "content", StrSub("x") if k == 2 else "y")
                elif mode == 3 and k == 2:
                    evs.clear()
                elif mode == 4:
                    evs.append(E.Turn(role="r", content="more")) if k < 6 else None
                elif mode == 5:
                    evs[k % 4].meta.clear()
                return k
            return evs, clock

        evs, clock = make()
        got = outcome(E._NATIVE.encode, evs, 0, clock, 1)
        evs, clock = make()
        want = outcome(E._encode_plain_reference, evs, 0, clock, 1)
        if got[0] == "raised" or want[0] == "raised":
            assert got == want
        else:
            assert got[1][3] <= want[1][3] and got[1][0] == want[1][0][: got[1][3]], (mode, got, want)


def test_encoder_clock_errors_and_reentrancy() -> None:
    t = E.Turn(role="r", content="c")

    def reentrant() -> int:
        E._NATIVE.encode([t, t], 0, lambda: 3, 1)  # the encoder called from inside its own clock
        return 1

    assert E._NATIVE.encode([t], 0, reentrant, 1)[0] == E._encode_plain_reference([t], 0, reentrant, 1)[0]

    class Boom(BaseException):
        pass

    def boom() -> int:
        raise Boom

    for fn in (E._NATIVE.encode, E._encode_plain_reference):
        with pytest.raises(Boom):
            fn([t], 0, boom, 1)


# --- what the encoder reads as Python reads it ---------------------------------------------------------


class FloorDivInt(int):
    """An int subclass whose floor division is its own."""

    def __floordiv__(self, other: object) -> int:
        return 42


class IndexOnly:
    """Not an int, but has __index__; its floor division gives something that is not an int."""

    def __index__(self) -> int:
        return 5000

    def __floordiv__(self, other: object) -> str:
        return "not an int"


@pytest.mark.parametrize("reading", [FloorDivInt(5000), IndexOnly()], ids=["int-subclass-floordiv", "__index__"])
def test_scaled_clock_reading_is_divided_as_python_divides_it(reading: object) -> None:
    t = E.Turn(role="user", content="hi")
    got = E._NATIVE.encode([t], 0, lambda: reading, 1000)
    want = E._encode_plain_reference([t], 0, lambda: reading, 1000)
    assert got[1] == want[1]
    assert got[0] == want[0][: len(got[0])]


@pytest.mark.parametrize("reading", ["x", None, [1]])
def test_scaled_clock_reading_error_type(reading: object) -> None:
    t = E.Turn(role="user", content="hi")
    assert outcome(E._NATIVE.encode, [t], 0, lambda: reading, 1000) == outcome(
        E._encode_plain_reference, [t], 0, lambda: reading, 1000)


def test_list_subclass_is_read_as_python_reads_it() -> None:
    t = E.Turn(role="user", content="hi")

    class Shadow(list):  # type: ignore[type-arg]
        def __getitem__(self, i: Any) -> Any:
            return E.Turn(role="sub", content="x")

        def __len__(self) -> int:
            return 1

    # The native encoder reads only an exact list; encode_plain hands anything else to the reference.
    with pytest.raises(TypeError, match="events must be a list"):
        E._NATIVE.encode(Shadow([t, t]), 0, iter([1, 2, 3]).__next__, 1)
    got = E.encode_plain(Shadow([t, t]), 0, iter([1, 2, 3]).__next__, 1)
    want = E._encode_plain_reference(Shadow([t, t]), 0, iter([1, 2, 3]).__next__, 1)
    assert got == want


# =====================================================================================
# 2. Merkle trees, proofs, frontier (lib.rs / tree.rs / hash.rs / par.rs)
# =====================================================================================

EDGES = [0, 1, 2, 62, 63, 64, 65, 126, 127, 128, 1022, 1023, 1024, 1025, 1087, 1088, 2046, 2047, 2048, 2049,
         3071, 3072, 4095, 4096, 4097, 16382, 16383, 16384, 16385, 32767, 32768]


@st.composite
def block_runs(draw: st.DrawFn) -> list[bytes]:
    """Batches with runs of up to 20 entries of one block count, shuffled, around the chunk and copy cuts."""
    out: list[bytes] = []
    seed = draw(st.binary(min_size=1, max_size=4))
    for n in draw(st.lists(st.sampled_from(EDGES), min_size=1, max_size=3)):
        blocks = max(1, -(-(n + 1) // 64))
        lo, hi = 64 * (blocks - 1), 64 * blocks - 1
        for k, length in enumerate(draw(st.lists(st.integers(lo, hi), min_size=1, max_size=20))):
            out.append((seed + bytes([k % 256])) * (length // (len(seed) + 1)) + b"\xff" * (length % (len(seed) + 1)))
    return draw(st.permutations(out))


def b3(prefix: bytes, data: bytes) -> bytes:
    return blake3(prefix + data).digest()


@given(block_runs())
@settings(max_examples=300, deadline=None)
def test_leaf_hashes_of_mixed_batches_equal_blake3(entries: list[bytes]) -> None:
    want = [b3(b"\x00", e) for e in entries]
    assert M.leaf_hashes(entries) == want
    assert native.leaf_hashes([bytearray(e) for e in entries]) == want
    assert native.leaf_hashes(tuple(entries)) == want
    with pytest.raises(TypeError):  # natively an exact list or tuple only: merkle reads anything else first
        native.leaf_hashes(iter(entries))
    assert M.leaf_hashes(iter(entries)) == want
    assert M.tree_root(entries) == P.tree_root(entries)


@given(st.lists(st.sampled_from(EDGES + [5000, 70000, 131071, 131072, 131073, 262143, 262144, 262145, 1 << 20]),
                min_size=0, max_size=6), st.binary(min_size=1, max_size=3))
@settings(max_examples=60, deadline=None)
def test_leaf_hash_one_at_a_time_and_large(lengths: list[int], seed: bytes) -> None:
    entries = [(seed * (n // len(seed) + 1))[:n] for n in lengths]
    for e in entries:
        assert native.leaf_hash(e) == M.leaf_hash(e) == P.leaf_hash(e) == b3(b"\x00", e)
    assert M.leaf_hashes(entries) == P.leaf_hashes(entries)
    assert M.tree_root(entries) == P.tree_root(entries)


def test_parallel_paths_equal_reference() -> None:
    """Batches above the parallel cuts (of leaves, trees and node levels) equal the reference."""
    entries = [bytes([i % 251]) * (100 + i % 1500) for i in range(3000)]
    leaves = P.leaf_hashes(entries)
    assert M.leaf_hashes(entries) == leaves
    assert M.tree_root(entries) == P.root_of_leaves(leaves)
    assert M.root_of_leaves(leaves) == P.root_of_leaves(leaves)
    assert M.subtree_levels(leaves) == P.subtree_levels(leaves)
    for i in (0, 1, 1499, 2047, 2048, 2999):
        assert M.inclusion_proof(entries, i) == P.inclusion_proof(entries, i)
    for m in (0, 1, 2047, 2048, 2049, 2999, 3000):
        assert M.consistency_proof(entries, m) == P.consistency_proof(entries, m)


@given(st.integers(0, 200), st.data())
@settings(max_examples=200, deadline=None)
def test_proofs_and_span_roots_equal_reference(n: int, data: st.DataObject) -> None:
    entries = [bytes([i % 256, i // 256]) * (i % 5) for i in range(n)]
    leaves = P.leaf_hashes(entries)
    if n:
        i = data.draw(st.integers(0, n - 1))
        assert M.inclusion_proof(entries, i) == P.inclusion_proof(entries, i)
    m = data.draw(st.integers(0, n))
    assert M.consistency_proof(entries, m) == P.consistency_proof(entries, m)
    stop = data.draw(st.integers(0, n))
    start = data.draw(st.integers(0, stop))
    assert M.span_root(entries, start, stop) == P.span_root(entries, start, stop)
    assert M.span_root_of_leaves(leaves, start, stop) == P.span_root_of_leaves(leaves, start, stop)
    assert M.span_root_of_leaves(leaves[start:stop], start, stop, first=start) == P.span_root_of_leaves(
        leaves[start:stop], start, stop, first=start)


@given(st.sampled_from([0, 1, 2**32, 2**62, 2**63 - 7, 2**63, 2**63 + 1, 2**64 - 40, 2**64 - 17, 2**64, 2**65]),
       st.integers(0, 33), st.data())
@settings(max_examples=300, deadline=None)
def test_span_roots_at_positions_near_the_u64_edge(first: int, n: int, data: st.DataObject) -> None:
    """``first`` near 2**63 and 2**64 (the _U64 routing threshold): native where it fits, reference past it, same root."""
    leaves = H32[:n]
    stop = data.draw(st.integers(first, first + n))
    start = data.draw(st.integers(first, stop))
    assert outcome(M.span_root_of_leaves, leaves, start, stop, first=first) == outcome(
        P.span_root_of_leaves, leaves, start, stop, first=first)
    if stop - start == len(leaves[: stop - start]) and stop < 2**64:
        assert native.span_root_of_leaves(leaves[start - first : stop - first], start, stop) == P.span_root_of_leaves(
            leaves, start, stop, first=first)


proof_lists = st.lists(st.sampled_from(H32[:4] + [b"", b"x" * 31, b"x" * 33, bytearray(32)]), max_size=70)
big_sizes = st.one_of(st.integers(0, 70), st.sampled_from([2**63 - 1, 2**63, 2**63 + 1, 2**64 - 2, 2**64 - 1, 2**64, 2**64 + 1, -1]))


@given(st.sampled_from(H32[:3] + [b"short", bytearray(32)]), big_sizes, big_sizes, proof_lists)
@settings(max_examples=2000, deadline=None)
def test_root_from_inclusion_equals_reference_at_any_size(leaf: bytes, index: int, size: int, proof: list[bytes]) -> None:
    assert outcome(M.root_from_inclusion, leaf, index, size, proof) == outcome(P.root_from_inclusion, leaf, index, size, proof)


@given(big_sizes, big_sizes, st.sampled_from(H32[:3] + [blake3(b"").digest()]), st.sampled_from(H32[:3] + [blake3(b"").digest()]),
       proof_lists)
@settings(max_examples=2000, deadline=None)
def test_verify_consistency_equals_reference_at_any_size(old: int, new: int, a: bytes, b: bytes, proof: list[bytes]) -> None:
    assert outcome(M.verify_consistency, old, new, a, b, proof) == outcome(P.verify_consistency, old, new, a, b, proof)


@given(st.integers(1, 300), st.data())
@settings(max_examples=200, deadline=None)
def test_real_proofs_verify_natively_and_tampered_ones_fail_alike(n: int, data: st.DataObject) -> None:
    entries = [i.to_bytes(4, "big") for i in range(n)]
    leaves = P.leaf_hashes(entries)
    i = data.draw(st.integers(0, n - 1))
    proof = P.inclusion_proof(entries, i)
    root = P.tree_root(entries)
    assert M.root_from_inclusion(leaves[i], i, n, proof) == root
    if proof:
        k = data.draw(st.integers(0, len(proof) - 1))
        bad = list(proof)
        bad[k] = bytes(32)
        assert M.root_from_inclusion(leaves[i], i, n, bad) == P.root_from_inclusion(leaves[i], i, n, bad)
        assert M.root_from_inclusion(leaves[i], i, n, proof[:-1]) == P.root_from_inclusion(leaves[i], i, n, proof[:-1])
        assert M.root_from_inclusion(leaves[i], i, n, [*proof, root]) == P.root_from_inclusion(leaves[i], i, n, [*proof, root])
    m = data.draw(st.integers(0, n))
    cproof = P.consistency_proof(entries, m)
    old = P.tree_root(entries[:m])
    assert M.verify_consistency(m, n, old, root, cproof) is True
    assert M.verify_consistency(m, n, old, root, cproof + [root]) == P.verify_consistency(m, n, old, root, cproof + [root])


@given(st.integers(0, 600), st.lists(st.integers(0, 70), max_size=6), st.sampled_from([1, 2, 3, 4, 5, 64]))
@settings(max_examples=300, deadline=None)
def test_frontier_extend_and_extend_root_equal_reference(start: int, chunks: list[int], every: int) -> None:
    leaves = P.leaf_hashes([i.to_bytes(4, "big") for i in range(start + sum(chunks))])
    a = M.Frontier()
    b = P.Frontier()
    assert a.extend(leaves[:start], every=every) == b.extend(leaves[:start], every=every)
    at = start
    for k, c in enumerate(chunks):
        part = leaves[at : at + c]
        if k % 2:
            assert a.extend_root(part, every=every) == b.extend_root(part, every=every)
        else:
            assert a.extend(part, every=every) == b.extend(part, every=every)
        assert (a.size, a.hashes) == (b.size, b.hashes)
        at += c
    assert a.root() == b.root() == P.root_of_leaves(leaves)


@pytest.mark.parametrize("size", [2**63 - 1, 2**63, 2**64 - 70, 2**64 - 3, 2**64 - 2])
@pytest.mark.parametrize("count", [1, 2, 3, 70])
def test_frontier_near_the_u64_edge_equals_reference(size: int, count: int) -> None:
    hashes = H32[1 : 1 + bin(size).count("1")]
    leaves = H32[100 : 100 + count]
    a, b = M.Frontier(size, hashes), P.Frontier(size, hashes)
    assert outcome(a.extend, leaves) == outcome(b.extend, leaves)
    assert (a.size, a.hashes) == (b.size, b.hashes)
    a, b = M.Frontier(size, hashes), P.Frontier(size, hashes)
    assert outcome(a.extend_root, leaves, every=4) == outcome(b.extend_root, leaves, every=4)
    assert (a.size, a.hashes) == (b.size, b.hashes)


def _store_of(leaves: list[bytes]) -> Callable[[list[tuple[int, int]]], list[bytes]]:
    levels = P.subtree_levels(leaves)

    def fetch(coords: list[tuple[int, int]]) -> list[bytes]:
        assert len(set(coords)) == len(coords)
        assert all(P.is_stored(lv) for lv, _ in coords)
        return [levels[lv][i] for lv, i in coords]

    return fetch


@given(st.integers(1, 700), st.lists(st.tuples(st.integers(0, 700), st.integers(0, 700)), min_size=1, max_size=6))
@settings(max_examples=200, deadline=None)
def test_serve_and_resolve_equal_reference_with_an_honest_store(n: int, raw: list[tuple[int, int]]) -> None:
    leaves = P.leaf_hashes([i.to_bytes(4, "big") for i in range(n)])
    fetch = _store_of(leaves)
    spans = [(min(a, b) % (n + 1), max(a, b) % (n + 1)) for a, b in raw]
    spans = [(a, b) if a <= b else (b, a) for a, b in spans]
    assert M.serve(spans, fetch) == P.serve(spans, fetch)
    coords = [c for a, b in spans for c in P.cover(a, b)]
    assert M.resolve(coords, fetch) == P.resolve(coords, fetch)


@given(st.integers(1, 300), st.sets(st.integers(0, 299), max_size=20))
@settings(max_examples=200, deadline=None)
def test_root_with_equals_reference(n: int, given_positions: set[int]) -> None:
    leaves = P.leaf_hashes([i.to_bytes(4, "big") for i in range(n)])
    fetch = _store_of(leaves)
    known = {p: leaves[p] for p in given_positions if p < n}
    assert outcome(M.root_with, known, n, fetch) == outcome(P.root_with, known, n, fetch)


@pytest.mark.parametrize("fetch_kind", ["short", "empty", "one-less-per-run"])
def test_resolve_with_a_short_fetch_raises_as_the_reference_does(fetch_kind: str) -> None:
    def fetch(coords: list[tuple[int, int]]) -> list[bytes]:
        got = [H32[i % 256] for i in range(len(coords))]
        return {"short": got[:-1], "empty": [], "one-less-per-run": got[:3]}[fetch_kind]

    coords = [(2, 0)]  # level 2 is not stored: served from a run of 4 level-0 roots
    assert outcome(M.resolve, coords, fetch) == outcome(P.resolve, coords, fetch)


@pytest.mark.parametrize("leaf", [b"", b"short", bytearray(32)], ids=["empty", "short", "bytearray"])
def test_root_with_routes_malformed_given_leaves_to_the_reference(leaf: bytes) -> None:
    leaves = P.leaf_hashes([i.to_bytes(4, "big") for i in range(16)])
    fetch = _store_of(leaves)
    assert outcome(M.root_with, {0: leaf}, 16, fetch) == outcome(P.root_with, {0: leaf}, 16, fetch)


def test_frontier_every_as_float() -> None:
    leaves = H32[:3]
    a, b = M.Frontier(), P.Frontier()
    assert outcome(a.extend, leaves, every=2.0) == outcome(b.extend, leaves, every=2.0)


def test_malformed_hashes_route_to_the_reference() -> None:
    odd = [b"", b"x" * 31, b"x" * 33, bytearray(32), "s" * 32]
    for bad in odd:
        for items in ([bad], [H32[0], bad], [bad, H32[1], H32[2]]):
            assert outcome(M.fold, items) == outcome(P.fold, items)
            assert outcome(M.root_of_leaves, items) == outcome(P.root_of_leaves, items)
            assert outcome(M.subtree_levels, items) == outcome(P.subtree_levels, items)
            n = len(items)
            assert outcome(M.span_root_of_leaves, items, 0, n) == outcome(P.span_root_of_leaves, items, 0, n)
            f, g = M.Frontier(), P.Frontier()
            assert outcome(f.extend, items) == outcome(g.extend, items)
            assert f.hashes == g.hashes and f.size == g.size
            assert outcome(M.node_hash, bad, H32[0]) == outcome(P.node_hash, bad, H32[0]) or isinstance(bad, str)


@pytest.mark.parametrize("fn", ["leaf_hash", "leaf_hashes", "tree_root", "node_hash", "digest", "content"])
def test_memoryview_entries_are_hashed_as_the_reference_hashes_them(fn: str) -> None:
    mv = memoryview(b"abc" * 20)
    calls: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        "leaf_hash": (lambda: M.leaf_hash(mv), lambda: P.leaf_hash(mv)),
        "leaf_hashes": (lambda: M.leaf_hashes([mv, b"x"]), lambda: P.leaf_hashes([mv, b"x"])),
        "tree_root": (lambda: M.tree_root([mv, b"x"]), lambda: P.tree_root([mv, b"x"])),
        "node_hash": (lambda: M.node_hash(memoryview(H32[0]), H32[1]), lambda: P.node_hash(memoryview(H32[0]), H32[1])),
        "digest": (lambda: M.digest_fn()(mv, None), lambda: P.digest(mv, None)),
        "content": (lambda: _digest_with(C.digester(), [[mv]]), lambda: _digest_with(C.ContentDigest(), [[mv]])),
    }
    native_call, pure_call = calls[fn]
    assert outcome(native_call) == outcome(pure_call)


# =====================================================================================
# 3. The content digest (content.rs) against content.ContentDigest
# =====================================================================================


def _digest_with(d: Any, batches: list[Sequence[Any]]) -> bytes:
    for b in batches:
        d.update(b)
    return d.digest()


@given(st.lists(st.lists(st.sampled_from([0, 1, 63, 64, 1023, 1024, 16383, 16384, 16385, 65535, 65536, 65537, 100000]),
                         max_size=6), max_size=5),
       st.booleans())
@settings(max_examples=200, deadline=None)
def test_content_digest_equals_reference_across_stage_boundaries(sizes: list[list[int]], as_bytearray: bool) -> None:
    batches = [[(bytes([(len(batch) + k) % 256]) * n) for k, n in enumerate(batch)] for batch in sizes]
    if as_bytearray:
        batches = [[bytearray(x) for x in b] for b in batches]
    assert _digest_with(C.digester(), batches) == _digest_with(C.ContentDigest(), batches)


def test_content_digest_refusals_match_reference() -> None:
    for bad in ([None], ["s"], [1], "abc", b"abc"):
        d, r = C.digester(), C.ContentDigest()
        assert outcome(d.update, bad)[0] == outcome(r.update, bad)[0] == "raised"
        # a refused batch leaves the digest as it was
        assert d.digest() == r.digest()
    d, r = C.digester(), C.ContentDigest()
    d.digest(), r.digest()
    assert outcome(d.update, [b"x"]) == outcome(r.update, [b"x"])


def test_content_digest_shared_between_threads() -> None:
    d = C.digester()
    errors: list[BaseException] = []
    big = [bytes(1 << 20)] * 4

    def work() -> None:
        for _ in range(4):
            try:
                d.update(big)
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# =====================================================================================
# 4. Crashes, aborts, panics, races and fork: each in a subprocess
# =====================================================================================

LYING = """
    import sys
    from collections.abc import Sequence
    class Lying(Sequence):
        '''A sequence whose __len__ is a (huge) lie; it holds no item.'''
        def __len__(self): return 2**45
        def __getitem__(self, i): raise IndexError(i)
"""


@pytest.mark.parametrize("call", [
    "from compactstore import merkle; merkle.root_of_leaves(Lying())",
    "from compactstore import merkle; merkle.fold(Lying())",
    "from compactstore import merkle; merkle.subtree_levels(Lying())",
    "from compactstore import content; content.digester().update(Lying())",
])
def test_lying_len_does_not_abort(call: str) -> None:
    done = run_py(LYING + textwrap.indent(textwrap.dedent(f"""
        try:
            {call}
        except Exception as exc:
            print("raised", type(exc).__name__)
        print("alive")
    """), "    "))
    assert done.returncode == 0 and "alive" in done.stdout, (done.returncode, done.stderr[-400:])


@pytest.mark.parametrize("fn", ["frontier_extend", "frontier_push"])
@pytest.mark.parametrize("size,count", [(2**64 - 1, 1), (2**64 - 2, 3)])
def test_frontier_past_u64_refuses(fn: str, size: int, count: int) -> None:
    done = run_py(f"""
        from compactstore import _native as n
        h = bytes(32)
        try:
            n.{fn}({size}, [h] * {bin(size).count("1")}, [h] * {count}, 1)
            print("returned")
        except Exception as exc:
            print("raised", type(exc).__name__)
        except BaseException as exc:
            print("PANIC", type(exc).__name__)
    """)
    assert done.returncode == 0 and done.stdout.startswith("raised"), (done.stdout, done.stderr[-300:])


def test_native_calls_with_hostile_sizes_never_panic() -> None:
    """Every native entry point at 0, 1, 2**63, 2**64-1, negative and huge sizes: an Exception or a value, never a panic."""
    done = run_py("""
        import itertools
        from compactstore import _native as n
        h = bytes(32)
        sizes = [0, 1, 2, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1, 2**64, -1, True]
        calls = []
        for a, b in itertools.product(sizes, sizes):
            calls += [
                lambda: n.span_root([b"x"] * 2, a, b), lambda: n.span_root_of_leaves([h] * 2, a, b),
                lambda: n.span_root_of_leaves([], a, b), lambda: n.span_root([], a, b),
                lambda: n.root_from_inclusion(h, a, b, [h] * 64), lambda: n.root_from_inclusion(h, a, b, []),
                lambda: n.verify_consistency(a, b, h, h, [h] * 64), lambda: n.verify_consistency(a, b, h, h, []),
                lambda: n.frontier_extend(a, [h] * (bin(a).count("1") if isinstance(a, int) and a >= 0 else 0), [h] * 3, 1),
            ]
        for a in sizes:
            calls += [lambda: n.inclusion_proof([b"x"] * 3, a), lambda: n.consistency_proof([b"x"] * 3, a),
                      lambda: n.frontier_extend(0, [], [h] * 5, a), lambda: n.inclusion_proof([], a)]
        panics = 0
        for c in calls:
            try:
                c()
            except Exception:
                pass
            except BaseException as exc:
                panics += 1
                print("PANIC", exc)
        print("panics", panics)
    """, timeout=300)
    assert done.returncode == 0, done.stderr[-500:]
    out = [line for line in done.stdout.splitlines() if line.startswith("PANIC")]
    # u64::MAX frontier panics are refused as test_frontier_past_u64_refuses shows
    assert all("frontier root for each 1-bit" in line for line in out), out


def test_bytearrays_resized_and_rewritten_by_another_thread_while_hashing() -> None:
    """Bytearrays are copied before the GIL is released: no crash, and never a torn hash."""
    done = run_py("""
        import threading
        from blake3 import blake3
        from compactstore import _native as n, merkle, content
        A, B = b"A" * (600 * 1024), b"B" * (600 * 1024)
        ok = {blake3(b"\\x00" + A).digest(), blake3(b"\\x00" + B).digest()}
        buf = bytearray(A)
        small = [bytearray(b"a" * 1500) for _ in range(400)]
        stop = False
        def mutate():
            i = 0
            while not stop:
                buf[:] = B if i % 2 else A
                for s in small[:50]:
                    s.extend(b"x"); del s[-1:]
                    s[:] = b"q" * (1 + i % 3000)
                i += 1
        t = threading.Thread(target=mutate); t.start()
        try:
            for _ in range(150):
                assert n.leaf_hash(buf) in ok
                assert n.leaf_hashes([buf, buf])[0] in ok
                n.tree_root(small); n.leaf_hashes(small); n.tree_root([buf] * 3)
                n.span_root(small, 0, len(small))
                n.inclusion_proof(small, 7); n.consistency_proof(small, 9)
                d = content.digester(); d.update(small); d.update([buf]); d.digest()
                n.node_hash(buf, buf); n.digest(buf, None)
        finally:
            stop = True; t.join()
        print("ok")
    """, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-600:])


def test_threads_hashing_side_by_side_agree_with_the_reference() -> None:
    done = run_py("""
        import threading
        from compactstore import merkle, merkle_pure
        entries = [bytes([i % 256]) * (i % 3000) for i in range(1200)]
        want_root = merkle_pure.tree_root(entries)
        want_leaves = merkle_pure.leaf_hashes(entries)
        errors = []
        def work(k):
            try:
                for r in range(6):
                    assert merkle.tree_root(entries) == want_root
                    assert merkle.leaf_hashes(entries) == want_leaves
                    assert merkle.root_of_leaves(want_leaves) == want_root
                    assert merkle.inclusion_proof(entries, (k * 37 + r) % 1200) == merkle_pure.inclusion_proof(entries, (k * 37 + r) % 1200)
            except BaseException as exc:
                errors.append(repr(exc))
        ts = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        [t.start() for t in ts]; [t.join() for t in ts]
        print("errors", errors)
    """, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "errors []", (done.stdout, done.stderr[-600:])


def test_fork_after_use_and_while_other_threads_hash() -> None:
    """A child forked after threads hashed, and while other threads are in parallel hashing, hashes on threads of its own."""
    done = run_py("""
        import os, signal, threading
        from compactstore import merkle, merkle_pure
        entries = [bytes([i % 256]) * 1500 for i in range(1000)]   # ~1.5 MB: above every parallel cut
        want = merkle_pure.tree_root(entries)
        assert merkle.tree_root(entries) == want          # hashed on every core
        stop = False
        def busy():
            while not stop:
                merkle.tree_root(entries); merkle.leaf_hashes(entries)
        ts = [threading.Thread(target=busy) for _ in range(2)]
        [t.start() for t in ts]
        bad = 0
        try:
            for _ in range(25):
                pid = os.fork()
                if pid == 0:
                    signal.alarm(20)
                    ok = merkle.tree_root(entries) == want and merkle.leaf_hashes(entries)[5] == merkle_pure.leaf_hash(entries[5])
                    os._exit(0 if ok else 1)
                _, status = os.waitpid(pid, 0)
                bad += status != 0
        finally:
            stop = True
            [t.join() for t in ts]
        print("bad", bad)
    """, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "bad 0", (done.stdout, done.stderr[-600:])


def test_encoder_and_hashing_do_not_leak_memory() -> None:
    """Many calls of every entry point, accepted and refused: the resident size settles."""
    done = run_py("""
        import resource, gc
        from compactstore import _native as n, events as E, merkle, content
        h = bytes(32)
        t = E.Turn(role="r", content="c" * 100, meta={"a": [1, 2, {"b": "x"}]})
        bad = E.ToolResult(call_id="c", output=[1.5])
        def round_():
            for _ in range(2000):
                E._NATIVE.encode([t, t, bad, t], 0, iter(range(10)).__next__, 1)
                E._NATIVE.encode([t], 0, iter([10**30]).__next__, 1000)
                n.leaf_hashes([b"x" * 100] * 20); n.tree_root([b"y" * 50] * 20)
                n.frontier_push(3, [h, h], [h] * 5, 1)
                n.root_from_inclusion(h, 1, 5, [h, h, h])
                d = content.digester(); d.update([b"a" * 10, bytearray(b"b" * 10)]); d.digest()
                try: n.fold([h, b"x"])
                except ValueError: pass
                try: n.leaf_hashes([b"x", None])
                except TypeError: pass
        def rss():
            gc.collect()
            return int(open("/proc/self/statm").read().split()[1]) * 4096
        round_(); base = rss()
        for _ in range(5): round_()
        print((rss() - base) // 1024)
    """, timeout=600)
    assert done.returncode == 0, done.stderr[-400:]
    assert int(done.stdout.strip()) < 20 * 1024, f"grew by {done.stdout.strip()} KiB"


# =====================================================================================
# 5. More routing and end-to-end checks
# =====================================================================================


E2E = r'''
import hashlib, sys, tempfile, os, random, itertools
import compactstore as cs
from compactstore import merkle
out = hashlib.sha256()
def feed(x): out.update(repr(x).encode("utf-8", "surrogatepass"))
rnd = random.Random(int(sys.argv[1]))
texts = ["", "a", "\x00", "\u2028", "é", "😀", '"\\', "x" * 17, "\ud800", "\x1f" * 33, "中" * 100]
def t(): return rnd.choice(texts) + rnd.choice(texts)
def j(d=0):
    c = rnd.randrange(8 if d < 3 else 5)
    return [lambda: None, lambda: True, lambda: rnd.choice([0, -1, 2**63 - 1, 2**64 - 1, 2**64, 1.5]), t,
            lambda: rnd.randrange(10), lambda: [j(d + 1) for _ in range(rnd.randrange(3))],
            lambda: {t(): j(d + 1) for _ in range(rnd.randrange(3))}, lambda: tuple(j(d + 1) for _ in range(2))][c]()
def ev():
    k = rnd.randrange(6)
    if k == 0: return cs.Turn(role=rnd.choice(["user", "", "ü"]), content=t(), meta=rnd.choice([None, {t(): j()}]))
    if k == 1: return cs.ToolCall(call_id="c" + t(), name="n", args={t(): j() for _ in range(rnd.randrange(3))})
    if k == 2: return cs.ToolResult(call_id="c", output=j(), ok=rnd.choice([True, False]))
    if k == 3: return cs.events.Binding(key="k" + t(), value=j())
    if k == 4: return cs.events.HandleOpened(handle="h", resource=rnd.choice(["other", "".join(["oth", "er"]), "file", "bogus"]))
    return cs.events.Write(checkpoint="cp", task=t(), channel="ch", idx=rnd.choice([0, 1, -5, 2**64]))
clock = itertools.count(1_767_225_600_000_000, 1000).__next__
with tempfile.TemporaryDirectory() as d:
    with cs.open(os.path.join(d, "s.db"), clock=clock) as store:
        s = store.session("s")
        for _ in range(40):
            batch = [ev() for _ in range(rnd.randrange(1, 6))]
            try:
                recs = s.extend(batch) if len(batch) > 1 else [s.append(batch[0])]
                feed([(r.pos, r.body, r.leaf) for r in recs])
            except Exception as exc:
                feed(("refused", type(exc).__name__, getattr(exc, "field", None)))
        n = s.head().size
        feed(s.head().root)
        for p in range(0, n, 3):
            feed(s.inclusion_proof(p))
        for m in range(0, n + 1, 4):
            feed(s.consistency_proof(m))
        for a in range(0, n, 5):
            feed(s.span_root(a, min(n, a + 7)))
print(merkle.IMPLEMENTATION, n, out.hexdigest())
'''


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_store_workload_is_identical_natively_and_with_compactstore_pure(seed: int) -> None:
    """Bodies, leaves, refusals, heads, proofs and span roots of a hostile workload, in two processes."""
    native_run = subprocess.run([sys.executable, "-c", E2E, str(seed)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                                env={k: v for k, v in os.environ.items() if k != "COMPACTSTORE_PURE"})
    pure_run = subprocess.run([sys.executable, "-c", E2E, str(seed)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                              env={**os.environ, "COMPACTSTORE_PURE": "1"})
    assert native_run.returncode == pure_run.returncode == 0, (native_run.stderr[-400:], pure_run.stderr[-400:])
    kind_a, n_a, digest_a = native_run.stdout.split()
    kind_b, n_b, digest_b = pure_run.stdout.split()
    assert (kind_a, kind_b) == ("native", "pure")
    assert int(n_a) > 10 and (n_a, digest_a) == (n_b, digest_b)


def test_iterator_proofs_verify_the_same_on_both_paths() -> None:
    entries = [bytes([i]) for i in range(5)]
    leaves = P.leaf_hashes(entries)
    proof, root = P.inclusion_proof(entries, 2), P.tree_root(entries)
    cproof, old = P.consistency_proof(entries, 3), P.tree_root(entries[:3])
    assert M.root_from_inclusion(leaves[2], 2, 5, iter(proof)) == P.root_from_inclusion(leaves[2], 2, 5, iter(proof))
    assert M.verify_consistency(3, 5, old, root, iter(cproof)) == P.verify_consistency(3, 5, old, root, iter(cproof))


class LenLies(bytes):
    def __len__(self) -> int:
        return 32


class AlwaysEqual(bytes):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = bytes.__hash__


@pytest.mark.parametrize("case", ["len-lies", "eq-lies"])
def test_bytes_subclasses_that_lie_verify_alike(case: str) -> None:
    if case == "len-lies":
        leaf = LenLies(b"abcde")
        assert M.root_from_inclusion(leaf, 0, 1, []) == P.root_from_inclusion(leaf, 0, 1, [])
    else:
        root = P.tree_root([b"a", b"b"])
        fake_empty = AlwaysEqual(bytes(32))
        assert M.verify_consistency(0, 2, fake_empty, root, []) == P.verify_consistency(0, 2, fake_empty, root, [])


def test_digest_fn_takes_the_same_arguments() -> None:
    assert outcome(M.digest_fn(), data=b"x", key=None) == outcome(P.digest_fn(), data=b"x", key=None)


def test_an_encoder_refuses_a_depth_past_its_cap_and_declines_deeper_json_without_overflow() -> None:
    """Depth is native stack: past the cap the constructor refuses; at it, any deeper value is declined, on a small thread stack too."""
    done = run_py("""
        import threading
        from compactstore import events as E
        from compactstore.native import Encoder
        plans = [(t, parts) for t, plan in E._PLANS.items() if (parts := E._native_plan(t, plan)) is not None]
        try:
            Encoder(plans, 1 << 40, 10**9)
        except ValueError as exc:
            print("refused", exc)
        enc = Encoder(plans, 1 << 40, 256)
        v = 1
        for _ in range(2_000_000):
            v = [v]
        got = []
        threading.stack_size(256 * 1024)
        t = threading.Thread(target=lambda: got.append(enc.encode([E.ToolResult(call_id="c", output=v)], 0, lambda: 1, 1)[3]))
        t.start(); t.join()
        print("stop", got)
    """)
    assert done.returncode == 0, (done.returncode, done.stderr[-300:])
    assert "refused depth must be at most 256" in done.stdout and "stop [0]" in done.stdout


def test_run_root_with_equals_the_reference_root_with() -> None:
    for n in (1, 2, 15, 16, 17, 33, 100, 257):
        leaves = P.leaf_hashes([i.to_bytes(4, "big") for i in range(n)])
        fetch = _store_of(leaves)
        for start in range(0, n, max(1, n // 7)):
            for stop in range(start, n + 1, max(1, n // 5)):
                run = leaves[start:stop]
                assert M.run_root_with(start, run, n, fetch) == P.root_with(dict(enumerate(run, start)), n, fetch) == P.root_of_leaves(leaves)


def test_daemon_threads_hashing_at_interpreter_exit() -> None:
    """Threads inside native calls (GIL released) when the interpreter exits: a clean exit, no abort."""
    for mode in ("tree", "leaves", "content", "leaf"):
        done = run_py(f"""
            import threading, time
            from compactstore import merkle, content
            entries = [bytes([i % 256]) * 1500 for i in range(3000)]
            def loop():
                while True:
                    if "{mode}" == "tree": merkle.tree_root(entries)
                    elif "{mode}" == "leaves": merkle.leaf_hashes(entries)
                    elif "{mode}" == "content":
                        d = content.digester(); d.update(entries); d.digest()
                    else: merkle.leaf_hash(b"x" * (1 << 20))
            for _ in range(4):
                threading.Thread(target=loop, daemon=True).start()
            time.sleep(0.3)
            print("exiting")
        """, timeout=120)
        assert done.returncode == 0 and "exiting" in done.stdout, (mode, done.returncode, done.stderr[-300:])


def test_large_batches_across_every_parallel_cut_equal_the_reference() -> None:
    """300k leaves (parallel pairs and roots), 70k entries (parallel leaves), odd sizes around TASK_NODES multiples."""
    leaves = [blake3(i.to_bytes(4, "big")).digest() for i in range(300_007)]
    assert M.root_of_leaves(leaves) == P.root_of_leaves(leaves)
    assert M.subtree_levels(leaves) == P.subtree_levels(leaves)
    for n in (2047, 2048, 2049, 3 * 1024 + 5, 65_537):
        assert M.root_of_leaves(leaves[:n]) == P.root_of_leaves(leaves[:n])
        assert M.span_root_of_leaves(leaves, 7, 7 + n) == P.span_root_of_leaves(leaves, 7, 7 + n)
    entries = [bytes([i % 256]) * (i % 40) for i in range(70_000)]
    assert M.leaf_hashes(entries) == P.leaf_hashes(entries)
    assert M.tree_root(entries) == P.tree_root(entries)
    f, g = M.Frontier(), P.Frontier()
    assert f.extend(leaves[:100_003], every=4) == g.extend(leaves[:100_003], every=4)
    assert f.extend_root(leaves[100_003:200_000], every=4) == g.extend_root(leaves[100_003:200_000], every=4)


@pytest.mark.parametrize("fn", ["leaf_hashes", "tree_root", "inclusion_proof"])
def test_list_subclass_entries_are_read_as_the_reference_reads_them(fn: str) -> None:
    class Shadow(list):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            return iter([b"other", b"x"])

    entries = Shadow([b"a", b"b"])
    args: tuple[Any, ...] = (entries, 0) if fn == "inclusion_proof" else (entries,)
    assert getattr(M, fn)(*args) == getattr(P, fn)(*args)
