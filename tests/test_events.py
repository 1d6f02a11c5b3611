"""The canonical encoding: one event, one byte string, whatever the caller's dict order."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compactstore as cs
from compactstore import events as ev

from strategies import events, json_values, texts, wild_events


@given(events())
@settings(max_examples=300, deadline=None)
def test_canonical_bytes_round_trip(event: cs.Event) -> None:
    """Decoding the canonical bytes and encoding again gives the same bytes."""
    canon, body = ev.canonical(event)
    assert ev.encode(canon) == body
    assert ev.decode(body) == canon
    assert ev.canonical(canon)[1] == body


@given(st.dictionaries(texts(max_size=8), json_values, max_size=8))
@settings(max_examples=200, deadline=None)
def test_map_order_does_not_change_the_bytes(args: dict[str, object]) -> None:
    """The same arguments inserted in another order encode identically."""
    reordered = dict(reversed(list(args.items())))
    a = ev.canonical(cs.ToolCall("c", "t", args))[1]
    b = ev.canonical(cs.ToolCall("c", "t", reordered))[1]
    assert a == b


def test_defaults_are_omitted_so_new_optional_fields_keep_old_bytes() -> None:
    """Unset optional fields are not encoded: bytes stay stable as the schema grows."""
    _, body = ev.canonical(cs.Turn("user", "hi", ts=1))
    assert body == b'{"content":"hi","kind":"turn","role":"user","ts":1}'


def test_tuples_are_stored_as_lists() -> None:
    """The canonical event is what decoding gives back (tuples become lists)."""
    canon, _ = ev.canonical(cs.ToolCall("c", "t", {"xs": (1, 2)}))
    assert canon.args == {"xs": [1, 2]}  # type: ignore[attr-defined]


def test_an_empty_tuple_for_a_list_field_is_omitted_like_the_default() -> None:
    """An empty tuple equals the field's default once decoded, so the bytes omit it."""
    assert ev.canonical(cs.Obligation("o", needs=()))[1] == ev.canonical(cs.Obligation("o"))[1]
    assert ev.canonical(cs.Obligation("o", needs=("k",)))[1] == ev.canonical(cs.Obligation("o", needs=["k"]))[1]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_numbers_are_refused(bad: float) -> None:
    """JSON would silently turn NaN into null; the store refuses it instead."""
    with pytest.raises(cs.InvalidEvent) as info:
        ev.canonical(cs.ToolResult("c", {"deep": [1, {"x": bad}]}))
    assert info.value.field == "output.deep[1].x"


def test_decode_rejects_unknown_kinds_and_garbage() -> None:
    """Bytes that are not a registered event are refused with InvalidEvent."""
    for body in (b'{"kind":"nope"}', b"not json", b'{"kind":"turn","role":"u"}'):
        with pytest.raises(cs.InvalidEvent):
            ev.decode(body)


def test_every_event_type_has_a_distinct_kind() -> None:
    """Kinds are the tags of the union the decoder accepts."""
    assert len(ev.KINDS) == len(ev.EVENT_TYPES)
    assert {"turn", "tool_call", "tool_result", "binding", "obligation", "node", "spill"} <= ev.KINDS
    assert cs.Turn("u", "x").kind == "turn"
    assert isinstance(msgspec.json.decode(ev.encode(cs.Turn("u", "x"))), dict)


def test_graph_state_and_write_events_have_fixed_bytes() -> None:
    """A framework's snapshot and pending write encode canonically; empty ids are refused."""
    _, cp = ev.canonical(cs.events.GraphState(id="c1", parent="c0", value={"b": 1}, ts=1))
    assert cp == b'{"id":"c1","kind":"graph_state","parent":"c0","ts":1,"value":{"b":1}}'
    _, w = ev.canonical(cs.events.Write(checkpoint="c1", task="t", channel="ch", idx=-1, value="v", ts=1))
    assert w == b'{"channel":"ch","checkpoint":"c1","idx":-1,"kind":"write","task":"t","ts":1,"value":"v"}'
    for bad, field in ((cs.events.GraphState(id=""), "id"), (cs.events.Write(checkpoint="", task="t", channel="c"), "checkpoint")):
        with pytest.raises(cs.InvalidEvent) as info:
            ev.canonical(bad)
        assert info.value.field == field
    with pytest.raises(cs.InvalidEvent) as info:
        ev.canonical(cs.events.GraphState(id="c", value={"x": float("nan")}))
    assert info.value.field == "value.x"


