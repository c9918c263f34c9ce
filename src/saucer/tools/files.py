"""The built-in ``files`` MCP server: read, write, append, list, stat and search inside a sandbox root.

Run it over stdio with ``python -m saucer.tools.files --root DIR`` (``--help``
lists the options; each also has a ``SAUCER_FILES_*`` variable).

Every path is relative to the root (an absolute path is accepted when it lies
inside the root). It is resolved from a descriptor of the root, component by
component, and the file is then read or written through the descriptor it
resolved to (:mod:`saucer.tools.sandbox`): a path that leaves the root by
``..`` or by being absolute elsewhere is refused, and so is any path through
a symbolic link, even one swapped in while the call runs. Writing a file that
has more than one hard link is refused (another link may be outside the root).
Paths are limited to 4096 bytes and 256 components.

Reads are capped (``--max-read``) and page with ``offset``; writes are capped
(``--max-write``). The file operations are synchronous and run in daemon worker
threads (:func:`saucer.tools._common.offload`), so a long search never blocks
the server's event loop -- the host's loop when the server runs in-process --
and a call that never returns cannot keep the process from exiting. Every
failure, expected or not, is a tool error of one line; nothing is raised into
the server.
"""

from __future__ import annotations

import argparse
import codecs
import errno
import os
import stat as stat_module
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from saucer.tools import files_models, native
from saucer.tools._common import (
    built_once,
    env_default,
    existing_dir,
    guarded,
    make_mcp_server,
    offload,
    parse,
    positive_int,
    serve_stdio,
)
from saucer.tools.files_models import (
    DirEntry,
    FileContent,
    FileStat,
    FileType,
    Listing,
    SearchMatch,
    SearchResult,
    WriteResult,
)
from saucer.tools.linear import LinearPattern, compile_linear
from saucer.tools.native import NativeServer, ToolError, ToolSpec
from saucer.tools.sandbox import SandboxError, SandboxPath, SandboxRoot

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

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
    "ToolError",
    "tool_table",
    "build_server",
    "create_server",
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
_LineMatches = list[tuple[int, str]]  # named here: inside FileTools, ``list`` is its list tool


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


def _read_all(fd: int, limit: int, offset: int = 0) -> bytes:
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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# Opening never blocks on a FIFO; what was opened is checked with fstat before any byte moves.
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
_WRITE_FLAGS = os.O_WRONLY | getattr(os, "O_NONBLOCK", 0)


