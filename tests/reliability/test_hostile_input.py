"""Hostile and malformed input over the public entry points.

Every call either succeeds (and then the store still verifies, and what was stored is
what was given) or raises a typed compactstore error (``InvalidEvent`` or
``InvalidArgument`` naming the field, or another ``CompactStoreError``) and leaves the
store byte-for-byte as it was: the database file and its WAL are compared before and
after. The property tests run a few hundred inputs per entry point by default and
thousands with ``--slow``.

Inputs that once broke these rules have tests of their own at the end.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_compaction import migration

import compactstore as cs
from compactstore import events as ev

#: Inputs each property test ran, by test: printed with ``-s``, recorded in RELIABILITY.md.
TRIED: dict[str, int] = {}


def _examples(request: pytest.FixtureRequest, default: int = 100) -> int:
    return 3000 if request.config.getoption("--slow") else default


def fuzz(request: pytest.FixtureRequest, strategy: st.SearchStrategy[Any], body: Callable[[Any], None],
         examples: int | None = None) -> None:
    """Run ``body`` over ``strategy`` (more examples with ``--slow``) and count the inputs."""
    name = request.node.name
    TRIED[name] = 0

    @settings(max_examples=examples or _examples(request), deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(args: Any) -> None:
        TRIED[name] += 1
        body(args)

    run()
    print(f"{name}: {TRIED[name]} inputs")


# --- the store under attack ------------------------------------------------------------


class Target:
    """An open store with a session holding every kind of event, and its files."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.store = cs.open(str(path), clock=cs.events.tick_clock())
        self.s = self.store.session("migration")
        migration(self.s)
        self.node = self.s.compact(0, 8, on_risk="spill")
        self.s.append(cs.Turn("assistant", "after"))
        self.marker = self.s.mark(self.node)

    def snapshot(self) -> tuple[bytes, ...]:
        """Return the bytes of the database file and its WAL."""
        return tuple(Path(str(self.path) + suffix).read_bytes() if Path(str(self.path) + suffix).exists() else b""
                     for suffix in ("", "-wal"))

    def refused(self, call: Callable[[], object], *, field: str | None = None) -> cs.CompactStoreError:
        """Assert ``call`` raises a typed error (naming ``field`` when given) and changes no byte."""
        before = self.snapshot()
        try:
            call()
        except cs.CompactStoreError as exc:
            err = exc
        else:
            raise AssertionError("accepted")
        assert self.snapshot() == before, f"{type(err).__name__} {err} but the store changed"
        if isinstance(err, cs.InvalidArgument):
            assert err.field, err
            if field is not None:
                assert err.field == field or err.field.startswith(field), (err.field, field)
        return err

    def attempt(self, call: Callable[[], object]) -> object | None:
        """Run ``call``: a typed error must leave every byte as it was; a success must verify."""
        before = self.snapshot()
        try:
            result = call()
        except cs.CompactStoreError as exc:
            assert self.snapshot() == before, f"{type(exc).__name__} {exc} but the store changed"
            if isinstance(exc, cs.InvalidArgument):
                assert exc.field, exc
            return None
        report = self.store.verify()
        assert report.ok, [str(p) for p in report.problems[:3]]
        return result


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Target]:
    """A store with the migration story, a spilling compaction and a marker."""
    t = Target(tmp_path / "hostile.db")
    yield t
    t.store.close()


# --- strategies --------------------------------------------------------------------------

NASTY_TEXT = [
    "", " ", "\x00", "\x1f", "\x7f", "a" * 600, "'; DROP TABLE events; --", "\" OR 1=1 --", "../../etc/passwd",
    "..\\..\\boot.ini", "/dev/null", "C:\\con", "spill:0", "%s%n", "${jndi:x}", "\u202e", "\ufeff", "𝔘𝔫𝔦", "ä" * 10,
]
ints = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, -1, 1, 2**31, 2**62]))
text = st.one_of(st.text(max_size=30), st.sampled_from(NASTY_TEXT))
finite = st.floats(allow_nan=False, allow_infinity=False)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), finite, text)
json_values = st.recursive(
    json_scalars, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(text, c, max_size=4)), max_leaves=10,
)
bad_scalars = st.one_of(
    st.just(float("nan")), st.just(float("inf")), st.just(-math.inf), st.just(object()), st.just(Ellipsis),
    st.just(complex(1, 2)), st.just(Path("/etc")),
)
bad_values = st.recursive(
    st.one_of(bad_scalars, json_scalars),
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.one_of(text, st.integers()), c, max_size=3)),
    max_leaves=8,
)
garbage = st.one_of(json_values, bad_values)
"""Values of every type the API may be handed: valid JSON, non-finite numbers, foreign objects."""


