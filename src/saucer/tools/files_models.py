"""What the ``files`` tools return: the pydantic models of :mod:`saucer.tools.files` (re-exported there)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["FileType", "FileContent", "WriteResult", "DirEntry", "Listing", "FileStat", "SearchMatch", "SearchResult"]

FileType = Literal["file", "directory", "symlink", "other"]


class FileContent(BaseModel):
    """A (possibly partial) read of a text file."""

    model_config = ConfigDict(defer_build=True)

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

    model_config = ConfigDict(defer_build=True)

    path: str
    type: FileType
    size: int | None = None


class Listing(BaseModel):
    """A directory listing; each directory's entries come sorted by name, parents before children."""

    model_config = ConfigDict(defer_build=True)

    path: str
    entries: list[DirEntry]
    truncated: bool = Field(description="True when there were more than max_entries entries.")


class FileStat(BaseModel):
    """Metadata of one path."""

    model_config = ConfigDict(defer_build=True)

    path: str
    type: FileType
    size: int
    modified: str = Field(description="Last modification time, ISO 8601 in UTC.")
    mode: str = Field(description="Permission bits in octal, e.g. 0o644.")
    is_symlink: bool = Field(description="True when the given path is a symbolic link (inside the root).")


class SearchMatch(BaseModel):
    """One matching line."""

    model_config = ConfigDict(defer_build=True)

    path: str
    line: int = Field(description="1-based line number.")
    text: str = Field(description="The line, cut to 300 characters.")


class SearchResult(BaseModel):
    """Lines matching a search, in path order."""

    model_config = ConfigDict(defer_build=True)

    matches: list[SearchMatch]
    files_searched: int
    files_skipped: int = Field(description="Binary, unreadable or oversized files that were not searched.")
    truncated: bool = Field(description="True when more than max_results lines matched.")
