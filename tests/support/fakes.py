"""The suite's one fake dispatcher, in-process and in device processes (``tests.support.fakes:make_dispatcher``).

Every command it is given is kept in :attr:`FakeDispatcher.ran`, in order. What it answers:

- a tool named in ``fail``: a failure, ``"<tool> broke"``;
- the scripted tools of the service tests, by ``tool_name``:

  - ``echo``: succeeds with its parameters as the result;
  - ``sleep``: sleeps ``seconds`` then succeeds;
  - ``append``: appends ``line`` (plus a newline) to the file ``path``, then sleeps ``seconds`` (default 0):
    the proof of how many times a step ran;
  - ``fail``: a failure result with ``error``;
  - ``raise``: the whole ``execute_commands`` call raises RuntimeError;
  - ``short``: the dispatcher returns one result fewer than it was given;
  - ``big``: succeeds with a string of ``size`` characters;
  - ``whoami``: succeeds with the device process id;

- any other tool: success, with ``{"tool": <tool_name>, **parameters}`` as the result.

``list_tools()`` answers ``tools`` (default :data:`DEFAULT_TOOLS`; the LLM tests pass their tool table,
:data:`tests.support.llm.TOOL_INFO`). ``delay`` makes each command take that long.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

from saucer.dispatch.messages import Command, Result, ResultStatus

__all__ = ["DEFAULT_TOOLS", "FakeDispatcher", "make_dispatcher"]

#: What ``list_tools`` answers unless told otherwise: the engine's TOOL_INFO in the engine tests.
DEFAULT_TOOLS: list[dict[str, Any]] = [
    {"name": "files.write", "description": "write a file"},
    {"name": "files.read", "description": "read a file"},
]


class FakeDispatcher:
    """Answers every command as the module says; records every command it ran in :attr:`ran`."""

    def __init__(self, fail: Sequence[str] = (), delay: float = 0.0, tools: Any = None) -> None:
        self.fail = set(fail)
        self.delay = delay
        self.ran: list[Command] = []
        self.tools: Any = DEFAULT_TOOLS if tools is None else tools

    def list_tools(self) -> Any:
        """The tool table given (a list of {name, description} or a TOOL_INFO mapping)."""
        return self.tools

    async def execute_commands(self, commands: Sequence[Command], timeout: float | None = None) -> list[Result]:
        """Run each command; raise for ``raise``; drop the last result for ``short``."""
        results: list[Result] = []
        short = False
        for command in commands:
            if self.delay:
                await asyncio.sleep(self.delay)
            self.ran.append(command)
            name, params = command.tool_name, command.parameters
            if name in self.fail:
                results.append(Result(status=ResultStatus.FAILURE, error=f"{name} broke", call_id=command.call_id))
            elif name == "raise":
                raise RuntimeError(str(params.get("message", "fake dispatcher exploded")))
            else:
                short = short or name == "short"
                results.append(await self._scripted(command))
        return results[:-1] if short else results

    async def _scripted(self, command: Command) -> Result:
        name, params = command.tool_name, command.parameters

        def ok(result: Any) -> Result:
            return Result(status=ResultStatus.SUCCESS, result=result, call_id=command.call_id)

        if name == "echo":
            return ok(params)
        if name == "sleep":
            await asyncio.sleep(float(params.get("seconds", 0)))
            return ok("slept")
        if name == "append":
            with open(params["path"], "a", encoding="utf-8") as handle:
                handle.write(f"{params['line']}\n")
                handle.flush()
                os.fsync(handle.fileno())
            await asyncio.sleep(float(params.get("seconds", 0)))
            return ok(params["line"])
        if name == "fail":
            return Result.failure(command, str(params.get("error", "fake failure")))
        if name == "short":
            return ok("short")
        if name == "whoami":
            return ok({"pid": os.getpid()})
        if name == "big":
            return ok("x" * int(params["size"]))
        return ok({"tool": name, **params})


def make_dispatcher() -> FakeDispatcher:
    """Factory used by device processes (``--dispatcher tests.support.fakes:make_dispatcher``)."""
    return FakeDispatcher()
