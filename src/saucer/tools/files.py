"""The built-in ``files`` MCP server: read, write, append, list, stat and search inside a sandbox root.

Run it over stdio with ``python -m saucer.tools.files --root DIR`` (``--help``
lists the options; each also has a ``SAUCER_FILES_*`` variable).

Every path is relative to the root (an absolute path is accepted when it lies
inside the root). A path that leaves the root, by ``..``, by being absolute
elsewhere, or through a symbolic link, is refused with an error naming the
path and the root. Reads are capped (``--max-read``) and page with
``offset``; writes are capped (``--max-write``). The tool functions are
synchronous: MCPServer runs them in a worker thread, so a long search never
blocks the server's event loop.
"""

from __future__ import annotations

import argparse
import codecs
import os
import re
import stat as stat_module
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from saucer.tools._common import (
    SandboxError,
    env_default,
    existing_dir,
    make_server,
    parse,
    positive_int,
    relative_to_root,
    resolve_in_root,
)

__all__ = [
    "FilesOptions",
    "FileContent",
    "WriteResult",
    "DirEntry",
    "Listing",
    "FileStat",
    "SearchMatch",
    "SearchResult",
    "FileTools",
    "build_server",
    "parse_options",
    "main",
]

DEFAULT_MAX_READ = 256 * 1024
DEFAULT_MAX_WRITE = 10 * 1024 * 1024
DEFAULT_MAX_ENTRIES = 500
DEFAULT_MAX_RESULTS = 100
# Files bigger than this are not searched (their size would dominate the call).
DEFAULT_MAX_SEARCH_FILE = 2 * 1024 * 1024
_LINE_PREVIEW = 300
_BINARY_SNIFF = 8192

FileType = Literal["file", "directory", "symlink", "other"]


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
    ) -> "FilesOptions":
        """Options with ``root`` resolved; the root must be an existing directory."""
        real = Path(os.path.realpath(root))
        if not real.is_dir():
            raise ValueError(f"sandbox root {str(root)!r} is not a directory")
        return cls(real, max_read, max_write, max_search_file, read_only)


class FileContent(BaseModel):
    """A (possibly partial) read of a text file."""

    path: str
    content: str
    offset: int = Field(description="Byte offset where this read started.")
    bytes_read: int
    size: int = Field(description="Size of the whole file in bytes.")
    truncated: bool = Field(description="True when the file goes on after this read; continue at next_offset.")
    next_offset: int | None = None


class WriteResult(BaseModel):
    """What a write or append did."""

    path: str
    bytes_written: int
    size: int = Field(description="Size of the file afterwards, in bytes.")
    created: bool


class DirEntry(BaseModel):
    """One entry of a directory listing."""

    path: str
    type: FileType
    size: int | None = None


class Listing(BaseModel):
    """A directory listing; each directory's entries come sorted by name, parents before children."""

    path: str
    entries: list[DirEntry]
    truncated: bool = Field(description="True when there were more than max_entries entries.")


class FileStat(BaseModel):
    """Metadata of one path."""

    path: str
    type: FileType
    size: int
    modified: str = Field(description="Last modification time, ISO 8601 in UTC.")
    mode: str = Field(description="Permission bits in octal, e.g. 0o644.")
    is_symlink: bool = Field(description="True when the given path is a symbolic link (inside the root).")


class SearchMatch(BaseModel):
    """One matching line."""

    path: str
    line: int = Field(description="1-based line number.")
    text: str = Field(description="The line, cut to 300 characters.")


class SearchResult(BaseModel):
    """Lines matching a search, in path order."""

    matches: list[SearchMatch]
    files_searched: int
    files_skipped: int = Field(description="Binary, unreadable or oversized files that were not searched.")
    truncated: bool = Field(description="True when more than max_results lines matched.")


def _type_of(mode: int) -> FileType:
    if stat_module.S_ISREG(mode):
        return "file"
    if stat_module.S_ISDIR(mode):
        return "directory"
    if stat_module.S_ISLNK(mode):
        return "symlink"
    return "other"