def _deep(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


KINDS: dict[str, type[cs.Event]] = {t.__struct_config__.tag: t for t in ev.EVENT_TYPES}  # type: ignore[misc]


@st.composite
def hostile_events(draw: st.DrawFn) -> cs.Event:
    """An event of any kind, each field valid-looking or garbage, built without validation."""
    cls = draw(st.sampled_from([KINDS[k] for k in ("turn", "tool_call", "tool_result", "binding", "obligation",
                                                   "fulfilment", "handle_opened", "handle_closed")]))
    fields = {}
    for name in cls.__struct_fields__:
        if name in ("ts", "supersedes", "idempotency_key"):
            continue
        if draw(st.booleans()):
            fields[name] = draw(st.one_of(garbage, st.just(_deep(80)), st.just("x" * 10)))
    try:
        return cls(**fields)
    except TypeError:  # a required field left out: msgspec insists on it
        return cls(**{n: fields.get(n, "x") for n in cls.__struct_fields__ if n not in
                      ("ts", "supersedes", "idempotency_key")})


def _given(value: object) -> object:
    """What the caller gave, as the store must keep it: tuples read back as lists."""
    if isinstance(value, tuple | list):
        return [_given(v) for v in value]
    if isinstance(value, dict):
        return {k: _given(v) for k, v in value.items()}
    return value


# --- property tests -------------------------------------------------------------------


def test_append_of_any_event(target: Target, request: pytest.FixtureRequest) -> None:
    """append(event) of any kind with garbage in any field: typed error and no change, or stored exactly as given."""

    def body(e: cs.Event) -> None:
        rec = target.attempt(lambda: target.s.append(e))
        if rec is None:
            return
        assert isinstance(rec, cs.Record)
        for name in e.__struct_fields__:
            if name in ("ts",):
                continue
            assert _given(getattr(rec.event, name)) == _given(getattr(e, name)), name

    fuzz(request, hostile_events(), body)


def test_extend_of_any_batch(target: Target, request: pytest.FixtureRequest) -> None:
    """extend(events, idempotency_keys=...) with garbage: all or nothing, the error naming events[i]."""
    keys = st.one_of(st.none(), st.lists(st.one_of(st.none(), text, ints), min_size=0, max_size=4))

    def body(args: tuple[list[cs.Event], list[object] | None]) -> None:
        events, idem = args
        size = target.s.size
        out = target.attempt(lambda: target.s.extend(events, idempotency_keys=idem))  # type: ignore[arg-type]
        if out is not None:
            assert target.s.size <= size + len(events)

    fuzz(request, st.tuples(st.lists(hostile_events(), max_size=4), keys), body)


def test_structural_calls(target: Target, request: pytest.FixtureRequest) -> None:
    """bind / oblige / fulfil with garbage arguments."""
    calls = st.one_of(
        st.tuples(st.just("bind"), garbage, garbage, garbage, garbage),
        st.tuples(st.just("oblige"), garbage, st.lists(garbage, max_size=3), st.none(), st.none()),
        st.tuples(st.just("fulfil"), garbage, st.none(), st.none(), st.none()),
    )

    def body(c: tuple[str, object, object, object, object]) -> None:
        op, a, b, x, y = c
        if op == "bind":
            target.attempt(lambda: target.s.bind(a, b, regenerable=x, how=y))  # type: ignore[arg-type]
        elif op == "oblige":
            target.attempt(lambda: target.s.oblige(a, b))  # type: ignore[arg-type]
        else:
            target.attempt(lambda: target.s.fulfil(a))  # type: ignore[arg-type]

    fuzz(request, calls, body)


positions = st.one_of(ints, st.integers(-3, 20), st.floats(), st.none(), text)


def test_compact_and_digest(target: Target, request: pytest.FixtureRequest) -> None:
    """compact(start, stop, ...) and digest(nodes, ...) with garbage positions, summaries, loss classes and lists."""
    lists = st.lists(st.one_of(positions, garbage, st.builds(cs.events.Fact, positions, garbage, garbage),
                               st.builds(cs.events.Item, positions, garbage, garbage)), max_size=3)
    calls = st.one_of(
        st.tuples(st.just("compact"), positions, positions, st.one_of(st.none(), garbage), garbage,
                  st.one_of(st.just(cs.AUTO), lists), st.one_of(st.just(()), st.lists(st.one_of(
                      text, st.tuples(positions, text)), max_size=2)), st.one_of(garbage, st.sampled_from(
                          ["refuse", "preserve", "spill"]))),
        st.tuples(st.just("roll_up"), st.lists(positions, max_size=3), st.none(), st.one_of(st.none(), garbage),
                  st.one_of(st.none(), garbage), st.just(cs.AUTO), st.just(()), st.none()),
    )

    def body(c: tuple[Any, ...]) -> None:
        op, a, b, summary, loss, facts, keep, on_risk = c
        if op == "compact":
            kwargs = {"summary": summary, "negative_facts": facts, "keep": keep, "on_risk": on_risk}
            if loss is not None:
                kwargs["loss"] = loss
            target.attempt(lambda: target.s.compact(a, b, **kwargs))
        else:
            target.attempt(lambda: target.s.roll_up(a, summary=summary, loss=loss))

    fuzz(request, calls, body)


def test_markers_and_resume(target: Target, request: pytest.FixtureRequest) -> None:
    """mark(node), mark_raw(size), resume(marker) with garbage: typed error or a sound marker."""
    calls = st.tuples(st.sampled_from(["mark", "mark_raw", "resume"]), st.one_of(positions, garbage))

    def body(c: tuple[str, object]) -> None:
        op, arg = c
        if op == "mark":
            target.attempt(lambda: target.s.mark(arg))  # type: ignore[arg-type]
        elif op == "mark_raw":
            target.attempt(lambda: target.s.mark_raw(arg))  # type: ignore[arg-type]
        else:
            res = target.attempt(lambda: target.s.resume(arg))  # type: ignore[arg-type]
            if res is not None:
                assert res == target.s.resume(arg)  # type: ignore[arg-type]

    fuzz(request, calls, body)


def test_session_names(target: Target, request: pytest.FixtureRequest) -> None:
    """store.session(name) with SQL-ish, path-ish and garbage names: typed error, or a session of exactly that name."""
    names = st.one_of(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),
                      st.sampled_from(NASTY_TEXT), garbage)

    def body(name: object) -> None:
        def go() -> cs.Record:
            return target.store.session(name).append(cs.Turn("user", "hi"))  # type: ignore[arg-type]

        rec = target.attempt(go)
        if rec is not None:
            assert isinstance(rec, cs.Record) and rec.session == name and name in target.store.sessions()
        assert sorted(os.listdir(target.path.parent)) == sorted(
            p for p in os.listdir(target.path.parent) if p.startswith("hostile.db"))

    fuzz(request, names, body)


