"""LocalCommandDispatcher with the fixture server: in-process, stdio and streamable HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from mcp.server.mcpserver import MCPServer
from tests.dispatch import dispatch_fixture_server
from tests.dispatch.dispatch_fixture_server import PROBE, app

from saucer.dispatch import Command, LocalCommandDispatcher, Result, ResultStatus

pytestmark = pytest.mark.anyio


def _statuses(results: list[Result]) -> list[ResultStatus]:
    return [r.status for r in results]


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); its state in /proc says it is gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


# -- in-process --------------------------------------------------------------------


async def test_in_process_server_tools_results_and_call_ids() -> None:
    async with LocalCommandDispatcher.from_servers({"fx": app}) as dispatcher:
        tools = await dispatcher.list_tools()
        assert json.loads(json.dumps(tools)) == tools
        assert tools["fx.add"]["input_schema"]["required"] == ["a", "b"]
        assert tools["fx.add"]["description"] == "Add two integers."
        assert tools["fx.probe"]["tool_type"] == "data_collection" and tools["fx.add"]["tool_type"] == "action"

        commands = [
            Command(tool_name="fx.add", parameters={"a": 2, "b": 3}, call_id="given-1"),
            Command(tool_name="echo", parameters={"text": "hi"}, call_id=None),
        ]
        results = await dispatcher.execute_commands(commands)
        assert _statuses(results) == [ResultStatus.SUCCESS, ResultStatus.SUCCESS]
        assert results[0].call_id == "given-1" and results[1].call_id == commands[1].call_id
        assert results[1].call_id  # generated, never empty
        assert results[0].result == {"result": 5} and results[0].namespace == "fx"
        assert results[0].error is None


async def test_tool_errors_are_failures_with_the_text_in_error() -> None:
    async with LocalCommandDispatcher.from_servers({"fx": app}) as dispatcher:
        fail, skipped = await dispatcher.execute_commands(
            [Command(tool_name="fx.fail", parameters={"message": "disk is full"}), Command(tool_name="fx.pid")]
        )
        assert fail.status == ResultStatus.FAILURE and fail.result is None and fail.namespace == "fx"
        assert "disk is full" in fail.error and "'fx.fail'" in fail.error
        assert skipped.status == ResultStatus.SKIPPED and "'fx.fail'" in skipped.error

        [boom] = await dispatcher.execute_commands([Command(tool_name="fx.boom")])
        assert boom.status == ResultStatus.FAILURE and "fx.boom" in boom.error

        [bad] = await dispatcher.execute_commands([Command(tool_name="fx.add", parameters={"a": "two", "b": 3})])
        assert bad.status == ResultStatus.FAILURE and "invalid parameters for tool 'fx.add'" in bad.error
        assert "'a'" in bad.error


async def test_bare_names_resolve_only_when_unique() -> None:
    other = MCPServer("other", log_level="WARNING")

    @other.tool()
    def echo(text: str) -> str:
        """Shout ``text``."""
        return text.upper()

    async with LocalCommandDispatcher.from_servers({"fx": app, "other": other}) as dispatcher:
        (ambiguous,) = await dispatcher.execute_commands([Command(tool_name="echo", parameters={"text": "a"})])
        assert ambiguous.status == ResultStatus.FAILURE
        assert "ambiguous tool name 'echo'" in ambiguous.error
        assert "fx.echo" in ambiguous.error and "other.echo" in ambiguous.error

        unique, qualified = await dispatcher.execute_commands(
            [
                Command(tool_name="add", parameters={"a": 1, "b": 1}),
                Command(tool_name="other.echo", parameters={"text": "a"}),
            ]
        )
        assert unique.result == {"result": 2} and unique.namespace == "fx"
        assert qualified.result == {"result": "A"} and qualified.namespace == "other"

        [no_server] = await dispatcher.execute_commands([Command(tool_name="nosuch.echo", parameters={"text": "a"})])
        assert no_server.status == ResultStatus.FAILURE
        assert "unknown tool 'nosuch.echo'" in no_server.error and "there is no server 'nosuch'" in no_server.error


async def test_a_slow_tool_hits_the_server_timeout_and_the_rest_is_skipped() -> None:
    servers = {"fx": {"import_path": "tests.dispatch.dispatch_fixture_server:app", "timeout": 0.3}}
    async with LocalCommandDispatcher.from_config(servers) as dispatcher:
        slow, after = await dispatcher.execute_commands(
            [
                Command(tool_name="fx.slow", parameters={"seconds": 5}),
                Command(tool_name="fx.echo", parameters={"text": "x"}),
            ]
        )
        assert slow.status == ResultStatus.FAILURE and "tool 'fx.slow' timed out after 0.3 s" in slow.error
        assert after.status == ResultStatus.SKIPPED
        [again] = await dispatcher.execute_commands([Command(tool_name="fx.echo", parameters={"text": "still here"})])
        assert again.result == {"result": "still here"}


async def test_a_bad_import_path_is_a_failure_naming_it() -> None:
    async with LocalCommandDispatcher.from_config(
        {"fx": {"import_path": "tests.dispatch.dispatch_fixture_server:nothing"}}
    ) as d:
        [result] = await d.execute_commands([Command(tool_name="fx.echo", parameters={"text": "x"})])
        assert result.status == ResultStatus.FAILURE
        assert "tests.dispatch.dispatch_fixture_server:nothing" in result.error and "'fx'" in result.error
        assert await d.list_tools() == {} and "fx" in d.server_errors


async def test_parallel_data_collection_through_the_dispatcher() -> None:
    reads = [Command(tool_name="fx.probe", parameters={"seconds": 0.2}, tool_type="data_collection") for _ in range(3)]
    for parallel, expected in ((False, 1), (True, 3)):
        PROBE["max"] = 0
        async with LocalCommandDispatcher.from_servers({"fx": app}, parallel_data_collection=parallel) as dispatcher:
            results = await dispatcher.execute_commands(reads)
        assert _statuses(results) == [ResultStatus.SUCCESS] * 3
        assert PROBE["max"] == expected


# -- sensitive commands -------------------------------------------------------------


async def test_an_approver_refusal_fails_the_command_and_skips_the_rest() -> None:
    asked: list[Command] = []

    async def refuse(command: Command) -> bool:
        asked.append(command)
        return False

    servers = {"fx": {"import_path": "tests.dispatch.dispatch_fixture_server:app", "sensitive_tools": ["add"]}}
    async with LocalCommandDispatcher.from_config(servers, approver=refuse) as dispatcher:
        tools = await dispatcher.list_tools()
        assert tools["fx.add"]["sensitive"] and not tools["fx.echo"]["sensitive"]
        echo, add, later = await dispatcher.execute_commands(
            [
                Command(tool_name="fx.echo", parameters={"text": "harmless"}),
                Command(tool_name="add", parameters={"a": 1, "b": 2}, call_id="sensitive"),
                Command(tool_name="fx.echo", parameters={"text": "later"}),
            ]
        )
    assert [c.call_id for c in asked] == ["sensitive"]
    assert echo.status == ResultStatus.SUCCESS
    assert add.status == ResultStatus.FAILURE and "refused by the user" in add.error and "'fx.add'" in add.error
    assert later.status == ResultStatus.SKIPPED


async def test_command_patterns_ask_and_an_approval_lets_the_command_run() -> None:
    asked: list[str] = []

    async def approve(command: Command) -> bool:
        asked.append(command.parameters["command"])
        return True

    async with LocalCommandDispatcher.from_servers(
        {"fx": app}, approver=approve, sensitive_commands=["rm *", "re:^sudo\\b"]
    ) as dispatcher:
        results = await dispatcher.execute_commands(
            [
                Command(tool_name="fx.run", parameters={"command": "ls -la"}),
                Command(tool_name="fx.run", parameters={"command": "cd /tmp && rm -rf build"}),
                Command(tool_name="fx.run", parameters={"command": "sudo reboot"}),
            ]
        )
        reason = await dispatcher.sensitive_reason(Command(tool_name="fx.run", parameters={"command": "rm x"}))
    assert _statuses(results) == [ResultStatus.SUCCESS] * 3
    assert asked == ["cd /tmp && rm -rf build", "sudo reboot"]
    assert reason is not None and "'rm *'" in reason


async def test_without_an_approver_sensitive_commands_need_assume_yes() -> None:
    command = Command(tool_name="fx.run", parameters={"command": "rm -rf /tmp/x"})
    async with LocalCommandDispatcher.from_servers({"fx": app}, sensitive_commands=["rm *"]) as dispatcher:
        [refused] = await dispatcher.execute_commands([command])
    assert refused.status == ResultStatus.FAILURE
    assert "refused" in refused.error and "no approver" in refused.error and "rm *" in refused.error
    async with LocalCommandDispatcher.from_servers({"fx": app}, sensitive_commands=["rm *"], assume_yes=True) as d:
        [allowed] = await d.execute_commands([command])
    assert allowed.status == ResultStatus.SUCCESS and allowed.result == {"result": "ran rm -rf /tmp/x"}


async def test_a_failing_approver_refuses() -> None:
    async def broken(command: Command) -> bool:
        raise RuntimeError("no terminal")

    async with LocalCommandDispatcher.from_servers({"fx": app}, approver=broken, sensitive_tools=["fx.pid"]) as d:
        [result] = await d.execute_commands([Command(tool_name="fx.pid")])
    assert result.status == ResultStatus.FAILURE and "no terminal" in result.error and "refused" in result.error


# -- stdio: persistence, crash and restart ----------------------------------------------


async def test_one_persistent_stdio_session_closed_on_exit(fixture_stdio: dict[str, Any], tmp_path: Path) -> None:
    log = tmp_path / "logs" / "fx.stderr"
    async with LocalCommandDispatcher.from_servers({"fx": {**fixture_stdio, "stderr": log}}) as dispatcher:
        first, second = await dispatcher.execute_commands([Command(tool_name="fx.pid"), Command(tool_name="fx.pid")])
        [third] = await dispatcher.execute_commands([Command(tool_name="fx.pid")])
        pid = first.result["result"]
        assert pid == second.result["result"] == third.result["result"] != os.getpid()
        assert _process_alive(pid)
        assert log.exists()  # the server's stderr goes to the configured file
    assert not _process_alive(pid)


async def test_a_server_killed_mid_batch_is_restarted_once(fixture_stdio: dict[str, Any], tmp_path: Path) -> None:
    marker = tmp_path / "refuse-start"
    config = {**fixture_stdio, "env": {"FIXTURE_REFUSE_START_IF": str(marker)}}
    async with LocalCommandDispatcher.from_servers({"fx": config}) as dispatcher:
        [first] = await dispatcher.execute_commands([Command(tool_name="fx.pid")])
        old_pid = first.result["result"]

        async def kill_soon() -> None:
            await asyncio.sleep(0.3)
            os.kill(old_pid, signal.SIGKILL)

        killer = asyncio.create_task(kill_soon())
        crashed, skipped = await dispatcher.execute_commands(
            [Command(tool_name="fx.slow", parameters={"seconds": 10}), Command(tool_name="fx.pid")]
        )
        await killer
        assert crashed.status == ResultStatus.FAILURE and crashed.namespace == "fx"
        assert "server 'fx' crashed while running tool 'fx.slow'" in crashed.error
        assert "it was restarted" in crashed.error and "not retried" in crashed.error
        assert skipped.status == ResultStatus.SKIPPED

        [after] = await dispatcher.execute_commands([Command(tool_name="fx.pid")])
        assert after.status == ResultStatus.SUCCESS and after.result["result"] != old_pid

        # A crash whose restart fails says so; the next batch tries again and works once it can.
        marker.touch()
        (crashed,) = await dispatcher.execute_commands([Command(tool_name="fx.exit_now")])
        assert "crashed" in crashed.error and "restarting it failed" in crashed.error
        [down] = await dispatcher.execute_commands([Command(tool_name="fx.pid")])
        assert down.status == ResultStatus.FAILURE and "could not start" in down.error
        marker.unlink()
        [back] = await dispatcher.execute_commands([Command(tool_name="fx.echo", parameters={"text": "back"})])
        assert back.status == ResultStatus.SUCCESS and back.result == {"result": "back"}


async def test_a_server_that_cannot_start_is_a_failure_not_an_exception(tmp_path: Path) -> None:
    servers = {"ghost": {"command": str(tmp_path / "no-such-server")}}
    async with LocalCommandDispatcher.from_servers(servers) as dispatcher:
        results = await dispatcher.execute_commands([Command(tool_name="ghost.tool"), Command(tool_name="ghost.other")])
        assert _statuses(results) == [ResultStatus.FAILURE, ResultStatus.SKIPPED]
        assert "server 'ghost' could not start" in results[0].error and "no-such-server" in results[0].error
        assert await dispatcher.list_tools() == {}
        with pytest.raises(Exception, match="ghost"):
            await dispatcher.list_tools(strict=True)


async def test_a_server_that_never_answers_hits_the_startup_timeout(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    servers = {"mute": {"command": sys.executable, "args": ["-c", script], "startup_timeout": 0.5}}
    async with LocalCommandDispatcher.from_servers(servers) as dispatcher:
        [result] = await dispatcher.execute_commands([Command(tool_name="mute.anything")])
    assert result.status == ResultStatus.FAILURE and "server 'mute' did not start within 0.5 s" in result.error
    assert not _process_alive(int(pid_file.read_text()))


# -- streamable HTTP -------------------------------------------------------------------


class _HeaderRecorder:
    """ASGI middleware that remembers the headers of each request."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.headers: list[dict[str, str]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await self.inner(scope, receive, send)


