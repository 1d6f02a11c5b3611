"""Bad input is refused with InvalidEvent naming the field, on the native and the pure path, and nothing is written.

Each case here is a value the encoder cannot write: nesting too deep for it (in a typed
field, which the JSON walk of free-form fields does not look at), a list that holds
itself, an int too long to write in decimal. None of them may escape as a RecursionError
or a bare ValueError.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import compactstore as cs
from compactstore import events as E


def _deep(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


def _loop() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


HUGE = 10**5000  # more digits than int -> str converts by default (4300)

CASES: dict[str, tuple[Callable[[], cs.Event], str]] = {
    "deep list in uses": (lambda: cs.Turn("user", "x", uses=[_deep(10_000)]), "uses"),
    "deep list in needs": (lambda: cs.Obligation("o", needs=[_deep(10_000)]), "needs"),
    "self-holding list as content": (lambda: cs.Turn("user", _loop()), "content"),  # type: ignore[arg-type]
    "self-holding list as supersedes": (lambda: cs.Turn("user", "x", supersedes=_loop()), "supersedes"),  # type: ignore[arg-type]
    "huge int in meta": (lambda: cs.Turn("user", "x", meta={"n": HUGE}), "meta"),
    "huge int in a tool's args": (lambda: cs.ToolCall("c", "run", {"n": HUGE}), "args"),
    "huge int as supersedes": (lambda: cs.Turn("user", "x", supersedes=HUGE), "supersedes"),
    "huge int as ts": (lambda: cs.Turn("user", "x", ts=HUGE), "ts"),
}


@pytest.fixture(params=["native", "pure"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "native":
        if E._NATIVE is None:
            pytest.skip("compactstore.native is not in use")
    else:
        monkeypatch.setattr(E, "_NATIVE", None)
    yield request.param


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("how", ["append", "extend"])
def test_unwritable_values_are_refused_as_invalid_event(tmp_path: Any, path: str, case: str, how: str) -> None:
    make, field = CASES[case]
    with cs.open(os.path.join(tmp_path, "s.db"), clock=E.tick_clock()) as store:
        s = store.session("s")
        s.append(cs.Turn("user", "first"))
        with pytest.raises(cs.InvalidEvent) as info:
            if how == "append":
                s.append(make())
            else:
                s.extend([cs.Turn("user", "ok"), make()])
        want = field if how == "append" else f"events[1].{field}"
        assert info.value.field.startswith(want), info.value.field
        assert s.size == 1


def test_a_clock_reading_too_long_to_write_is_refused_as_invalid_event(tmp_path: Any, path: str) -> None:
    with cs.open(os.path.join(tmp_path, "s.db"), clock=lambda: HUGE) as store:
        s = store.session("s")
        for events in ([cs.Turn("user", "x")], [cs.Turn("user", "x"), cs.Turn("user", "y")]):
            with pytest.raises(cs.InvalidEvent) as info:
                s.extend(events)
            assert info.value.field.endswith("ts"), info.value.field
        assert s.size == 0


class _Text(str):
    pass


class _Number(int):
    pass


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: cs.Turn("user", "x", meta={"k": _Text("v")}), "meta.k"),
        (lambda: cs.ToolCall("c", "run", {"k": [_Number(1)]}), "args.k[0]"),
        (lambda: cs.ToolResult("c", output={"k": _Text("v")}), "output.k"),
    ],
)
def test_a_str_or_int_subclass_in_free_json_is_refused_naming_its_path(tmp_path: Any, path: str,
                                                                       make: Callable[[], cs.Event], field: str) -> None:
    """As bytes or a set there is: ``meta.k``, not ``event``."""
    with cs.open(os.path.join(tmp_path, "s.db"), clock=E.tick_clock()) as store:
        s = store.session("s")
        with pytest.raises(cs.InvalidEvent) as info:
            s.append(make())
        assert info.value.field == field
        assert s.size == 0


def test_a_clock_reading_of_an_int_subclass_is_refused_naming_ts(tmp_path: Any, path: str) -> None:
    with cs.open(os.path.join(tmp_path, "s.db"), clock=lambda: _Number(5)) as store:
        s = store.session("s")
        with pytest.raises(cs.InvalidEvent) as info:
            s.append(cs.Turn("user", "x"))
        assert info.value.field == "ts"
        assert s.size == 0


class _Unshowable:
    """A value whose repr raises: an error message must still be made."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


#: Values no error message may fail on: an int too long for decimal, nesting past the
#: recursion limit, a repr that raises.
HOSTILE = {"huge int": HUGE, "deep list": _deep(5_000), "unshowable": _Unshowable()}

#: Public calls that take a caller's value, each given a hostile one.
CALLS: dict[str, Callable[[cs.Session, Any], object]] = {
    "extend expect_size": lambda s, v: s.extend([cs.Turn("user", "x")], expect_size=v),
    "read": lambda s, v: s.read(v),
    "scan start": lambda s, v: list(s.scan(v)),
    "head size": lambda s, v: s.head(v),
    "sealed_head size": lambda s, v: s.sealed_head(v),
    "inclusion_proof": lambda s, v: s.inclusion_proof(v),
    "consistency_proof": lambda s, v: s.consistency_proof(v),
    "span_root": lambda s, v: s.span_root(0, v),
    "root_with position": lambda s, v: s.view.root_with({v: b"x" * 32}, 1) if isinstance(v, int) else s.view.root_with({0: v}, 1),
    "redact": lambda s, v: s.redact([v], "why"),
    "bind value": lambda s, v: s.bind("k", v),
    "compact loss": lambda s, v: s.compact(0, 1, summary="sum", loss=v),
    "compact span": lambda s, v: s.compact(0, v, summary="sum"),
    "mark_raw size": lambda s, v: s.mark_raw(v),
    "read_span start": lambda s, v: s.view.read_span(v, 1),
    "node": lambda s, v: s.node(v),
    "spilled handle": lambda s, v: s.spilled(v),
    "policy threshold": lambda s, v: s.maintain(cs.CompactionPolicy(threshold=v)),
    "policy on_risk": lambda s, v: s.maintain(cs.CompactionPolicy(on_risk=v)),
}


@pytest.mark.parametrize("value", list(HOSTILE))
@pytest.mark.parametrize("call", list(CALLS))
def test_hostile_values_are_refused_as_invalid_argument_with_a_message(tmp_path: Any, call: str, value: str) -> None:
    """Whatever a caller passes, the refusal is an InvalidArgument whose message could be made; nothing is written."""
    with cs.open(os.path.join(tmp_path, "s.db"), clock=E.tick_clock()) as store:
        s = store.session("s")
        s.append(cs.Turn("user", "first"))
        with pytest.raises(cs.InvalidArgument) as info:
            CALLS[call](s, HOSTILE[value])
        assert info.value.field and str(info.value)
        assert s.size == 1


def test_shown_cuts_a_long_repr_and_never_raises() -> None:
    assert cs.errors.shown("x" * 1000, 20) == repr("x" * 1000)[:17] + "..."
    assert cs.errors.shown(HUGE) == f"a int of {HUGE.bit_length()} bits"
    assert cs.errors.shown(_Unshowable()) == "a _Unshowable"
    assert cs.errors.shown(_deep(100_000)) == "a list"
