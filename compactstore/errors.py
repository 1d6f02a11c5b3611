"""The error hierarchy: one base class, each error subclassing the matching built-in."""

from __future__ import annotations

from collections.abc import Sequence


def shown(value: object, limit: int = 200) -> str:
    """Return ``value`` as an error message shows it: its repr, cut to ``limit`` characters.

    Never an error of its own: an int too long for decimal, a value nested past the
    recursion limit, or a ``__repr__`` that raises is shown by its type instead.
    """
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - whatever a caller's value does, the message is still made
        bits = f" of {value.bit_length()} bits" if isinstance(value, int) else ""
        return f"a {type(value).__name__}{bits}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class CompactStoreError(Exception):
    """Base class of every error compactstore raises.

    Attributes:
        hint: what the caller can do about it, when there is something to do.
    """

    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint


class InvalidArgument(CompactStoreError, ValueError):
    """A caller passed a bad value; nothing was written.

    Attributes:
        field: the name (or path, like ``args.a[0]``) of the bad value.
        reason: why it was refused.
    """

    def __init__(self, field: str, reason: str, *, hint: str | None = None) -> None:
        super().__init__(f"invalid {field}: {reason}", hint=hint)
        self.field = field
        self.reason = reason


class InvalidEvent(InvalidArgument):
    """An event failed validation; nothing was written."""


class SummaryTooLongError(InvalidArgument):
    """A summarizer returned more text than the compaction policy allows; nothing was written.

    The field is ``summarizer``. The session is unchanged: the next maintenance runs
    the same step again.

    Attributes:
        limit: the policy's ``summary_limit``, in characters.
        size: the characters the summarizer returned.
    """

    def __init__(self, limit: int, size: int) -> None:
        super().__init__(
            "summarizer", f"returned {size} characters, more than the policy's summary_limit of {limit}",
            hint="return a shorter summary, or raise CompactionPolicy(summary_limit=...)",
        )
        self.limit = limit
        self.size = size