@pytest.fixture
async def http_server() -> AsyncIterator[tuple[str, _HeaderRecorder]]:
    """The fixture server over streamable HTTP on 127.0.0.1, a free port, in this event loop."""
    recorder = _HeaderRecorder(dispatch_fixture_server.app.streamable_http_app())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(recorder, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/mcp", recorder
    finally:
        server.should_exit = True
        await task
        sock.close()


async def test_streamable_http_server(http_server: tuple[str, _HeaderRecorder]) -> None:
    url, recorder = http_server
    servers = {"web": {"url": url, "headers": {"X-Saucer-Test": "yes"}, "timeout": 0.5}}
    async with LocalCommandDispatcher.from_config(servers) as dispatcher:
        tools = await dispatcher.list_tools()
        assert "web.echo" in tools
        ok, tool_error = await dispatcher.execute_commands(
            [
                Command(tool_name="web.add", parameters={"a": 20, "b": 22}),
                Command(tool_name="web.fail", parameters={"message": "nope"}),
            ]
        )
        assert ok.status == ResultStatus.SUCCESS and ok.result == {"result": 42} and ok.namespace == "web"
        assert tool_error.status == ResultStatus.FAILURE and "nope" in tool_error.error
        slow, skipped = await dispatcher.execute_commands(
            [Command(tool_name="web.slow", parameters={"seconds": 3}), Command(tool_name="web.pid")]
        )
        assert "timed out after 0.5 s" in slow.error and skipped.status == ResultStatus.SKIPPED
        [unknown] = await dispatcher.execute_commands([Command(tool_name="web.nothing")])
        assert "server 'web' has no tool 'nothing'" in unknown.error
    assert recorder.headers and all(h.get("x-saucer-test") == "yes" for h in recorder.headers)
