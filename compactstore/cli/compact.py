"""``compactstore compact`` and ``compactstore digest``: L1 and L2 summary nodes, behind the gate."""

from __future__ import annotations

from typing import Any

import click

from ..compaction import AUTO, Auto, Node
from ..errors import CompactionInvariantError
from ..rules import Risk
from ..events import LossClass
from .app import emit, main, opened, pick_session, reporting, short, store_options

LOSSES = [c.value for c in LossClass]
#: ``--loss AUTO`` and ``--keep AUTO``: the library's :data:`compactstore.AUTO`.
AUTO_NAME = AUTO.value
GATE_HINT = ("rerun with --on-risk spill (store the binding, addressable by handle) or --on-risk preserve "
             "(keep it verbatim in the summary under a contract)")


def node_data(node: Node) -> dict[str, Any]:
    """Return a node as plain JSON data."""
    return {
        "pos": node.pos, "tier": node.tier, "start": node.start, "stop": node.stop, "loss": node.loss.value,
        "span_root": node.span_root.hex(), "children": node.children, "summary": node.summary,
        "negative_facts": [{"pos": f.pos, "status": f.status, "text": f.text} for f in node.negative_facts],
        "unresolved": [{"pos": i.pos, "kind": i.kind, "id": i.id} for i in node.unresolved],
        "kept": [{"pos": e.pos, "path": e.path, "value": e.value} for e in node.kept],
        "spills": [{"handle": r.handle, "key": r.key, "source": r.source, "digest": r.digest} for r in node.spills],
        "contract": node.contract,
    }


def node_lines(node: Node) -> list[str]:
    """Return a node described in a few lines."""
    lines = [f"L{node.tier} node at pos {node.pos} over [{node.start}, {node.stop}): {node.loss.value}, "
             f"span root {short(node.span_root)}…"]
    if node.children:
        lines.append(f"  digests L1 nodes at {', '.join(map(str, node.children))}")
    facts = ", ".join(f"pos {f.pos} {f.status}" for f in node.negative_facts) or "none"
    lines.append(f"  negative facts retained: {facts}")
    items = ", ".join(f"{i.kind} {i.id!r}" for i in node.unresolved) or "none"
    lines.append(f"  listed as UNRESOLVED: {items}")
    if node.kept:
        lines.append("  kept verbatim: " + ", ".join(f"pos {e.pos} {e.path}" for e in node.kept))
    for r in node.spills:
        lines.append(f"  spilled {r.key!r} (bound at pos {r.source}) to {r.handle}, digest {r.digest[:16]}…")
    return lines


def _keep(values: tuple[str, ...]) -> list[str | tuple[int, str]] | Auto:
    if AUTO_NAME in values:
        if len(values) > 1:  # the library takes AUTO or a list, never both
            raise click.BadParameter(f"{AUTO_NAME} keeps every literal: give it alone", param_hint="--keep")
        return AUTO
    out: list[str | tuple[int, str]] = []
    for v in values:
        pos, sep, path = v.partition(":")
        out.append((int(pos), path) if sep and pos.isdigit() and path else v)
    return out


@main.command("compact")
@click.argument("start", type=int)
@click.argument("stop", type=int)
@click.option("--summary", help="The summary text. Default: the extractive summarizer's.")
@click.option("--loss", type=click.Choice([*LOSSES, AUTO_NAME]), default="LOSSY_GIST", show_default=True,
              help="What the summary lost. LOSSLESS needs every literal of the span kept; AUTO picks LOSSLESS "
                   "when the node keeps every literal, negative fact and item of its span, else LOSSY_LITERAL.")
@click.option("--keep", multiple=True, metavar="KEY|POS:PATH|AUTO",
              help="Keep a binding (by key) or an event field (e.g. 2:output) verbatim. Repeatable. "
                   "AUTO (alone) keeps every literal of the span.")
@click.option("--on-risk", type=click.Choice(["refuse", "preserve", "spill"]), default="refuse", show_default=True,
              help="What the gate does with a non-regenerable binding an open obligation needs.")