def test_open_with_any_key(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """cs.open(target, key=...) of a keyed store with garbage keys: IntegrityError/InvalidArgument, no byte changed."""
    path = tmp_path / "keyed.db"
    with cs.open(str(path), key=b"the right key") as st0:
        st0.session("s").append(cs.Turn("user", "x"))
    before = path.read_bytes()
    keys = st.one_of(st.binary(max_size=40), st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),
                     st.sampled_from(NASTY_TEXT), st.none(), ints, finite, st.lists(ints, max_size=2))

    def body(key: object) -> None:
        try:
            store = cs.open(str(path), key=key)  # type: ignore[arg-type]
        except cs.CompactStoreError:
            pass
        else:
            with store:
                assert key == b"the right key" or key is None
        assert path.read_bytes() == before

    fuzz(request, keys, body)


def test_decode_of_any_bytes(request: pytest.FixtureRequest) -> None:
    """events.decode(bytes): an event, or InvalidEvent naming where; never another exception."""
    docs = st.one_of(
        st.binary(max_size=200),
        st.builds(lambda v: msgspec.json.encode(v), st.dictionaries(st.sampled_from(
            ["kind", "role", "content", "call_id", "name", "args", "output", "ok", "key", "value", "ts", "meta",
             "status", "supersedes", "tier", "start", "stop", "span_root", "summary", "size", "root"]),
            st.one_of(json_values, st.sampled_from(["turn", "tool_call", "node", "marker", "spill", "binding"])),
            max_size=8)),
        st.builds(lambda v, cut: msgspec.json.encode({"kind": "turn", "role": "u", "content": "x", "meta": v})[:cut],
                  json_values, st.integers(0, 400)),
        st.sampled_from([b"\xff\xfe", b'{"kind":"turn","role":"u","content":"\xed\xa0\x80"}', b"1e999",
                         b'{"kind":"turn","role":"u","content":"x","meta":{"a":1e999}}', b'{"kind":"turn"' * 50,
                         b'{"kind":"tool_result","call_id":"c","output":' + b"[" * 60 + b"]" * 60 + b"}"]),
    )

    def body(data: bytes) -> None:
        try:
            event = ev.decode(data)
        except cs.InvalidEvent as exc:
            assert exc.field
            return
        assert isinstance(event, cs.Event)

    fuzz(request, docs, body, examples=_examples(request, 200))