class IntegrityError(CompactStoreError):
    """Stored data does not match its digest, tree head or MAC (tampering or corruption)."""

    def __init__(
        self,
        message: str,
        *,
        session: str | None = None,
        pos: int | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.session = session
        self.pos = pos


class WitnessMismatch(IntegrityError):
    """A session's stored tree does not extend the head a witness holds for it: restored, truncated or forked.

    Attributes:
        held: the size of the head the witness holds.
        got: the size of the session's latest stored head (0 when it has none).
    """

    def __init__(self, reason: str, *, session: str, held: int, got: int) -> None:
        super().__init__(
            f"session {session!r}: the store holds size {got}, the witness holds size {held}: {reason}",
            session=session,
            hint="the store is not the one the witness saw last: restore it from a copy that holds the witnessed head",
        )
        self.held = held
        self.got = got


class ConflictError(CompactStoreError):
    """An idempotency key was reused with a different event, or a writer lost a race."""

    def __init__(
        self, message: str, *, session: str | None = None, pos: int | None = None
    ) -> None:
        super().__init__(message)
        self.session = session
        self.pos = pos


class SessionMoved(ConflictError):
    """A compare-and-append found the session at another size than expected; nothing was written.

    Attributes:
        got: the session's size when the append was tried.
        want: the size the caller expected (``expect_size``).
    """

    def __init__(self, *, session: str, got: int, want: int) -> None:
        super().__init__(f"session {session!r} is at size {got}, not the expected {want}", session=session)
        self.hint = "read what was appended since, decide again, and retry"
        self.got = got
        self.want = want


class StaleHead(ConflictError):
    """A writer that built on a remembered head found the session moved on; nothing was written.

    Raised only by a backend writer opened with ``speculate=True``; the store then builds
    the append again under the lock, so it never reaches a caller.
    """


class LockTimeout(ConflictError):
    """A lock or serialization timeout (the database was busy); nothing was written. Retrying may succeed."""


class CompactionInvariantError(CompactStoreError):
    """A compaction would lose what an open obligation needs, or claims a loss class it does not meet.

    Attributes:
        risks: for a gate refusal, each open obligation and the binding it would lose
            (:class:`compactstore.rules.Risk`); empty for other refusals.
    """

    def __init__(self, message: str, *, risks: Sequence[object] = (), hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.risks = list(risks)


class MarkerInvalid(CompactStoreError):
    """A recovery marker failed a condition at emission.

    Attributes:
        violations: one entry per failed condition, naming condition, position and item.
    """

    def __init__(self, message: str, violations: Sequence[object] | None = None) -> None:
        super().__init__(message)
        self.violations = list(violations or [])


class ReconstructionUnsoundError(CompactStoreError, RuntimeError):
    """A restoration was asked of an artifact that cannot support it."""


class BodyDroppedError(ReconstructionUnsoundError):
    """A body was dropped by retention (its leaf stays, so the tree still verifies): what it held cannot be given back.

    Attributes:
        pos: the dropped position.
        by: the position of the retention event that dropped it.
        when: that event's timestamp, in microseconds since the Unix epoch.
    """

    def __init__(self, pos: int, by: int, when: int | None, doing: str = "read") -> None:
        import datetime as _dt

        stamp = "" if when is None else " at " + _dt.datetime.fromtimestamp(when / 1e6, _dt.timezone.utc).isoformat(
            timespec="seconds")
        super().__init__(f"cannot {doing}: the body at pos {pos} was dropped by the retention event at pos {by}{stamp}; "
                         "a certified summary stands for it",
                         hint="read the summary that covers it (Session.context), or keep it out of retention")
        self.pos, self.by, self.when = pos, by, when


class KeyRequired(CompactStoreError):
    """A keyed store opened without its key was asked to certify or restore; nothing was certified.

    The store may still be read; only its key can check the seals that every
    certification and restoration rests on.

    Attributes:
        session: the session asked about, when there is one.
    """

    def __init__(self, what: str = "certify", *, session: str | None = None) -> None:
        super().__init__(
            f"this store is keyed: open it with its key to {what}",
            hint="open it with cs.open(target, key=...) to certify, resume or restore",
        )
        self.session = session


class NotAStore(CompactStoreError):
    """The target holds no compactstore store, and opening it did not create one; nothing was written.

    Raised when ``open(target, create=False)`` finds no store there (a missing or empty
    file, an empty database), and always when the target is something else: a file
    that is not a SQLite database, or a database that holds other tables.

    Attributes:
        target: the target, as it is fit to print (a URL's password masked).
        reason: what was found there instead.
    """

    def __init__(self, target: str, reason: str, *, hint: str | None = None) -> None:
        super().__init__(f"{target} is not a compactstore store: {reason}", hint=hint)
        self.target = target
        self.reason = reason


class SchemaOutdatedError(CompactStoreError):
    """The store was made by an earlier release, and was not opened to be migrated; nothing was written.

    Attributes:
        found: the schema version the store records.
        wanted: the version this release reads.
        command: the command that migrates it (``cs.open(..., migrate=True)`` does the same).
    """

    def __init__(self, target: str, found: str, wanted: str, command: str) -> None:
        super().__init__(f"{target} is a store of schema {found}; this release reads {wanted}",
                         hint=f"run: {command} (or open it with migrate=True); it keeps every event and proof")
        self.found, self.wanted, self.command = found, wanted, command


class StoreClosed(CompactStoreError, ValueError):
    """The store was closed: the call was refused before it touched the database, and nothing was written.

    :meth:`compactstore.Store.close` waits for the calls in flight to finish, then
    refuses every new one with this error (a ``ValueError``, as an operation on a
    closed file is).

    Attributes:
        target: the store that was closed, as it is fit to print (a URL's password masked).
    """

    def __init__(self, target: str) -> None:
        super().__init__(f"the store {target} is closed", hint="open it again with cs.open()")
        self.target = target


class ForeignReference(InvalidArgument, ReconstructionUnsoundError):
    """A ``Node``, ``Marker`` or ``Artifact`` passed in is not what this session of this store logged.

    Only its position (and digest) is ever taken from a caller's object; when those
    name another session, another store, or another event than the one logged at that
    position, nothing is certified or restored. A bad argument and a refused
    restoration both, so it is both errors.

    Attributes:
        field: ``node``, ``marker`` or ``artifact``.
        reason: what does not match.
        session, pos: where it was held against the log.
    """

    def __init__(self, field: str, reason: str, *, session: str | None = None, pos: int | None = None) -> None:
        super().__init__(field, reason, hint="take nodes, markers and artifacts from the session you pass them to")
        self.session = session
        self.pos = pos


class InvalidType(InvalidArgument, TypeError):
    """A caller passed a value of the wrong type, or a setting its type does not have; nothing was written.

    A ``TypeError`` too, as Python raises for an argument of the wrong type or an
    unexpected keyword, and as a framework whose settings an adapter takes raises for them.
    """