class FileTools:
    """The file operations, each confined to ``options.root``; errors are :class:`ToolError`.

    Every path is resolved from a descriptor of the root (see
    :mod:`saucer.tools.sandbox`) and used through the descriptor it resolved
    to. ``use_openat2`` forces or disables the kernel resolver (tests).
    """

    def __init__(self, options: FilesOptions, *, use_openat2: bool | None = None) -> None:
        self.options = options
        self.root = options.root
        self.sandbox = SandboxRoot(options.root, use_openat2=use_openat2)

    def close(self) -> None:
        """Release the root's descriptor."""
        self.sandbox.close()

    def _path(self, path: str) -> SandboxPath:
        try:
            return self.sandbox.path(path)
        except SandboxError as exc:
            raise ToolError(str(exc)) from None

    def _open(self, rel: SandboxPath, given: str, flags: int, what: str = "file") -> int:
        try:
            return self.sandbox.open(rel, flags)
        except SandboxError as exc:
            raise ToolError(str(exc)) from None
        except FileNotFoundError:
            raise ToolError(f"{what} {given!r} does not exist") from None
        except OSError as exc:
            raise ToolError(f"cannot open {given!r}: {exc.strerror}") from None

    def read(self, path: str, offset: int = 0, max_bytes: int | None = None) -> FileContent:
        """Read a text file from byte ``offset``, at most ``max_bytes`` (capped by the server)."""
        rel = self._path(path)
        if offset < 0:
            raise ToolError(f"offset must be >= 0, got {offset}")
        cap = self.options.max_read if max_bytes is None else min(max_bytes, self.options.max_read)
        if cap <= 0:
            raise ToolError(f"max_bytes must be > 0, got {max_bytes}")
        fd = self._open(rel, path, _READ_FLAGS)
        try:
            info = os.fstat(fd)
            if stat_module.S_ISDIR(info.st_mode):
                raise ToolError(f"{path!r} is a directory; use list to see its entries")
            if not stat_module.S_ISREG(info.st_mode):
                raise ToolError(f"{path!r} is not a regular file")
            # One extra byte tells whether the file goes on.
            data = _read_all(fd, cap + 1, offset)
        finally:
            os.close(fd)
        if b"\x00" in data[:_BINARY_SNIFF]:
            raise ToolError(f"file {path!r} looks binary (it contains NUL bytes); only text files can be read")
        more = len(data) > cap
        data = data[:cap]
        text, used = _complete_utf8(data) if more else (data.decode("utf-8", errors="replace"), len(data))
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

    def _open_for_write(self, rel: SandboxPath, path: str, create_dirs: bool, append: bool) -> tuple[int, bool]:
        """A descriptor of the file to write (created when missing) and whether it was created."""
        try:
            parent = self.sandbox.open_dir(rel.parent, create=create_dirs)
        except SandboxError as exc:
            raise ToolError(str(exc)) from None
        except (FileNotFoundError, NotADirectoryError):
            raise ToolError(
                f"directory {rel.parent.shown!r} does not exist"
                + ("" if create_dirs else " (set create_dirs to create it)")
            ) from None
        except OSError as exc:
            raise ToolError(f"cannot create directory {rel.parent.shown!r}: {exc.strerror}") from None
        flags = _WRITE_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if append else 0)
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
                    f"{str(self.root)!r} can be written through one"
                ) from None
            if exc.errno == errno.EISDIR:
                raise ToolError(f"{path!r} is a directory, not a file") from None
            if exc.errno == errno.ENXIO:
                raise ToolError(f"{path!r} is not a regular file") from None
            raise ToolError(f"cannot write {path!r}: {exc.strerror}") from None
        finally:
            os.close(parent)

    def _write(self, path: str, content: str, create_dirs: bool, append: bool) -> WriteResult:
        if self.options.read_only:
            raise ToolError("this files server is read-only")
        rel = self._path(path)
        if not rel.parts:
            raise ToolError(f"{path!r} is a directory, not a file")
        data = content.encode("utf-8")
        if len(data) > self.options.max_write:
            raise ToolError(f"content is {len(data)} bytes; the limit for one write is {self.options.max_write} bytes")
        fd, created = self._open_for_write(rel, path, create_dirs, append)
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

    def write(self, path: str, content: str, create_dirs: bool = True) -> WriteResult:
        """Create or replace a text file with ``content``."""
        return self._write(path, content, create_dirs, append=False)

    def append(self, path: str, content: str, create_dirs: bool = True) -> WriteResult:
        """Add ``content`` at the end of a text file (created when missing)."""
        return self._write(path, content, create_dirs, append=True)

    def _directory(self, path: str, rel: SandboxPath) -> None:
        """Raise ToolError unless ``rel`` is a directory one can walk."""
        fd = self._open(rel, path, _READ_FLAGS, what="directory")
        try:
            if not stat_module.S_ISDIR(os.fstat(fd).st_mode):
                raise ToolError(f"{path!r} is a file, not a directory; use stat or read")
        finally:
            os.close(fd)

    def list(
        self,
        path: str = ".",
        recursive: bool = False,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        include_hidden: bool = False,
    ) -> Listing:
        """Entries of a directory (or of its whole tree when ``recursive``)."""
        if max_entries <= 0:
            raise ToolError(f"max_entries must be > 0, got {max_entries}")
        rel = self._path(path)
        self._directory(path, rel)
        if recursive:
            found: Iterable[tuple[SandboxPath, os.stat_result]] = self.sandbox.walk(rel, hidden=include_hidden)
        else:
            try:
                listed = self.sandbox.entries(rel)
            except (OSError, SandboxError) as exc:
                raise ToolError(f"cannot list {path!r}: {exc}") from None
            found = ((rel.child(name), info) for name, info in listed if include_hidden or not name.startswith("."))
        entries: list[DirEntry] = []
        truncated = False
        for entry, info in found:
            if len(entries) >= max_entries:
                truncated = True
                break
            kind = _type_of(info.st_mode)
            # Links are listed as links, under their own name, never followed.
            entries.append(DirEntry(path=entry.shown, type=kind, size=info.st_size if kind == "file" else None))
        return Listing(path=rel.shown, entries=entries, truncated=truncated)

    def stat(self, path: str) -> FileStat:
        """Type, size, modification time and permissions of ``path`` (a link is described, not followed)."""
        rel = self._path(path)
        try:
            info = self.sandbox.lstat(rel)
        except SandboxError as exc:
            raise ToolError(str(exc)) from None
        except (FileNotFoundError, NotADirectoryError):
            raise ToolError(f"path {path!r} does not exist") from None
        except OSError as exc:
            raise ToolError(f"cannot stat {path!r}: {exc.strerror}") from None
        return FileStat(
            path=rel.shown,
            type=_type_of(info.st_mode),
            size=info.st_size,
            modified=datetime.fromtimestamp(info.st_mtime, tz=UTC).isoformat(),
            mode=oct(stat_module.S_IMODE(info.st_mode)),
            is_symlink=stat_module.S_ISLNK(info.st_mode),
        )

    def _search_file(self, rel: SandboxPath, compiled: LinearPattern) -> _LineMatches | None:
        """Matching (line number, text) pairs of one file, or None when it is skipped (binary, big, gone)."""
        try:
            fd = self.sandbox.open(rel, _READ_FLAGS)
        except (OSError, SandboxError):
            return None
        try:
            info = os.fstat(fd)
            if not stat_module.S_ISREG(info.st_mode) or info.st_size > self.options.max_search_file:
                return None
            data = _read_all(fd, self.options.max_search_file + 1)
        except OSError:
            return None
        finally:
            os.close(fd)
        if len(data) > self.options.max_search_file or b"\x00" in data[:_BINARY_SNIFF]:
            return None
        lines = data.decode("utf-8", errors="replace").splitlines()
        return [(number, line) for number, line in enumerate(lines, start=1) if compiled.search(line)]

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
        try:
            compiled = compile_linear(pattern, ignore_case=not case_sensitive, literal=not regex)
        except ValueError as exc:
            raise ToolError(f"invalid regular expression {pattern!r}: {exc}") from None
        rel = self._path(path)
        fd = self._open(rel, path, _READ_FLAGS, what="path")
        try:
            is_dir = stat_module.S_ISDIR(os.fstat(fd).st_mode)
        finally:
            os.close(fd)
        candidates: Iterator[SandboxPath]
        if is_dir:
            candidates = (entry for entry, info in self.sandbox.walk(rel) if stat_module.S_ISREG(info.st_mode))
        else:
            candidates = iter([rel])
        matches: list[SearchMatch] = []
        searched = skipped = 0
        for candidate in candidates:
            shown = PurePosixPath(*candidate.parts[len(rel.parts) :]) if is_dir else PurePosixPath(candidate.name)
            if glob and not shown.match(glob):
                continue
            found = self._search_file(candidate, compiled)
            if found is None:
                skipped += 1
                continue
            searched += 1
            for number, line in found:
                if len(matches) >= max_results:
                    return SearchResult(matches=matches, files_searched=searched, files_skipped=skipped, truncated=True)
                matches.append(SearchMatch(path=candidate.shown, line=number, text=line[:_LINE_PREVIEW]))
        return SearchResult(matches=matches, files_searched=searched, files_skipped=skipped, truncated=False)


