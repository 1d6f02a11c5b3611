"""Run the OpenAI Agents SDK's own session tests against CompactStoreSession, their assertions unchanged.

``tests/agents_sdk/tests/`` is a pinned copy of the SDK's session tests (see
``copy_sdk_tests.py``). Their subject is ``SQLiteSession``, the SDK's reference session,
which each test module names as a global; here that name is bound, per test, to
``SQLiteSignature`` (``sqlite_signature.py``): a ``CompactStoreSession`` built from
``SQLiteSession``'s arguments. The tests that read ``SQLiteSession``'s own internals (its connections, locks,
tables and error text) cannot apply to another session: :data:`NOT_APPLICABLE` skips each
with its reason. The run ends with a line counting what passed against ours.

The SDK runs its tests under pytest-asyncio; :func:`pytest_pyfunc_call` runs a coroutine
test in a fresh event loop instead, which is what that plugin's function scope gives.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from collections.abc import Iterator
from importlib import metadata, util
from pathlib import Path
from typing import Any

import pytest
from copy_sdk_tests import DEST, copied_version

#: The SDK version the copy was taken from.
VERSION = copied_version()
if util.find_spec("agents") is None:
    #: Without the test extra the copied tests cannot be imported (test_sdk_copy.py still checks the copy).
    collect_ignore = ["tests"]

_INTERNALS = "reads SQLiteSession's own {what}, which another session does not have"
#: Tests of SQLiteSession itself, by name (every parametrisation): why each cannot apply to another session.
NOT_APPLICABLE = {
    **dict.fromkeys((
        "test_sqlite_session_close_closes_worker_thread_connections",
        "test_sqlite_session_reaps_connections_from_exited_worker_threads",
        "test_sqlite_session_closes_retired_connections_before_the_next_allocation",
        "test_sqlite_session_keeps_connections_of_live_worker_threads",
        "test_sqlite_session_rollback_failure_evicts_connection",
        "test_sqlite_session_close_retries_quarantined_connection",
        "test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome",
    ), _INTERNALS.format(what="per-thread sqlite3 connections (_connections, _connections_lock)")),
    **dict.fromkeys((
        "test_sqlite_session_pop_item_skips_corrupt_most_recent",
        "test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows",
        "test_sqlite_session_get_items_limit_skips_corrupt_newest_rows",
        "test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows",
    ), "writes malformed JSON into SQLiteSession's table through its _locked_connection, to see it skipped; "
       "compactstore refuses a changed row instead (tests/test_tamper.py)"),
    "test_sqlite_session_file_lock_is_shared_across_instances": _INTERNALS.format(what="per-file lock (_lock)"),
    **dict.fromkeys((
        "test_sqlite_session_failed_add_items_releases_write_lock",
        "test_sqlite_session_failed_clear_session_rolls_back",
        "test_sqlite_session_failed_pop_item_releases_write_lock",
    ), _INTERNALS.format(what="tables (agent_sessions, agent_messages), opened with sqlite3")),
    "test_sqlite_session_closed_rejects_empty_add_items": (
        "asserts SQLiteSession's own error, RuntimeError('SQLiteSession is closed'); a closed store raises StoreClosed"),
    **dict.fromkeys((
        "test_backend_read_limit_cannot_hide_retained_history_from_compaction",
        "test_automatic_compaction_does_not_reload_unbounded_hidden_history",
        "test_expired_read_overhead_does_not_authorize_hidden_history",
    ), "relies on SQLiteSession's private compaction snapshot (_get_compaction_snapshot), without which the SDK's "
       "compaction session skips automatic compaction by design: SQLiteSession fails it too with that hook hidden"),
}


_outcomes: Counter[str] = Counter()


def _ours(item: pytest.Item) -> bool:
    return DEST in Path(str(item.path)).parents


def pytest_configure(config: pytest.Config) -> None:
    """Register the SDK's ``asyncio`` marker, which no plugin defines here."""
    config.addinivalue_line("markers", "asyncio: a coroutine test, run in a fresh event loop")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip the tests listed in :data:`NOT_APPLICABLE`, with their reasons; all of them under another SDK version."""
    for item in items:
        if not _ours(item):
            continue
        installed = metadata.version("openai-agents")
        reason = NOT_APPLICABLE.get(getattr(item, "originalname", item.name))
        if installed != VERSION:
            item.add_marker(pytest.mark.skip(reason=f"the copy is of openai-agents {VERSION}, {installed} is installed: "
                                                    "copy its tests with tests/agents_sdk/copy_sdk_tests.py"))
        elif reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"not applicable to another session: {reason}"))


@pytest.fixture(autouse=True)
def _compactstore_session(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Bind the test module's ``SQLiteSession`` to ``SQLiteSignature`` for this test."""
    from sqlite_signature import SQLiteSignature, current

    current[0] = request.node.nodeid
    if getattr(request.module, "SQLiteSession", None) is not None:
        monkeypatch.setattr(request.module, "SQLiteSession", SQLiteSignature)
    yield


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run a coroutine test to completion in a fresh event loop."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = inspect.signature(pyfuncitem.obj).parameters
    arguments: dict[str, Any] = {name: pyfuncitem.funcargs[name] for name in names}
    asyncio.run(pyfuncitem.obj(**arguments))
    return True


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Count each copied test's outcome, and whether it ran against a CompactStoreSession."""
    if "agents_sdk/tests/" not in report.nodeid.replace("\\", "/"):
        return
    import sqlite_signature

    if report.when == "call" or (report.when == "setup" and not report.passed):
        used = "" if report.nodeid in sqlite_signature.constructed or not report.passed else " that use no SQLiteSession"
        _outcomes[report.outcome + used] += 1


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print one line: how the SDK's session tests went against CompactStoreSession."""
    if _outcomes:
        counts = ", ".join(f"{n} {what}" for what, n in sorted(_outcomes.items()))
        terminalreporter.write_line(f"openai-agents {VERSION} session tests against CompactStoreSession: {counts}")
