"""The CLI as a user runs it: ``python -m saucer`` in a fresh environment (no SAUCER_* settings of the caller's)."""

from __future__ import annotations

import os
import sys

__all__ = ["SAUCER", "cli_env"]

SAUCER = [sys.executable, "-m", "saucer"]


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a CLI run: no SAUCER_* settings of the caller's, no colour, 200 columns."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    env["COLUMNS"] = "200"
    env["NO_COLOR"] = "1"
    env.update(extra or {})
    return env
