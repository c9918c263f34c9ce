"""The ``saucer`` command line.

Every command prints one clear sentence and exits non-zero on a user mistake
(bad path, unknown session, malformed file); tracebacks are for bugs only.
Every command that takes a session accepts its whole id, a unique prefix of
it, or ``last`` (the most recently updated session). What is printed is what
is stored: values are never read as markup, and output to a pipe is not wrapped.
"""

from __future__ import annotations

import typer

from saucer import __version__
from saucer.cli import (
    config_cmds,
    doctor_cmd,
    people,
    queue_cmds,
    running,
    service_cmds,
    session_cmds,
    store_cmds,
    transfer_cmds,
    ui_cmd,
)
from saucer.cli.common import console

app = typer.Typer(
    name="saucer",
    help="Durable, typed session state for agents: run sessions, then inspect, time-travel, fork and audit them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
store_app = typer.Typer(help="Maintain the event store: migrate, rekey, prune, delete.", no_args_is_help=True)
app.add_typer(store_app, name="store")
config_cmds.register(app)


def _version_callback(value: bool) -> None:
    if value:
        console.print(f"saucer {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """saucer: durable, typed session state for agents."""


session_cmds.register(app)  # sessions, show, history, state, diff
transfer_cmds.register(app)  # fork, export, import

# ================================================================= running

app.command("run")(running.run_cmd)
app.command("resume")(running.resume_cmd)
app.command("demo")(running.demo_cmd)
app.command("ui")(ui_cmd.ui_cmd)
people.register(app)  # set, vars, approvals, approve, refuse, answer, cancel


service_cmds.register(app)
store_cmds.register(store_app)
queue_cmds.register(app)
doctor_cmd.register(app)


def main() -> None:
    """Entry point of the ``saucer`` script."""
    app()


if __name__ == "__main__":
    main()
