"""What a session's parts read of the store they belong to: :class:`compactstore.store.Store` is one."""

from __future__ import annotations

from typing import Protocol

from .. import events as ev
from .. import witness as witnesses
from ..backends import Backend
from .caches import Caches


class Host(Protocol):
    """A store handle as its sessions' parts see it: its backend, caches, clock, witness and seals."""

    backend: Backend
    caches: Caches
    clock: ev.Clock
    watch: witnesses.Watch | None
    #: whether the store was made with a key
    keyed: bool
    #: the store's identity, bound into every artifact it makes
    store_id: str

    @property
    def has_key(self) -> bool:
        """Return whether this handle was opened with the store's key."""
        ...

    def seal_head(self, session: str, size: int, root: bytes, prev: int, seqs: bytes) -> bytes:
        """Return the seal a stored head of ``session`` must carry."""
        ...

    def head_mac(self, session: str, size: int, root: bytes) -> bytes | None:
        """Return the MAC a tree head carries under this handle's key (None without one)."""
        ...