def _outcome(canonical: object, event: object) -> tuple[object, ...]:
    try:
        canon, body = canonical(event)  # type: ignore[operator]
    except Exception as exc:  # noqa: BLE001 - the refusal itself is what is compared
        return ("refused", type(exc), getattr(exc, "field", None), str(exc))
    assert ev.encode(canon) == body
    return ("ok", body, canon)


@given(st.one_of(events(), wild_events()))
@settings(max_examples=1500, deadline=None)
def test_fast_canonical_gives_the_bytes_and_refusals_of_the_decoding_path(event: object) -> None:
    """Skipping the validating decode changes nothing: same bytes, an equal event, the same refusal."""
    assert _outcome(ev.canonical, event) == _outcome(ev._canonical_by_decoding, event)


@given(wild_events())
@settings(max_examples=1500, deadline=None)
def test_every_refusal_is_invalid_event_naming_one_of_the_events_fields(event: object) -> None:
    """Whatever a field holds, the event is taken or refused as InvalidEvent under the name of a field it has."""
    fields = event.__struct_fields__  # type: ignore[attr-defined]
    for canonical in (ev.canonical, ev._canonical_by_decoding):
        try:
            canonical(event)
        except cs.InvalidEvent as exc:
            assert exc.field.split(".")[0].split("[")[0] in fields, exc.field


def _fresh(value: object, depth: int = 0) -> object:
    """An equal value built at run time, sharing no str with ``value`` (a literal's or a default's own object).

    Past a depth no encodable value reaches (one holding itself, say), the value itself.
    """
    if depth > 2 * ev.MAX_DEPTH:
        return value
    if type(value) is str:
        return "".join(list(value))
    if type(value) is list:
        return [_fresh(v, depth + 1) for v in value]
    if type(value) is dict:
        return {_fresh(k, depth + 1): _fresh(v, depth + 1) for k, v in value.items()}
    return value


@given(st.one_of(events(), wild_events()))
@settings(max_examples=800, deadline=None)
def test_equal_events_have_the_same_canonical_bytes(event: object) -> None:
    """The bytes depend on the event's value only: an equal event whose strings are other objects encodes the same."""
    fields = event.__struct_fields__  # type: ignore[attr-defined]
    twin = type(event)(**{f: _fresh(getattr(event, f)) for f in fields})
    assert twin == event
    first, second = _outcome(ev.canonical, event), _outcome(ev.canonical, twin)
    assert first[:2] == second[:2]


def test_a_default_built_at_run_time_is_omitted_as_the_default_is(tmp_path: Path) -> None:
    """HandleOpened(resource="other") encodes without ``resource`` whichever "other" object it holds, and the store verifies."""
    made = cs.events.HandleOpened("h", resource="".join(["oth", "er"]))  # type: ignore[arg-type]
    assert ev.canonical(made)[1] == ev.canonical(cs.events.HandleOpened("h"))[1] == b'{"handle":"h","kind":"handle_opened"}'
    with cs.open(str(tmp_path / "s.db")) as store:
        built = cs.events.HandleOpened("h", resource="".join(["fi", "le"]))  # type: ignore[arg-type]
        store.session("s").extend([made, built])
        store.session("s").append(made)
        assert store.verify().ok


def test_fast_canonical_is_taken_for_plain_events_only() -> None:
    """A plain event skips the decode (and is returned as given); a tuple or a NaN takes the slow way."""
    plain = cs.ToolCall("c1", "run", {"sql": "x", "n": [1, 2.5, None, True]}, ts=1, meta={"k": {}}, uses=["a"])
    assert ev.canonical(plain)[0] is plain
    assert ev.canonical(cs.ToolCall("c1", "run", {"xs": (1, 2)}, ts=1))[0].args == {"xs": [1, 2]}
    for odd in (cs.ToolResult("c", float("nan")), cs.Turn("user", "x", ts=True), cs.Turn("user", "x", uses=("a",))):
        assert not ev._PLAIN[type(odd)](odd)
    assert cs.events.Summary not in ev._PLAIN  # enums and nested structs: always decoded


def _decoded(body: bytes) -> tuple[str, object]:
    """What verify learns of a stored body by the union decoder: the event if its bytes are its encoding, else why not."""
    try:
        event = ev.decode_canonical(body)
    except ev.InvalidEvent as exc:
        return ("invalid", exc.field)
    return ("canonical", event) if ev.encode(event) == body else ("not canonical", event.kind)


_KINDS = st.sampled_from([t.__struct_config__.tag for t in ev.EVENT_TYPES])