# --- fixed cases: the error names the field ---------------------------------------------


@pytest.mark.parametrize(
    ("label", "call", "field"),
    [
        ("nan in args", lambda s: s.append(cs.ToolCall("c", "n", {"x": float("nan")})), "args.x"),
        ("inf in meta", lambda s: s.append(cs.Turn("u", "x", meta={"a": [float("inf")]})), "meta.a[0]"),
        ("int key", lambda s: s.append(cs.ToolCall("c", "n", {1: 2})), "args"),  # type: ignore[dict-item]
        ("surrogate text", lambda s: s.append(cs.Turn("u", "\ud800")), None),
        ("too deep", lambda s: s.append(cs.ToolResult("c", _deep(100))), "output"),
        ("foreign object", lambda s: s.append(cs.ToolResult("c", object())), None),
        ("not an event", lambda s: s.append({"kind": "turn"}), "event"),  # type: ignore[arg-type]
        ("empty role", lambda s: s.append(cs.Turn("", "x")), "role"),
        ("bad status", lambda s: s.append(cs.Turn("u", "x", status="maybe")), "status"),  # type: ignore[arg-type]
        ("future supersedes", lambda s: s.append(cs.Turn("u", "x", supersedes=10**6)), "supersedes"),
        ("float ts", lambda s: s.append(cs.Turn("u", "x", ts=1.5)), "ts"),  # type: ignore[arg-type]
        ("idem key type", lambda s: s.append(cs.Turn("u", "x"), idempotency_key=5), "idempotency_key"),  # type: ignore[arg-type]
        ("idem key huge", lambda s: s.append(cs.Turn("u", "x"), idempotency_key="k" * 2000), "idempotency_key"),
        ("batch field", lambda s: s.extend([cs.Turn("u", "x"), cs.Turn("u", float("nan"))]), "events[1]"),  # type: ignore[arg-type]
        ("batch keys length", lambda s: s.extend([cs.Turn("u", "x")], idempotency_keys=["a", "b"]), "idempotency_keys"),
        ("bind nan", lambda s: s.bind("k", float("nan")), "value"),
        ("bind key type", lambda s: s.bind(5, "v"), "key"),  # type: ignore[arg-type]
        ("oblige needs type", lambda s: s.oblige("o", needs=[1]), "needs[0]"),  # type: ignore[list-item]
        ("fulfil unknown", lambda s: s.fulfil("nope"), "name"),
        ("compact span", lambda s: s.compact(5, 2), "span"),
        ("compact bool span", lambda s: s.compact(False, True), None),
        ("compact summary type", lambda s: s.compact(13, 15, summary=5), "summary"),  # type: ignore[arg-type]
        ("compact loss", lambda s: s.compact(13, 15, loss="SORT_OF"), "loss"),  # type: ignore[arg-type]
        ("compact on_risk", lambda s: s.compact(13, 15, on_risk="yolo"), "on_risk"),  # type: ignore[arg-type]
        ("compact keep", lambda s: s.compact(13, 15, keep=[(0, "no.such.path")]), "keep"),
        ("compact overlap", lambda s: s.compact(2, 4), "span"),
        ("compact fact", lambda s: s.compact(13, 15, negative_facts=[object()]), "negative_facts"),
        ("digest none", lambda s: s.roll_up([]), "nodes"),
        ("digest not a node", lambda s: s.roll_up([1]), "node"),
        ("digest summary type", lambda s: s.roll_up([12], summary=5), "summary"),  # type: ignore[arg-type]
        ("mark type", lambda s: s.mark("12"), "node"),  # type: ignore[arg-type]
        ("mark_raw size", lambda s: s.mark_raw(-1), "size"),
        ("mark_raw bool", lambda s: s.mark_raw(True), None),
        ("resume type", lambda s: s.resume("x"), "marker"),  # type: ignore[arg-type]
        ("resume not a marker", lambda s: s.resume(0), "marker"),
        ("resume negative", lambda s: s.resume(-1), "marker"),
        ("spilled handle", lambda s: s.spilled("../../etc/passwd"), "handle"),
        ("head size", lambda s: s.head(10**6), "size"),
    ],
)
def test_fixed_hostile_inputs(target: Target, label: str, call: Callable[[cs.Session], object],
                              field: str | None) -> None:
    """Each known-hostile input gets a typed error naming the field, and no byte of the store changes."""
    target.refused(lambda: call(target.s), field=field)


