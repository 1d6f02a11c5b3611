"""compactstore: tamper-evident, compaction-aware memory for AI agents.

An append-only event log per session, every event a leaf of the session's Merkle
tree (RFC 9162 shape, BLAKE3), with tree heads, span roots and proofs.

The names here are what an agent codes against: opening a store, the events it
appends, what reads and resolutions return, and the errors. Everything else stays in
its module: ``compactstore.events`` (every event kind), ``compactstore.resolver``
(context items, restored spans), ``compactstore.rules`` (risks, violations),
``compactstore.verify`` (problems), ``compactstore.summarize``, ``compactstore.policy``
(the steps a policy takes), ``compactstore.render`` (model input), ``compactstore.recall``
(fetching by handle what model input names without quoting it) and the adapters.
"""

from . import compaction, events, policy, recall, render, resolver, rules, summarize, verify, witness
from .compaction import AUTO, Node
from .copy import copy
from .errors import (
    CompactionInvariantError,
    CompactStoreError,
    ConflictError,
    IntegrityError,
    InvalidArgument,
    InvalidEvent,
    MarkerInvalid,
    NotAStore,
    ReconstructionUnsoundError,
    StoreClosed,
)
from .events import (
    Binding,
    Event,
    Fulfilment,
    LossClass,
    Obligation,
    Record,
    Redaction,
    ToolCall,
    ToolResult,
    TreeHead,
    Turn,
)
from .markers import Marker
from .policy import CompactionPolicy
from .resolver import Artifact, Resolution, reconstruct
from .store import Session, Store, open
from .verify import VerifyReport

__all__ = [
    # Opening a store, and its sessions.
    "open",
    "Store",
    "Session",
    "copy",
    # The events an agent appends.
    "Event",
    "Turn",
    "ToolCall",
    "ToolResult",
    "Binding",
    "Obligation",
    "Fulfilment",
    "Redaction",
    "LossClass",
    "AUTO",
    # When a session compacts itself.
    "CompactionPolicy",
    # What reads, compactions, markers and resolutions return.
    "Record",
    "TreeHead",
    "Node",
    "Marker",
    "Resolution",
    "Artifact",
    "reconstruct",
    "VerifyReport",
    # Errors.
    "CompactStoreError",
    "ConflictError",
    "IntegrityError",
    "InvalidArgument",
    "InvalidEvent",
    "MarkerInvalid",
    "NotAStore",
    "StoreClosed",
    "CompactionInvariantError",
    "ReconstructionUnsoundError",
]