@given(st.one_of(events(), wild_events()), _KINDS, st.sampled_from(["", " ", "kind", "space", "negative"]))
@settings(max_examples=600, deadline=None)
def test_decoding_by_a_known_kind_gives_what_the_union_decoder_gives(event: object, kind: str, edit: str) -> None:
    """canonical_of_kind returns exactly the canonical events of that kind the union decoder returns, and None for every other body."""
    try:
        body = ev.encode(event)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError):
        return
    if edit == " ":
        body = body.replace(b":", b": ", 1)
    elif edit == "kind":
        body = body.replace(b'"kind":"', b'"kind":"x', 1)
    elif edit == "space":
        body = b" " + body
    elif edit == "negative":
        body = body.replace(b"{", b'{"supersedes":-1,', 1) if b'"supersedes"' not in body else body
    got = ev.canonical_of_kind(body, kind)
    want = _decoded(body)
    if want[0] == "canonical" and want[1].kind == kind:  # type: ignore[attr-defined]
        assert got == want[1] and type(got) is type(want[1])
    else:
        assert got is None, (body, kind, want)


def test_decoding_by_kind_refuses_a_body_without_its_tag_and_a_kind_that_is_no_string() -> None:
    """A body missing its kind key, or a kind column that is not text, gets None: the union decoder says what is wrong."""
    body = ev.encode(cs.Turn("user", "hi", ts=1))
    assert ev.canonical_of_kind(body, "turn") == ev.decode_canonical(body)
    assert ev.canonical_of_kind(body.replace(b'"kind":"turn",', b""), "turn") is None
    assert ev.canonical_of_kind(body, b"turn") is None
    assert ev.canonical_of_kind(body, None) is None
    assert ev.canonical_of_kind(body, "tool_call") is None


def _prepare_one_by_one(batch: list[ev.Event], clock: ev.Clock,
                        other: Callable[[int, ev.Event], ev.Prepared]) -> list[ev.Prepared]:
    """What ev.prepare must give: canonical() of each stamped event, in order, the rest through ``other``."""
    out = []
    for i, event in enumerate(batch):
        if type(event) not in ev.EVENT_TYPES or event.ts is not None or event.idempotency_key is not None:
            out.append(other(i, event))
            continue
        try:
            canon, body = ev.canonical(msgspec.structs.replace(event, ts=clock()))
        except cs.InvalidEvent as exc:
            if len(batch) == 1:
                raise
            raise cs.InvalidEvent(f"events[{i}].{exc.field}", exc.reason) from exc
        out.append(ev.Prepared(canon, body, None, True))
    return out


@given(st.lists(st.one_of(events(), wild_events(), st.just({"kind": "turn"})), min_size=1, max_size=5))
@settings(max_examples=800, deadline=None)
def test_prepare_gives_what_canonical_gives_each_event_in_order(batch: list[ev.Event]) -> None:
    """The batch pass: the same events, bytes, refusals and clock readings as canonical() event by event."""
    def outcome(fn: Callable[..., list[ev.Prepared]]) -> tuple[object, ...]:
        clock = ev.tick_clock(1, 1)
        others: list[int] = []

        def other(i: int, event: ev.Event) -> ev.Prepared:
            others.append(i)
            return ev.Prepared(*ev.canonical(event), None, False)

        try:
            got = fn(batch, clock, other)
        except Exception as exc:  # noqa: BLE001 - the refusal itself is what is compared
            return ("refused", type(exc), getattr(exc, "field", None), str(exc), clock())
        return ("ok", [(p.event, p.body, p.key, p.stamped) for p in got], others, clock())

    assert outcome(ev.prepare) == outcome(_prepare_one_by_one)


# --- the native encoder of plain events, against the reference ---------------------


def _has_float(value: object) -> bool:
    if type(value) is float:
        return True
    if isinstance(value, list | tuple):
        return any(map(_has_float, value))
    if isinstance(value, dict):
        return any(map(_has_float, value.values()))
    if isinstance(value, msgspec.Struct):
        return any(_has_float(getattr(value, f)) for f in value.__struct_fields__)
    return False


_stamps = st.one_of(st.integers(0, 2**62), st.sampled_from([2**63 - 1, 2**64 - 1, 2**64, -1, True, 1.5, "x", None]))


@given(st.lists(st.one_of(events(), wild_events()).map(lambda e: msgspec.structs.replace(e, ts=None)),  # type: ignore[type-var]
                min_size=1, max_size=6), st.lists(_stamps, min_size=6, max_size=6), st.integers(0, 5))
