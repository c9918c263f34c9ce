"""Dispatchers made inside share_tool_servers() share one connection per server: started once, closed by the scope."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from saucer.dispatch import Command, LocalCommandDispatcher, ResultStatus
from saucer.dispatch.shared import current_shared_servers, share_tool_servers

pytestmark = pytest.mark.anyio


async def _pid(dispatcher: LocalCommandDispatcher) -> int:
    [result] = await dispatcher.execute_commands([Command(tool_name="fixture.pid")])
    assert result.status == ResultStatus.SUCCESS, result.error
    return int(result.result["result"])


async def test_dispatchers_in_a_scope_share_one_server_process(fixture_stdio: dict[str, Any]) -> None:
    servers = {"fixture": fixture_stdio}
    async with share_tool_servers() as shared:
        async with share_tool_servers() as inner:
            assert inner is shared  # a scope inside a scope is the same scope
        first = LocalCommandDispatcher.from_config(servers, assume_yes=True)
        second = LocalCommandDispatcher.from_config(servers)  # its own approval settings, the same server
        pids = await asyncio.gather(_pid(first), _pid(second))
        assert pids[0] == pids[1] and len(shared) == 1
        await first.aclose()
        # Closing one dispatcher leaves the server running for the others.
        assert await _pid(second) == pids[0]
        closed = await first.execute_commands([Command(tool_name="fixture.pid")])
        assert closed[0].status == ResultStatus.FAILURE and "closed" in closed[0].error
        await second.aclose()
    # The scope stops the server when it ends.
    for _ in range(200):
        if not Path(f"/proc/{pids[0]}").exists():
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail(f"the shared server (pid {pids[0]}) outlived its scope")
    assert current_shared_servers() is None


async def test_a_dispatcher_on_another_loop_gets_its_own_connections(fixture_stdio: dict[str, Any]) -> None:
    async with share_tool_servers():
        assert current_shared_servers() is not None
        # A thread with a loop of its own (asyncio.to_thread copies this context) must not borrow.
        seen = await asyncio.to_thread(lambda: asyncio.run(_scope_in_a_new_loop()))
        assert seen is None


async def _scope_in_a_new_loop() -> Any:
    return current_shared_servers()
