"""The files tool's path resolution: its options, and every path resolved inside the sandbox root.

A :class:`FilesRoot` holds the options and the root's descriptor
(:class:`~saucer.tools.sandbox.SandboxRoot`); it turns a path given by the
model into a :class:`~saucer.tools.sandbox.SandboxPath` and opens it, and turns
every refusal or OS error into a one-line :class:`~saucer.tools.native.ToolError`.
Reading (:mod:`saucer.tools.files_read`), writing (:mod:`saucer.tools.files_write`)
and searching (:mod:`saucer.tools.files_search`) go through it.
"""

from __future__ import annotations

import os
import stat as stat_module
from dataclasses import dataclass
from pathlib import Path

from saucer.tools.files_models import FileType
from saucer.tools.native import ToolError
from saucer.tools.sandbox import SandboxError, SandboxPath, SandboxRoot

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_MAX_READ",
    "DEFAULT_MAX_RESULTS",
    "DEFAULT_MAX_SEARCH_FILE",
    "DEFAULT_MAX_WRITE",
    "READ_FLAGS",
    "WRITE_FLAGS",
    "FilesOptions",
    "FilesRoot",
    "type_of",
]

DEFAULT_MAX_READ = 256 * 1024
DEFAULT_MAX_WRITE = 10 * 1024 * 1024
DEFAULT_MAX_ENTRIES = 500
DEFAULT_MAX_RESULTS = 100
# Files bigger than this are not searched (their size would dominate the call).
DEFAULT_MAX_SEARCH_FILE = 2 * 1024 * 1024

# Opening never blocks on a FIFO; what was opened is checked with fstat before any byte moves.
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK
WRITE_FLAGS = os.O_WRONLY | os.O_NONBLOCK


@dataclass(frozen=True)
class FilesOptions:
    """The sandbox root and the size caps."""

    root: Path
    max_read: int = DEFAULT_MAX_READ
    max_write: int = DEFAULT_MAX_WRITE
    max_search_file: int = DEFAULT_MAX_SEARCH_FILE
    read_only: bool = False

    @classmethod
    def create(
        cls,
        root: str | os.PathLike[str],
        *,
        max_read: int = DEFAULT_MAX_READ,
        max_write: int = DEFAULT_MAX_WRITE,
        max_search_file: int = DEFAULT_MAX_SEARCH_FILE,
        read_only: bool = False,
    ) -> FilesOptions:
        """Options with ``root`` resolved; the root must be an existing directory."""
        real = Path(os.path.realpath(root))
        if not real.is_dir():
            raise ValueError(f"sandbox root {str(root)!r} is not a directory")
        return cls(real, max_read, max_write, max_search_file, read_only)


def type_of(mode: int) -> FileType:
    """The kind of file a ``st_mode`` describes, as the tools name it."""
    if stat_module.S_ISREG(mode):
        return "file"
    if stat_module.S_ISDIR(mode):
        return "directory"
    if stat_module.S_ISLNK(mode):
        return "symlink"
    return "other"


class FilesRoot:
    """The options and the root's descriptor; paths resolved and opened inside it, errors as :class:`ToolError`.

    ``use_openat2`` forces or disables the kernel resolver (tests).
    """

    def __init__(self, options: FilesOptions, *, use_openat2: bool | None = None) -> None:
        self.options = options
        self.sandbox = SandboxRoot(options.root, use_openat2=use_openat2)

    def close(self) -> None:
        """Release the root's descriptor."""
        self.sandbox.close()

    def path(self, path: str) -> SandboxPath:
        """``path`` resolved inside the root (refused when it would leave it)."""
        try:
            return self.sandbox.path(path)
        except SandboxError as exc:
            raise ToolError(str(exc)) from None

    def open(self, rel: SandboxPath, given: str, flags: int, what: str = "file") -> int:
        """A descriptor of ``rel`` (``given`` is the caller's spelling, for the error message)."""
        try:
            return self.sandbox.open(rel, flags)
        except SandboxError as exc:
            raise ToolError(str(exc)) from None
        except FileNotFoundError:
            raise ToolError(f"{what} {given!r} does not exist") from None
        except OSError as exc:
            raise ToolError(f"cannot open {given!r}: {exc.strerror}") from None

    def is_directory(self, rel: SandboxPath, given: str, what: str = "path") -> bool:
        """Whether ``rel`` (which must exist) is a directory."""
        fd = self.open(rel, given, READ_FLAGS, what=what)
        try:
            return stat_module.S_ISDIR(os.fstat(fd).st_mode)
        finally:
            os.close(fd)

    def directory(self, rel: SandboxPath, given: str) -> None:
        """Raise ToolError unless ``rel`` is a directory one can walk."""
        if not self.is_directory(rel, given, what="directory"):
            raise ToolError(f"{given!r} is a file, not a directory; use stat or read")
