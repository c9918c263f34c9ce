"""Paths confined to a directory, resolved from a file descriptor of it: never by name after a check.

:class:`SandboxRoot` holds an open descriptor of the root directory. Every
path is first normalised as text (``.`` and ``..`` folded; leaving the root
is refused; absolute paths must lie inside the root), then opened *relative
to that descriptor* in one of two ways:

- on Linux 5.6+, one ``openat2`` call with ``RESOLVE_BENEATH |
  RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS``: the kernel refuses any
  symbolic link and anything that resolves above the root, atomically;
- elsewhere, a walk that opens each component relative to the previous
  directory descriptor with ``O_NOFOLLOW | O_DIRECTORY`` (and the last one
  with ``O_NOFOLLOW``).

Either way, a symbolic link anywhere in the path is refused, and a directory
swapped for a link between two calls cannot redirect the open. The caller
then reads, writes, lists and stats through the descriptor it got back
(``fstat``, ``pread``, ``scandir`` of a descriptor, ``*at`` calls with
``dir_fd``), so what was checked is what is used.

What this does not cover: an object that was inside the root when it was
opened can be *moved* out of it afterwards by someone who may write outside
the root, and a file may have hard links elsewhere (writers should refuse
files with ``st_nlink > 1``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat as stat_module
import struct
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "SandboxError",
    "SandboxRoot",
    "SandboxPath",
    "MAX_PATH_BYTES",
    "MAX_DEPTH",
    "openat2_available",
]

MAX_PATH_BYTES = 4096
"""Longest path accepted, in UTF-8 bytes (Linux's PATH_MAX)."""

MAX_DEPTH = 256
"""Most components a path may have once normalised; walks stop descending at this depth too."""

_MAX_NAME_BYTES = 255
_EAGAIN_RETRIES = 8

# openat2(2): <linux/openat2.h>. The syscall number is the same on every architecture that has it.
_SYS_OPENAT2 = 437
_AT_FDCWD = -100
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_RESOLVE = _RESOLVE_NO_MAGICLINKS | _RESOLVE_NO_SYMLINKS | _RESOLVE_BENEATH

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)


class SandboxError(ValueError):
    """A path is refused: it leaves the sandbox root, goes through a symbolic link, or is too long or deep."""


@dataclass(frozen=True)
class SandboxPath:
    """A path inside the root as its normalised components (``()`` is the root itself)."""

    parts: tuple[str, ...]

    @property
    def shown(self) -> str:
        """The path as shown to the model: relative to the root, ``.`` for the root."""
        return "/".join(self.parts) or "."

    @property
    def parent(self) -> SandboxPath:
        """The containing directory (the root's parent is refused before it is ever asked for)."""
        return SandboxPath(self.parts[:-1])

    @property
    def name(self) -> str:
        """The last component (empty for the root)."""
        return self.parts[-1] if self.parts else ""

    def child(self, name: str) -> SandboxPath:
        """This path with one more component."""
        return SandboxPath((*self.parts, name))


def _load_openat2() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
    return syscall


_syscall = _load_openat2()


def _openat2(dir_fd: int, path: bytes, flags: int, mode: int) -> int:
    """``openat2(dir_fd, path, {flags, mode, resolve})``; raise OSError like ``os.open``."""
    assert _syscall is not None
    how = ctypes.create_string_buffer(struct.pack("=QQQ", flags, mode if flags & os.O_CREAT else 0, _RESOLVE))
    for _ in range(_EAGAIN_RETRIES):
        fd = _syscall(_SYS_OPENAT2, dir_fd, path, how, len(how.raw))
        if fd >= 0:
            return int(fd)
        code = ctypes.get_errno()
        if code not in (errno.EAGAIN, errno.EINTR):
            raise OSError(code, os.strerror(code), path.decode("utf-8", "surrogateescape"))
    # The kernel could not rule out a race with a rename: refuse rather than guess.
    raise OSError(errno.EAGAIN, "path resolution kept racing with renames", path.decode("utf-8", "surrogateescape"))


