"""Hypothesis strategies for Merkle tree tests: entries, sizes, indices and spans."""

from __future__ import annotations

import random

from hypothesis import strategies as st

ALGOS = ("blake3", "sha256")

algos = st.sampled_from(ALGOS)
"""A supported hash name."""

entry = st.binary(max_size=48)
"""One log entry: arbitrary bytes, the empty string included."""


def entry_lists(min_size: int = 0, max_size: int = 40, unique: bool = False) -> st.SearchStrategy[list[bytes]]:
    """Small lists of arbitrary entries, drawn element by element (shrinks well).

    With ``unique`` no entry repeats, which tampering tests need: in a tree with
    repeated entries a proof for one position can truly be a proof for another.
    """
    return st.lists(entry, min_size=min_size, max_size=max_size, unique=unique)


def _synthetic(size: int, salt: bytes) -> list[bytes]:
    # Distinct entries of varying length, cheap to build for hundreds of leaves.
    return [salt + i.to_bytes(2 + i % 3, "big") for i in range(size)]


def large_entry_lists(min_size: int = 65, max_size: int = 600) -> st.SearchStrategy[list[bytes]]:
    """Larger lists of distinct entries built from a drawn size and salt, not drawn one by one."""
    return st.builds(_synthetic, st.integers(min_size, max_size), st.binary(max_size=8))


def any_entry_lists(max_size: int = 600, unique: bool = False) -> st.SearchStrategy[list[bytes]]:
    """Small drawn lists or larger synthetic ones (always distinct), up to ``max_size`` entries."""
    return st.one_of(entry_lists(0, 40, unique), large_entry_lists(41, max_size))


@st.composite
def with_index(draw: st.DrawFn, lists: st.SearchStrategy[list[bytes]]) -> tuple[list[bytes], int]:
    """A non-empty entry list and a valid leaf index into it."""
    entries = draw(lists.filter(bool))
    return entries, draw(st.integers(0, len(entries) - 1))


@st.composite
def with_old_size(
    draw: st.DrawFn, lists: st.SearchStrategy[list[bytes]], min_old: int = 0
) -> tuple[list[bytes], int]:
    """An entry list and an old size ``min_old <= m <= len(entries)``."""
    entries = draw(lists.filter(lambda e: len(e) >= min_old))
    return entries, draw(st.integers(min_old, len(entries)))


@st.composite
def with_span(draw: st.DrawFn, lists: st.SearchStrategy[list[bytes]]) -> tuple[list[bytes], int, int]:
    """An entry list and a span ``0 <= start <= stop <= len(entries)``."""
    entries = draw(lists)
    stop = draw(st.integers(0, len(entries)))
    return entries, draw(st.integers(0, stop)), stop


@st.composite
def with_positions(draw: st.DrawFn, lists: st.SearchStrategy[list[bytes]]) -> tuple[list[bytes], list[int]]:
    """An entry list and sorted distinct positions in it: a run, a few scattered ones, none or all."""
    entries = draw(lists)
    n = len(entries)
    stop = draw(st.integers(0, n))
    run = range(draw(st.integers(0, stop)), stop)
    scattered = draw(st.sets(st.integers(0, max(n - 1, 0)), max_size=min(n, 12)))
    return entries, sorted(set(run) | scattered)


#: Entry lengths at the edges of BLAKE3's 64-byte blocks and 1024-byte chunks once the
#: leaf prefix is added: where the native hasher takes another path (one chunk, two, more).
EDGE_LENGTHS = (0, 1, 62, 63, 64, 126, 127, 200, 1022, 1023, 1024, 1025, 1087, 1088, 1500, 2046, 2047, 2048,
                3071, 3072, 5000, 16383, 16384)

edge_entry = st.sampled_from(EDGE_LENGTHS).flatmap(lambda n: st.binary(min_size=n, max_size=n))
"""One entry whose length sits at a block or chunk edge."""


def edge_entry_lists(max_size: int = 40) -> st.SearchStrategy[list[bytes]]:
    """Lists of entries at block and chunk edges, some of equal length (hashed side by side)."""
    return st.lists(edge_entry, max_size=max_size)


