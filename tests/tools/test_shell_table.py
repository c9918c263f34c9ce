"""The in-process shell listed without its implementation says and does what the implementation does.

:func:`saucer.tools.shell_table.create_server` (the default ``shell``) lists the
tool from the options and the schemas kept in ``shell_schema.json``, and
imports :mod:`saucer.tools.shell` on the first call. These tests keep the kept
schemas equal to what the implementation builds (a changed parameter or result
field fails here until ``python -m saucer.tools.shell_table`` writes the file
again), the listing and every result equal to the implementation's, and the
listing free of the implementation's import.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from saucer.dispatch import Command, LocalCommandDispatcher, default_servers
from saucer.tools import shell, shell_table
from saucer.tools.shell_table import LazyShellServer

pytestmark = pytest.mark.anyio

OPTION_SETS: list[dict[str, Any]] = [
    {},
    {"allow": ["echo *", "ls*"], "deny": ["curl *", "re:^rm "], "max_output": 10, "timeout": 5, "max_timeout": 7},
    {"timeout": 900, "sandbox": "off", "network": [443], "env": {"A": "b"}},
]


def test_the_kept_schemas_are_the_ones_the_implementation_builds() -> None:
    built = shell.built_schemas()
    # text equality: the order of the properties is what a model reads, so it must be kept too
    assert json.dumps(shell_table.kept_schemas()) == json.dumps(built), (
        "the shell tool's parameters or result changed: run `python -m saucer.tools.shell_table`"
    )
    assert json.loads(shell_table.SCHEMA_FILE.read_text(encoding="utf-8")) == built


@pytest.mark.parametrize("options", OPTION_SETS, ids=["defaults", "rules", "confinement"])
def test_the_listing_is_the_implementations(tmp_path: Path, options: dict[str, Any]) -> None:
    lazy = shell_table.create_server(tmp_path, **options)
    eager = shell.create_server(tmp_path, **options)
    assert isinstance(lazy, LazyShellServer)
    assert json.dumps(lazy.list_tools()) == json.dumps(eager.list_tools())
    assert (lazy.name, lazy.instructions) == (eager.name, eager.instructions)
    listed = lazy.list_tools()
    listed[0]["inputSchema"]["properties"].clear()  # each listing is the caller's to change
    assert lazy.list_tools()[0]["inputSchema"]["properties"]


def test_the_options_are_refused_as_the_implementation_refuses_them(tmp_path: Path) -> None:
    for bad in (
        {"root": tmp_path / "missing"},
        {"root": tmp_path, "deny": ["re:("]},
        {"root": tmp_path, "sandbox": "x"},
    ):
        with pytest.raises(ValueError) as lazy_error:
            shell_table.create_server(**bad)
        with pytest.raises(ValueError) as eager_error:
            shell.create_server(**bad)
        assert str(lazy_error.value) == str(eager_error.value)


def test_a_call_goes_to_the_shared_table_of_the_same_options(tmp_path: Path) -> None:
    lazy = shell_table.create_server(tmp_path, deny=["curl *"])
    eager = shell.create_server(tmp_path, deny=["curl *"])
    assert lazy.loaded() is eager
    assert lazy.tools is eager.tools
    with pytest.raises(AttributeError):
        lazy.tools = {}


def _calls() -> list[tuple[str, dict[str, Any]]]:
    return [
        ("run", {"command": "echo hi; echo err >&2"}),
        ("run", {"command": "exit 3"}),
        ("run", {"command": "grep nothing /dev/null", "expect_exit": [0, 1]}),
        ("run", {"command": "pwd", "cwd": "sub"}),
        ("run", {"command": "pwd", "cwd": "../outside"}),
        ("run", {"command": "curl http://example.invalid"}),
        ("run", {"command": "echo $X", "env": '{"X": "from json"}'}),
        ("run", {"command": 5}),
        ("run", {}),
        ("missing", {"command": "true"}),
    ]


def _comparable(outcome: Any) -> Any:
    structured = dict(outcome.structured) if outcome.structured is not None else None
    if structured is not None:
        structured.pop("duration", None)
    return outcome.text if structured is None else None, structured, outcome.is_error


async def test_every_call_gives_the_implementations_result(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    options = {"deny": ["curl *"], "sandbox": "off"}
    lazy = LazyShellServer(*shell_table.prepare(tmp_path, **options))  # a table of its own: loaded by its first call
    eager = shell.tool_table(shell.ShellOptions.create(tmp_path, **options, env=lazy.options.env))
    assert lazy._table is None
    for name, arguments in _calls():
        got, expected = await lazy.call_tool(name, arguments), await eager.call_tool(name, arguments)
        assert _comparable(got) == _comparable(expected), (name, arguments)
        if expected.structured is None:
            assert got.text == expected.text
    assert lazy._table is not None


async def test_the_default_shell_is_listed_and_called_through_the_dispatcher(tmp_path: Path) -> None:
    servers = default_servers(tmp_path)
    assert servers["shell"].import_path == "saucer.tools.shell_table:create_server"
    isolated = default_servers(tmp_path, isolate=["shell"])
    async with (
        LocalCommandDispatcher.from_config(servers) as direct,
        LocalCommandDispatcher.from_config(isolated) as over_stdio,
    ):
        assert await direct.list_tools() == await over_stdio.list_tools()
        command = Command(tool_name="shell.run", parameters={"command": "echo hello"})
        (result,) = await direct.execute_commands([command])
    assert result.status == "success"
    assert result.result["stdout"] == "hello\n"


def test_listing_the_shell_does_not_import_its_implementation(tmp_path: Path) -> None:
    code = (
        "import sys; from saucer.tools import shell_table as t\n"
        f"listed = t.create_server({str(tmp_path)!r}).list_tools()\n"
        "assert listed[0]['name'] == 'run'\n"
        "print(sorted(m for m in ('saucer.tools.shell', 'saucer.tools.shell_run', 'saucer.tools._child') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
