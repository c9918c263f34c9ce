"""The built-in tools called directly (in-process, no MCP) say exactly what their MCP servers say.

The same tool table runs two ways: :class:`saucer.tools.native.NativeServer`
called by the dispatcher, and the MCPServer that ``build_server`` registers it
on. The listing the dispatcher records and every result (successes, tool
errors, argument errors the schema lets through, crashes) must be equal, so a
session records the same events whichever way its tools run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from saucer.dispatch import Command, LocalCommandDispatcher
from saucer.tools import files, shell
from saucer.tools.files_models import FileStat
from saucer.tools.native import NativeServer, ToolError, ToolOutcome, ToolSpec

pytestmark = pytest.mark.anyio


def _servers(root: Path, read_only: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """(native, MCP) servers of the same options."""
    file_options = files.FilesOptions.create(root, read_only=read_only)
    shell_options = shell.ShellOptions.create(root, deny=["curl *"], env=shell.default_environment())
    native = {"files": files.tool_table(file_options), "shell": shell.tool_table(shell_options)}
    mcp = {"files": files.build_server(file_options), "shell": shell.build_server(shell_options)}
    return native, mcp


@pytest.mark.parametrize("read_only", [False, True], ids=["read-write", "read-only"])
async def test_the_listing_is_the_mcp_servers_listing(tmp_path: Path, read_only: bool) -> None:
    native, mcp = _servers(tmp_path, read_only)
    async with LocalCommandDispatcher.from_servers(native) as direct, LocalCommandDispatcher.from_servers(mcp) as over:
        listed, expected = await direct.list_tools(), await over.list_tools()
    assert listed == expected
    assert {"files.read", "files.list", "files.stat", "files.search", "shell.run"} <= set(listed)
    assert ("files.write" in listed) is not read_only


def _commands() -> list[Command]:
    calls: list[tuple[str, dict[str, Any]]] = [
        ("files.write", {"path": "notes/a.txt", "content": "hello\nworld\n"}),
        ("files.read", {"path": "notes/a.txt", "max_bytes": 3}),
        ("files.read", {"path": "../outside"}),
        ("files.read", {"path": "missing.txt"}),
        ("files.list", {"path": ".", "recursive": True}),
        ("files.list", {"path": ".", "max_entries": "[1]"}),  # a string of JSON for an integer: refused
        ("files.list", {"path": ".", "max_entries": 0}),
        ("files.stat", {"path": "notes"}),
        ("files.search", {"pattern": "wor", "glob": "*.txt"}),
        ("files.search", {"pattern": "(", "regex": True}),
        ("files.search", {"pattern": "x", "unknown": 1}),  # extra arguments are ignored
        ("files.read", {"path": 5}),  # the schema lets nothing through here; with validation off, pydantic says it
        ("files.read", {}),
        ("shell.run", {"command": "echo out; echo err >&2"}),
        ("shell.run", {"command": "exit 3"}),
        ("shell.run", {"command": "exit 1", "expect_exit": "[0, 1]"}),  # JSON text for a list is parsed
        ("shell.run", {"command": "echo $X", "env": {"X": "set"}}),
        ("shell.run", {"command": "curl http://example.invalid"}),
        ("shell.run", {"command": "pwd", "cwd": ".."}),
        ("shell.run", {"command": "   "}),
        ("shell.run", {"command": "true", "timeout": -1}),
        ("shell.run", {"command": "true", "env": {"X": 1}}),
    ]
    return [Command(tool_name=tool, parameters=params, call_id=f"c{i}") for i, (tool, params) in enumerate(calls)]


def _comparable(result: Any) -> Any:
    data = result.model_dump(mode="json")
    if isinstance(data.get("result"), dict):
        data["result"].pop("duration", None)  # how long a command ran is the one thing that may differ
        data["result"].pop("modified", None)
    return data


@pytest.mark.parametrize("validate", [True, False], ids=["schema-checked", "unchecked"])
async def test_every_result_is_the_mcp_servers_result(tmp_path: Path, validate: bool) -> None:
    outcomes = []
    root = tmp_path / "workspace"
    for way in (0, 1):
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()  # the same folder, fresh, each way: paths in messages are equal
        servers = _servers(root)[way]
        async with LocalCommandDispatcher.from_servers(servers, validate_parameters=validate, assume_yes=True) as d:
            outcomes.append([_comparable(await d.execute_command(c)) for c in _commands()])
    native, mcp = outcomes
    for command, mine, theirs in zip(_commands(), native, mcp, strict=False):
        assert mine == theirs, command
    errors = [r["error"] for r in native if r["error"]]
    assert any("Error executing tool read: path '../outside' escapes the sandbox root" in e for e in errors)
    if not validate:
        assert any("validation error for readArguments" in e for e in errors)


async def test_a_crash_is_reported_without_its_text_either_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(*args: Any) -> None:
        raise RuntimeError("secret detail")

    monkeypatch.setattr(files, "guarded", crash)
    results = []
    for servers in _servers(tmp_path):
        async with LocalCommandDispatcher.from_servers(servers) as dispatcher:
            results.append(await dispatcher.execute_command(Command(tool_name="files.stat", parameters={"path": "."})))
    native, mcp = results
    assert native.error == mcp.error == "tool 'files.stat' failed: Error executing tool stat"


def test_the_commands_environment_is_the_one_a_stdio_server_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    from mcp.client.stdio import get_default_environment

    monkeypatch.setenv("SHELL", "() { :; }; echo exported function")
    monkeypatch.setenv("TERM", "xterm")
    assert shell.default_environment() == get_default_environment()
    assert "SHELL" not in shell.default_environment()


async def test_a_native_server_answers_every_failure_with_an_outcome() -> None:
    async def boom(flag: bool) -> ToolOutcome:
        if flag:
            raise ToolError("told you")
        return ToolOutcome("fine", {"bad": "shape"})  # a success that does not fit the output model

    server = NativeServer("t", "test", [ToolSpec("boom", boom, FileStat, "a tool")])
    assert await server.call_tool("nope", {}) == ToolOutcome("Unknown tool: nope", is_error=True)
    assert await server.call_tool("boom", {"flag": True}) == ToolOutcome(
        "Error executing tool boom: told you", is_error=True
    )
    assert await server.call_tool("boom", {"flag": False}) == ToolOutcome("Error executing tool boom", is_error=True)
    refused = await server.call_tool("boom", {})
    assert refused.is_error and "validation error for boomArguments" in refused.text
    with pytest.raises(ValueError, match="defined twice"):
        NativeServer("t", "test", [ToolSpec("boom", boom, FileStat, "a"), ToolSpec("boom", boom, FileStat, "b")])
    with pytest.raises(ValueError, match="unknown hints"):
        ToolSpec("boom", boom, FileStat, "a", hints={"readonly": True}).annotations()


def test_the_in_process_tools_never_import_the_mcp_sdk_nor_jsonschema_for_valid_commands(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import asyncio, sys
        from pathlib import Path
        from saucer.dispatch import Command, LocalCommandDispatcher, default_servers

        async def main():
            async with LocalCommandDispatcher.from_config(default_servers(Path(sys.argv[1]))) as dispatcher:
                assert {"shell.run", "files.read"} <= set(await dispatcher.list_tools())
                results = await dispatcher.execute_commands([
                    Command(tool_name="shell.run", parameters={"command": "echo hi"}),
                    Command(tool_name="files.read", parameters={"path": "nope"}),
                ])
                print(results[0].status.value, results[1].status.value)

        asyncio.run(main())
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("mcp", "mcp_types", "httpx2", "starlette", "jsonschema")))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["success failure", "[]"]


# -- the schema cache -------------------------------------------------------------------------------


def _table(source: Path, *, default: int = 3) -> NativeServer:
    """A one-tool table whose schemas follow from ``source`` (the cache goes to its __pycache__)."""

    async def look(path: str, depth: int = default) -> FileStat:
        raise ToolError("not called")

    return NativeServer("t", "test", [ToolSpec("look", look, FileStat, "a tool")], schema_sources=(source,))


def _listed_without_pydantic(table: NativeServer, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The listing, failing if any schema had to be computed."""
    from saucer.tools import native

    def refuse(*args: Any) -> None:
        raise AssertionError("the schemas were computed, not read from the cache")

    with monkeypatch.context() as patch:
        patch.setattr(native._Compiled, "__init__", refuse)
        return table.list_tools()