def _complete_utf8(data: bytes) -> tuple[str, int]:
    """Decode ``data`` up to its last complete UTF-8 character; return the text and the bytes used."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(data, final=False)
    pending = decoder.getstate()[0]
    return text, len(data) - len(pending)


class FileTools:
    """The file operations, each confined to ``options.root``; errors are :class:`ToolError`."""

    def __init__(self, options: FilesOptions) -> None:
        self.options = options
        self.root = options.root

    def _path(self, path: str) -> Path:
        try:
            return resolve_in_root(self.root, path)
        except SandboxError as exc:
            raise ToolError(str(exc)) from exc

    def _show(self, real: Path) -> str:
        return relative_to_root(self.root, real)

    def read(self, path: str, offset: int = 0, max_bytes: int | None = None) -> FileContent:
        """Read a text file from byte ``offset``, at most ``max_bytes`` (capped by the server)."""
        real = self._path(path)
        if not real.exists():
            raise ToolError(f"file {path!r} does not exist")
        if real.is_dir():
            raise ToolError(f"{path!r} is a directory; use list to see its entries")
        if offset < 0:
            raise ToolError(f"offset must be >= 0, got {offset}")
        cap = self.options.max_read if max_bytes is None else min(max_bytes, self.options.max_read)
        if cap <= 0:
            raise ToolError(f"max_bytes must be > 0, got {max_bytes}")
        size = real.stat().st_size
        with open(real, "rb") as handle:
            handle.seek(offset)
            # One extra byte tells whether the file goes on.
            data = handle.read(cap + 1)
        if b"\x00" in data[:_BINARY_SNIFF]:
            raise ToolError(f"file {path!r} looks binary (it contains NUL bytes); only text files can be read")
        more = len(data) > cap
        data = data[:cap]
        text, used = _complete_utf8(data) if more else (data.decode("utf-8", errors="replace"), len(data))
        end = offset + used
        truncated = more or end < size
        return FileContent(
            path=self._show(real),
            content=text,
            offset=offset,
            bytes_read=used,
            size=size,
            truncated=truncated,
            next_offset=end if truncated else None,
        )

    def _check_writable(self, path: str, content: str, create_dirs: bool) -> tuple[Path, bytes]:
        if self.options.read_only:
            raise ToolError("this files server is read-only")
        real = self._path(path)
        if real == self.root or real.is_dir():
            raise ToolError(f"{path!r} is a directory, not a file")
        data = content.encode("utf-8")
        if len(data) > self.options.max_write:
            raise ToolError(f"content is {len(data)} bytes; the limit for one write is {self.options.max_write} bytes")
        if not real.parent.exists():
            if not create_dirs:
                raise ToolError(f"directory {self._show(real.parent)!r} does not exist (set create_dirs to create it)")
            real.parent.mkdir(parents=True, exist_ok=True)
        return real, data

    def _open_flags(self, append: bool) -> int:
        # O_NOFOLLOW: a symlink swapped in after the check is refused, not followed out of the root.
        base = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        return base | (os.O_APPEND if append else os.O_TRUNC)

    def _write(self, path: str, content: str, create_dirs: bool, append: bool) -> WriteResult:
        real, data = self._check_writable(path, content, create_dirs)
        created = not real.exists()
        try:
            fd = os.open(real, self._open_flags(append), 0o644)
        except OSError as exc:
            raise ToolError(f"cannot write {path!r}: {exc.strerror}") from exc
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        return WriteResult(path=self._show(real), bytes_written=len(data), size=real.stat().st_size, created=created)

    def write(self, path: str, content: str, create_dirs: bool = True) -> WriteResult:
        """Create or replace a text file with ``content``."""
        return self._write(path, content, create_dirs, append=False)

    def append(self, path: str, content: str, create_dirs: bool = True) -> WriteResult:
        """Add ``content`` at the end of a text file (created when missing)."""
        return self._write(path, content, create_dirs, append=True)

    def _walk(self, top: Path, recursive: bool, hidden: bool = False) -> Iterator[Path]:
        """Paths under ``top`` in sorted order, never descending through symlinks.

        Hidden directories (``.git``, ``.venv``) are pruned unless ``hidden``:
        they are rarely wanted and can hold most of a tree's files.
        """
        if not recursive:
            yield from sorted(top.iterdir())
            return
        for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
            if not hidden:
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            dirnames.sort()
            base = Path(dirpath)
            for name in sorted([*dirnames, *filenames]):
                yield base / name

    def list(
        self,
        path: str = ".",
        recursive: bool = False,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        include_hidden: bool = False,
    ) -> Listing:
        """Entries of a directory (or of its whole tree when ``recursive``)."""
        real = self._path(path)
        if not real.exists():
            raise ToolError(f"directory {path!r} does not exist")
        if not real.is_dir():
            raise ToolError(f"{path!r} is a file, not a directory; use stat or read")
        if max_entries <= 0:
            raise ToolError(f"max_entries must be > 0, got {max_entries}")
        entries: list[DirEntry] = []
        truncated = False
        for entry in self._walk(real, recursive, hidden=include_hidden):
            rel = entry.relative_to(real)
            if not include_hidden and any(part.startswith(".") for part in rel.parts):
                continue
            if len(entries) >= max_entries:
                truncated = True
                break
            try:
                info = entry.lstat()
            except OSError:
                continue
            kind = _type_of(info.st_mode)
            # ``entry`` itself is not resolved, so a symlink is listed as one, under its own name.
            shown = relative_to_root(self.root, entry)
            entries.append(DirEntry(path=shown, type=kind, size=info.st_size if kind == "file" else None))
        return Listing(path=self._show(real), entries=entries, truncated=truncated)

    def stat(self, path: str) -> FileStat:
        """Type, size, modification time and permissions of ``path``."""
        real = self._path(path)
        if not real.exists():
            raise ToolError(f"path {path!r} does not exist")
        given = self.root / path if not os.path.isabs(path) else Path(path)
        info = real.stat()
        return FileStat(
            path=self._show(real),
            type=_type_of(info.st_mode),
            size=info.st_size,
            modified=datetime.fromtimestamp(info.st_mtime, tz=timezone.utc).isoformat(),
            mode=oct(stat_module.S_IMODE(info.st_mode)),
            is_symlink=given.is_symlink(),
        )

    def search(
        self,
        pattern: str,
        path: str = ".",
        regex: bool = False,
        case_sensitive: bool = True,
        glob: str | None = None,
        max_results: int = DEFAULT_MAX_RESULTS,
    ) -> SearchResult:
        """Lines containing ``pattern`` (a substring, or a regular expression) in text files under ``path``."""
        if not pattern:
            raise ToolError("pattern is empty")
        if max_results <= 0:
            raise ToolError(f"max_results must be > 0, got {max_results}")
        flags = 0 if case_sensitive else re.IGNORECASE
        try:
            compiled = re.compile(pattern if regex else re.escape(pattern), flags)
        except re.error as exc:
            raise ToolError(f"invalid regular expression {pattern!r}: {exc}") from exc
        real = self._path(path)
        if not real.exists():
            raise ToolError(f"path {path!r} does not exist")
        files = [real] if real.is_file() else list(self._walk(real, recursive=True))
        matches: list[SearchMatch] = []
        searched = skipped = 0
        truncated = False
        for candidate in files:
            if truncated:
                break
            if candidate.is_symlink() or not candidate.is_file():
                # Links are skipped rather than followed: one could lead out of the root.
                continue
            rel = candidate.relative_to(real) if real.is_dir() else Path(candidate.name)
            if glob and not rel.match(glob):
                continue
            try:
                if candidate.stat().st_size > self.options.max_search_file:
                    skipped += 1
                    continue
                data = candidate.read_bytes()
            except OSError:
                skipped += 1
                continue
            if b"\x00" in data[:_BINARY_SNIFF]:
                skipped += 1
                continue
            searched += 1
            for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
                if compiled.search(line):
                    if len(matches) >= max_results:
                        truncated = True
                        break
                    matches.append(SearchMatch(path=self._show(candidate), line=number, text=line[:_LINE_PREVIEW]))
        return SearchResult(matches=matches, files_searched=searched, files_skipped=skipped, truncated=truncated)


_READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)


def build_server(options: FilesOptions) -> MCPServer:
    """The files MCP server for ``options`` (without write/append when read-only)."""
    tools = FileTools(options)
    root = options.root
    server = make_server("saucer-files", instructions=f"Reads and writes files inside the workspace {root}.")

    def read(
        path: Annotated[str, Field(description="File path relative to the workspace root.")],
        offset: Annotated[int, Field(description="Byte offset to start at (use next_offset to continue).")] = 0,
        max_bytes: Annotated[int | None, Field(description="Most bytes to return (the server caps it).")] = None,
    ) -> FileContent:
        return tools.read(path, offset, max_bytes)

    def write(
        path: Annotated[str, Field(description="File path relative to the workspace root.")],
        content: Annotated[str, Field(description="The complete new content of the file (UTF-8 text).")],
        create_dirs: Annotated[bool, Field(description="Create missing parent directories.")] = True,
    ) -> WriteResult:
        return tools.write(path, content, create_dirs)

    def append(
        path: Annotated[str, Field(description="File path relative to the workspace root.")],
        content: Annotated[str, Field(description="Text to add at the end of the file.")],
        create_dirs: Annotated[bool, Field(description="Create missing parent directories.")] = True,
    ) -> WriteResult:
        return tools.append(path, content, create_dirs)

    def list_dir(
        path: Annotated[str, Field(description="Directory relative to the workspace root.")] = ".",
        recursive: Annotated[bool, Field(description="List the whole tree below the directory.")] = False,
        max_entries: Annotated[int, Field(description="Most entries to return.")] = DEFAULT_MAX_ENTRIES,
        include_hidden: Annotated[bool, Field(description="Include names starting with a dot.")] = False,
    ) -> Listing:
        return tools.list(path, recursive, max_entries, include_hidden)

    def stat(path: Annotated[str, Field(description="Path relative to the workspace root.")]) -> FileStat:
        return tools.stat(path)

    def search(
        pattern: Annotated[str, Field(description="Text to look for (a regular expression when regex is true).")],
        path: Annotated[str, Field(description="File or directory to search, relative to the root.")] = ".",
        regex: Annotated[bool, Field(description="Treat pattern as a Python regular expression.")] = False,
        case_sensitive: Annotated[bool, Field(description="Match letter case exactly.")] = True,
        glob: Annotated[str | None, Field(description="Only files whose path matches this glob, e.g. *.py.")] = None,
        max_results: Annotated[int, Field(description="Most matching lines to return.")] = DEFAULT_MAX_RESULTS,
    ) -> SearchResult:
        return tools.search(pattern, path, regex, case_sensitive, glob, max_results)

    cap = f"{options.max_read} bytes"
    server.add_tool(
        read, name="read", title="Read a file", annotations=_READ_ONLY,
        description=f"Read a UTF-8 text file inside the workspace root ({root}). Returns at most {cap} per call; "
        "when `truncated` is true, call again with `offset` set to `next_offset` to read on. Binary files are refused.",
    )
    if not options.read_only:
        server.add_tool(
            write, name="write", title="Write a file",
            annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True, open_world_hint=False),
            description="Create a text file or replace its whole content, inside the workspace root "
            f"({root}). Missing parent directories are created. At most {options.max_write} bytes per call; "
            "use append to add to an existing file.",
        )
        server.add_tool(
            append, name="append", title="Append to a file",
            annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=False, open_world_hint=False),
            description="Add text at the end of a file inside the workspace root (the file is created when missing). "
            "Include a trailing newline yourself if you want one.",
        )
    server.add_tool(
        list_dir, name="list", title="List a directory", annotations=_READ_ONLY,
        description="List the entries of a directory inside the workspace root: path (relative to the root), "
        "type (file, directory, symlink, other) and size of files. Set recursive for the whole tree; hidden "
        "names (starting with a dot) are left out unless include_hidden is set.",
    )
    server.add_tool(
        stat, name="stat", title="File metadata", annotations=_READ_ONLY,
        description="Type, size in bytes, last modification time (UTC) and permission bits of a path inside "
        "the workspace root.",
    )
    server.add_tool(
        search, name="search", title="Search file contents", annotations=_READ_ONLY,
        description="Find lines containing a text (or matching a regular expression) in the text files under a "
        "directory of the workspace, like grep -rn. Returns path, line number and line text for each match, "
        f"up to max_results. Binary files, hidden directories and files over {options.max_search_file} bytes "
        "are skipped; symbolic links are not followed.",
    )
    return server


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m saucer.tools.files",
        description="saucer's files MCP server over stdio: read, write, append, list, stat and search "
        "inside a sandbox root.",
        epilog="Environment variables: SAUCER_FILES_ROOT, SAUCER_FILES_MAX_READ, SAUCER_FILES_MAX_WRITE, "
        "SAUCER_FILES_READ_ONLY=1.",
    )
    parser.add_argument("--root", type=existing_dir, default=env_default("SAUCER_FILES_ROOT", "."),
                        help="sandbox root; no path may leave it (default: .)")
    parser.add_argument("--max-read", type=positive_int, metavar="BYTES",
                        default=env_default("SAUCER_FILES_MAX_READ", str(DEFAULT_MAX_READ)),
                        help=f"most bytes one read returns (default {DEFAULT_MAX_READ})")
    parser.add_argument("--max-write", type=positive_int, metavar="BYTES",
                        default=env_default("SAUCER_FILES_MAX_WRITE", str(DEFAULT_MAX_WRITE)),
                        help=f"most bytes one write or append takes (default {DEFAULT_MAX_WRITE})")
    parser.add_argument("--read-only", action="store_true",
                        default=env_default("SAUCER_FILES_READ_ONLY", "") in ("1", "true", "yes"),
                        help="offer no write or append tool")
    return parser


def parse_options(argv: Sequence[str] | None = None) -> FilesOptions:
    """Options from ``argv`` and ``SAUCER_FILES_*`` variables."""
    args = parse(_parser(), argv)
    return FilesOptions.create(args.root, max_read=args.max_read, max_write=args.max_write, read_only=args.read_only)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the file tools over stdio until the client closes the connection."""
    build_server(parse_options(argv)).run("stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