@pytest.mark.parametrize("name", ["", "a\x00b", "a\nb", "x" * 513, 5, None, b"bytes"])
def test_bad_session_names_are_refused(target: Target, name: object) -> None:
    """Empty, control characters, too long, not a str: InvalidArgument('session'), nothing written."""
    target.refused(lambda: target.store.session(name).append(cs.Turn("u", "x")), field="session")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", NASTY_TEXT[6:])
def test_sql_and_path_names_are_plain_names(target: Target, name: str) -> None:
    """A session named like SQL or a path is a session of exactly that name; no file appears."""
    before = sorted(os.listdir(target.path.parent))
    target.store.session(name).append(cs.Turn("u", "x"))
    assert name in target.store.sessions() and target.store.verify().ok
    assert sorted(os.listdir(target.path.parent)) == before


def test_wrong_key_and_wrong_files_are_typed(tmp_path: Path) -> None:
    """Wrong key, no key for a keyed store, a directory, a text file: typed errors, the files untouched."""
    path = tmp_path / "k.db"
    with cs.open(str(path), key="secret") as st0:
        st0.session("s").append(cs.Turn("u", "x"))
    before = path.read_bytes()
    with pytest.raises(cs.IntegrityError):
        cs.open(str(path), key="wrong")
    with pytest.raises(cs.InvalidArgument):
        cs.open(str(path), key="")
    with cs.open(str(path)) as st1, pytest.raises(cs.CompactStoreError):
        st1.session("s").append(cs.Turn("u", "y"))
    assert path.read_bytes() == before
    with pytest.raises(cs.CompactStoreError):
        cs.open(str(tmp_path))
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n" * 100)
    with pytest.raises(cs.CompactStoreError):
        cs.open(str(text))
    assert text.read_text() == "not a database\n" * 100


def test_an_event_over_the_size_limit_is_refused(target: Target) -> None:
    """An event of many strings, 20 MiB in all (over the 16 MiB default limit), is refused; nothing is written."""
    chunk = "x" * (2 * 1024 * 1024)
    target.refused(lambda: target.s.append(cs.ToolResult("c", {str(i): chunk for i in range(10)})), field="event")
    target.refused(lambda: target.s.append(cs.Turn("u", chunk * 10)), field="event")


# --- inputs that once broke the rules ------------------------------------------------


@pytest.mark.parametrize("value", [b"\x00\xff", {1, 2}, frozenset({"a"})], ids=["bytes", "set", "frozenset"])
def test_non_json_values_are_refused(target: Target, value: object) -> None:
    """A value JSON cannot hold as given is refused by name, like NaN is."""
    target.refused(lambda: target.s.append(cs.ToolCall("c", "n", {"v": value})), field="args.v")


@pytest.mark.parametrize("which", ["needs", "idempotency_keys"])
def test_a_string_is_not_taken_for_a_list(target: Target, which: str) -> None:
    """oblige(needs="rollback") must not record needs ['r','o','l','l','b','a','c','k']."""
    if which == "needs":
        target.refused(lambda: target.s.oblige("o", needs="rollback"), field="needs")
    else:
        target.refused(lambda: target.s.extend([cs.Turn("u", "a"), cs.Turn("u", "b")], idempotency_keys="ab"),
                       field="idempotency_keys")