@settings(max_examples=1500, deadline=None)
def test_native_encoder_gives_the_references_bytes_and_stamps(batch: list[ev.Event], stamps: list[object], start: int) -> None:
    """Native and reference read the same stamps in order and give the same bytes; the native stops earlier only at a float."""
    if ev._NATIVE is None:
        pytest.skip("compactstore.native is not in use: not built, or COMPACTSTORE_PURE=1")
    start = min(start, len(batch))
    twins = [type(e)(**{f: _fresh(getattr(e, f)) for f in e.__struct_fields__}) for e in batch]  # type: ignore[arg-type]
    for events in (batch, twins):
        got = ev._NATIVE.encode(events, start, iter(stamps).__next__, 1)
        want = ev._encode_plain_reference(events, start, iter(stamps).__next__, 1)  # type: ignore[arg-type]
        assert got[3] <= want[3]
        taken = got[3] - start
        assert got[0] == want[0][:taken] and got[1] == want[1][: len(got[1])]
        assert got[2] == events[start : got[3] + 1] and len(got[1]) == len(got[2])
        if got[3] < want[3]:
            assert _has_float(events[got[3]])


def test_native_encoder_scales_the_clock_and_raises_its_error() -> None:
    """``scale`` floor-divides each reading (the system clock in nanoseconds); a clock's error is raised as it is."""
    if ev._NATIVE is None:
        pytest.skip("compactstore.native is not in use: not built, or COMPACTSTORE_PURE=1")
    turns: list[ev.Event] = [cs.Turn("user", "a"), cs.Turn("user", "b")]
    readings = iter([1_999, 5_000])
    bodies, stamps, read, stop = ev._NATIVE.encode(turns, 0, readings.__next__, 1000)
    assert (stamps, read, stop) == ([1, 5], turns, 2)
    assert bodies == [ev.encode(msgspec.structs.replace(t, ts=s)) for t, s in zip(turns, stamps, strict=True)]

    def broken() -> int:
        raise OSError("no clock")

    with pytest.raises(OSError, match="no clock"):
        ev._NATIVE.encode(turns, 0, broken, 1)
    for encode in (ev._NATIVE.encode, ev._encode_plain_reference):
        with pytest.raises(ValueError, match="scale"):
            encode(turns, 0, readings.__next__, 0)
        # A reading that is not an int is divided as Python divides it, and the event is left to canonical().
        assert encode(turns, 0, iter([2500.0]).__next__, 1000)[1:] == ([2.0], turns[:1], 0)  # type: ignore[arg-type]
        # A stamp or a key of the event's own: not taken (prepare leaves such an event to its caller).
        own: list[ev.Event] = [cs.Turn("user", "a", ts=7), msgspec.structs.replace(cs.Turn("user", "b"), idempotency_key="k")]
        assert encode(own, 0, iter([1]).__next__, 1)[3] == 0
        assert encode(own, 1, iter([1]).__next__, 1)[3] == 1


def test_a_foreign_slot_is_read_by_name_not_by_offset() -> None:
    """A plan whose field a class borrowed from an unrelated type's member descriptor encodes nothing and does not crash."""
    code = (
        "from compactstore.native import Encoder\n"
        "class Big:\n    __slots__ = ('a', 'b', 'c', 'd')\n"
        "class B(bytes):\n    pass\n"
        "B.x = Big.__dict__['b']\n"
        "plan = [b'\"kind\":\"k\"', ('x', b'\"x\":', 0, False, [], 0, None, False, False, False, False)]\n"
        "print(Encoder([(B, plan)], 1 << 20, 64).encode([B(b'A' * 32)], 0, lambda: 0, 1)[3])\n"
    )
    if ev._NATIVE is None:
        pytest.skip("compactstore.native is not in use: not built, or COMPACTSTORE_PURE=1")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "0\n"), done.stderr


