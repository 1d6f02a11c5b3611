"""Every event enters by one rule, the same on every backend: exact types, no NUL character, bounded names.

The fields are read from the event types' definitions, so a field added later is held to
the rules without a line here: each string field of each kind is given a NUL, each field
a container whose own methods hide what it holds, each name a length past the bound.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compactstore as cs
from compactstore import events as ev
from compactstore import rules

from strategies import json_values, texts


def _value(t: mi.Type) -> object:
    """Return a plain value of msgspec type ``t`` that decoding accepts."""
    if isinstance(t, mi.UnionType):
        return _value(next(m for m in t.types if not isinstance(m, mi.NoneType)))
    if isinstance(t, mi.StrType):
        return "x"
    if isinstance(t, mi.IntType):
        return 0
    if isinstance(t, mi.BoolType):
        return False
    if isinstance(t, mi.LiteralType):
        return t.values[0]
    if isinstance(t, mi.EnumType):
        return next(iter(t.cls))
    if isinstance(t, mi.ListType):
        return []
    if isinstance(t, mi.DictType):
        return {}
    return 1


def _fields(cls: type) -> list[mi.Field]:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return list(info.fields)


def _base(cls: type[ev.Event]) -> dict[str, object]:
    """Return the required fields of an event of type ``cls``, each a plain value."""
    return {f.name: _value(f.type) for f in _fields(cls) if f.required}


def _strip(t: mi.Type) -> mi.Type:
    if isinstance(t, mi.UnionType):
        rest = [m for m in t.types if not isinstance(m, mi.NoneType)]
        return rest[0] if len(rest) == 1 else t
    return t


def _with_nul(t: mi.Type) -> Iterator[tuple[object, str]]:
    """Yield values of type ``t`` holding a NUL character, each with the path (after the field) that holds it."""
    t = _strip(t)
    if isinstance(t, mi.StrType):
        yield "a\x00b", ""
    elif isinstance(t, mi.ListType):
        for value, where in _with_nul(t.item_type):
            yield [value], f"[0]{where}"
    elif isinstance(t, mi.DictType):
        yield {"k\x00": _value(t.value_type)}, ""
        for value, where in _with_nul(t.value_type):
            yield {"k": value}, f".k{where}"
    elif isinstance(t, mi.StructType):
        for f in t.fields:
            for value, where in _with_nul(f.type):
                yield {**{g.name: _value(g.type) for g in t.fields if g.required}, f.name: value}, f".{f.name}{where}"
    elif isinstance(t, mi.AnyType):
        yield "a\x00", ""
        yield {"x": ["ok", "a\x00"]}, ".x[1]"
        yield {"\x00": 1}, ""


def _nul_cases() -> list[tuple[type[ev.Event], str, object, str]]:
    out = []
    for cls in ev.EVENT_TYPES:
        for f in _fields(cls):
            t = _strip(f.type)
            parts = t.item_type if isinstance(t, mi.ListType) and isinstance(t.item_type, mi.StructType) else None
            for value, where in _with_nul(t):
                if parts is not None:  # a summary node's facts, items, excerpts, spills: as the structs they are
                    value = [msgspec.convert(value[0], parts.cls)]  # type: ignore[index]
                out.append((cls, f.name, value, f.name + where))
    return out


NUL_CASES = _nul_cases()


def test_every_kind_and_every_text_field_is_walked() -> None:
    """The walk reaches every event kind and every field that can hold a string (a guard on the walk itself)."""
    walked = {(cls, name) for cls, name, _, _ in NUL_CASES}
    assert {cls for cls, _ in walked} == set(ev.EVENT_TYPES)
    assert (ev.ToolResult, "output") in walked and (ev.Binding, "key") in walked
    assert (ev.Summary, "negative_facts") in walked and (ev.Obligation, "needs") in walked


@pytest.mark.parametrize(("cls", "name", "value", "path"), NUL_CASES,
                         ids=[f"{c.__name__}.{p}" for c, _, _, p in NUL_CASES])
def test_a_nul_anywhere_in_an_event_is_refused_alike_on_every_backend(
    store: cs.Store, cls: type[ev.Event], name: str, value: object, path: str
) -> None:
    """A NUL in any string of any kind, at any depth, is an InvalidEvent naming where; nothing is written, and the log verifies."""
    s = store.session("s")
    s.append(cs.Turn("user", "first"))
    key = None
    if name == "idempotency_key":  # given as the store takes it
        event, key = cls(**_base(cls)), value  # type: ignore[call-arg]
    else:
        event = cls(**{**_base(cls), name: value})  # type: ignore[call-arg]
    with pytest.raises(cs.InvalidEvent) as one:
        s.append(event, idempotency_key=key)  # type: ignore[arg-type]
    assert (one.value.field, "NUL" in one.value.reason) == (path, True)
    with pytest.raises(cs.InvalidEvent) as batch:
        s.extend([cs.Turn("user", "ok"), event], idempotency_keys=None if key is None else [None, key])  # type: ignore[list-item]
    assert batch.value.field == f"events[1].{path}"
    assert s.size == 1 and store.verify().ok


def test_a_hand_written_line_holding_a_nul_is_refused_by_decode() -> None:
    """decode, which reads lines from outside the store, refuses what append refuses."""
    with pytest.raises(cs.InvalidEvent) as info:
        ev.decode(b'{"kind":"binding","key":"a\\u0000b","value":1}')
    assert info.value.field == "key"
    assert ev.decode(b'{"kind":"binding","key":"a\\\\u0000b","value":1}').key == "a\\u0000b"  # type: ignore[attr-defined]


#: Characters both backends must store as given: every other control character, DEL,
#: separators, a non-character, a combining mark, an astral one.
ODD = "".join(map(chr, range(1, 32))) + "\x7f\u2028\u2029\ufffe\u0301\U0001f600é"


def _raw_events(text: str) -> list[ev.Event]:
    """Return an event of each raw kind with every string field set to ``text`` (names too), some of them negative."""
    out: list[ev.Event] = []
    for cls in ev.EVENT_TYPES:
        if str(cls.__struct_config__.tag) in ev.DERIVED_KINDS:
            continue
        fields = _base(cls)
        for f in _fields(cls):
            t = _strip(f.type)
            if f.name == "idempotency_key":
                continue
            if isinstance(t, mi.StrType):
                fields[f.name] = text
            elif isinstance(t, mi.ListType) and isinstance(t.item_type, mi.StrType):
                fields[f.name] = [text]
            elif isinstance(t, mi.DictType | mi.AnyType):
                fields[f.name] = {text: [text]}
        for status in (None, "failed", "rejected", "superseded"):
            out.append(cls(**fields, status=status, ts=1))  # type: ignore[call-arg]
    return out


@pytest.mark.parametrize("text", [ODD, "é" * (ev.MAX_NAME_BYTES // 2), "\U0001f600" * (ev.MAX_NAME_BYTES // 4)])
def test_every_string_both_backends_take_is_stored_as_the_same_bytes(store: cs.Store, text: str) -> None:
    """Odd characters, and names of exactly MAX_NAME_BYTES bytes, in every field of every raw kind: each body is its canonical bytes, on every backend."""
    s = store.session("s")
    events = _raw_events(text)
    s.extend(events)
    for record, event in zip(s.scan(), events):
        assert record.body == ev.canonical(event)[1]
    assert store.verify().ok


def _name_fields() -> list[tuple[type[ev.Event], str]]:
    return [(cls, name) for cls in ev.EVENT_TYPES for name in ev.NAMES[cls]]


#: The str fields that hold text, not names, per kind: with NAMES, every str field of every kind.
TEXT = {
    ev.Turn: {"role", "content", "name"}, ev.ToolCall: {"name"}, ev.Binding: {"how"},
    ev.HandleOpened: {"detail"}, ev.Summary: {"span_root", "summary", "contract", "content_digest"},
    ev.Spill: {"digest"}, ev.RecoveryMarker: {"root", "mac", "conditions"}, ev.Attempt: {"operation"},
    ev.Redaction: {"reason"}, ev.GraphState: {"id", "ns", "parent"},
    ev.Write: {"checkpoint", "task", "channel", "path", "ns"}, ev.Retention: {"index_digest"},
}


def test_every_str_field_is_a_name_or_text() -> None:
    """A field added to a kind must be classed: a name is bounded and found by equality, text is neither."""
    for cls in ev.EVENT_TYPES:
        strs = {f.name for f in _fields(cls) if isinstance(t := _strip(f.type), mi.StrType)
                or isinstance(t, mi.ListType) and isinstance(t.item_type, mi.StrType)}
        assert strs == set(ev.NAMES[cls]) | TEXT.get(cls, set()), cls.__name__
        assert not set(ev.NAMES[cls]) & TEXT.get(cls, set())


@pytest.mark.parametrize(("cls", "name"), _name_fields(), ids=[f"{c.__name__}.{n}" for c, n in _name_fields()])
def test_a_name_past_the_bound_is_refused_alike_on_every_backend(store: cs.Store, cls: type[ev.Event], name: str) -> None:
    """A name of MAX_NAME_BYTES + 1 bytes is an InvalidEvent naming it, on every backend, in append and extend."""
    s = store.session("s")
    long = "é" * (ev.MAX_NAME_BYTES // 2) + "x"
    is_list = isinstance(_strip(next(f.type for f in _fields(cls) if f.name == name)), mi.ListType)
    key = long if name == "idempotency_key" else None
    fields = _base(cls) if key else {**_base(cls), name: [long] if is_list else long}
    want = f"{name}[0]" if is_list else name
    with pytest.raises(cs.InvalidEvent) as one:
        s.append(cls(**fields), idempotency_key=key)  # type: ignore[call-arg]
    with pytest.raises(cs.InvalidEvent) as batch:
        s.extend([cs.Turn("user", "ok"), cls(**fields)], idempotency_keys=None if key is None else [None, key])  # type: ignore[call-arg]
    assert (one.value.field, batch.value.field) == (want, f"events[1].{want}")
    assert s.size == 0


def test_a_binding_key_of_ten_megabytes_is_refused_before_any_lookup(store: cs.Store) -> None:
    """The key that made a gate's look-up per need cost its length each time never enters the log."""
    s = store.session("s")
    with pytest.raises(cs.InvalidEvent, match="name of more than"):
        s.append(cs.Binding("k" * 10_000_000, 1))
    assert s.size == 0


