#!/usr/bin/env python3
"""One long agent conversation through two compacting OpenAI Agents SDK sessions, side by side.

    python benchmarks/sdk_compaction.py [--turns 1000] [--repeat 7]

The same conversation, as Responses input items, goes through ``add_items`` of:

* **compactstore**: ``CompactStoreSession(..., compaction=cs.CompactionPolicy(every=40,
  roll_up_every=5, on_risk="preserve", summarizer=bounded_summary))`` on SQLite, the
  summarizer deterministic and bounded (as in ``memory_loop.py``);
* **the SDK**: ``agents.memory.OpenAIResponsesCompactionSession`` wrapping a
  ``SQLiteSession`` file, its default trigger (10 compaction candidates), with a real
  ``openai.AsyncOpenAI`` client whose HTTP transport (a ``MockTransport`` of the httpx the
  client is built on) answers
  ``POST /responses/compact`` as the API documents it: every user message of the
  input, then one ``compaction`` item whose ``encrypted_content`` is opaque (here
  :data:`OPAQUE` characters derived from the input's digest). After each turn's
  ``add_items`` it calls ``run_compaction()``, as the Runner does after a turn; the
  SDK's own code decides, calls the endpoint and replaces the stored history.

Each turn (as ``memory_loop.py`` plays it): a user message, a tool call and its
output (every 7th fails with the SDK's default tool error text), an assistant message;
every 11th turn a proposed tool call the user rejects (its output the SDK's rejection
text); every 5th a snapshot tool call whose output is a literal re-bound under one of
four keys, which the compactstore side also records as a ``Binding`` on
``session.log``, with an obligation needing the latest one every 50th turn (fulfilled 30
turns later, so one is open when 1,000 turns end). Turns are played interleaved, the order of the two sides alternating.

The SDK side's compaction time is the client's own work with a local endpoint: a real
call adds a network round trip and the model. Each of its compactions sends every user
message so far, so its cost grows with the session: 1,000 turns took 11 minutes on a
shared 2-core machine, and ``make bench`` runs 300 (about a minute).

Reported side by side: what ``get_items()`` returns after the last turn (items,
characters as JSON), the time of ``add_items`` per turn (and of the SDK's
``run_compaction``), of ``get_items``, how many failed and rejected calls' ids and live
snapshot literals are in what the model is fed (and, beyond it, in what the store
keeps), whether every item is valid Responses input, whether the context is certified
and the store verifies, and what a restart (the store reopened by a new process's
objects) returns.

Writes benchmarks/results/sdk_compaction.json.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Goal, Section, seconds  # noqa: E402

import compactstore as cs  # noqa: E402
from compactstore import events as ev  # noqa: E402

try:
    from agents import SQLiteSession
    from agents.memory import OpenAIResponsesCompactionSession
    from agents.tool import DEFAULT_APPROVAL_REJECTION_MESSAGE, default_tool_error_function
    from openai import AsyncOpenAI
    from openai.types.responses import ResponseInputItemParam
    from pydantic import TypeAdapter, ValidationError

    from compactstore.adapters.openai_agents import CompactStoreSession

    # The HTTP library this openai client is built on (httpx2 since openai 3), so that its own path runs.
    try:
        import httpx2 as httpx
    except ImportError:
        import httpx  # type: ignore[no-redef]
except ImportError as exc:  # pragma: no cover - the openai extra is missing
    raise SystemExit(f"sdk_compaction needs the openai extra (pip install -e '.[openai]'): {exc}") from exc

Item = dict[str, Any]
TOOLS = ("run_sql", "read_file", "write_file", "http_get", "grep")
#: The SDK's default text for a failed tool and for a rejected approval.
TOOL_ERROR = default_tool_error_function(None, RuntimeError())  # type: ignore[arg-type]
REJECTION = DEFAULT_APPROVAL_REJECTION_MESSAGE
#: Characters of the fake endpoint's ``encrypted_content``: a fixed stand-in for an opaque blob.
OPAQUE = 1024
#: A summary's text is cut to this many characters, however long its span: a model's would be too.
SUMMARY_LIMIT = 600
#: The ids the conversation gives its calls; read back out of a context's JSON.
IDS = re.compile(r"(?:call|proposal|snapshot)-[0-9]+")
RESPONSES_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseInputItemParam)


def bounded_summary(records: Sequence[cs.Record]) -> str:
    """Summarize deterministically in at most SUMMARY_LIMIT characters: counts and negatives by position."""
    kinds: dict[str, int] = {}
    for r in records:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
    negative = [f"{r.pos} {r.event.status}" for r in records if r.event.status in ("failed", "rejected")]
    counts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    text = f"positions {records[0].pos}..{records[-1].pos}: {counts}; negatives: {', '.join(negative) or 'none'}"
    return text if len(text) <= SUMMARY_LIMIT else text[: SUMMARY_LIMIT - 1] + "…"


# --- the conversation ---------------------------------------------------------------------


@dataclass
class Truth:
    """What the conversation did, to hold each side's context against."""

    failed: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    #: each snapshot key's latest value
    live: dict[str, str] = field(default_factory=dict)
    #: the obligations open, each with the key it needs
    open: dict[str, str] = field(default_factory=dict)
    items: int = 0