@st.composite
def block_count_runs(draw: st.DrawFn) -> list[bytes]:
    """Entries in runs of 5 to 20 whose prefixed lengths have the same number of 64-byte
    blocks (each run's count taken at an edge length), shuffled together: the native
    hasher takes eight or more such entries sixteen at a time, one per lane."""
    out: list[bytes] = []
    rng = random.Random(draw(st.integers(0, 2**32)))
    for edge in draw(st.lists(st.sampled_from(EDGE_LENGTHS), min_size=1, max_size=3)):
        blocks = max(1, -(-(edge + 1) // 64))
        lo, hi = 64 * (blocks - 1), 64 * blocks - 1
        out += [rng.randbytes(n) for n in draw(st.lists(st.integers(lo, hi), min_size=5, max_size=20))]
    return draw(st.permutations(out))


sizes = st.integers(0, 2000)
"""A tree size (for coordinate arithmetic that needs no entries)."""


@st.composite
def spans(draw: st.DrawFn, max_stop: int = 5000) -> tuple[int, int]:
    """A span ``0 <= start <= stop <= max_stop``."""
    stop = draw(st.integers(0, max_stop))
    return draw(st.integers(0, stop)), stop


# --- events -------------------------------------------------------------------------

#: A character an event may hold: any but a lone surrogate (not text) and NUL (refused on entry).
_char = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")


def texts(min_size: int = 0, max_size: int | None = None) -> st.SearchStrategy[str]:
    """Text an event may hold: no lone surrogate, no NUL."""
    return st.text(_char, min_size=min_size, max_size=max_size)


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    texts(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(texts(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
"""Any JSON value the canonical encoding accepts (finite numbers, str keys)."""

_status = st.sampled_from([None, "ok", "failed", "rejected", "superseded"])
_common = {
    "status": _status,
    "supersedes": st.none() | st.integers(0, 10_000),
    "ts": st.none() | st.integers(0, 2**62),
    "meta": st.none() | st.dictionaries(texts(max_size=6), json_values, max_size=3),
}
_ident = texts(min_size=1, max_size=12)


def events() -> st.SearchStrategy[object]:
    """Any valid event of the built-in kinds."""
    from compactstore.events import ToolCall, ToolResult, Turn

    return st.one_of(
        st.builds(Turn, role=_ident, content=texts(max_size=60), name=st.none() | _ident, **_common),
        st.builds(
            ToolCall, call_id=_ident, name=_ident,
            args=st.dictionaries(texts(max_size=6), json_values, max_size=4), **_common,
        ),
        st.builds(ToolResult, call_id=_ident, output=json_values, ok=st.booleans(), **_common),
    )


class _Str(str):
    """A str subclass: encodes like a str, decodes as a plain one."""


class _Int(int):
    """An int subclass: encodes like an int, decodes as a plain one."""


_odd_scalars = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([float("nan"), float("inf"), -0.0, 1.0, True, False, 2**63, 2**64 - 1, 2**64, -(2**63) - 1]),
    st.text(max_size=8).map(_Str),
    st.integers(-5, 5).map(_Int),
    st.binary(max_size=4),
    st.sampled_from(["\ud800", "ok", "failed", "OK", "", "other", "file"]),
)
_odd_values = st.recursive(
    st.one_of(json_scalars, _odd_scalars),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers(0, 3), st.text(max_size=4).map(_Str)),
                        children, max_size=3),
        st.frozensets(st.integers(0, 3), max_size=2),
    ),
    max_leaves=8,
)


def _nested(depth: int) -> object:
    value: object = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def _valid_for(t: object) -> st.SearchStrategy[object]:
    """Values of msgspec type ``t`` that decoding accepts (plain ones, the kind the fast path takes)."""
    import msgspec.inspect as mi

    if isinstance(t, mi.UnionType):
        return st.one_of(*(_valid_for(m) for m in t.types))
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.StrType):
        return texts(min_size=1, max_size=8)
    if isinstance(t, mi.IntType):
        return st.integers(0, 2**62)
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.ListType):
        return st.lists(_valid_for(t.item_type), max_size=3)
    if isinstance(t, mi.DictType):
        return st.dictionaries(texts(max_size=6), json_values, max_size=3)
    if isinstance(t, mi.EnumType):
        return st.sampled_from(list(t.cls))
    return json_values


