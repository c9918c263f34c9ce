"""``saucer config convert``: UFO's YAML settings as saucer's TOML.

``register(app)`` adds the ``saucer config`` group.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from saucer.cli.common import friendly

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the ``config`` group (``convert``) to ``app``."""
    config_app = typer.Typer(
        help="Read other projects' settings: UFO's config.yaml / agents.yaml as saucer.toml.", no_args_is_help=True
    )
    config_app.command("convert")(config_convert_cmd)
    app.add_typer(config_app, name="config")


@friendly
def config_convert_cmd(
    source: Path = typer.Argument(
        ..., help="UFO's YAML file (config.yaml, system.yaml, agents.yaml) or a folder of them."
    ),
) -> None:
    """Print the saucer.toml equivalent of UFO's settings: every key with a counterpart, and a comment
    saying why for each key without one. `saucer config convert config/ufo/ > saucer.toml`."""
    from saucer.ufo_config import convert

    sys.stdout.write(convert(source))
