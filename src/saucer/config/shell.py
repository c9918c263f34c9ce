"""``[shell]``: how the commands of the shell tool and the programs the desktop tool launches are confined.

The values are those of :class:`saucer.tools.confine.Policy` (config imports nothing of saucer, so
the names are repeated here; a test keeps the two lists of modes equal).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["ShellSettings"]


class ShellSettings(BaseModel):
    """``[shell]``: the kernel confinement of commands and launched programs (see the README's Boundaries)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, defer_build=True)

    sandbox: Literal["auto", "landlock", "bubblewrap", "off"] = Field(
        "auto",
        description="How commands are confined: auto (Landlock, else bubblewrap; refused when neither), landlock, "
        "bubblewrap, or off (unconfined, said once per run).",
    )
    network: bool | list[int] = Field(
        True, description="Network of commands: true, false (no TCP), or the TCP ports they may connect to."
    )
    read: list[Path] = Field(
        default_factory=lambda: [Path("/")],
        description="Folders commands may read (default: the whole file system); list what programs need "
        "to run too (/usr, /lib, /etc...).",
    )
    write: list[Path] = Field(
        [],
        description="Folders commands may write to besides the workspace, the session's artifacts and a private TMPDIR.",
    )

    @field_validator("network")
    @classmethod
    def _check_ports(cls, value: bool | list[int]) -> bool | list[int]:
        if not isinstance(value, bool) and any(not 0 < port < 65536 for port in value):
            raise ValueError(f"TCP ports are between 1 and 65535, got {value}")
        return value

    @field_validator("read", "write")
    @classmethod
    def _absolute(cls, value: list[Path]) -> list[Path]:
        for path in value:
            if not Path(path).expanduser().is_absolute():
                raise ValueError(f"folders must be absolute paths, got {str(path)!r}")
        return [Path(path).expanduser() for path in value]