def openat2_available() -> bool:
    """Whether this kernel has ``openat2`` with the flags used here (Linux 5.6+, not filtered out)."""
    if _syscall is None:
        return False
    try:
        fd = _openat2(_AT_FDCWD, b".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, 0)
    except OSError:
        return False
    os.close(fd)
    return True


_OPENAT2 = openat2_available()


class SandboxRoot:
    """An open directory that every path is resolved beneath; see the module docs.

    ``use_openat2`` forces (True) or disables (False) the kernel resolver;
    by default it is used when available. Close the root with :meth:`close`.
    """

    def __init__(self, root: str | os.PathLike[str], *, use_openat2: bool | None = None) -> None:
        self.root = Path(os.path.realpath(root))
        if use_openat2 and not _OPENAT2:
            raise OSError(errno.ENOSYS, "openat2 is not available on this system")
        self.kernel_resolver = _OPENAT2 if use_openat2 is None else use_openat2
        try:
            self.fd = os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise ValueError(
                f"sandbox root {str(root)!r} is not a directory that can be opened: {exc.strerror}"
            ) from None
        self._closer = weakref.finalize(self, os.close, self.fd)

    def close(self) -> None:
        """Release the root's descriptor (also done when the object is collected)."""
        self._closer()
        self.fd = -1

    # ------------------------------------------------------------------ paths as text

    def path(self, raw: str | os.PathLike[str]) -> SandboxPath:
        """Normalise ``raw`` (relative to the root, or absolute inside it); raise :class:`SandboxError`."""
        text = os.fspath(raw)
        if not isinstance(text, str):
            raise SandboxError("a path must be text")
        if "\x00" in text:
            raise SandboxError(f"path {text[:80]!r} contains a NUL byte")
        try:
            size = len(text.encode("utf-8", "surrogateescape"))
        except UnicodeEncodeError:
            raise SandboxError(f"path {_clip(text)!r} is not valid Unicode (it has an unpaired surrogate)") from None
        if size > MAX_PATH_BYTES:
            raise SandboxError(f"path is {size} bytes long; the limit is {MAX_PATH_BYTES}")
        if os.path.isabs(text):
            root = str(self.root)
            if text != root and not text.startswith(root.rstrip("/") + "/"):
                raise SandboxError(f"path {_clip(text)!r} escapes the sandbox root {root!r}")
            text = text[len(root) :]
        parts: list[str] = []
        for part in text.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if not parts:
                    raise SandboxError(f"path {_clip(text)!r} escapes the sandbox root {str(self.root)!r}")
                parts.pop()
                continue
            if len(part.encode("utf-8", "surrogateescape")) > _MAX_NAME_BYTES:
                raise SandboxError(f"a component of path {_clip(text)!r} is longer than {_MAX_NAME_BYTES} bytes")
            parts.append(part)
        if len(parts) > MAX_DEPTH:
            raise SandboxError(f"path has {len(parts)} components; the limit is {MAX_DEPTH}")
        return SandboxPath(tuple(parts))

    # ------------------------------------------------------------------ opening

    def open(self, path: SandboxPath, flags: int, mode: int = 0o644) -> int:
        """A descriptor of ``path`` opened with ``flags``; no component (the last included) may be a link.

        Raises :class:`SandboxError` for a link (naming it) and OSError for the
        rest (``FileNotFoundError``, ``IsADirectoryError``...).
        """
        flags |= os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        if not path.parts:
            return os.open(".", flags & ~os.O_CREAT, dir_fd=self.fd)
        try:
            if self.kernel_resolver:
                return _openat2(self.fd, "/".join(path.parts).encode("utf-8", "surrogateescape"), flags, mode)
            parent = self._walk(path.parent)
            try:
                return os.open(path.name, flags, mode, dir_fd=parent)
            finally:
                os.close(parent)
        except OSError as exc:
            raise self._explain(path, exc) from None

    def open_dir(self, path: SandboxPath, *, create: bool = False) -> int:
        """A descriptor of the directory ``path``; with ``create``, missing directories are made (mode 0o755)."""
        try:
            return self.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            if not create:
                raise
        try:
            return self._walk(path, create=True)
        except OSError as exc:
            raise self._explain(path, exc) from None

    def _walk(self, path: SandboxPath, *, create: bool = False) -> int:
        """Open each component of ``path`` relative to the previous one (no link is followed)."""
        fd = os.dup(self.fd)
        try:
            for part in path.parts:
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    # made by someone else meanwhile; the open below checks what it is
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def lstat(self, path: SandboxPath) -> os.stat_result:
        """Metadata of ``path`` itself (a link is reported as a link, not followed)."""
        if not path.parts:
            return os.fstat(self.fd)
        parent = self.open_dir(path.parent)
        try:
            return os.stat(path.name, dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(parent)

    def walk(self, top: SandboxPath, *, hidden: bool = False) -> Iterator[tuple[SandboxPath, os.stat_result]]:
        """Entries under the directory ``top``, each directory's sorted by name, parents before children.

        Nothing is followed through a link; hidden names (starting with a dot)
        are skipped unless ``hidden``; directories deeper than
        :data:`MAX_DEPTH` are not entered. A directory that vanishes or turns
        into a link while walking is skipped.
        """
        pending = [top]
        while pending:
            directory = pending.pop()
            try:
                entries = self.entries(directory)
            except (OSError, SandboxError):
                continue
            below: list[SandboxPath] = []
            for name, info in entries:
                if not hidden and name.startswith("."):
                    continue
                child = directory.child(name)
                yield child, info
                if stat_module.S_ISDIR(info.st_mode) and len(child.parts) < MAX_DEPTH:
                    below.append(child)
            pending.extend(reversed(below))

    def entries(self, directory: SandboxPath) -> list[tuple[str, os.stat_result]]:
        """The names in ``directory`` with their own metadata (links not followed), sorted by name."""
        fd = self.open_dir(directory)
        try:
            found = []
            with os.scandir(fd) as scan:
                for entry in scan:
                    try:
                        found.append((entry.name, entry.stat(follow_symlinks=False)))
                    except OSError:
                        continue  # removed while listing
        finally:
            os.close(fd)
        return sorted(found, key=lambda item: item[0])

    # ------------------------------------------------------------------ errors

    def _explain(self, path: SandboxPath, exc: OSError) -> Exception:
        """A :class:`SandboxError` naming the link when ``exc`` came from one; ``exc`` otherwise."""
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EXDEV, errno.EAGAIN):
            return exc
        link = self._first_link(path)
        if link is not None:
            return SandboxError(
                f"path {path.shown!r} goes through the symbolic link {link!r}; links are not followed, "
                f"so nothing outside the sandbox root {str(self.root)!r} can be reached through one"
            )
        if exc.errno in (errno.EXDEV, errno.EAGAIN):
            return SandboxError(f"path {path.shown!r} escapes the sandbox root {str(self.root)!r}")
        return exc

    def _first_link(self, path: SandboxPath) -> str | None:
        """The first component of ``path`` that is a symbolic link right now (for messages only)."""
        fd = os.dup(self.fd)
        try:
            for index, part in enumerate(path.parts):
                try:
                    info = os.stat(part, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    return None
                if stat_module.S_ISLNK(info.st_mode):
                    return "/".join(path.parts[: index + 1])
                if not stat_module.S_ISDIR(info.st_mode):
                    return None
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    return None
                os.close(fd)
                fd = child
            return None
        finally:
            os.close(fd)


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