@given(st.lists(events(), min_size=2, max_size=5), st.integers(0, 4), st.integers(0, 4), st.booleans())
@settings(max_examples=150, deadline=None)
def test_a_clock_that_changes_the_callers_list_changes_nothing(batch: list[ev.Event], when: int, where: int,
                                                              keyed: bool) -> None:
    """prepare reads a copy of the list taken before the clock runs: each body is its own event's, on both paths."""
    batch = [msgspec.structs.replace(e, ts=None, idempotency_key=None) for e in batch]
    swap = cs.Turn("user", "swapped", idempotency_key="k" if keyed else None)

    def outcome() -> tuple[object, ...]:
        given, ticks = list(batch), itertools.count(1)

        def clock() -> int:
            tick = next(ticks)
            if tick == when + 1:
                given[where % len(given)] = swap
            return tick

        def other(i: int, e: ev.Event) -> ev.Prepared:
            raise AssertionError(f"events[{i}] went to other()")

        try:
            got = ev.prepare(given, clock, other)
        except cs.InvalidEvent as exc:
            return ("refused", exc.field)
        assert [p.event for p in got] == [msgspec.structs.replace(e, ts=p.event.ts) for e, p in zip(batch, got)]
        assert all(ev.encode(p.event) == p.body for p in got)
        return ("ok", [(p.event, p.body) for p in got])

    native = outcome()
    saved, ev._NATIVE = ev._NATIVE, None
    try:
        assert outcome() == native
    finally:
        ev._NATIVE = saved


class _OwnInt(int):
    """A clock reading that is an int, but not exactly one."""


#: Clock readings a caller's clock may give: within and past 64 bits, and not ints at all.
_READINGS = st.one_of(st.integers(0, 2**62), st.sampled_from([2**64 - 1, 2**64, -1, True, 1.5, None, "x", _OwnInt(3)]))


@given(st.lists(st.one_of(events(), wild_events(), st.just({"kind": "turn"})), min_size=1, max_size=5),
       st.one_of(st.none(), st.lists(_READINGS, min_size=6, max_size=6)))
@settings(max_examples=600, deadline=None)
def test_prepare_is_the_same_on_the_native_and_pure_paths(batch: list[ev.Event], readings: list[object] | None) -> None:
    """prepare gives the same events, bytes, refusals and clock readings with the native encoder and without it, whatever the clock reads."""
    def outcome() -> tuple[object, ...]:
        clock = ev.tick_clock(1, 1) if readings is None else iter([*readings, *[7] * 10]).__next__
        try:
            got = ev.prepare(batch, clock, lambda i, e: ev.Prepared(*ev.canonical(e), None, False))
        except Exception as exc:  # noqa: BLE001 - the refusal itself is what is compared
            return ("refused", type(exc), getattr(exc, "field", None), str(exc), clock())
        return ("ok", [(p.event, p.body, p.key, p.stamped) for p in got], clock())

    native = outcome()
    saved, ev._NATIVE = ev._NATIVE, None
    try:
        pure = outcome()
    finally:
        ev._NATIVE = saved
    assert native == pure


def test_a_float_enum_member_is_taken_and_reads_back_as_its_value(target: str) -> None:
    """A member of an enum of floats is written as its value, as members of str and int enums are, and reads back equal."""
    import enum

    class Ratio(float, enum.Enum):
        HALF = 0.5

    with cs.open(target) as st:
        s = st.session("a")
        got = s.append(cs.ToolResult("c1", {"ratio": Ratio.HALF}))
        assert s.read(got.pos).event.output == {"ratio": 0.5} == {"ratio": Ratio.HALF}


def test_a_plain_enum_member_is_refused_as_not_a_json_value(target: str) -> None:
    """A member of an Enum that is neither a str nor an int would read back as its bare value, unequal to it: refused."""
    import enum

    class Colour(enum.Enum):
        RED = 1

    assert Colour.RED != 1
    with cs.open(target) as st:
        with pytest.raises(cs.InvalidEvent, match="not a JSON value"):
            st.session("a").append(cs.ToolResult("c1", {"colour": Colour.RED}))
        assert st.session("a").size == 0


def test_a_float_enum_member_unequal_to_its_value_is_refused(target: str) -> None:
    """A float enum whose member is not its value (a __new__ setting _value_) would read back as the value, unequal to what was given: refused, naming the path."""
    import enum

    class Doubled(float, enum.Enum):
        def __new__(cls, value: float) -> Doubled:
            member = float.__new__(cls, value * 2)
            member._value_ = value
            return member

        HALF = 0.5

    assert Doubled.HALF == 1.0 and Doubled.HALF.value == 0.5
    with cs.open(target) as st:
        s = st.session("a")
        try:
            got = s.append(cs.ToolResult("c1", {"ratio": Doubled.HALF}))
        except cs.InvalidEvent as exc:
            assert "output.ratio" in str(exc)
            assert s.size == 0
            return
        back = s.read(got.pos).event.output
        assert back == {"ratio": Doubled.HALF}, f"given {float(Doubled.HALF)}, read back {back}"