def call(call_id: str, name: str, args: dict[str, Any], output: str) -> list[Item]:
    """Return a function call and its output as Responses input items."""
    return [{"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(args)},
            {"type": "function_call_output", "call_id": call_id, "output": output}]


def turn_items(t: int, truth: Truth) -> tuple[list[Item], list[ev.Event]]:
    """Return turn ``t``'s items, and the structural events the compactstore side records beside them."""
    tool = TOOLS[t % len(TOOLS)]
    failed = t % 7 == 3
    ok = json.dumps({"rows": t % 97, "table": f"t{t % 13}", "note": "ok " * 20})
    items: list[Item] = [
        {"role": "user", "content": f"Turn {t}: continue the migration of table t{t % 13}, checking constraint c{t % 17} first."},
        *call(f"call-{t}", tool, {"target": f"t{t % 13}", "attempt": t}, TOOL_ERROR if failed else ok),
        {"role": "assistant", "content": f"Step {t} {'failed, retrying later' if failed else 'done'}; next: table t{(t + 1) % 13}."},
    ]  # fmt: skip
    if failed:
        truth.failed.append(f"call-{t}")
    if t % 11 == 5:
        items += call(f"proposal-{t}", "backfill_in_place", {"table": f"t{t % 13}"}, REJECTION)
        truth.rejected.append(f"proposal-{t}")
    events: list[ev.Event] = []
    if t % 5 == 0:
        key, value = f"snapshot{t % 4}", f"snap-{t:06d}-{(t * 7919) % 100003:05d}"
        items += call(f"snapshot-{t}", "create_snapshot", {"key": key}, value)
        truth.live[key] = value
        events.append(cs.Binding(key=key, value=value))
    if t % 50 == 30:
        events.append(cs.Obligation(name=f"restore-{t}", needs=[f"snapshot{t % 4}"]))
        truth.open[f"restore-{t}"] = f"snapshot{t % 4}"
    if t % 50 == 10 and t >= 50:
        events.append(cs.Fulfilment(name=f"restore-{t - 30}"))
        del truth.open[f"restore-{t - 30}"]
    truth.items += len(items)
    return items, events


# --- the SDK side's endpoint --------------------------------------------------------------


def _is_user(item: Item) -> bool:
    return item.get("role") == "user" and item.get("type", "message") == "message"


def _text_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    return [dict(p) for p in content] if isinstance(content, list) else []


def compact_endpoint(request: httpx.Request) -> httpx.Response:
    """Answer ``POST /responses/compact`` as the API documents it: the input's user messages, then one compaction item.

    Deterministic: ids and the opaque content come from the digest of the request body.
    """
    if request.method != "POST" or not request.url.path.endswith("/responses/compact"):
        return httpx.Response(404, json={"error": {"message": f"no route {request.method} {request.url.path}"}})
    body = json.loads(request.content)
    digest = hashlib.blake2b(request.content, digest_size=16).hexdigest()
    users = [i for i in body.get("input") or [] if isinstance(i, dict) and _is_user(i)]
    output: list[Item] = [
        {"id": f"msg_{digest}_{n}", "type": "message", "role": "user", "status": "completed",
         "content": _text_parts(u.get("content"))}
        for n, u in enumerate(users)
    ]
    blob = base64.b64encode(hashlib.shake_256(request.content).digest(OPAQUE * 3 // 4)).decode()
    output.append({"id": f"cmp_{digest}", "type": "compaction", "encrypted_content": blob})
    return httpx.Response(200, json={
        "id": f"resp_{digest}", "object": "response.compaction", "created_at": 1_700_000_000, "output": output,
        "usage": {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 0,
                  "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 0},
    })


class Endpoint:
    """A real ``AsyncOpenAI`` client whose transport is :func:`compact_endpoint`; counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

        def handler(request: httpx.Request) -> httpx.Response:
            self.calls += 1
            return compact_endpoint(request)

        self.client = AsyncOpenAI(api_key="sk-local", base_url="http://compact.invalid/v1", max_retries=0,
                                  http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)))


# --- the two sides ------------------------------------------------------------------------


def policy() -> cs.CompactionPolicy:
    """Return the compactstore side's policy."""
    return cs.CompactionPolicy(every=40, roll_up_every=5, on_risk="preserve", summarizer=bounded_summary)


def open_ours(path: str, session_id: str) -> CompactStoreSession:
    """Open the compactstore side (again, after a restart)."""
    return CompactStoreSession(session_id, path, compaction=policy())


def open_sdk(path: str, session_id: str, endpoint: Endpoint) -> tuple[SQLiteSession, OpenAIResponsesCompactionSession]:
    """Open the SDK side (again, after a restart): a SQLiteSession file under the compaction session."""
    store = SQLiteSession(session_id, path)
    return store, OpenAIResponsesCompactionSession(session_id, store, client=endpoint.client, model="gpt-4.1")


@dataclass
class Side:
    """One side's timings as the conversation is played."""

    add: list[float] = field(default_factory=list)
    compact: list[float] = field(default_factory=list)


async def play(turns: int, ours: CompactStoreSession, sdk: OpenAIResponsesCompactionSession,
               truth: Truth) -> tuple[Side, Side]:
    """Play ``turns`` turns through both sessions, interleaved, the order alternating per turn."""
    a, b = Side(), Side()

    async def feed_ours(items: list[Item], events: list[ev.Event]) -> None:
        t0 = time.perf_counter()
        await ours.add_items(items)
        a.add.append(time.perf_counter() - t0)
        if events:  # what the agent itself declares: not timed, the SDK side has no such call
            await asyncio.to_thread(ours.log.extend, events)

    async def feed_sdk(items: list[Item]) -> None:
        t0 = time.perf_counter()
        await sdk.add_items(items)  # type: ignore[arg-type]  # plain dicts, as the SDK stores them
        t1 = time.perf_counter()
        await sdk.run_compaction()  # what the Runner does after a turn; the SDK's trigger decides
        t2 = time.perf_counter()
        b.add.append(t1 - t0)
        b.compact.append(t2 - t1)

    for t in range(turns):
        items, events = turn_items(t, truth)
        copy = json.loads(json.dumps(items))
        if t % 2:
            await feed_sdk(copy)
            await feed_ours(items, events)
        else:
            await feed_ours(items, events)
            await feed_sdk(copy)
    return a, b


# --- what each side feeds the model -------------------------------------------------------


def found(items: list[Item]) -> set[str]:
    """Return the call ids named anywhere in ``items``' JSON."""
    return set(IDS.findall(json.dumps(items, ensure_ascii=False)))


def invalid(items: list[Item]) -> int:
    """Return how many of ``items`` the OpenAI types refuse as Responses input."""
    bad = 0
    for item in items:
        try:
            RESPONSES_ITEM.validate_python(item)
        except ValidationError:
            bad += 1
    return bad


def retained_ids(session: CompactStoreSession) -> set[str]:
    """Return the call ids the certified context retains: fed, in its summaries' facts, or fetched by the recall tool.

    A digest's note names the range of the earlier facts its children keep
    (``facts:A-B``); the model fetches them with the recall tool, page by page, as here.
    """
    got = session.log.context()
    ids = found(got.as_messages("openai-responses"))
    for entry in got.context:
        for fact in getattr(entry, "negative_facts", ()):
            ids.update(IDS.findall(fact.text))
        if isinstance(entry, cs.resolver.SummaryItem) and entry.start < cs.render.listed_from(entry):
            handle: str | None = f"facts:{entry.start}-{cs.render.listed_from(entry)}"
            while handle is not None:
                text = cs.recall.recall(session.log, handle)
                ids.update(IDS.findall(text))
                more = re.search(r"\(more: (facts:\d+-\d+)\)", text)
                handle = more.group(1) if more else None
    return ids


def stored_ids(items: list[Item]) -> set[str]:
    """Return the ids of the failed and rejected outputs among ``items``."""
    return {i["call_id"] for i in items if i.get("type") == "function_call_output"
            and i.get("output") in (TOOL_ERROR, REJECTION)}


def describe(items: list[Item], truth: Truth) -> dict[str, Any]:
    """Return what ``items``, fed to the model, hold of the conversation's negative facts and live literals."""
    ids = found(items)
    text = json.dumps(items, ensure_ascii=False)
    return {
        "items": len(items), "chars": len(text), "invalid": invalid(items),
        "failed_fed": sum(i in ids for i in truth.failed), "rejected_fed": sum(i in ids for i in truth.rejected),
        "live_fed": sum(v in text for v in truth.live.values()),
        "needed_fed": sum(truth.live[k] in text for k in truth.open.values()),
        "opaque_items": sum(i.get("type") == "compaction" for i in items),
    }


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


async def get_timings(ours: CompactStoreSession, sdk: OpenAIResponsesCompactionSession,
                      repeat: int) -> tuple[list[float], list[float]]:
    """Time ``get_items()`` on both sides, interleaved, after one warm-up call each."""
    a: list[float] = []
    b: list[float] = []
    for r in range(repeat + 1):
        for side in ((ours, a), (sdk, b)) if r % 2 else ((sdk, b), (ours, a)):
            t0 = time.perf_counter()
            await side[0].get_items()
            if r:
                side[1].append(time.perf_counter() - t0)
    return a, b


async def compare(turns: int, folder: str, repeat: int = 7) -> dict[str, Any]:
    """Play the conversation through both sides, then measure, restart both and measure again; return the figures."""
    truth = Truth()
    ours_path, sdk_path = str(Path(folder) / "ours.db"), str(Path(folder) / "sdk.db")
    endpoint = Endpoint()
    ours = open_ours(ours_path, "conversation")
    raw, sdk = open_sdk(sdk_path, "conversation", endpoint)
    started = time.perf_counter()
    a, b = await play(turns, ours, sdk, truth)
    elapsed = time.perf_counter() - started
    fed_ours: list[Item] = await ours.get_items()
    fed_sdk: list[Item] = [dict(i) for i in await sdk.get_items()]
    get_a, get_b = await get_timings(ours, sdk, repeat)
    context = ours.log.context()
    kept = retained_ids(ours)
    log_items = [x for x in (await asyncio.to_thread(lambda: list(ours.log.scan())))]
    ours_stored = {r.event.call_id for r in log_items if isinstance(r.event, ev.ToolResult) and r.event.status in ("failed", "rejected")}
    sdk_stored = stored_ids([dict(i) for i in await raw.get_items()])
    verified = ours.store.verify().ok
    ours.close()
    raw.close()
    # A restart: new objects over the same files, as a new process would make them.
    ours2 = open_ours(ours_path, "conversation")
    raw2, sdk2 = open_sdk(sdk_path, "conversation", endpoint)
    try:
        again_ours, again_sdk = await ours2.get_items(), [dict(i) for i in await sdk2.get_items()]
        restart = {
            "ours_same": again_ours == fed_ours, "sdk_same": again_sdk == fed_sdk,
            "ours_mode": ours2.log.context().mode, "ours_raw_items": ours2.log.size,
            "sdk_raw_items": len(await raw2.get_items()),
        }
    finally:
        ours2.close()
        raw2.close()
    negatives = set(truth.failed) | set(truth.rejected)
    return {
        "turns": turns, "items_added": truth.items, "failed": len(truth.failed), "rejected": len(truth.rejected),
        "live_keys": len(truth.live), "needed": len(truth.open), "elapsed_s": elapsed, "compaction_calls": endpoint.calls,
        "ours": {**describe(fed_ours, truth), "add_median_s": median(a.add), "add_total_s": sum(a.add),
                 "get_median_s": median(get_a), "mode": context.mode, "verified": verified,
                 "negatives_retained": len(negatives & kept), "negatives_stored": len(negatives & ours_stored),
                 "nodes": sum(1 for r in log_items if r.kind == "node")},
        "sdk": {**describe(fed_sdk, truth), "add_median_s": median(b.add), "add_total_s": sum(b.add),
                "compact_median_s": median(b.compact), "compact_total_s": sum(b.compact),
                "compact_max_s": max(b.compact, default=0.0),
                "get_median_s": median(get_b), "mode": "not certified (no proof; compaction item opaque)",
                "verified": False, "negatives_retained": len(negatives & found(fed_sdk)),
                "negatives_stored": len(negatives & sdk_stored)},
        "restart": restart,
    }


# --- the report ---------------------------------------------------------------------------


def section_of(r: dict[str, Any]) -> Section:
    """Return the side-by-side table of one comparison."""
    o, s, rs = r["ours"], r["sdk"], r["restart"]
    neg = r["failed"] + r["rejected"]
    section = Section(
        f"get_items() after {r['turns']:,} turns ({r['items_added']:,} items added): CompactStoreSession vs "
        "OpenAIResponsesCompactionSession",
        ("", "what", "CompactStoreSession", "OpenAIResponsesCompactionSession(SQLiteSession)"),
    )
    rows = [
        ("fed", "items", f"{o['items']:,}", f"{s['items']:,}"),
        ("fed", "characters (JSON)", f"{o['chars']:,}", f"{s['chars']:,}"),
        ("fed", "items refused as Responses input", str(o["invalid"]), str(s["invalid"])),
        ("fed", "opaque items", str(o["opaque_items"]), str(s["opaque_items"])),
        ("time", "add_items per turn (median)", seconds(o["add_median_s"]), seconds(s["add_median_s"])),
        ("time", "+ run_compaction per turn (median; max)", "(in add_items)",
         f"{seconds(s['compact_median_s'])}; {seconds(s['compact_max_s'])}"),
        ("time", "add_items and compaction, whole run", seconds(o["add_total_s"]),
         seconds(s["add_total_s"] + s["compact_total_s"])),
        ("time", "get_items (median)", seconds(o["get_median_s"]), seconds(s["get_median_s"])),
        ("negatives", f"failed call ids fed (of {r['failed']})", str(o["failed_fed"]), str(s["failed_fed"])),
        ("negatives", f"rejected call ids fed (of {r['rejected']})", str(o["rejected_fed"]), str(s["rejected_fed"])),
        ("negatives", f"fed, or in the context's summaries' facts (of {neg})", str(o["negatives_retained"]),
         str(s["negatives_retained"])),
        ("negatives", f"still in the store (of {neg})", str(o["negatives_stored"]), str(s["negatives_stored"])),
        ("literals", f"needed by an open obligation, fed (of {r['needed']})", str(o["needed_fed"]), str(s["needed_fed"])),
        ("literals", f"latest snapshot values fed (of {r['live_keys']})", str(o["live_fed"]), str(s["live_fed"])),
        ("trust", "context", o["mode"], s["mode"]),
        ("trust", "store verifies", "yes" if o["verified"] else "NO", "no check exists"),
        ("restart", "get_items the same", "yes" if rs["ours_same"] else "NO", "yes" if rs["sdk_same"] else "NO"),
        ("restart", "raw items in the store", f"{rs['ours_raw_items']:,} events ({rs['ours_mode']})",
         f"{rs['sdk_raw_items']:,} items"),
    ]
    section.rows += rows
    section.data.append(r)
    section.notes += [
        f"compactstore: CompactionPolicy(every=40, roll_up_every=5, on_risk='preserve'), bounded summarizer, "
        f"{o['nodes']} nodes; the SDK: default trigger (10 candidates), {r['compaction_calls']} compaction calls to a "
        f"local endpoint answering as the API documents (user messages + one opaque compaction item of {OPAQUE} chars)",
        "ids are counted in plain text; what the opaque compaction item holds cannot be checked by anyone but the model",
        "a digest's note names its newest 40 negative facts and the range of the earlier ones its children keep, "
        "which the recall tool fetches (facts:A-B); retained counts what is fed, listed or fetched so",
        "the SDK's run_compaction time is the client's own work (request transform, response parsing, history "
        "replacement); a real call adds a round trip and the model's compaction",
        f"whole run, both sides interleaved: {r['elapsed_s']:.1f} s",
    ]
    section.goals += [
        Goal("negatives fed or retained by compactstore (share)", o["negatives_retained"] / max(neg, 1), 1.0),
        Goal("compactstore items refused as Responses input", o["invalid"], 0, higher_is_better=False),
        Goal("compactstore context certified after restart", float(rs["ours_mode"] == "certified" and rs["ours_same"]), 1.0),
    ]
    return section


def main(argv: list[str] | None = None) -> int:
    """Run the comparison, print its table and write benchmarks/results/sdk_compaction.json."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1000, help="agent turns (default 1000; make bench runs 300)")
    parser.add_argument("--repeat", type=int, default=7, help="timed get_items calls per side (default 7)")
    args = parser.parse_args(argv)
    info = harness.machine()
    harness.print_machine(info, args.repeat)
    folder = tempfile.mkdtemp(prefix="sdk-compaction-")
    try:
        result = asyncio.run(compare(args.turns, folder, args.repeat))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    section = section_of(result)
    section.print()
    path = harness.write_json("sdk_compaction", info, [section], params=vars(args), elapsed_s=result["elapsed_s"])
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
