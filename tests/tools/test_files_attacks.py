"""The files sandbox under attack: symlink swaps racing the tool, hard links, FIFOs, deep and long paths.

The race tests swap a workspace directory and a workspace file for symbolic
links to the outside (an atomic ``renameat2(RENAME_EXCHANGE)``, and back)
while the tool reads, writes, lists and searches in a loop; then they check
that not one byte was read from or written to the outside. A control run of
a name-based check (what the tool did before) against the same racer shows
that the racer does find that hole.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from saucer.dispatch import Command, LocalCommandDispatcher, ResultStatus
from saucer.tools.files import FilesOptions, FileTools
from saucer.tools.native import ToolError
from saucer.tools.sandbox import MAX_DEPTH, openat2_available

SECRET = "OUTSIDE-SECRET"
RACE_SECONDS = 3.0

_libc = ctypes.CDLL(None, use_errno=True)
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: Path, b: Path) -> None:
    """Swap two names atomically (renameat2 RENAME_EXCHANGE), or with three renames where it is missing."""
    renameat2 = getattr(_libc, "renameat2", None)
    if renameat2 is not None and renameat2(_AT_FDCWD, bytes(a), _AT_FDCWD, bytes(b), _RENAME_EXCHANGE) == 0:
        return
    tmp = a.with_name(a.name + ".swap")
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)


def snapshot(top: Path) -> dict[str, bytes | str]:
    """Every name under ``top`` with its content (files) or link target (links)."""
    found: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(top))
            if path.is_symlink():
                found[rel] = "-> " + os.readlink(path)
            elif path.is_file():
                found[rel] = path.read_bytes()
            else:
                found[rel] = "dir"
    return found


@pytest.fixture
def arena(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A workspace with a directory and a file that a racer swaps for links to an outside tree."""
    root, outside = tmp_path / "ws", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    (outside / "sub").mkdir(parents=True)
    (root / "sub" / "f.txt").write_text("inside\n")
    (root / "file.txt").write_text("inside\n")
    (outside / "sub" / "f.txt").write_text(SECRET + "\n")
    (outside / "file.txt").write_text(SECRET + "\n")
    os.symlink(outside / "sub", root / "evil")  # swapped with the directory ws/sub
    os.symlink(outside / "file.txt", root / "evil.txt")  # swapped with the file ws/file.txt
    yield root, outside


