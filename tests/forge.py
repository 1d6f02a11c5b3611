"""Writing what the store refuses: a writer that skips the rules, as an attacker with write access can be."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from compactstore.log.admission import Admission


@contextmanager
def unchecked() -> Iterator[None]:
    """Let appends in this block skip the rules on derived events (every tree, head and seal is still written).

    What a store written by another writer, or edited by someone with the database and
    the key, can hold: the resolver and ``verify`` must then catch what admission would
    have refused.
    """
    admit = Admission.admit
    Admission.admit = lambda *args, **kwargs: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Admission.admit = admit  # type: ignore[method-assign]
