"""The files tool's searching: lines matching a text or a linear-time regular expression, like ``grep -rn``.

Patterns are compiled by :func:`saucer.tools.linear.compile_linear` (no
catastrophic backtracking). Binary files, files over the options'
``max_search_file`` and files that vanish mid-walk are skipped and counted;
links are never followed.
"""

from __future__ import annotations

import os
import stat as stat_module
from collections.abc import Iterator
from pathlib import PurePosixPath

from saucer.tools.files_models import SearchMatch, SearchResult
from saucer.tools.files_paths import DEFAULT_MAX_RESULTS, READ_FLAGS, FilesRoot
from saucer.tools.files_read import BINARY_SNIFF, read_all
from saucer.tools.linear import LinearPattern, compile_linear
from saucer.tools.native import ToolError
from saucer.tools.sandbox import SandboxError, SandboxPath

__all__ = ["search_files"]

_LINE_PREVIEW = 300


def _search_file(root: FilesRoot, rel: SandboxPath, compiled: LinearPattern) -> list[tuple[int, str]] | None:
    """Matching (line number, text) pairs of one file, or None when it is skipped (binary, big, gone)."""
    limit = root.options.max_search_file
    try:
        fd = root.sandbox.open(rel, READ_FLAGS)
    except (OSError, SandboxError):
        return None
    try:
        info = os.fstat(fd)
        if not stat_module.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        data = read_all(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > limit or b"\x00" in data[:BINARY_SNIFF]:
        return None
    lines = data.decode("utf-8", errors="replace").splitlines()
    return [(number, line) for number, line in enumerate(lines, start=1) if compiled.search(line)]


def _candidates(root: FilesRoot, rel: SandboxPath, is_dir: bool) -> Iterator[tuple[SandboxPath, PurePosixPath]]:
    """The files to search, each with its path as a glob sees it (relative to ``rel``)."""
    if not is_dir:
        yield rel, PurePosixPath(rel.name)
        return
    for entry, info in root.sandbox.walk(rel):
        if stat_module.S_ISREG(info.st_mode):
            yield entry, PurePosixPath(*entry.parts[len(rel.parts) :])


def search_files(
    root: FilesRoot,
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
    rel = root.path(path)
    is_dir = root.is_directory(rel, path)
    matches: list[SearchMatch] = []
    searched = skipped = 0
    for candidate, shown in _candidates(root, rel, is_dir):
        if glob and not shown.match(glob):
            continue
        found = _search_file(root, candidate, compiled)
        if found is None:
            skipped += 1
            continue
        searched += 1
        for number, line in found:
            if len(matches) >= max_results:
                return SearchResult(matches=matches, files_searched=searched, files_skipped=skipped, truncated=True)
            matches.append(SearchMatch(path=candidate.shown, line=number, text=line[:_LINE_PREVIEW]))
    return SearchResult(matches=matches, files_searched=searched, files_skipped=skipped, truncated=False)