_READ_ONLY = {"read_only": True, "destructive": False, "idempotent": True, "open_world": False}


def tool_table(options: FilesOptions) -> NativeServer:
    """The files tools for ``options`` (without write/append when read-only), to call in-process or serve over MCP."""
    tools = FileTools(options)
    root = options.root

    async def read(
        path: Annotated[str, Field(description="File path relative to the workspace root.")],
        offset: Annotated[int, Field(description="Byte offset to start at (use next_offset to continue).")] = 0,
        max_bytes: Annotated[int | None, Field(description="Most bytes to return (the server caps it).")] = None,
    ) -> FileContent:
        return await offload(guarded, tools.read, path, offset, max_bytes)

    async def write(
        path: Annotated[str, Field(description="File path relative to the workspace root.")],
        content: Annotated[str, Field(description="The complete new content of the file (UTF-8 text).")],
        create_dirs: Annotated[bool, Field(description="Create missing parent directories.")] = True,
    ) -> WriteResult:
        return await offload(guarded, tools.write, path, content, create_dirs)

    async def append(
        path: Annotated[str, Field(description="File path relative to the workspace root.")],
        content: Annotated[str, Field(description="Text to add at the end of the file.")],
        create_dirs: Annotated[bool, Field(description="Create missing parent directories.")] = True,
    ) -> WriteResult:
        return await offload(guarded, tools.append, path, content, create_dirs)

    async def list_dir(
        path: Annotated[str, Field(description="Directory relative to the workspace root.")] = ".",
        recursive: Annotated[bool, Field(description="List the whole tree below the directory.")] = False,
        max_entries: Annotated[int, Field(description="Most entries to return.")] = DEFAULT_MAX_ENTRIES,
        include_hidden: Annotated[bool, Field(description="Include names starting with a dot.")] = False,
    ) -> Listing:
        return await offload(guarded, tools.list, path, recursive, max_entries, include_hidden)

    async def stat(path: Annotated[str, Field(description="Path relative to the workspace root.")]) -> FileStat:
        return await offload(guarded, tools.stat, path)

    async def search(
        pattern: Annotated[str, Field(description="Text to look for (a regular expression when regex is true).")],
        path: Annotated[str, Field(description="File or directory to search, relative to the root.")] = ".",
        regex: Annotated[bool, Field(description="Treat pattern as a Python regular expression.")] = False,
        case_sensitive: Annotated[bool, Field(description="Match letter case exactly.")] = True,
        glob: Annotated[str | None, Field(description="Only files whose path matches this glob, e.g. *.py.")] = None,
        max_results: Annotated[int, Field(description="Most matching lines to return.")] = DEFAULT_MAX_RESULTS,
    ) -> SearchResult:
        return await offload(guarded, tools.search, pattern, path, regex, case_sensitive, glob, max_results)

    cap = f"{options.max_read} bytes"
    table = [
        ToolSpec(
            "read",
            read,
            FileContent,
            title="Read a file",
            hints=_READ_ONLY,
            description=f"Read a UTF-8 text file inside the workspace root ({root}). Returns at most {cap} per call; "
            "when `truncated` is true, call again with `offset` set to `next_offset` to read on. Binary files are refused.",
        )
    ]
    if not options.read_only:
        table += [
            ToolSpec(
                "write",
                write,
                WriteResult,
                title="Write a file",
                hints={"destructive": True, "idempotent": True, "open_world": False},
                description="Create a text file or replace its whole content, inside the workspace root "
                f"({root}). Missing parent directories are created. At most {options.max_write} bytes per call; "
                "use append to add to an existing file.",
            ),
            ToolSpec(
                "append",
                append,
                WriteResult,
                title="Append to a file",
                hints={"destructive": False, "idempotent": False, "open_world": False},
                description="Add text at the end of a file inside the workspace root (the file is created when missing). "
                "Include a trailing newline yourself if you want one.",
            ),
        ]
    table += [
        ToolSpec(
            "list",
            list_dir,
            Listing,
            title="List a directory",
            hints=_READ_ONLY,
            description="List the entries of a directory inside the workspace root: path (relative to the root), "
            "type (file, directory, symlink, other) and size of files. Set recursive for the whole tree; hidden "
            "names (starting with a dot) are left out unless include_hidden is set. Symbolic links are listed, "
            "never followed: the files tools refuse paths through them.",
        ),
        ToolSpec(
            "stat",
            stat,
            FileStat,
            title="File metadata",
            hints=_READ_ONLY,
            description="Type, size in bytes, last modification time (UTC) and permission bits of a path inside "
            "the workspace root.",
        ),
        ToolSpec(
            "search",
            search,
            SearchResult,
            title="Search file contents",
            hints=_READ_ONLY,
            description="Find lines containing a text (or matching a regular expression) in the text files under a "
            "directory of the workspace, like grep -rn. Returns path, line number and line text for each match, "
            f"up to max_results. Binary files, hidden files and directories, and files over {options.max_search_file} "
            "bytes are skipped; symbolic links are not followed.",
        ),
    ]
    return NativeServer(
        "saucer-files",
        f"Reads and writes files inside the workspace {root}.",
        table,
        schema_sources=(__file__, files_models.__file__, native.__file__),
    )