# --- exact types: what a container's own methods say is not read -----------------------


class _HidingDict(dict):  # type: ignore[type-arg]
    """A dict whose methods show nothing of what it holds."""

    def items(self) -> Any:
        return iter(())

    def keys(self) -> Any:
        return iter(())

    def values(self) -> Any:
        return iter(())

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0


class _HidingList(list):  # type: ignore[type-arg]
    """A list whose methods show nothing of what it holds."""

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0


def _deep(levels: int) -> object:
    value: object = "x"
    for _ in range(levels):
        value = [value]
    return value


#: What JSON would store as something else (null, base64, text) or not at all.
POISON = {"nan": float("nan"), "-inf": float("-inf"), "bytes": b"\x00\x01", "set": {1}, "datetime": datetime.date(2026, 1, 1),
          "deep": _deep(ev.MAX_DEPTH + 2), "int key": {1: "one"}, "huge int": 10**5000}


FIELDS = [(cls, f.name) for cls in ev.EVENT_TYPES for f in _fields(cls)]


@pytest.mark.parametrize(("cls", "name"), FIELDS, ids=[f"{c.__name__}.{n}" for c, n in FIELDS])
def test_a_container_that_hides_what_it_holds_is_read_by_what_it_holds(store: cs.Store, cls: type[ev.Event], name: str) -> None:
    """Poison behind a dict's items() or a list's __iter__, in any field of any kind, is refused naming that field; nothing is written."""
    s = store.session("s")
    for poison in POISON.values():
        for value in (_HidingDict({"k": poison}), _HidingList([poison])):
            for write in (lambda e: s.append(e), lambda e: s.extend([cs.Turn("user", "ok"), e])):
                with pytest.raises(cs.InvalidEvent) as info:
                    write(cls(**{**_base(cls), name: value}))  # type: ignore[call-arg]
                assert info.value.field.split("events[1].")[-1].startswith(name), info.value.field
    assert s.size == 0 and store.verify().ok


