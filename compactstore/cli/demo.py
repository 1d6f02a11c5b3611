"""``compactstore demo``: play the story in :mod:`compactstore.demo` and leave its store behind."""

from __future__ import annotations

import json
import os
import shutil
import sys

import click

from .. import demo
from .app import is_url, json_option, main, reporting

STYLES = {"title": "bold", "step": "bold cyan", "ok": "green", "bad": "red", "dim": "dim"}


def _invoked_as() -> str:
    """Return how to spell the command so that it runs here: bare when it is on PATH."""
    argv0 = sys.argv[0]
    if os.path.basename(argv0) != "compactstore":
        return "compactstore"
    on_path = shutil.which("compactstore")
    if on_path and os.path.realpath(on_path) == os.path.realpath(argv0):
        return "compactstore"
    return argv0


@main.command("demo")
@click.option("--store", "-s", "target", default="compactstore.db", show_default=True, metavar="PATH",
              help="The SQLite file to write. An earlier demo's store there is replaced; anything else is refused.")
@json_option
def demo_command(target: str, as_json: bool) -> None:
    """Play a coding agent's session end to end and leave its store for the other commands.

    A migration made reversible: a failed dry run, a user's rejection, a rollback
    script that exists nowhere else and an obligation that needs it. The gate refuses
    a compaction until the script is spilled; L1 and L2 nodes, a certified marker and
    its resume; a summary that drops the rejection, refused at emission and falling
    back when forged; an authorize refused on a lossy artifact; the audit; then a
    tampered copy (in a temporary folder) caught by verify. Deterministic: the digests
    are the same on every run.
    """
    if is_url(target) or target == ":memory:":
        raise click.BadParameter("the demo writes a SQLite file: name a path", param_hint="--store")
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True)

    def say(text: str, style: str | None = None) -> None:
        if not as_json:
            console.print(text, style=STYLES.get(style or ""), markup=False)

    with reporting(as_json):
        result = demo.run(target, say, _invoked_as())
    if as_json:
        click.echo(json.dumps({"ok": True, **result}))
