"""The built-in files server: the sandbox holds, reads are capped and page, search finds lines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from saucer.dispatch import Command, LocalCommandDispatcher, ResultStatus
from saucer.tools.files import FilesOptions, FileTools, build_server, parse_options
from saucer.tools.native import ToolError


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "mod.py").write_text("def hello():\n    return 'Hello'\n")
    (root / "README.md").write_text("# Title\nhello world\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("hello from git\n")
    (root / "blob.bin").write_bytes(b"hello\x00\x01\x02")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("hello secret\n")
    os.symlink(outside, root / "link_out")
    os.symlink(outside / "secret.txt", root / "secret_link.txt")
    os.symlink(root / "README.md", root / "readme_link.md")
    return root


@pytest.fixture
def tools(sandbox: Path) -> FileTools:
    return FileTools(FilesOptions.create(sandbox, max_read=16))


@pytest.mark.parametrize("path", ["../outside/secret.txt", "src/../../outside/secret.txt", "/etc/passwd"])
def test_every_way_out_of_the_root_is_refused(tools: FileTools, sandbox: Path, path: str) -> None:
    for operation in (
        lambda: tools.read(path),
        lambda: tools.stat(path),
        lambda: tools.list(path),
        lambda: tools.write(path, "x"),
        lambda: tools.append(path, "x"),
        lambda: tools.search("x", path),
    ):
        with pytest.raises(ToolError, match="escapes the sandbox root"):
            operation()
    assert (sandbox.parent / "outside" / "secret.txt").read_text() == "hello secret\n"
    assert not (sandbox.parent / "outside" / "x").exists()


@pytest.mark.parametrize("path", ["link_out/secret.txt", "secret_link.txt", "link_out", "readme_link.md"])
def test_no_path_goes_through_a_symbolic_link(tools: FileTools, sandbox: Path, path: str) -> None:
    # Even a link that stays inside the root is refused: links are never followed.
    for operation in (
        lambda: tools.read(path),
        lambda: tools.list(path),
        lambda: tools.write(path, "x"),
        lambda: tools.append(path, "x"),
        lambda: tools.search("x", path),
    ):
        with pytest.raises(ToolError, match="symbolic link"):
            operation()
    assert (sandbox.parent / "outside" / "secret.txt").read_text() == "hello secret\n"
    assert (sandbox / "README.md").read_text() == "# Title\nhello world\n"


def test_stat_describes_a_link_without_following_it(tools: FileTools) -> None:
    for path in ("link_out", "secret_link.txt", "readme_link.md"):
        info = tools.stat(path)
        assert info.type == "symlink" and info.is_symlink is True and info.path == path
    with pytest.raises(ToolError, match="goes through the symbolic link 'link_out'"):
        tools.stat("link_out/secret.txt")


def test_absolute_paths_inside_the_root_and_dot_dot_inside_it_work(tools: FileTools, sandbox: Path) -> None:
    assert tools.read(str(sandbox / "README.md")).path == "README.md"
    assert tools.read("src/../README.md").content == "# Title\nhello wo"  # 16 bytes: the cap
    assert tools.stat("./src/pkg/..").path == "src" and tools.stat(".").path == "."


def test_reads_are_capped_and_page_with_offsets(sandbox: Path) -> None:
    (sandbox / "text.txt").write_text("héllo wörld " * 4)  # multi-byte characters straddle the cap
    tools = FileTools(FilesOptions.create(sandbox, max_read=10))
    pieces, offset = [], 0
    while True:
        part = tools.read("text.txt", offset=offset)
        assert part.bytes_read <= 10 and "\ufffd" not in part.content
        pieces.append(part.content)
        if not part.truncated:
            assert part.next_offset is None
            break
        offset = part.next_offset
    assert "".join(pieces) == "héllo wörld " * 4
    assert tools.read("text.txt", max_bytes=3).bytes_read <= 3  # a smaller cap per call is honoured
    with pytest.raises(ToolError, match="looks binary"):
        tools.read("blob.bin")
    with pytest.raises(ToolError, match="does not exist"):
        tools.read("missing.txt")
    with pytest.raises(ToolError, match="is a directory"):
        tools.read("src")


def test_write_append_stat_and_list(sandbox: Path) -> None:
    tools = FileTools(FilesOptions.create(sandbox, max_write=100))
    created = tools.write("new/dir/a.txt", "one\n")
    assert created.created and created.size == 4 and created.path == "new/dir/a.txt"
    appended = tools.append("new/dir/a.txt", "two\n")
    assert not appended.created and appended.size == 8
    assert (sandbox / "new" / "dir" / "a.txt").read_text() == "one\ntwo\n"
    with pytest.raises(ToolError, match="limit for one write is 100 bytes"):
        tools.write("big.txt", "x" * 101)
    with pytest.raises(ToolError, match="does not exist"):
        tools.write("nowhere/b.txt", "x", create_dirs=False)
    info = tools.stat("new/dir/a.txt")
    assert info.type == "file" and info.size == 8 and info.mode.startswith("0o")

    top = tools.list()
    names = [e.path for e in top.entries]
    assert "README.md" in names and "src" in names and ".git" not in names
    assert next(e for e in top.entries if e.path == "link_out").type == "symlink"
    deep = tools.list("src", recursive=True)
    assert [e.path for e in deep.entries] == ["src/pkg", "src/pkg/mod.py"]
    assert tools.list(recursive=True, max_entries=2).truncated
    assert ".git/config" in [e.path for e in tools.list(recursive=True, include_hidden=True).entries]


def test_read_only_mode_refuses_writes(sandbox: Path) -> None:
    tools = FileTools(FilesOptions.create(sandbox, read_only=True))
    with pytest.raises(ToolError, match="read-only"):
        tools.write("a.txt", "x")


def test_search_substring_and_regex(tools: FileTools) -> None:
    found = tools.search("hello")
    assert {(m.path, m.line) for m in found.matches} == {("README.md", 2), ("src/pkg/mod.py", 1)}
    assert found.files_skipped >= 1  # the binary file; .git and links are not searched at all
    regex = tools.search(r"^\s+return", regex=True)
    assert [(m.path, m.line, m.text) for m in regex.matches] == [("src/pkg/mod.py", 2, "    return 'Hello'")]
    assert [m.path for m in tools.search("HELLO", case_sensitive=False, glob="*.py").matches] == ["src/pkg/mod.py"] * 2
    assert tools.search("hello", max_results=1).truncated
    with pytest.raises(ToolError, match="invalid regular expression"):
        tools.search("(", regex=True)


def test_options_from_argv(sandbox: Path) -> None:
    options = parse_options(["--root", str(sandbox), "--max-read", "5", "--read-only"])
    assert options.root == sandbox.resolve() and options.max_read == 5 and options.read_only


@pytest.mark.anyio
async def test_the_tools_over_mcp(sandbox: Path) -> None:
    server = build_server(FilesOptions.create(sandbox, read_only=True))
    async with LocalCommandDispatcher.from_servers({"files": server}) as dispatcher:
        tools = await dispatcher.list_tools()
        assert set(tools) == {"files.read", "files.list", "files.stat", "files.search"}  # no writes when read-only
        assert all(info["tool_type"] == "data_collection" for info in tools.values())
        assert all(len(info["description"]) > 60 for info in tools.values())
        read, escape = await dispatcher.execute_commands(
            [
                Command(tool_name="files.read", parameters={"path": "README.md"}),
                Command(tool_name="files.read", parameters={"path": "link_out/secret.txt"}),
            ]
        )
        assert read.status == ResultStatus.SUCCESS and read.result["content"] == "# Title\nhello world\n"
        assert escape.status == ResultStatus.FAILURE and "symbolic link 'link_out'" in escape.error
        assert "hello secret" not in escape.error