@pytest.mark.parametrize("poison", list(POISON))
def test_arguments_are_read_by_what_they_hold(store: cs.Store, poison: str) -> None:
    """reconstruct's uses, tool results and payload, read through hiding containers, are refused as InvalidArgument."""
    s = store.session("s")
    s.append(cs.Turn("user", "go"))
    art = s.artifact(s.compact(0, 1, summary="go"))
    calls = [
        lambda: s.reconstruct(art, "plan", uses=_HidingDict({"x": POISON[poison]})),
        lambda: s.reconstruct(art, "plan", uses={"x": 1}, tool_results=[_HidingList([POISON[poison]])]),
        lambda: cs.reconstruct(msgspec.structs.replace(art, payload=_HidingDict({"x": POISON[poison]})), "plan", s.lookup),
    ]
    for call in calls:
        with pytest.raises(cs.InvalidArgument):
            call()


@given(json_values)
@settings(max_examples=300, deadline=None)
def test_a_plain_value_reads_back_as_its_exact_copy(value: object) -> None:
    """as_json returns an equal value of exact types, with the same canonical bytes."""
    copy = ev.as_json("v", value)
    assert ev.encode_json(copy) == ev.encode_json(value)


# --- positions in text: ASCII digits, at most 19 ---------------------------------------

