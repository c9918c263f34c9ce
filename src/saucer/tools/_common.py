"""Helpers shared by the built-in servers: sandbox paths, option parsing, quiet servers."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from mcp.server.mcpserver import MCPServer

__all__ = [
    "SandboxError",
    "resolve_in_root",
    "relative_to_root",
    "env_default",
    "env_list",
    "existing_dir",
    "positive_int",
    "positive_float",
    "make_server",
    "parse",
]


class SandboxError(ValueError):
    """A path points outside the sandbox root."""


def resolve_in_root(root: Path, path: str | os.PathLike[str]) -> Path:
    """The real path of ``path`` (relative to ``root``, or absolute), refusing anything outside ``root``.

    Symbolic links are resolved before the check, so a link inside the root
    that points outside it is refused like ``..`` is. ``root`` must already be
    a resolved path.
    """
    raw = os.fspath(path)
    if "\x00" in raw:
        raise SandboxError(f"path {raw!r} contains a NUL byte")
    candidate = Path(raw) if os.path.isabs(raw) else root / raw
    real = Path(os.path.realpath(candidate))
    if real != root and root not in real.parents:
        raise SandboxError(f"path {raw!r} escapes the sandbox root {str(root)!r} (it resolves to {str(real)!r})")
    return real


def relative_to_root(root: Path, path: Path) -> str:
    """``path`` as shown to the model: relative to the root, ``.`` for the root itself."""
    rel = path.relative_to(root).as_posix()
    return rel or "."


def env_default(name: str, default: str | None = None) -> str | None:
    """The value of environment variable ``name`` or ``default`` (options: argv beats env beats default)."""
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def env_list(name: str) -> list[str]:
    """A newline-separated list from environment variable ``name`` (patterns may contain ``:``)."""
    value = os.environ.get(name, "")
    return [line.strip() for line in value.splitlines() if line.strip()]


def positive_int(text: str) -> int:
    """argparse type: an integer > 0."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def make_server(name: str, instructions: str) -> MCPServer:
    """An MCPServer that logs warnings only, so a stdio server's stderr stays quiet."""
    return MCPServer(name, instructions=instructions, log_level="WARNING", warn_on_duplicate_tools=True)


def existing_dir(text: str) -> Path:
    """argparse type: an existing directory, returned resolved."""
    path = Path(os.path.realpath(Path(text).expanduser()))
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    return path


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv`` (None: ``sys.argv[1:]``)."""
    return parser.parse_args(None if argv is None else list(argv))
