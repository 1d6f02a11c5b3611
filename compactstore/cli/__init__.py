"""The ``compactstore`` command: a thin layer over the public API, one module per subcommand.

See :mod:`compactstore.cli.app` for the options and exit codes every subcommand shares.
"""

from __future__ import annotations

from . import append, audit, compact, copy, demo, export, mark, migrate, proof, show, verify  # noqa: F401 - registers
from .app import main

__all__ = ["main"]
