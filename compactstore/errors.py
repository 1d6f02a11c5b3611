"""The error hierarchy: one base class, each error subclassing the matching built-in."""

from __future__ import annotations

from collections.abc import Sequence


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


class ConflictError(CompactStoreError):
    """An idempotency key was reused with a different event, or a writer lost a race."""

    def __init__(
        self, message: str, *, session: str | None = None, pos: int | None = None
    ) -> None:
        super().__init__(message)
        self.session = session
        self.pos = pos


class CompactionInvariantError(CompactStoreError):
    """A compaction would lose a non-regenerable binding an open obligation needs."""


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