@pytest.fixture
def write_bytecode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)


def test_schemas_are_cached_beside_their_source_and_follow_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_bytecode: None
) -> None:
    source = tmp_path / "tools.py"
    source.write_text("# version 1\n")
    first = _table(source).list_tools()
    [cached] = (tmp_path / "__pycache__").glob("tools.t.tool-schemas.json")
    assert _listed_without_pydantic(_table(source), monkeypatch) == first
    assert first[0]["inputSchema"]["properties"]["depth"]["default"] == 3
    # Another default is another tool: computed, not taken from the entry of the first.
    assert _table(source, default=4).list_tools()[0]["inputSchema"]["properties"]["depth"]["default"] == 4
    # A changed source makes every entry stale.
    source.write_text("# version 2\n")
    with pytest.raises(AssertionError, match="were computed"):
        _listed_without_pydantic(_table(source), monkeypatch)
    assert _table(source).list_tools() == first and cached.exists()


def test_a_change_to_another_module_beside_the_sources_makes_the_cache_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_bytecode: None
) -> None:
    source = tmp_path / "tools.py"
    source.write_text("x = 1\n")
    models = tmp_path / "tool_models.py"  # where a result model might have moved, named nowhere
    models.write_text("# version 1\n")
    first = _table(source).list_tools()
    assert _listed_without_pydantic(_table(source), monkeypatch) == first
    models.write_text("# version 2\n")
    with pytest.raises(AssertionError, match="were computed"):
        _listed_without_pydantic(_table(source), monkeypatch)


