"""The artifacts directory: where screenshots, saved trees and program logs are written.

A name given by the caller is a path inside the directory (``step-3/screen``);
one that leaves it (``..``, an absolute path elsewhere, a symbolic link) is
refused. Without a name, files are called ``KIND-YYYYmmdd-HHMMSS-mmm-NNN``
(UTC). Files are written whole or not at all: a temporary file with a random
name, then a rename.

Every file is written through descriptors, never through a path that can be
swapped: the directory is opened from the artifacts root one component at a
time with ``O_NOFOLLOW`` (:class:`saucer.tools.sandbox.SandboxRoot`), the
temporary file is created in it with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and
renamed within it (``renameat``), and a program's log is created the same
way. A symbolic link planted at a predictable name is never followed: the
write fails or replaces the link itself, and nothing outside is touched.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from saucer.tools._common import SandboxError, relative_to_root, resolve_in_root
from saucer.tools.desktop import DesktopError
from saucer.tools.sandbox import SandboxRoot

__all__ = ["Artifacts"]

_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Artifacts:
    """Names and writes files under one directory (created on first use)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._counter = 0

    def path(self, name: str | None, kind: str, suffix: str) -> tuple[Path, str]:
        """The file for ``name`` (or a fresh one for ``kind``) ending in ``suffix``, and its name relative to the root.

        Only a name: nothing is created here but the artifacts directory itself;
        :meth:`write` and :meth:`open_log` make the file (and its folders) through descriptors.
        """
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DesktopError(f"cannot create the artifacts directory {str(self.root)!r}: {exc}") from None
        root = Path(os.path.realpath(self.root))
        if name is None:
            self._counter += 1
            stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S-%f")[:-3]
            name = f"{kind}-{stamp}-{self._counter:03d}{suffix}"
        elif not name.endswith(suffix):
            name += suffix
        try:
            path = resolve_in_root(root, name)
        except SandboxError as exc:
            raise DesktopError(f"artifact name refused: {exc}") from None
        if path == root or path.is_dir():
            raise DesktopError(f"artifact name {name!r} names a directory")
        return path, relative_to_root(root, path)

    def _folder(self, path: Path) -> tuple[SandboxRoot, int, str]:
        """The artifacts root, a descriptor of ``path``'s folder (made if missing, no link followed) and its name."""
        try:
            sandbox = SandboxRoot(self.root)
        except ValueError as exc:
            raise DesktopError(str(exc)) from None
        try:
            where = sandbox.path(str(path))
            if not where.parts:
                raise SandboxError(f"{str(path)!r} is the artifacts directory itself")
            return sandbox, sandbox.open_dir(where.parent, create=True), where.name
        except (SandboxError, OSError) as exc:
            sandbox.close()
            raise DesktopError(f"cannot write {str(path)!r}: {exc}") from None

    def write(self, path: Path, data: bytes) -> None:
        """Write ``data`` to ``path`` (from :meth:`path`) atomically, through its folder's descriptor."""
        sandbox, folder, name = self._folder(path)
        tmp = f".{name}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(tmp, _NEW_FILE, 0o644, dir_fd=folder)
            try:
                with open(fd, "wb", closefd=False) as out:
                    out.write(data)
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)  # replaces a link at ``name``, never follows it
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise DesktopError(f"cannot write {str(path)!r}: {exc}") from None
        finally:
            os.close(folder)
            sandbox.close()

    def open_log(self, path: Path) -> BinaryIO:
        """A new file at ``path`` (from :meth:`path`) to append a program's output to; refused if anything is there."""
        sandbox, folder, name = self._folder(path)
        try:
            fd = os.open(name, _NEW_FILE | os.O_APPEND, 0o644, dir_fd=folder)
        except OSError as exc:
            raise DesktopError(f"cannot create the log {str(path)!r}: {exc}") from None
        finally:
            os.close(folder)
            sandbox.close()
        return open(fd, "ab")
