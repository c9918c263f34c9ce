"""MCPServerConfig: transports inferred from the keys, errors naming the field, the default server set."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from saucer.dispatch import LocalCommandDispatcher, MCPServerConfig, default_servers
from saucer.dispatch.servers import configured_servers
from saucer.tools.rules import DEFAULT_SENSITIVE_COMMANDS


def test_transport_follows_from_the_keys() -> None:
    stdio = MCPServerConfig.model_validate({"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]})
    http = MCPServerConfig.model_validate({"url": "http://127.0.0.1:9/mcp", "headers": {"X-Token": "t"}})
    inproc = MCPServerConfig.model_validate({"import_path": "pkg.mod:server", "timeout": 5})
    assert (stdio.transport, http.transport, inproc.transport) == ("stdio", "http", "inprocess")
    assert stdio.timeout == 30.0 and inproc.timeout == 5.0
    assert stdio.sensitive_tools == [] and stdio.env == {}


def test_a_config_survives_a_json_round_trip() -> None:
    config = MCPServerConfig(command="x", args=["-v"], env={"A": "1"}, cwd=Path("/tmp"), sensitive_tools=["t"])
    again = MCPServerConfig.model_validate(json.loads(config.model_dump_json()))
    assert again == config


def _messages(exc: pytest.ExceptionInfo[ValidationError]) -> str:
    return "\n".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.value.errors())


@pytest.mark.parametrize(
    "table, expected",
    [
        ({"command": "x", "comand": "y"}, "comand"),  # unknown key
        ({"comand": "y"}, "unknown field 'comand' (did you mean 'command'?)"),
        ({"command": "x", "args": "not-a-list"}, "args"),
        ({"command": "x", "timeout": "soon"}, "timeout"),
        ({"command": "x", "timeout": 0}, "timeout"),
        ({"command": "x", "env": {"A": 1}}, "env.A"),
        ({"command": "x", "url": "http://h/mcp"}, "'command', 'url'"),
        ({"url": "http://h/mcp", "args": ["-v"]}, "'args'"),
        ({"url": "ftp://h/mcp"}, "url"),
        ({"import_path": "no_colon"}, "import_path"),
        ({"command": "x", "sensitive_commands": ["re:("]}, "re:("),
        ({"args": ["-v"]}, "'command' (stdio)"),
        ({"transport": "http", "command": "x"}, "'url' is required"),
    ],
)
def test_bad_tables_name_the_field(table: dict[str, object], expected: str) -> None:
    with pytest.raises(ValidationError) as exc:
        MCPServerConfig.model_validate(table)
    assert expected in _messages(exc)


def test_dispatcher_config_errors_name_the_server_and_the_field() -> None:
    with pytest.raises(ValidationError) as exc:
        LocalCommandDispatcher.from_config({"time": {"command": "mcp-server-time", "timeout": "x"}})
    assert "time.timeout" in _messages(exc)
    with pytest.raises(ValueError, match="server name"):
        LocalCommandDispatcher.from_config({"a.b": {"command": "x"}})


def test_configs_are_immutable() -> None:
    config = MCPServerConfig(command="x")
    with pytest.raises(ValidationError):
        config.timeout = 3  # type: ignore[misc]


def test_default_servers_run_the_builtin_tools_in_the_workspace(tmp_path: Path) -> None:
    # Isolated: each built-in server is its own stdio process (in-process is the default, tested below).
    servers = default_servers(tmp_path, shell_deny=["curl *"], isolate=True)
    assert set(servers) == {"shell", "files"}
    shell, files = servers["shell"], servers["files"]
    assert shell.transport == files.transport == "stdio"
    assert shell.command == files.command == sys.executable
    assert shell.args[:3] == ["-P", "-m", "saucer.tools.shell"] and files.args[:3] == ["-P", "-m", "saucer.tools.files"]
    root = str(tmp_path.resolve())
    assert shell.args[shell.args.index("--root") + 1] == root and files.args[files.args.index("--root") + 1] == root
    assert shell.cwd == files.cwd == tmp_path.resolve()
    assert shell.args[shell.args.index("--deny") + 1] == "curl *"
    assert shell.sensitive_commands == list(DEFAULT_SENSITIVE_COMMANDS)
    # The dispatcher must wait at least as long as the longest command the shell accepts.
    max_timeout = float(shell.args[shell.args.index("--max-timeout") + 1])
    assert shell.timeout > max_timeout
    assert default_servers(tmp_path, sensitive_commands=[])["shell"].sensitive_commands == []


def test_default_servers_run_in_process_with_the_same_options(tmp_path: Path) -> None:
    isolated = default_servers(tmp_path, shell_deny=["curl *"], isolate=True)
    servers = default_servers(tmp_path, shell_deny=["curl *"])
    shell, files = servers["shell"], servers["files"]
    assert shell.transport == files.transport == "inprocess"
    assert shell.import_path == "saucer.tools.shell_table:create_server"  # the lazy form of shell:create_server
    assert files.import_path == "saucer.tools.files:create_server"
    root = str(tmp_path.resolve())
    assert shell.options["root"] == files.options["root"] == root
    assert shell.options["deny"] == ["curl *"]
    # What the dispatcher enforces is the same either way: timeouts and the sensitive patterns.
    assert (shell.timeout, shell.sensitive_commands) == (
        isolated["shell"].timeout,
        isolated["shell"].sensitive_commands,
    )
    assert files.timeout == isolated["files"].timeout
    assert shell.options["max_timeout"] == float(
        isolated["shell"].args[isolated["shell"].args.index("--max-timeout") + 1]
    )
    # One server can be isolated while the other stays in-process.
    mixed = default_servers(tmp_path, isolate=["shell"])
    assert (mixed["shell"].transport, mixed["files"].transport) == ("stdio", "inprocess")


def test_isolate_names_only_builtin_servers(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="isolate names built-in servers .*not 'desktop'"):
        default_servers(tmp_path, isolate=["desktop"])
    with pytest.raises(ValueError, match="not 'time'"):
        configured_servers({"time": MCPServerConfig(command="mcp-server-time")}, tmp_path, isolate=["time"])


def test_options_belong_to_in_process_servers() -> None:
    with pytest.raises(ValidationError, match="'options' applies to inprocess servers"):
        MCPServerConfig(command="x", options={"root": "."})
    config = MCPServerConfig(import_path="saucer.tools.files:create_server", options={"root": "."})
    assert config.transport == "inprocess"
