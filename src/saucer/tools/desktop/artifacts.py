"""The artifacts directory: where screenshots, saved trees and program logs are written.

A name given by the caller is a path inside the directory (``step-3/screen``);
one that leaves it (``..``, an absolute path elsewhere, a symbolic link) is
refused. Without a name, files are called ``KIND-YYYYmmdd-HHMMSS-mmm-NNN``
(UTC). Files are written whole or not at all (a temporary file, then rename).
"""

from __future__ import annotations

import contextlib
import os
from datetime import datetime, timezone
from pathlib import Path

from saucer.tools._common import SandboxError, relative_to_root, resolve_in_root
from saucer.tools.desktop import DesktopError

__all__ = ["Artifacts"]


class Artifacts:
    """Names and writes files under one directory (created on first use)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._counter = 0

    def path(self, name: str | None, kind: str, suffix: str) -> tuple[Path, str]:
        """The file for ``name`` (or a fresh one for ``kind``) ending in ``suffix``, and its name relative to the root."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DesktopError(f"cannot create the artifacts directory {str(self.root)!r}: {exc}") from None
        root = Path(os.path.realpath(self.root))
        if name is None:
            self._counter += 1
            stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")[:-3]
            name = f"{kind}-{stamp}-{self._counter:03d}{suffix}"
        elif not name.endswith(suffix):
            name += suffix
        try:
            path = resolve_in_root(root, name)
        except SandboxError as exc:
            raise DesktopError(f"artifact name refused: {exc}") from None
        if path == root or path.is_dir():
            raise DesktopError(f"artifact name {name!r} names a directory")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DesktopError(f"cannot create {str(path.parent)!r}: {exc}") from None
        return path, relative_to_root(root, path)

    @staticmethod
    def write(path: Path, data: bytes) -> None:
        """Write ``data`` to ``path`` atomically."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise DesktopError(f"cannot write {str(path)!r}: {exc}") from None