#: Spellings of a position that are not one: Unicode digits (``int`` reads '٣' as 3, refuses
#: '²'), spaces, signs, underscores, fullwidth digits, more digits than a position has.
SPELLINGS = ["²", "٣", "３", " 3", "3 ", "+3", "-1", "3_0", "0x3", "1" * 20, "9223372036854775808", "1" * 5000, ""]


@pytest.fixture
def spilled_session(store: cs.Store) -> cs.Session:
    """Return a session with a spill at position 3 and a binding keyed like a position in Unicode digits."""
    s = store.session("s")
    s.bind("rollback", "down.sql")  # 0
    s.oblige("finish", needs=["rollback"])  # 1
    s.append(cs.Turn("user", "go"))  # 2
    s.compact(0, 3, on_risk="spill")  # 3: the spill, 4: the node
    for spelling in SPELLINGS:
        if len(spelling) < 100:  # a longer one is no name (MAX_NAME_BYTES)
            s.bind(f"{spelling}:value", spelling)
    assert s.spilled("spill:3") == "down.sql"
    return s


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_no_spelling_but_ascii_digits_names_a_position(spilled_session: cs.Session, spelling: str) -> None:
    """lookup, spilled, recall and field paths take ASCII digits only: anything else is a key, or a typed refusal, never a ValueError."""
    s = spilled_session
    ascii_digits = spelling.isascii() and spelling.isdigit()
    if ascii_digits:  # too many digits for a position
        with pytest.raises(cs.InvalidArgument):
            s.lookup(f"{spelling}:value")
    else:  # a binding key, found as one
        assert s.lookup(f"{spelling}:value") == spelling
    with pytest.raises(cs.InvalidArgument):
        s.spilled(f"spill:{spelling}")
    with pytest.raises(cs.InvalidArgument):
        cs.recall.parse(f"span:{spelling}-99")
    with pytest.raises(KeyError):
        rules.extract(cs.ToolResult("c", output=["a", "b", "c", "d"]), f"output[{spelling}]")


@given(st.text(alphabet="0123456789²٣３ +-_:x", max_size=30))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_handle_or_name_is_answered_or_refused_as_invalid_argument(spilled_session: cs.Session, text: str) -> None:
    """Whatever the text, lookup and spilled return or raise InvalidArgument (or the spill's own refusals), nothing else."""
    s = spilled_session
    for call in (lambda: s.lookup(text), lambda: s.spilled(text), lambda: s.spilled(f"spill:{text}")):
        try:
            call()
        except (cs.InvalidArgument, cs.ReconstructionUnsoundError):
            pass


def test_a_lossless_artifact_over_a_key_in_unicode_digits_restores(store: cs.Store) -> None:
    """A binding keyed '²:v' is a key, not a position: a LOSSLESS artifact naming it restores."""
    s = store.session("s")
    s.bind("²:v", 1)
    s.bind("٣:v", 2)
    s.append(cs.Turn("user", "go"))
    art = s.artifact(s.compact(0, 3, loss=cs.LossClass.LOSSLESS, keep=cs.AUTO))
    assert art.payload["literals"]["²:v"] == 1 and art.payload["literals"]["٣:v"] == 2  # type: ignore[index]
    assert s.reconstruct(art, "authorize") == art.payload


# --- artifacts and operations: typed refusals, never a TypeError -----------------------


class _Str(str):
    """A str subclass that says it equals anything."""

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = str.__hash__


ODD_VALUES = [object(), [1], {}, {"a": 1}, 3, 1.5, True, b"LOSSLESS", _Str("LOSSLESS"), None, "garbage"]
TYPED = (cs.InvalidArgument, cs.ReconstructionUnsoundError)


@pytest.fixture
def artifact(store: cs.Store) -> tuple[cs.Session, cs.Artifact]:
    """Return a session and the artifact of a LOSSLESS node of it."""
    s = store.session("s")
    s.bind("k", 1)
    s.append(cs.Turn("user", "go"))
    return s, s.artifact(s.compact(0, 2, loss=cs.LossClass.LOSSLESS, keep=cs.AUTO))


