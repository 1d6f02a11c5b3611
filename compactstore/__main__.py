"""``python -m compactstore``: the ``compactstore`` command."""

from .cli import main

main(prog_name="compactstore")
