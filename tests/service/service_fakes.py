"""A small fake device dispatcher for service-mode tests (in-process and in device processes).

Tools (``tool_name``):

- ``echo``: succeeds with its parameters as the result;
- ``sleep``: sleeps ``seconds`` then succeeds;
- ``append``: appends ``line`` (plus a newline) to the file ``path``, then
  sleeps ``seconds`` (default 0): the proof of how many times a step ran;
- ``fail``: a failure result with ``error``;
- ``raise``: the whole ``execute_commands`` call raises RuntimeError;
- ``short``: the dispatcher returns one result fewer than it was given;
- ``big``: succeeds with a string of ``size`` characters;
- ``whoami``: succeeds with the device process id.
"""

from __future__ import annotations

import asyncio
import os

from saucer.dispatch.messages import Command, Result, ResultStatus


class FakeDispatcher:
    """Runs the fake tools above, one command after the other."""

    def __init__(self) -> None:
        self.calls: list[Command] = []

    async def execute_commands(self, commands: list[Command], timeout: float) -> list[Result]:
        """Run each command; raise for ``raise``; drop the last result for ``short``."""
        results: list[Result] = []
        short = False
        for command in commands:
            self.calls.append(command)
            params = command.parameters
            name = command.tool_name
            if name == "echo":
                results.append(Result(status=ResultStatus.SUCCESS, result=params, call_id=command.call_id))
            elif name == "sleep":
                await asyncio.sleep(float(params.get("seconds", 0)))
                results.append(Result(status=ResultStatus.SUCCESS, result="slept", call_id=command.call_id))
            elif name == "append":
                with open(params["path"], "a", encoding="utf-8") as handle:
                    handle.write(f"{params['line']}\n")
                    handle.flush()
                    os.fsync(handle.fileno())
                await asyncio.sleep(float(params.get("seconds", 0)))
                results.append(Result(status=ResultStatus.SUCCESS, result=params["line"], call_id=command.call_id))
            elif name == "fail":
                results.append(Result.failure(command, str(params.get("error", "fake failure"))))
            elif name == "raise":
                raise RuntimeError(str(params.get("message", "fake dispatcher exploded")))
            elif name == "short":
                short = True
                results.append(Result(status=ResultStatus.SUCCESS, result="short", call_id=command.call_id))
            elif name == "whoami":
                results.append(
                    Result(status=ResultStatus.SUCCESS, result={"pid": os.getpid()}, call_id=command.call_id)
                )
            elif name == "big":
                results.append(
                    Result(status=ResultStatus.SUCCESS, result="x" * int(params["size"]), call_id=command.call_id)
                )
            else:
                results.append(Result.failure(command, f"unknown fake tool {name!r}"))
        return results[:-1] if short else results


def make_dispatcher() -> FakeDispatcher:
    """Factory used by device processes (``--dispatcher service_fakes:make_dispatcher``)."""
    return FakeDispatcher()