@pytest.mark.parametrize("field", cs.Artifact.__struct_fields__)
def test_an_artifact_field_of_any_type_gets_a_typed_answer(artifact: tuple[cs.Session, cs.Artifact], field: str) -> None:
    """Each field of an artifact, replaced by any value, gets a payload or a typed refusal from every operation, on both paths."""
    s, art = artifact
    for odd in ODD_VALUES:
        given = msgspec.structs.replace(art, **{field: odd})
        for operation in ("plan", "authorize", "retry_idempotent"):
            for call in (lambda: s.reconstruct(given, operation, attempt="a" if operation == "retry_idempotent" else None),
                         lambda: cs.reconstruct(given, operation, s.lookup, prior={})):
                try:
                    call()
                except TYPED:
                    pass


@pytest.mark.parametrize("loss", [object(), [1], {}, 3, b"LOSSLESS", _Str("LOSSLESS")])
def test_an_unreadable_loss_tag_reads_as_lossy_literal(artifact: tuple[cs.Session, cs.Artifact], loss: object) -> None:
    """A loss tag that is no LossClass or str is unreadable: a tolerant operation gets the payload, a restoration is unsound."""
    s, art = artifact
    given = msgspec.structs.replace(art, loss=loss)
    assert cs.reconstruct(given, "plan", s.lookup) == art.payload
    with pytest.raises(cs.ReconstructionUnsoundError):
        cs.reconstruct(given, "authorize", s.lookup)
    with pytest.raises(cs.ReconstructionUnsoundError):
        s.reconstruct(given, "authorize")


@pytest.mark.parametrize("operation", [["authorize"], b"authorize", None, 5, _Str("authorize")])
def test_an_operation_that_is_no_str_is_refused_naming_operation(artifact: tuple[cs.Session, cs.Artifact],
                                                                 operation: object) -> None:
    """reconstruct(art, ["authorize"]) and its kin are an InvalidArgument naming ``operation``, on both paths."""
    s, art = artifact
    for call in (lambda: s.reconstruct(art, operation), lambda: cs.reconstruct(art, operation, s.lookup)):  # type: ignore[arg-type]
        with pytest.raises(cs.InvalidArgument) as info:
            call()
        assert info.value.field == "operation"


# --- costs: a literal's path is bounded --------------------------------------------------

_keys = st.one_of(texts(max_size=3), st.integers(1, 3000).map(lambda n: "k" * n))
_nested = st.recursive(st.one_of(st.none(), st.integers(), texts(max_size=4)),
                       lambda c: st.one_of(st.lists(c, max_size=5), st.dictionaries(_keys, c, max_size=3)), max_leaves=40)


@given(_nested)
@settings(max_examples=300, deadline=None)
def test_a_literal_path_is_bounded_so_literals_cost_what_their_event_does(value: object) -> None:
    """Every literal's path is at most MAX_PATH characters, and there are no more literals than bytes: spelling them is linear."""
    event = cs.ToolResult("c", output=value)
    lits = rules.literals_of(0, event)
    assert all(len(lit.path) <= rules.MAX_PATH for lit in lits)
    assert len(lits) <= len(ev.canonical(event)[1])
    for lit in lits:  # each literal is still read back from its path
        assert rules.same_value(rules.extract(event, lit.path), lit.value)


# --- a store written before the rules: read alike, copied alike ---------------------------


@pytest.mark.parametrize("event", [
    cs.ToolResult("c1", output="ERROR: \x00 in the stream", ok=False), cs.Binding("k\x00", 1),
    cs.ToolCall("c\x00", "run"), cs.Obligation("o\x00"), ev.HandleOpened(handle="h\x00"),
], ids=["failed output", "binding key", "call id", "obligation", "handle"])
def test_a_sqlite_store_holding_a_nul_reads_and_is_copied_to_either_backend_alike(
    tmp_path: Any, target: str, monkeypatch: pytest.MonkeyPatch, event: ev.Event
) -> None:
    """A store written before the rule stays readable and verifies; copying it is refused with the same InvalidEvent on SQLite and PostgreSQL."""
    src = str(tmp_path / "old.db")
    with monkeypatch.context() as m:  # written as a store without the entry rules wrote it
        m.setattr(ev, "check_entry", lambda event, body: None)
        m.setattr(ev, "_may_refuse", lambda events: False)
        with cs.open(src, clock=ev.tick_clock()) as old:
            old.session("s").extend([cs.Turn("user", "go"), event])
    with cs.open(src) as old, cs.open(target) as dst:
        kept = old.session("s").read(1).event
        assert old.verify().ok and kept == msgspec.structs.replace(event, ts=kept.ts)
        with pytest.raises(cs.InvalidEvent) as info:
            cs.copy(old, dst)
        assert "NUL" in info.value.reason
