"""Adapters that plug compactstore into agent frameworks.

Each adapter is a module of its own and imports its framework; this package imports
none, so ``import compactstore`` never loads a framework:

- :mod:`compactstore.adapters.langgraph`: ``CompactStoreSaver``, a LangGraph
  checkpointer (extra ``compactstore[langgraph]``).
- :mod:`compactstore.adapters.openai_agents`: ``CompactStoreSession``, an OpenAI Agents
  SDK session (extra ``compactstore[openai]``).
"""
