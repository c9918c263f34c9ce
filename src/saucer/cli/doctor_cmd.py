"""``saucer doctor``: what this machine gives saucer's tools, starting with the kernel confinement in force.

``register(app)`` adds the command. The confinement line is the one ``saucer run`` prints at its
start (:func:`saucer.dispatch.servers.confinement_summary`).
"""

from __future__ import annotations

from pathlib import Path

import typer

from saucer.cli.common import ConfigOption, console, friendly, settings_for
from saucer.cli.output import visible

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add ``doctor`` to ``app``."""
    app.command("doctor")(doctor_cmd)


@friendly
def doctor_cmd(
    workspace: Path | None = typer.Option(
        None,
        "--workspace",
        "-w",
        help="Directory the built-in shell and files tools act in (default: the current directory).",
    ),
    config: Path | None = ConfigOption,
) -> None:
    """Say how commands run here: the kernel confinement in force (setting shell.sandbox) and what it allows.

    Exits 1 when no confinement can be put in force (then the shell tool refuses
    every command until bubblewrap is installed or shell.sandbox is "off").
    """
    from saucer.dispatch.servers import confinement_summary
    from saucer.tools.confine import bubblewrap_path, resolve
    from saucer.tools.landlock import abi_version

    settings = settings_for(config)
    where = (workspace or Path.cwd()).expanduser().resolve()
    console.print(visible(confinement_summary(settings.shell, where)), markup=False, highlight=False)
    abi = abi_version()
    console.print(
        f"landlock: ABI {abi}" if abi else "landlock: not offered by this kernel", markup=False, highlight=False
    )
    bwrap = bubblewrap_path()
    console.print(
        f"bubblewrap: {visible(bwrap)}"
        if bwrap
        else "bubblewrap: not installed (Debian: apt-get install -y bubblewrap)",
        markup=False,
        highlight=False,
    )
    console.print(f"sandbox setting: {settings.shell.sandbox}", markup=False, highlight=False)
    if resolve(settings.shell.sandbox).error is not None:
        raise typer.Exit(1)