@click.option("--dry-run", is_flag=True, help="Run the gate only; write nothing.")
@store_options
def compact_command(start: int, stop: int, summary: str | None, loss: str, keep: tuple[str, ...], on_risk: str,
                    dry_run: bool, target: str, key_env: str | None, session_name: str | None, as_json: bool) -> None:
    """Compact raw positions [START, STOP) into an L1 summary node.

    The node records the span root, the summary, its loss class, the negative facts it
    retains and the open items it lists as UNRESOLVED (both read from the log's
    structure). Before a lossy compaction the gate runs: if an open obligation needs a
    non-regenerable binding bound in the span, the compaction is refused (exit 1)
    unless --on-risk preserve or spill says what to do with it, or --keep AUTO keeps it.
    --loss AUTO makes the node as strong as what it keeps allows: with --keep AUTO a
    span whose literals are all readable gives a LOSSLESS node.
    """
    kept = _keep(keep)  # before the store opens: a bad --keep is bad usage
    with opened(target, key_env, as_json) as store:
        session = pick_session(store, session_name, target, as_json)
        with reporting(as_json, {CompactionInvariantError: GATE_HINT}):
            if dry_run:
                try:
                    session.assert_compaction_safe(start, stop, [] if kept is AUTO else [k for k in keep if ":" not in k])
                    risks: list[Risk] = []
                except CompactionInvariantError as exc:
                    # Every binding at risk is bound in the span, so --keep AUTO keeps its value.
                    if kept is not AUTO and (on_risk == "refuse" or not exc.risks):
                        raise
                    # Otherwise --on-risk says what the compaction does with these: the dry run reports it.
                    risks = [] if kept is AUTO else [r for r in exc.risks if isinstance(r, Risk)]
                data: dict[str, Any] = {"ok": True, "dry_run": True, "start": start, "stop": stop, "on_risk": on_risk}
                text = (f"the gate lets [{start}, {stop}) be compacted lossily: no open obligation needs a "
                        "non-regenerable binding from it")
                if kept is AUTO:
                    data["keep"] = AUTO_NAME
                    text = f"the gate lets [{start}, {stop}) be compacted: --keep AUTO keeps every literal of it verbatim"
                if risks:
                    data["at_risk"] = [{"key": r.key, "binding_pos": r.binding_pos, "obligation": r.obligation,
                                        "obligation_pos": r.obligation_pos} for r in risks]
                    doing = "spill" if on_risk == "spill" else "keep verbatim (preserve)"
                    text = (f"the gate lets [{start}, {stop}) be compacted with --on-risk {on_risk}: it would {doing} "
                            + ", ".join(f"binding {r.key!r} (bound at pos {r.binding_pos}, needed by obligation "
                                        f"{r.obligation!r})" for r in risks))
                emit(as_json, data, text)
                return
            node = session.compact(start, stop, summary=summary, loss=AUTO if loss == AUTO_NAME else LossClass(loss),
                                   keep=kept, on_risk=on_risk)  # type: ignore[arg-type]
    emit(as_json, {"ok": True, "node": node_data(node)}, node_lines(node))


@main.command("roll-up")
@click.argument("nodes", nargs=-1, required=True, type=int)
@click.option("--summary", help="The summary text. Default: the extractive summarizer's, over the children.")
@click.option("--loss", type=click.Choice([*LOSSES, AUTO_NAME]),
              help="Default (and AUTO): the weakest of the children's.")
@store_options
def roll_up_command(nodes: tuple[int, ...], summary: str | None, loss: str | None, target: str, key_env: str | None,
                   session_name: str | None, as_json: bool) -> None:
    """Roll up contiguous L1 NODES (their positions) into an L2 node.

    The L2 node carries its children's negative facts, excerpts and spills forward, and
    lists the items still open at its boundary. Its loss class cannot be stronger than
    its weakest child's (exit 1 if asked).
    """
    with opened(target, key_env, as_json) as store:
        session = pick_session(store, session_name, target, as_json)
        with reporting(as_json):
            node = session.roll_up(list(nodes), summary=summary, loss=LossClass(loss) if loss and loss != AUTO_NAME else AUTO)
    emit(as_json, {"ok": True, "node": node_data(node)}, node_lines(node))
