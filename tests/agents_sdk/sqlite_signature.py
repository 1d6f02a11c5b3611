"""A CompactStoreSession that SQLiteSession's arguments make: what the copied SDK tests construct."""

from __future__ import annotations

from pathlib import Path

from agents.memory import SessionSettings

from compactstore.adapters.openai_agents import PREFIX, CompactStoreSession

_DEFAULT_TABLES = ("agent_sessions", "agent_messages")
#: The node ids of the tests that constructed one (the fixture in conftest.py names the current test).
constructed: set[str] = set()
current: list[str] = [""]


class SQLiteSignature(CompactStoreSession):
    """A CompactStoreSession made from SQLiteSession's arguments: ``db_path`` is the store, custom tables a name prefix."""

    def __init__(
        self,
        session_id: str,
        db_path: str | Path = ":memory:",
        sessions_table: str = "agent_sessions",
        messages_table: str = "agent_messages",
        session_settings: SessionSettings | dict[str, object] | None = None,
    ) -> None:
        """Open ``db_path`` as a store; sessions in other tables of one file are kept apart by their name's prefix."""
        constructed.add(current[0])
        tables = (sessions_table, messages_table)
        prefix = PREFIX if tables == _DEFAULT_TABLES else f"{PREFIX}{sessions_table}/{messages_table}:"
        super().__init__(session_id, str(db_path), session_settings=session_settings, prefix=prefix)
