"""The options of one desktop: where artifacts go, which display, the limits of one call, confinement."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from saucer.tools.confine import Policy

__all__ = ["DesktopOptions"]


@dataclass(frozen=True)
class DesktopOptions:
    """Where artifacts go, which display to use, and the limits of one call."""

    artifacts: Path
    display: str | None = None
    max_nodes: int = 5000
    max_depth: int = 100
    max_text: int = 10_000
    call_timeout: float = 5.0
    max_wait: float = 120.0
    max_type: int = 10_000
    keep_apps: bool = False
    #: How launched programs are confined (None: the default policy, writing to the working directory,
    #: the artifacts and a private temporary folder).
    policy: Policy | None = None

    def confinement(self) -> Policy:
        """:attr:`policy`, or the default one for this working directory and artifacts folder."""
        return self.policy or Policy.create("auto", (Path.cwd(), self.artifacts), scoped=False)
