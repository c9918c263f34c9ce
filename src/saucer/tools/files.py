"""The built-in ``files`` MCP server: read, write, append, list, stat and search inside a sandbox root.

Run it over stdio with ``python -m saucer.tools.files --root DIR`` (``--help``
lists the options; each also has a ``SAUCER_FILES_*`` variable).

The operations live by concern: path resolution and the options in
:mod:`saucer.tools.files_paths`, reading (files, directories, metadata) in
:mod:`saucer.tools.files_read`, writing in :mod:`saucer.tools.files_write`,
searching in :mod:`saucer.tools.files_search`; this module puts them in one
:class:`FileTools`, its tool table and the stdio server.

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

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from saucer.tools import files_models, files_paths, native
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
    Listing,
    SearchMatch,
    SearchResult,
    WriteResult,
)
from saucer.tools.files_paths import (
    DEFAULT_MAX_ENTRIES,
    DEFAULT_MAX_READ,
    DEFAULT_MAX_RESULTS,
    DEFAULT_MAX_WRITE,
    FilesOptions,
    FilesRoot,
)
from saucer.tools.files_read import list_directory, read_text, stat_path
from saucer.tools.files_search import search_files
from saucer.tools.files_write import write_text
from saucer.tools.native import NativeServer, ToolError, ToolSpec

if TYPE_CHECKING:
    import argparse

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


class FileTools:
    """The file operations, each confined to ``options.root``; errors are :class:`ToolError`.

    Every path is resolved from a descriptor of the root (see
    :mod:`saucer.tools.sandbox`, :class:`~saucer.tools.files_paths.FilesRoot`)
    and used through the descriptor it resolved to. ``use_openat2`` forces or
    disables the kernel resolver (tests).
    """

    def __init__(self, options: FilesOptions, *, use_openat2: bool | None = None) -> None:
        self.options = options
        self.root = options.root
        self.files = FilesRoot(options, use_openat2=use_openat2)
        self.sandbox = self.files.sandbox

    def close(self) -> None:
        """Release the root's descriptor."""
        self.files.close()

    def read(self, path: str, offset: int = 0, max_bytes: int | None = None) -> FileContent:
        """Read a text file from byte ``offset``, at most ``max_bytes`` (capped by the server)."""
        return read_text(self.files, path, offset, max_bytes)

    def write(self, path: str, content: str, create_dirs: bool = True) -> WriteResult:
        """Create or replace a text file with ``content``."""
        return write_text(self.files, path, content, create_dirs=create_dirs, append=False)

    def append(self, path: str, content: str, create_dirs: bool = True) -> WriteResult:
        """Add ``content`` at the end of a text file (created when missing)."""
        return write_text(self.files, path, content, create_dirs=create_dirs, append=True)

    def list(
        self,
        path: str = ".",
        recursive: bool = False,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        include_hidden: bool = False,
    ) -> Listing:
        """Entries of a directory (or of its whole tree when ``recursive``)."""
        return list_directory(self.files, path, recursive, max_entries, include_hidden)

    def stat(self, path: str) -> FileStat:
        """Type, size, modification time and permissions of ``path`` (a link is described, not followed)."""
        return stat_path(self.files, path)

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
        return search_files(self.files, pattern, path, regex, case_sensitive, glob, max_results)


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
        schema_sources=(__file__, files_models.__file__, files_paths.__file__, native.__file__),
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
    import argparse  # only for the stdio server's command line

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
