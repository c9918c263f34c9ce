"""The files tool's reading: a text file's bytes (paged), a directory's entries, a path's metadata.

Each function takes the :class:`~saucer.tools.files_paths.FilesRoot` that resolves
its path; every failure is a :class:`~saucer.tools.native.ToolError` of one line.
"""

from __future__ import annotations

import codecs
import os
import stat as stat_module
from collections.abc import Iterable
from datetime import UTC, datetime

from saucer.tools.files_models import DirEntry, FileContent, FileStat, Listing
from saucer.tools.files_paths import DEFAULT_MAX_ENTRIES, READ_FLAGS, FilesRoot, type_of
from saucer.tools.native import ToolError
from saucer.tools.sandbox import SandboxError, SandboxPath

__all__ = ["BINARY_SNIFF", "complete_utf8", "list_directory", "read_all", "read_text", "stat_path"]

# A file with a NUL byte in its first BINARY_SNIFF bytes is taken for binary.
BINARY_SNIFF = 8192


def complete_utf8(data: bytes) -> tuple[str, int]:
    """Decode ``data`` up to its last complete UTF-8 character; return the text and the bytes used."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(data, final=False)
    pending = decoder.getstate()[0]
    return text, len(data) - len(pending)


def read_all(fd: int, limit: int, offset: int = 0) -> bytes:
    """Up to ``limit`` bytes of ``fd`` from ``offset`` (pread loops until the limit or the end)."""
    chunks: list[bytes] = []
    got = 0
    while got < limit:
        chunk = os.pread(fd, min(limit - got, 1024 * 1024), offset + got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_text(root: FilesRoot, path: str, offset: int = 0, max_bytes: int | None = None) -> FileContent:
    """Read a text file from byte ``offset``, at most ``max_bytes`` (capped by the options' ``max_read``)."""
    rel = root.path(path)
    if offset < 0:
        raise ToolError(f"offset must be >= 0, got {offset}")
    limit = root.options.max_read
    cap = limit if max_bytes is None else min(max_bytes, limit)
    if cap <= 0:
        raise ToolError(f"max_bytes must be > 0, got {max_bytes}")
    fd = root.open(rel, path, READ_FLAGS)
    try:
        info = os.fstat(fd)
        if stat_module.S_ISDIR(info.st_mode):
            raise ToolError(f"{path!r} is a directory; use list to see its entries")
        if not stat_module.S_ISREG(info.st_mode):
            raise ToolError(f"{path!r} is not a regular file")
        # One extra byte tells whether the file goes on.
        data = read_all(fd, cap + 1, offset)
    finally:
        os.close(fd)
    if b"\x00" in data[:BINARY_SNIFF]:
        raise ToolError(f"file {path!r} looks binary (it contains NUL bytes); only text files can be read")
    more = len(data) > cap
    data = data[:cap]
    text, used = complete_utf8(data) if more else (data.decode("utf-8", errors="replace"), len(data))
    end = offset + used
    truncated = more or end < info.st_size
    return FileContent(
        path=rel.shown,
        content=text,
        offset=offset,
        bytes_read=used,
        size=info.st_size,
        truncated=truncated,
        next_offset=end if truncated else None,
    )


def list_directory(
    root: FilesRoot,
    path: str = ".",
    recursive: bool = False,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    include_hidden: bool = False,
) -> Listing:
    """Entries of a directory (or of its whole tree when ``recursive``); links are listed, never followed."""
    if max_entries <= 0:
        raise ToolError(f"max_entries must be > 0, got {max_entries}")
    rel = root.path(path)
    root.directory(rel, path)
    if recursive:
        found: Iterable[tuple[SandboxPath, os.stat_result]] = root.sandbox.walk(rel, hidden=include_hidden)
    else:
        try:
            listed = root.sandbox.entries(rel)
        except (OSError, SandboxError) as exc:
            raise ToolError(f"cannot list {path!r}: {exc}") from None
        found = ((rel.child(name), info) for name, info in listed if include_hidden or not name.startswith("."))
    entries: list[DirEntry] = []
    truncated = False
    for entry, info in found:
        if len(entries) >= max_entries:
            truncated = True
            break
        kind = type_of(info.st_mode)
        # Links are listed as links, under their own name, never followed.
        entries.append(DirEntry(path=entry.shown, type=kind, size=info.st_size if kind == "file" else None))
    return Listing(path=rel.shown, entries=entries, truncated=truncated)


def stat_path(root: FilesRoot, path: str) -> FileStat:
    """Type, size, modification time and permissions of ``path`` (a link is described, not followed)."""
    rel = root.path(path)
    try:
        info = root.sandbox.lstat(rel)
    except SandboxError as exc:
        raise ToolError(str(exc)) from None
    except (FileNotFoundError, NotADirectoryError):
        raise ToolError(f"path {path!r} does not exist") from None
    except OSError as exc:
        raise ToolError(f"cannot stat {path!r}: {exc.strerror}") from None
    return FileStat(
        path=rel.shown,
        type=type_of(info.st_mode),
        size=info.st_size,
        modified=datetime.fromtimestamp(info.st_mtime, tz=UTC).isoformat(),
        mode=oct(stat_module.S_IMODE(info.st_mode)),
        is_symlink=stat_module.S_ISLNK(info.st_mode),
    )
