"""No regular expression from a model, a plan or a user's rule freezes the host (issue 27, item 3).

Python's ``re`` needs seconds for ``(a+)+$`` against 25 ``a`` and a ``!``,
holding the GIL, so even a search in a worker thread stalls the event loop.
Each surface is driven with that input while a ticker task measures the
longest gap between its ticks: it must stay under 100 ms, and the call must
end with the correct answer or a clear error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from saucer.config import MCPServerConfig
from saucer.dispatch import Command, LocalCommandDispatcher, ResultStatus
from saucer.tools.desktop import DesktopError
from saucer.tools.desktop.tree import Selector, Tree, find_matches
from saucer.tools.files import FilesOptions
from saucer.tools.files import build_server as files_server
from saucer.tools.linear import compile_linear
from saucer.tools.rules import CommandRule, refusal_reason
from saucer.tools.shell import ShellOptions
from saucer.tools.shell import build_server as shell_server

EVIL = "(a+)+$"
VICTIM = "a" * 25 + "!"
MAX_STALL = 0.1


async def longest_stall(work: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    """Run ``work`` beside a ticker; the longest gap between two ticks (seconds) and what ``work`` gave."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    try:
        result = await work()
    finally:
        await asyncio.sleep(0.02)
        done.set()
        await task
    return max(gaps), result


def test_python_re_would_stall_on_this_input() -> None:
    """The input is hostile for a backtracking engine (the test below would fail with ``re``)."""
    import re

    start = time.perf_counter()
    assert re.search(r"(a+)+$", "a" * 18 + "!") is None
    assert time.perf_counter() - start > 0.005  # 2^18 steps; 25 a's take seconds


@pytest.mark.anyio
async def test_files_search_with_a_hostile_regex_does_not_stall_the_loop(tmp_path: Path) -> None:
    (tmp_path / "victim.txt").write_text((VICTIM + "\n") * 50 + "aaa\n")
    async with LocalCommandDispatcher.from_servers(
        {"files": files_server(FilesOptions.create(tmp_path))}
    ) as dispatcher:
        # The server's start and its first call (schemas, validators) are outside the measurement.
        await dispatcher.execute_commands([Command(tool_name="files.search", parameters={"pattern": "x"})])
        stall, [result] = await longest_stall(
            lambda: dispatcher.execute_commands(
                [Command(tool_name="files.search", parameters={"pattern": EVIL, "regex": True})]
            )
        )
        assert stall < MAX_STALL, f"the event loop stalled {stall * 1000:.0f} ms"
        assert result.status == ResultStatus.SUCCESS, result.error
        assert [(m["path"], m["line"]) for m in result.result["matches"]] == [("victim.txt", 51)]  # the linear answer
        [refused] = await dispatcher.execute_commands(
            [Command(tool_name="files.search", parameters={"pattern": r"(a)\1", "regex": True})]
        )
        assert refused.status == ResultStatus.FAILURE
        assert "backreferences and look-around are not supported" in refused.error


@pytest.mark.anyio
async def test_a_user_regex_rule_against_a_plan_command_does_not_stall_the_loop(tmp_path: Path) -> None:
    """A ``re:`` sensitive rule of the dispatcher and a ``re:`` deny rule of the shell server."""
    shell = shell_server(ShellOptions.create(tmp_path, deny=[f"re:{EVIL}"]))
    async with LocalCommandDispatcher.from_servers(
        {"shell": shell}, sensitive_commands=[f"re:{EVIL}"], assume_yes=True
    ) as dispatcher:
        await dispatcher.execute_commands([Command(tool_name="shell.run", parameters={"command": "true"})])
        command = Command(tool_name="shell.run", parameters={"command": f"echo {VICTIM}"})
        stall, reason = await longest_stall(lambda: dispatcher.sensitive_reason(command))
        assert stall < MAX_STALL, f"the sensitivity check stalled the loop {stall * 1000:.0f} ms"
        assert reason is None  # the linear-time answer: the rule does not match
        stall, [result] = await longest_stall(lambda: dispatcher.execute_commands([command]))
        assert stall < MAX_STALL, f"the shell's deny rule stalled the loop {stall * 1000:.0f} ms"
        assert result.status == ResultStatus.SUCCESS and VICTIM in result.result["stdout"]
    start = time.perf_counter()
    assert refusal_reason(f"echo {'a' * 5000}!", deny=[CommandRule.compile(f"re:{EVIL}")]) is None
    assert time.perf_counter() - start < MAX_STALL


def test_regex_rules_that_need_backtracking_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match=r"invalid regular expression in rule 're:\(a\)\\1'.*backreferences"):
        CommandRule.compile(r"re:(a)\1")
    with pytest.raises(ValueError, match=r"re:\(\?<=x\)y.*RE2"):
        MCPServerConfig.model_validate({"command": "x", "sensitive_commands": ["re:(?<=x)y"]})
    with pytest.raises(ValueError, match="pattern too large"):
        compile_linear(r"\pL{1000}")


@pytest.mark.anyio
async def test_desktop_name_matching_with_a_hostile_regex_does_not_stall_the_loop() -> None:
    tree = Tree(
        root={
            "id": "eroot0000",
            "role": "window",
            "name": "w",
            "children": [{"id": f"e{n:09d}", "role": "label", "name": VICTIM} for n in range(20)],
        }
    )

    async def search() -> list[Any]:
        return find_matches(tree, Selector(name=f"re:{EVIL}"))

    stall, found = await longest_stall(search)
    assert stall < MAX_STALL, f"the selector stalled the loop {stall * 1000:.0f} ms"
    assert found == []
    with pytest.raises(DesktopError, match="not a valid regular expression.*look-around"):
        Selector(name="re:(?=a)a")