class _Float(float):
    pass


def _holding_itself() -> object:
    loop: list[object] = []
    loop.append(loop)
    return loop


#: Values the encoder cannot write at all: too deep for it, holding themselves, an int
#: past 4,300 digits, a float subclass.
_unwritable = st.one_of(
    st.builds(_holding_itself),
    st.builds(lambda: _nested(5_000)),
    st.just(10**5000), st.just(-(10**4300)),
    st.floats(allow_nan=False).map(_Float),
)

_junk = st.one_of(
    st.none(), json_values, _odd_values, _unwritable,
    st.sampled_from([0, 5, -1, "ok", "failed", ["a", "b"], [1, 2], {"a": [1.5, None]}, ("a",), (1, 2)]),
    st.integers(60, 68).map(_nested),
)


@st.composite
def wild_events(draw: st.DrawFn) -> object:
    """An event of any registered type, each field valid or (one time in four) anything at all.

    Anything: wrong types, NaN and infinities, str and int subclasses, tuples, int
    keys, bytes, ints beyond 64 bits, lone surrogates, nesting near the depth limit, and
    values the encoder cannot write (nested thousands deep, holding themselves, ints past
    4,300 digits, float subclasses).
    """
    import msgspec

    from compactstore import events as ev

    cls = draw(st.sampled_from(ev.EVENT_TYPES))
    kwargs = {}
    for field in msgspec.inspect.type_info(cls).fields:  # type: ignore[attr-defined]
        if not field.required and draw(st.booleans()):
            continue  # keep the default
        junk = draw(st.integers(0, 3)) == 0
        kwargs[field.name] = draw(_junk if junk else _valid_for(field.type))
    return cls(**kwargs)


# --- sessions a model is fed -------------------------------------------------------------

#: Text a turn or a result may say: empty and blank ones included.
_said = st.one_of(st.sampled_from(["", "  ", "ok", "ERROR: lock timeout"]),
                  texts(max_size=24))
#: A binding's value: short, or past the bound a note quotes verbatim.
_bound_value = st.one_of(texts(max_size=12), st.integers(), st.builds(lambda n: "x" * n, st.integers(190, 400)))

Step = tuple[object, ...]


@st.composite
def session_scripts(draw: st.DrawFn, max_steps: int = 60) -> list[Step]:
    """A script of what an agent logs, for :func:`play`: turns of every role, tool calls answered at once,
    later or never, results without a call, bindings, obligations and their fulfilments, handles, redactions
    and maintenance, in any order.
    """
    ops = st.sampled_from(["turn", "turn", "turn", "calls", "calls", "answer", "answer", "stray", "bind", "bind",
                           "oblige", "oblige", "fulfil", "handle", "maintain", "maintain"])
    script: list[Step] = []
    for _ in range(draw(st.integers(1, max_steps))):
        op = "redact" if draw(st.integers(0, 40)) == 0 else draw(ops)
        if op == "turn":
            script.append((op, draw(st.sampled_from(["user", "assistant", "system", "developer", "tool"])),
                           draw(_said), draw(st.sampled_from([None, None, "rejected", "failed"]))))
        elif op == "calls":
            script.append((op, draw(st.integers(1, 3)), draw(st.sampled_from(["now", "now", "later"]))))
        elif op == "answer":
            script.append((op, draw(st.integers(0, 5)), draw(_said), draw(st.booleans())))
        elif op == "bind":
            script.append((op, draw(st.sampled_from(["rollback", "commit", "path"])), draw(_bound_value),
                           draw(st.integers(0, 3)) == 0))
        elif op == "oblige":
            script.append((op, draw(st.sampled_from(["migrate", "deploy"])),
                           draw(st.lists(st.sampled_from(["rollback", "commit", "path"]), min_size=1, max_size=3,
                                         unique=True))))
        elif op in ("fulfil", "handle"):
            script.append((op, draw(st.integers(0, 3))))
        else:
            script.append((op,))
    return script


