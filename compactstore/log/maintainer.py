"""Running a compaction policy on a session: each due step built, summarized and committed, a lost race decided again.

What is due is :func:`compactstore.policy.due`'s, from the session's plan kept by the
handle (:class:`compactstore.policy.Plan`). Each step is decided at a size and appended
only at that size (a compare-and-append), so a step that lost a race with another writer
(:class:`~compactstore.errors.SessionMoved`) is decided again from the log as it then
stands: two maintainers each do the work or find it done, and nothing is written twice.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from .. import compaction, markers, retention
from .. import events as ev
from .. import policy as policies
from ..errors import CompactionInvariantError, ConflictError, InvalidArgument, MarkerInvalid, SessionMoved
from ..policy import CompactionPolicy, Maintenance, Step
from .commit import RETRIES, Writer
from .reader import Reader


def run(view: Reader, writer: Writer, policy: CompactionPolicy, progress: Callable[[Step], None] | None) -> policies.Run:
    """Do the due steps, yielding what each needs summarized; return what was done.

    Each step is decided at a size and appended only at that size: a step that lost a
    race with another writer (:class:`~compactstore.errors.SessionMoved`) is decided
    again from the log as it then stands, so two maintainers each do the work or find
    it done. The text of a step summarized and then lost is kept for the same step.
    """
    if not isinstance(policy, CompactionPolicy):
        raise InvalidArgument("policy", f"want a CompactionPolicy, got {type(policy).__name__}")
    compacted: list[int] = []
    rolled_up: list[int] = []
    refused: list[str] = []
    marker: int | None = None
    flags = {"compact": True, "roll_up": True, "mark": True, "repair": False}
    repaired = False
    texts: dict[bytes, str] = {}
    lost = 0
    while True:
        size = view.size
        step = policies.due(view, policy, size=size, plan=_plan(view), **flags)
        if step is None and flags["repair"]:
            flags["repair"] = False  # nothing left to repair with: mark again
            continue
        if step is None:
            break
        if progress is not None:
            progress(step)
        try:
            if isinstance(step, policies.Mark):
                try:
                    marker = _step(writer, size, [markers.cover_marker(view, size)])
                    flags["mark"] = False  # one marker a run
                except MarkerInvalid as exc:
                    refused.append(f"marker at node {step.node}: {exc}")
                    # A cover that lost what an obligation opened since needs is written anew
                    # once a run: the tail compacted, the digest grown, the value spilled again.
                    stale = any(getattr(v, "condition", None) == "anchoring" for v in exc.violations)
                    flags["mark"] = stale and not repaired
                    flags["repair"] = flags["mark"]
                    repaired = True
                continue
            # Kept per redaction count: a summary of a span redacted since may quote what it erased.
            said = msgspec.json.encode(step) + str(len(view.host.backend.erasures(view.require_sid()))).encode()
            if said not in texts:
                texts[said] = yield policies.inputs(view, step)
            text = texts[said]
            if isinstance(step, policies.RollUp):
                rolled_up.append(_step(writer, size, compaction.roll_up(view, size, step.nodes, summary=text)))
                flags["repair"] = False
                continue
            try:
                compacted.append(_step(writer, size, compaction.compaction(
                    view, size, step.start, step.stop, summary=text, on_risk=policy.on_risk)))
            except CompactionInvariantError as exc:
                flags["compact"] = False  # the tail stays raw until the gate lets it go
                refused.append(f"compaction [{step.start}, {step.stop}): {exc}")
        except SessionMoved:
            lost += 1
            if lost > RETRIES:
                raise ConflictError(
                    f"session {view.name!r} kept moving while its maintenance was decided", session=view.name
                ) from None
    retained = None
    if marker is not None and policy.retain_last is not None:
        retained = _retain(view, writer, marker, policy.retain_last)
    return Maintenance(compacted, rolled_up, marker, refused, retained)


def _retain(view: Reader, writer: Writer, marker: int, keep_last: int) -> int | None:
    """Drop what the cover of the marker just emitted stands for, past what earlier erasures reached; return the retention's position."""
    erased = view.erasures()
    since = max(erased) + 1 if erased else 0

    def build(size: int) -> list[ev.Event]:
        plan = retention.planned(view, view.facts(size), marker, keep_last, since=since)
        return [] if plan is None else [plan]

    made = writer.built(build)
    return made[-1].pos if made else None

def _plan(view: Reader) -> policies.Plan | None:
    """Return the session's maintenance plan kept by this handle (a new one after a redaction)."""
    sid = view.sid()
    if sid is None:
        return None
    erasures = len(view.host.backend.erasures(sid))
    return view.host.caches.kept("plans", sid, erasures, policies.Plan)

def _step(writer: Writer, size: int, events: list[ev.Event]) -> int:
    """Append what a maintenance step built at ``size``, only at that size; return the last position."""
    return writer.extend(events, expect_size=size)[-1].pos