@pytest.mark.parametrize("damage", [b"", b"{not json", b"[]", b'{"key": 1, "tools": {}}', b"\xff\xfe"])
def test_a_damaged_cache_is_ignored_and_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_bytecode: None, damage: bytes
) -> None:
    source = tmp_path / "tools.py"
    source.write_text("x = 1\n")
    expected = _table(source).list_tools()
    [cached] = (tmp_path / "__pycache__").glob("*.tool-schemas.json")
    cached.write_bytes(damage)
    assert _table(source).list_tools() == expected
    assert _listed_without_pydantic(_table(source), monkeypatch) == expected  # rewritten whole


def test_a_forged_entry_of_the_right_key_is_what_the_cache_is_for(tmp_path: Path, write_bytecode: None) -> None:
    """The file is trusted like a .pyc beside it: a valid entry is used as it is (so never edit one by hand)."""
    source = tmp_path / "tools.py"
    source.write_text("x = 1\n")
    _table(source).list_tools()
    [cached] = (tmp_path / "__pycache__").glob("*.tool-schemas.json")
    data = json.loads(cached.read_text())
    [entry] = data["tools"].values()
    entry["inputSchema"]["title"] = "edited"
    cached.write_text(json.dumps(data))
    assert _table(source).list_tools()[0]["inputSchema"]["title"] == "edited"


def test_no_cache_is_written_under_dont_write_bytecode_or_where_it_cannot_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "tools.py"
    source.write_text("x = 1\n")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    expected = _table(source).list_tools()
    assert not (tmp_path / "__pycache__").exists()
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    (tmp_path / "__pycache__").write_text("a file where the folder would be")  # unwritable even for root
    assert _table(source).list_tools() == expected
    assert (tmp_path / "__pycache__").read_text() == "a file where the folder would be"


def test_missing_sources_mean_no_cache(tmp_path: Path, write_bytecode: None) -> None:
    table = _table(tmp_path / "gone.py")
    assert table.list_tools()[0]["name"] == "look"
    assert not (tmp_path / "__pycache__").exists()


def test_each_listing_is_a_copy_a_caller_may_change(tmp_path: Path) -> None:
    table = files.tool_table(files.FilesOptions.create(tmp_path))
    first = table.list_tools()
    first[0]["inputSchema"]["properties"].clear()
    first[0]["outputSchema"]["title"] = "changed"
    again = table.list_tools()
    assert again[0]["inputSchema"]["properties"] and again[0]["outputSchema"]["title"] != "changed"
    assert again == files.tool_table(files.FilesOptions.create(tmp_path)).list_tools()
