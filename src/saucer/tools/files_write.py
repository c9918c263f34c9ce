"""The files tool's writing: create, replace or append to a text file inside the sandbox root.

The file is opened without following links (``O_NOFOLLOW``) below a parent
directory opened through the sandbox, created with ``O_EXCL`` when missing, and
refused when it is not a regular file or has more than one hard link (another
link may lie outside the root). It is emptied only after those checks.
"""

from __future__ import annotations

import errno
import os
import stat as stat_module

from saucer.tools.files_models import WriteResult
from saucer.tools.files_paths import WRITE_FLAGS, FilesRoot
from saucer.tools.native import ToolError
from saucer.tools.sandbox import SandboxError, SandboxPath

__all__ = ["write_text"]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _open_for_write(root: FilesRoot, rel: SandboxPath, path: str, create_dirs: bool, append: bool) -> tuple[int, bool]:
    """A descriptor of the file to write (created when missing) and whether it was created."""
    try:
        parent = root.sandbox.open_dir(rel.parent, create=create_dirs)
    except SandboxError as exc:
        raise ToolError(str(exc)) from None
    except (FileNotFoundError, NotADirectoryError):
        raise ToolError(
            f"directory {rel.parent.shown!r} does not exist"
            + ("" if create_dirs else " (set create_dirs to create it)")
        ) from None
    except OSError as exc:
        raise ToolError(f"cannot create directory {rel.parent.shown!r}: {exc.strerror}") from None
    flags = WRITE_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if append else 0)
    try:
        for _ in range(3):
            try:
                return os.open(rel.name, flags, dir_fd=parent), False
            except FileNotFoundError:
                pass
            try:
                return os.open(rel.name, flags | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=parent), True
            except FileExistsError:
                continue  # created meanwhile: open it as an existing file
        raise ToolError(f"cannot write {path!r}: it keeps appearing and disappearing")
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ToolError(
                f"{path!r} is a symbolic link; links are not followed, so nothing outside the sandbox root "
                f"{str(root.options.root)!r} can be written through one"
            ) from None
        if exc.errno == errno.EISDIR:
            raise ToolError(f"{path!r} is a directory, not a file") from None
        if exc.errno == errno.ENXIO:
            raise ToolError(f"{path!r} is not a regular file") from None
        raise ToolError(f"cannot write {path!r}: {exc.strerror}") from None
    finally:
        os.close(parent)


def write_text(root: FilesRoot, path: str, content: str, *, create_dirs: bool, append: bool) -> WriteResult:
    """Replace (or, with ``append``, extend) the text file ``path`` with ``content``; refused when read-only."""
    if root.options.read_only:
        raise ToolError("this files server is read-only")
    rel = root.path(path)
    if not rel.parts:
        raise ToolError(f"{path!r} is a directory, not a file")
    data = content.encode("utf-8")
    limit = root.options.max_write
    if len(data) > limit:
        raise ToolError(f"content is {len(data)} bytes; the limit for one write is {limit} bytes")
    fd, created = _open_for_write(root, rel, path, create_dirs, append)
    try:
        info = os.fstat(fd)
        if not stat_module.S_ISREG(info.st_mode):
            raise ToolError(f"{path!r} is not a regular file")
        if info.st_nlink > 1:
            # Another name of the same file may lie outside the root: writing would change it there too.
            raise ToolError(
                f"{path!r} has {info.st_nlink} hard links; writing it would also change the other links, "
                "which may be outside the sandbox root"
            )
        if not append:
            os.ftruncate(fd, 0)  # only now: O_TRUNC would have emptied a refused file
        _write_all(fd, data)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    return WriteResult(path=rel.shown, bytes_written=len(data), size=size, created=created)