def play(session: object, script: list[Step], policy: object) -> None:
    """Append what ``script`` says to ``session``, maintaining it under ``policy`` where the script says so and at the end."""
    import compactstore as cs
    from compactstore import events as ev

    assert isinstance(session, cs.Session) and isinstance(policy, cs.CompactionPolicy)
    calls, pending, bound, obliged, handles = 0, [], set(), [], []
    for op, *args in script:
        if op == "turn":
            role, text, status = args
            session.append(cs.Turn(str(role), str(text), status=status))  # type: ignore[arg-type]
        elif op == "calls":
            n, when = args
            made = [f"c{calls + i}" for i in range(int(n))]  # type: ignore[call-overload]
            calls += len(made)
            session.extend([cs.ToolCall(c, "run", {"n": i}) for i, c in enumerate(made)])
            if when == "now":
                session.extend([cs.ToolResult(c, "ok") for c in made])
            else:
                pending += made
        elif op == "answer" and pending:
            which, text, ok = args
            c = pending.pop(int(which) % len(pending))  # type: ignore[call-overload]
            session.append(cs.ToolResult(c, str(text), ok=bool(ok), status=None if ok else "failed"))
        elif op == "stray":
            session.append(cs.ToolResult(f"x{session.size}", "a result whose call was never logged"))
        elif op == "bind":
            key, value, regenerable = args
            session.bind(str(key), value, regenerable=bool(regenerable))  # type: ignore[arg-type]
            bound.add(key)
        elif op == "oblige":
            name, needs = args
            needs = [k for k in needs if k in bound]  # type: ignore[attr-defined]
            if needs and name not in obliged:
                session.oblige(str(name), needs)
                obliged.append(name)
        elif op == "fulfil" and obliged:
            session.fulfil(str(obliged.pop(int(args[0]) % len(obliged))))  # type: ignore[call-overload]
        elif op == "handle":
            if handles and int(args[0]) % 2:  # type: ignore[call-overload]
                session.append(ev.HandleClosed(handle=handles.pop()))
            else:
                handles.append(f"h{session.size}")
                session.append(ev.HandleOpened(handle=handles[-1], resource="file", detail="/tmp/x"))
        elif op == "redact":
            raw = [r.pos for r in session.scan() if isinstance(r.event, cs.ToolCall)]
            if raw:
                session.redact([raw[-1]], "a call erased")
        elif op == "maintain":
            session.maintain(policy)  # type: ignore[arg-type]
    session.maintain(policy)  # type: ignore[arg-type]


def _summary_of(records: object) -> str:
    return f"{len(records)} records summarized"  # type: ignore[arg-type]


@st.composite
def policies(draw: st.DrawFn) -> object:
    """A compaction policy: compacting every 2 to 12 raw events, rolling up or not, spilling or preserving."""
    import compactstore as cs

    return cs.CompactionPolicy(every=draw(st.integers(2, 12)), roll_up_every=draw(st.none() | st.integers(1, 4)),
                               on_risk=draw(st.sampled_from(["spill", "preserve"])), summarizer=_summary_of)


@st.composite
def langchain_conversations(draw: st.DrawFn, max_turns: int = 30) -> list[object]:
    """A conversation as a LangGraph agent's state holds it, which a provider accepts: a human turn first, each
    AI tool call answered right after (or failed: ``status="error"``), every message with an id.
    """
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    out: list[object] = [HumanMessage("start", id="m0")]
    calls = 0
    for _ in range(draw(st.integers(1, max_turns))):
        n = len(out)
        kind = draw(st.sampled_from(["human", "ai", "tools", "tools"]))
        if kind == "human":
            out.append(HumanMessage(draw(_said.filter(str.strip)), id=f"m{n}"))
        elif kind == "ai":
            out.append(AIMessage(draw(_said.filter(str.strip)), id=f"m{n}"))
        else:
            k = draw(st.integers(1, 3))
            made = [f"call_{calls + i}" for i in range(k)]
            calls += k
            text = draw(st.sampled_from(["", "", "Let me check."]))
            out.append(AIMessage(text, id=f"m{n}", tool_calls=[{"name": "run", "args": {"i": i}, "id": c}
                                                                for i, c in enumerate(made)]))
            for i, c in enumerate(made):
                failed = draw(st.integers(0, 3)) == 0
                out.append(ToolMessage("ERROR: lock timeout" if failed else f"ok {i}", tool_call_id=c,
                                       status="error" if failed else "success", id=f"m{n}-{i}"))
    return out