class Racer:
    """A thread that keeps exchanging ws/sub <-> ws/evil and ws/file.txt <-> ws/evil.txt until stopped."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.swaps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        pairs = [(self.root / "sub", self.root / "evil"), (self.root / "file.txt", self.root / "evil.txt")]
        while not self._stop.is_set():
            for a, b in pairs:
                exchange(a, b)
                self.swaps += 1

    def __enter__(self) -> Racer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        # Leave the names as they were (an even number of swaps per pair).
        for a, b in [(self.root / "sub", self.root / "evil"), (self.root / "file.txt", self.root / "evil.txt")]:
            if a.is_symlink():
                exchange(a, b)


def hammer(tools: FileTools, seconds: float) -> tuple[int, int, list[str]]:
    """Read, write, append, list, search and stat through the racing names; return (ok, refused, texts read)."""
    ok = refused = 0
    seen: list[str] = []
    operations: list[Callable[[], object]] = [
        lambda: seen.append(tools.read("sub/f.txt").content),
        lambda: tools.write("sub/f.txt", "written\n"),
        lambda: seen.append(tools.read("file.txt").content),
        lambda: tools.write("file.txt", "written\n"),
        lambda: tools.append("sub/new.txt", "appended\n"),
        lambda: tools.write("sub/made/deeper.txt", "made\n"),
        lambda: seen.extend(m.text for m in tools.search(SECRET[:7], "sub").matches),
        lambda: seen.extend(m.text for m in tools.search(SECRET[:7]).matches),
        lambda: seen.extend(e.path for e in tools.list("sub", recursive=True).entries),
        lambda: tools.stat("sub/f.txt"),
    ]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for operation in operations:
            try:
                operation()
                ok += 1
            except ToolError:
                refused += 1
    return ok, refused, seen


def resolvers() -> list[object]:
    kernel = pytest.param(
        True,
        id="openat2",
        marks=pytest.mark.skipif(not openat2_available(), reason="this kernel has no openat2 (Linux >= 5.6)"),
    )
    return [kernel, pytest.param(False, id="walk")]


@pytest.mark.parametrize("use_openat2", resolvers())
def test_racing_symlink_swaps_never_reach_outside(arena: tuple[Path, Path], use_openat2: bool) -> None:
    root, outside = arena
    before = snapshot(outside)
    tools = FileTools(FilesOptions.create(root), use_openat2=use_openat2)
    with Racer(root) as racer:
        ok, refused, seen = hammer(tools, RACE_SECONDS)
    tools.close()
    assert racer.swaps > 1000, "the racer barely ran; the test proved nothing"
    assert ok > 0 and refused > 0, (ok, refused)  # both sides of the race were hit
    assert not [text for text in seen if SECRET in text]
    assert snapshot(outside) == before  # nothing written, created or changed outside


def test_control_a_check_then_open_by_name_does_escape(arena: tuple[Path, Path]) -> None:
    """The racer is strong enough: a realpath check followed by an open by name leaks within seconds."""
    root, _ = arena
    leaked = 0

    def naive_read(path: str) -> str:
        real = os.path.realpath(root / path)
        if not real.startswith(str(root) + "/"):
            raise PermissionError(path)
        with open(real, encoding="utf-8") as handle:  # the name is looked up again: the hole
            return handle.read()

    with Racer(root):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not leaked:
            for path in ("sub/f.txt", "file.txt"):
                with contextlib.suppress(OSError):
                    leaked += SECRET in naive_read(path)
    assert leaked, "the racer never won against the name-based check in 20 s"


def test_a_hard_link_to_an_outside_file_is_never_written(arena: tuple[Path, Path]) -> None:
    root, outside = arena
    os.link(outside / "file.txt", root / "linked.txt")
    tools = FileTools(FilesOptions.create(root))
    for operation in (lambda: tools.write("linked.txt", "pwned\n"), lambda: tools.append("linked.txt", "pwned\n")):
        with pytest.raises(ToolError, match="has 2 hard links"):
            operation()
    assert (outside / "file.txt").read_text() == SECRET + "\n"  # not even truncated
    assert tools.read("linked.txt").content == SECRET + "\n"  # reading a name inside the root is allowed


def test_fifos_and_other_special_files_never_block(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    tools = FileTools(FilesOptions.create(tmp_path))
    for operation in (lambda: tools.read("pipe"), lambda: tools.write("pipe", "x"), lambda: tools.append("pipe", "x")):
        with pytest.raises(ToolError, match="not a regular file"):
            operation()
    assert tools.search("x").files_searched == 0 and tools.stat("pipe").type == "other"


@pytest.mark.parametrize("use_openat2", resolvers())
def test_deep_and_long_paths_are_refused_cleanly_and_legit_depth_works(tmp_path: Path, use_openat2: bool) -> None:
    tools = FileTools(FilesOptions.create(tmp_path), use_openat2=use_openat2)
    hostile = "/".join(["d"] * 1500) + "/f.txt"
    for operation in (lambda: tools.write(hostile, "x"), lambda: tools.read(hostile), lambda: tools.list(hostile)):
        with pytest.raises(ToolError, match=f"1501 components; the limit is {MAX_DEPTH}"):
            operation()
    with pytest.raises(ToolError, match="the limit is 4096"):
        tools.read("x" * 100_000)
    with pytest.raises(ToolError, match="longer than 255 bytes"):
        tools.write("y" * 300, "x")
    with pytest.raises(ToolError, match="NUL"):
        tools.read("a\x00b")
    with pytest.raises(ToolError, match="not valid Unicode"):
        tools.write("a\ud800b", "x")
    deep = "/".join(["d"] * (MAX_DEPTH - 1)) + "/f.txt"
    assert tools.write(deep, "deep\n").created
    assert tools.read(deep).content == "deep\n"
    assert tools.search("deep").matches[0].path == deep
    assert tools.write("after.txt", "fine\n").created  # the next normal call just works


def test_an_unexpected_error_is_one_line_and_the_server_keeps_answering(tmp_path: Path, monkeypatch) -> None:
    from saucer.tools.files import build_server

    (tmp_path / "a.txt").write_text("a\n")

    def explode(self: FileTools, path: str, *args: object) -> None:
        def recurse(n: int) -> int:
            return recurse(n + 1) + 1

        recurse(0)

    monkeypatch.setattr(FileTools, "stat", explode)
    server = build_server(FilesOptions.create(tmp_path))

    import anyio

    async def main() -> None:
        async with LocalCommandDispatcher.from_servers({"files": server}) as dispatcher:
            broken, fine = await dispatcher.execute_commands(
                [
                    Command(tool_name="files.stat", parameters={"path": "a.txt"}, tool_type="data_collection"),
                    Command(tool_name="files.read", parameters={"path": "a.txt"}, tool_type="data_collection"),
                ],
            )
            assert broken.status == ResultStatus.FAILURE
            assert "RecursionError: maximum recursion depth exceeded" in broken.error
            assert "\n" not in broken.error and "Traceback" not in broken.error
            [fine] = await dispatcher.execute_commands([Command(tool_name="files.read", parameters={"path": "a.txt"})])
            assert fine.status == ResultStatus.SUCCESS and fine.result["content"] == "a\n"

    anyio.run(main)


@pytest.mark.anyio
async def test_attacks_through_the_real_stdio_server(arena: tuple[Path, Path], tmp_path: Path) -> None:
    """The files server as a process: hostile paths get one-line errors at once, and races still never escape."""
    root, outside = arena
    before = snapshot(outside)
    stderr = tmp_path / "files-server.stderr"
    servers = {
        "files": {
            "command": sys.executable,
            "args": ["-m", "saucer.tools.files", "--root", str(root)],
            "timeout": 10,
            "stderr": str(stderr),
        }
    }
    async with LocalCommandDispatcher.from_config(servers) as dispatcher:
        hostile = "/".join(["d"] * 1500) + "/f.txt"
        for tool in ("files.write", "files.read", "files.list", "files.search"):
            parameters = {"path": hostile, "content": "x"} if tool == "files.write" else {"path": hostile}
            if tool == "files.search":
                parameters["pattern"] = "x"
            [deep] = await dispatcher.execute_commands([Command(tool_name=tool, parameters=parameters)])
            assert deep.status == ResultStatus.FAILURE and "1501 components" in (deep.error or ""), deep
        # A wedged server would make this wait for the 10 s tool timeout and fail.
        [normal] = await dispatcher.execute_commands([Command(tool_name="files.read", parameters={"path": "file.txt"})])
        assert normal.status == ResultStatus.SUCCESS and normal.result["content"] == "inside\n"

        reads: list[str] = []
        with Racer(root) as racer:
            deadline = time.monotonic() + RACE_SECONDS
            while time.monotonic() < deadline:
                results = await dispatcher.execute_commands(
                    [
                        Command(tool_name="files.read", parameters={"path": "sub/f.txt"}, tool_type="data_collection"),
                        Command(tool_name="files.write", parameters={"path": "sub/f.txt", "content": "w\n"}),
                        Command(tool_name="files.read", parameters={"path": "file.txt"}, tool_type="data_collection"),
                        Command(tool_name="files.append", parameters={"path": "file.txt", "content": "a\n"}),
                    ],
                )
                reads.extend(str(r.result) for r in results if r.status == ResultStatus.SUCCESS)
    assert racer.swaps > 100 and reads
    assert not [text for text in reads if SECRET in text]
    assert snapshot(outside) == before
    log = stderr.read_text() if stderr.exists() else ""
    assert "Traceback" not in log, log