@pytest.mark.parametrize("call", [
    lambda s: s.extend(None),
    lambda s: s.oblige("o", needs=None),
    lambda s: s.compact(13, 15, keep=5),
    lambda s: s.compact(13, 15, negative_facts=5),
    lambda s: s.roll_up(None),
    lambda s: s.lookup(5),
    lambda s: list(s.scan("a")),
], ids=["extend", "oblige", "compact-keep", "compact-facts", "digest", "lookup", "scan"])
def test_non_iterables_get_a_typed_error(target: Target, call: Callable[[cs.Session], object]) -> None:
    """None or an int where a list is expected: InvalidArgument, not TypeError."""
    target.refused(lambda: call(target.s))


@pytest.mark.parametrize(("call", "field"), [
    (lambda s: s.read(2**64), "pos"),
    (lambda s: s.resume(2**64), "marker"),
    (lambda s: s.spilled("spill:" + "9" * 30), "handle"),
], ids=["read", "resume", "spilled"])
def test_positions_beyond_64_bits_get_a_typed_error(
    target: Target, call: Callable[[cs.Session], object], field: str
) -> None:
    """read/resume/spilled of a position past 2**63: InvalidArgument naming it, not OverflowError."""
    target.refused(lambda: call(target.s), field=field)


@pytest.mark.parametrize("where", ["session", "key"])
def test_lone_surrogates_get_a_typed_error(target: Target, tmp_path: Path, where: str) -> None:
    """A session name or key with a lone surrogate: InvalidArgument, not UnicodeEncodeError; no file created."""
    if where == "session":
        target.refused(lambda: target.store.session("\ud800").append(cs.Turn("u", "x")), field="session")
    else:
        path = tmp_path / "new.db"
        with pytest.raises(cs.InvalidArgument):
            cs.open(str(path), key="\ud800")
        assert not path.exists()


@pytest.mark.parametrize("case", ["none", "bytes", "int", "bad-key", "nul"])
def test_a_bad_target_or_key_creates_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """cs.open(None), cs.open(b"x"), cs.open(5), a bad key, a NUL in the path: typed error, no file created."""
    monkeypatch.chdir(tmp_path)
    args: dict[str, Any] = {
        "none": {"target": None}, "bytes": {"target": b"x.db"}, "int": {"target": 5},
        "bad-key": {"target": "new.db", "key": ""}, "nul": {"target": "a\x00b.db"},
    }[case]
    try:
        with pytest.raises(cs.CompactStoreError):
            cs.open(**args).close()
    finally:
        created = os.listdir(tmp_path)
    assert created == []


def test_decode_of_deeply_nested_bytes_is_typed() -> None:
    """events.decode of a body nested 100,000 deep raises InvalidEvent, not RecursionError."""
    with pytest.raises(cs.InvalidEvent):
        ev.decode(b'{"kind":"turn","role":"u","content":"x","meta":{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}}")


@pytest.mark.parametrize("body", [b'{"kind":"turn","role":"","content":"x"}',
                                  b'{"kind":"turn","role":"u","content":"x","supersedes":-5}'],
                         ids=["empty-role", "negative-supersedes"])
def test_decode_refuses_what_append_refuses(body: bytes) -> None:
    """An imported line that append() would refuse is refused by decode() too."""
    with pytest.raises(cs.InvalidEvent):
        ev.decode(body)


@pytest.mark.parametrize("event", [
    cs.Turn("u", "x", status=float("nan")),  # type: ignore[arg-type]
    cs.Turn("u", "x", name=float("inf")),  # type: ignore[arg-type]
    cs.Turn("u", "x", supersedes=float("nan")),  # type: ignore[arg-type]
    cs.Binding(key="k", value=1, how=float("nan")),  # type: ignore[arg-type]
], ids=["status", "name", "supersedes", "how"])
def test_nan_in_a_typed_field_is_refused(target: Target, event: cs.Event) -> None:
    """NaN or an infinity in an optional typed field is refused by name; today it is stored as
    ``"status":null``, a body that is not canonical, and ``verify()`` fails from then on."""
    try:
        target.refused(lambda: target.s.append(event))
    finally:
        assert target.store.verify().ok