def build_server(options: FilesOptions) -> MCPServer:
    """The files MCP server for ``options``: :func:`tool_table` registered on an MCPServer (imports the MCP SDK)."""
    return make_mcp_server(tool_table(options))


def create_server(
    root: str | os.PathLike[str] = ".",
    *,
    max_read: int = DEFAULT_MAX_READ,
    max_write: int = DEFAULT_MAX_WRITE,
    read_only: bool = False,
) -> NativeServer:
    """The files tools to run in-process, from keyword options (an ``import_path`` factory).

    The options are those of the command line. The dispatcher calls the
    tools directly (no MCP server is built, the MCP SDK is not imported).
    Tables are built once per options and shared
    (:func:`saucer.tools._common.built_once`); the root's descriptor is
    closed when its table is garbage.
    """
    options = FilesOptions.create(root, max_read=max_read, max_write=max_write, read_only=read_only)
    return built_once(
        "files",
        {"root": str(options.root), "max_read": max_read, "max_write": max_write, "read_only": read_only},
        lambda: tool_table(options),
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m saucer.tools.files",
        description="saucer's files MCP server over stdio: read, write, append, list, stat and search "
        "inside a sandbox root.",
        epilog="Environment variables: SAUCER_FILES_ROOT, SAUCER_FILES_MAX_READ, SAUCER_FILES_MAX_WRITE, "
        "SAUCER_FILES_READ_ONLY=1.",
    )
    parser.add_argument(
        "--root",
        type=existing_dir,
        default=env_default("SAUCER_FILES_ROOT", "."),
        help="sandbox root; no path may leave it (default: .)",
    )
    parser.add_argument(
        "--max-read",
        type=positive_int,
        metavar="BYTES",
        default=env_default("SAUCER_FILES_MAX_READ", str(DEFAULT_MAX_READ)),
        help=f"most bytes one read returns (default {DEFAULT_MAX_READ})",
    )
    parser.add_argument(
        "--max-write",
        type=positive_int,
        metavar="BYTES",
        default=env_default("SAUCER_FILES_MAX_WRITE", str(DEFAULT_MAX_WRITE)),
        help=f"most bytes one write or append takes (default {DEFAULT_MAX_WRITE})",
    )
    parser.add_argument(
        "--read-only",
        action="store_true",
        default=env_default("SAUCER_FILES_READ_ONLY", "") in ("1", "true", "yes"),
        help="offer no write or append tool",
    )
    return parser


def parse_options(argv: Sequence[str] | None = None) -> FilesOptions:
    """Options from ``argv`` and ``SAUCER_FILES_*`` variables."""
    args = parse(_parser(), argv)
    return FilesOptions.create(args.root, max_read=args.max_read, max_write=args.max_write, read_only=args.read_only)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the file tools over stdio until the client closes the connection."""
    options = parse_options(argv)
    return serve_stdio(lambda: build_server(options), "saucer-files")


if __name__ == "__main__":
    sys.exit(main())
