#!/usr/bin/env python3
"""Write ``golden_events.json``: the frozen bytes of every event kind, and their leaves.

    python tests/vectors/make_golden.py          # write the file (only for a new kind or field)
    python tests/vectors/make_golden.py --check  # exit 1 if the file differs from what it writes

The compatibility contract: an event's bytes, once written by a release, verify, resume
and restore under every later one. ``tests/test_golden_events.py`` holds the encoder
to this file, so a change to any kind's bytes fails there. Rewriting the file is right
only when a kind or an optional field is added; every body already in it must stay as
it is (the test checks that too, against git's copy, where there is one).

The leaves are computed with the naive RFC 9162 oracle (``tests/naive_merkle.py``),
not with the code under test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "golden_events.json"
sys.path.insert(0, str(HERE.parent))

import naive_merkle as naive  # noqa: E402

from compactstore import events as ev  # noqa: E402

TS = 1_765_000_000_000_000
COMMON = {"ts": TS}
FULL = {"ts": TS, "status": "failed", "supersedes": 0, "idempotency_key": "k-1", "meta": {"x": [1, 2.5, None, "é"]},
        "uses": ["deploy_id"]}


def golden() -> list[ev.Event]:
    """Return the golden events: each kind with its required fields only, then with every field set.

    ``redacted`` is not among them: it is what a read gives for an erased body, never a body.
    """
    return [
        ev.Turn(role="user", content="deploy service 7f3a9c", **COMMON),
        ev.Turn(role="assistant", content="line\nwith \"quotes\" and ☃ and \\", name="planner", **FULL),  # type: ignore[arg-type]
        ev.ToolCall(call_id="c1", name="deploy", **COMMON),
        ev.ToolCall(call_id="c2", name="deploy", args={"sha": "7f3a9c", "n": 3, "f": 0.1, "nested": {"a": [True, None]}},
                    **FULL),  # type: ignore[arg-type]
        ev.ToolResult(call_id="c1", **COMMON),
        ev.ToolResult(call_id="c2", output={"error": "E1234 timeout"}, ok=False, **FULL),  # type: ignore[arg-type]
        ev.Binding(key="deploy_id", value="d-42", **COMMON),
        ev.Binding(key="cfg", value={"n": -1, "big": 12345678901234567890}, regenerable=True, how="GET /cfg",
                   **FULL),  # type: ignore[arg-type]
        ev.Obligation(name="rollback", **COMMON),
        ev.Obligation(name="restore", needs=["deploy_id", "cfg"], **FULL),  # type: ignore[arg-type]
        ev.Fulfilment(name="rollback", **COMMON),
        ev.Fulfilment(name="restore", **FULL),  # type: ignore[arg-type]
        ev.HandleOpened(handle="h1", **COMMON),
        ev.HandleOpened(handle="h2", resource="file", detail="/tmp/x", **FULL),  # type: ignore[arg-type]
        ev.HandleClosed(handle="h1", **COMMON),
        ev.HandleClosed(handle="h2", **FULL),  # type: ignore[arg-type]
        ev.Summary(tier=1, start=0, stop=4, span_root="00" * 32, summary="four turns", **COMMON),
        ev.Summary(
            tier=2, start=0, stop=12, span_root="ab" * 32, summary="a digest", loss=ev.LossClass.LOSSLESS,
            children=[4, 9], negative_facts=[ev.Fact(pos=1, status="failed", text="E1234"), ev.Fact(pos=2, status="rejected")],
            unresolved=[ev.Item(pos=3, kind="tool_call", id="c2")], resolved=[ev.Item(pos=0, kind="obligation", id="o")],
            kept=[ev.Excerpt(pos=6, path="value", value="d-42"), ev.Excerpt(pos=7, path="args.sha")],
            spills=[ev.SpillRef(handle="spill:8", key="cfg", source=7, digest="cd" * 32)], contract="v1",
            content_digest="ef" * 32, **FULL,  # type: ignore[arg-type]
        ),
        ev.Spill(key="cfg", value={"n": -1}, source=7, digest="cd" * 32, **COMMON),
        ev.Spill(key="cfg", value=None, source=7, digest="cd" * 32, **FULL),  # type: ignore[arg-type]
        ev.RecoveryMarker(size=12, root="12" * 32, **COMMON),
        ev.RecoveryMarker(size=12, root="12" * 32, node=10, mac="34" * 32, conditions=["closure", "anchoring"],
                          path=[10, 4], cover=[10], **FULL),  # type: ignore[arg-type]
        ev.Attempt(key="a1", operation="deploy", **COMMON),
        ev.Attempt(key="a2", operation="deploy", literals={"sha": "7f3a9c", "n": 1.5}, **FULL),  # type: ignore[arg-type]
        ev.Redaction(positions=[3], reason="user asked to forget", **COMMON),
        ev.Redaction(positions=[3, 5], reason="gone", guards=[ev.Guard(pos=5, key="a2", literals={"sha": "56" * 32})],
                     **FULL),  # type: ignore[arg-type]
        ev.GraphState(id="1ef-01", **COMMON),
        ev.GraphState(id="1ef-02", ns="child", parent="1ef-01", value={"v": 1, "channel_values": {"m": ["hi"]}},
                      **FULL),  # type: ignore[arg-type]
        ev.Write(checkpoint="1ef-01", task="t1", channel="messages", **COMMON),
        ev.Write(checkpoint="1ef-02", task="t2", channel="messages", idx=-1, path="a.b", ns="child", value=[1, "two"],
                 **FULL),  # type: ignore[arg-type]
        # Added in 0.2.0 after the first 30: a golden body is appended, never rewritten.
        ev.Retention(marker=12, spans=[ev.Span(start=0, stop=4)], index_digest="78" * 32, **COMMON),
        ev.Retention(marker=12, spans=[ev.Span(start=0, stop=4), ev.Span(start=6, stop=9)], index_digest="78" * 32,
                     **FULL),  # type: ignore[arg-type]
    ]


def written() -> str:
    """Return the file's text: each golden event's kind, body and leaf, then the root over them all."""
    bodies = [ev.canonical(e)[1] for e in golden()]
    rows = [{"kind": e.kind, "body": b.decode(), "leaf": naive.leaf(b).hex()} for e, b in zip(golden(), bodies)]
    doc = {"events": rows, "root": naive.mth(bodies).hex()}
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def main() -> int:
    text = written()
    if "--check" in sys.argv[1:]:
        return 0 if OUT.read_text(encoding="utf-8") == text else 1
    OUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
