"""compactstore: tamper-evident, compaction-aware memory for AI agents.

An append-only event log per session, every event a leaf of the session's Merkle
tree (RFC 9162 shape, BLAKE3), with tree heads, span roots and proofs.
"""

from .errors import (
    CompactionInvariantError,
    CompactStoreError,
    ConflictError,
    IntegrityError,
    InvalidArgument,
    InvalidEvent,
    MarkerInvalid,
    ReconstructionUnsoundError,
)
from .compaction import AUTO, Finding, Node
from .rules import Risk
from .summarize import extractive
from .copy import CopyReport, copy
from .events import (
    Binding,
    Event,
    Excerpt,
    Fact,
    Fulfilment,
    GraphState,
    HandleClosed,
    HandleOpened,
    Item,
    LossClass,
    Obligation,
    Redacted,
    Redaction,
    Spill,
    SpillRef,
    Summary,
    ToolCall,
    ToolResult,
    Turn,
    Write,
    tick_clock,
)
from .markers import Marker, Violation
from .resolver import Artifact, ContextItem, RawItem, Resolution, RestoredSpan, SummaryItem, reconstruct
from .events import Record, TreeHead
from .store import Session, Store, open
from .verify import Problem, VerifyReport

__all__ = [
    "Artifact",
    "ContextItem",
    "Marker",
    "RawItem",
    "Resolution",
    "RestoredSpan",
    "SummaryItem",
    "Violation",
    "reconstruct",
    "AUTO",
    "Binding",
    "Excerpt",
    "Fact",
    "Finding",
    "Fulfilment",
    "GraphState",
    "HandleClosed",
    "HandleOpened",
    "Item",
    "LossClass",
    "Node",
    "Obligation",
    "Redacted",
    "Redaction",
    "Risk",
    "Spill",
    "SpillRef",
    "Summary",
    "extractive",
    "CompactStoreError",
    "CompactionInvariantError",
    "CopyReport",
    "ConflictError",
    "Event",
    "IntegrityError",
    "InvalidArgument",
    "InvalidEvent",
    "MarkerInvalid",
    "Problem",
    "ReconstructionUnsoundError",
    "Record",
    "Session",
    "Store",
    "ToolCall",
    "ToolResult",
    "TreeHead",
    "Turn",
    "VerifyReport",
    "Write",
    "copy",
    "open",
    "tick_clock",
]
