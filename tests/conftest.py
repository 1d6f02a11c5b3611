"""Shared fixtures: every store test runs against each backend through `target`."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

import compactstore as cs


@pytest.fixture(params=["sqlite"])
def target(request: pytest.FixtureRequest, tmp_path) -> str:  # type: ignore[no-untyped-def]
    """Return a fresh store location for each backend."""
    return str(tmp_path / "store.db")


@pytest.fixture
def open_store(target: str) -> Iterator[Callable[..., cs.Store]]:
    """Return a function that opens the test's store (deterministic clock by default)."""
    opened: list[cs.Store] = []

    def _open(**kwargs: object) -> cs.Store:
        kwargs.setdefault("clock", cs.tick_clock())
        s = cs.open(target, **kwargs)  # type: ignore[arg-type]
        opened.append(s)
        return s

    yield _open
    for s in opened:
        s.close()


@pytest.fixture
def store(open_store: Callable[..., cs.Store]) -> cs.Store:
    """Return an open store with a deterministic clock."""
    return open_store()
