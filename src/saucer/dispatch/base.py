"""The dispatcher protocol and the batch semantics every dispatcher shares.

A batch of commands always comes back as exactly one :class:`Result` per
:class:`Command`, in order, each carrying its command's ``call_id``:

* a command that raises, or that the batch ``timeout`` cuts off, becomes a
  failure result whose ``error`` says why (never an exception to the caller);
* after the first failure, the commands not yet started are ``skipped``
  (UFO's semantics), with the reason naming the command that failed;
* with ``parallel_data_collection``, each run of consecutive
  ``data_collection`` commands (reads that do not depend on each other) runs
  concurrently; ``action`` commands always run one at a time, in order. A
  failure inside a parallel run skips what comes after the run.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import ValidationError

from saucer.dispatch.messages import Command, Result, ResultStatus

__all__ = ["BasicCommandDispatcher", "BatchCommandDispatcher", "run_batch", "coerce_commands", "RunOne"]

RunOne = Callable[[Command], Awaitable[Result]]


@runtime_checkable
class BasicCommandDispatcher(Protocol):
    """Anything that runs a batch of commands and answers one Result per Command, in order."""

    async def execute_commands(self, commands: Sequence[Command], timeout: float | None = None) -> list[Result]:
        """Run ``commands``; ``timeout`` bounds the whole batch in seconds (None: no bound beyond each command's)."""
        ...


def _tool_label(command: Command) -> str:
    return f"{command.tool_name!r} (call_id {command.call_id})"


def coerce_commands(commands: Sequence[Command | Mapping[str, Any]]) -> tuple[list[Command], dict[int, Result]]:
    """Commands from ``Command`` objects or plain mappings.

    A mapping that is not a valid command cannot run; it gets a failure
    result (keyed by its position) naming what was wrong, so the batch still
    answers one result per entry.
    """
    out: list[Command] = []
    invalid: dict[int, Result] = {}
    for index, item in enumerate(commands):
        if isinstance(item, Command):
            out.append(item)
            continue
        try:
            out.append(Command.model_validate(dict(item)))
        except (ValidationError, TypeError, ValueError) as exc:
            call_id = item.get("call_id") if isinstance(item, Mapping) else None
            placeholder = Command(tool_name="<invalid>", call_id=call_id if isinstance(call_id, str) else None)
            out.append(placeholder)
            invalid[index] = Result.failure(placeholder, f"invalid command at position {index}: {exc}")
    return out, invalid


def _groups(commands: Sequence[Command], parallel_data_collection: bool) -> list[list[int]]:
    """Indexes to run together: singletons, or runs of consecutive data_collection commands."""
    groups: list[list[int]] = []
    for index, command in enumerate(commands):
        if (
            parallel_data_collection
            and command.tool_type == "data_collection"
            and groups
            and commands[groups[-1][-1]].tool_type == "data_collection"
        ):
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


def _bind(result: object, command: Command) -> Result:
    """``result`` as a Result for ``command`` (right call_id), or a failure saying what came back instead."""
    if not isinstance(result, Result):
        return Result.failure(command, f"tool {command.tool_name!r} returned {type(result).__name__}, not a Result")
    if result.call_id != command.call_id:
        result = result.model_copy(update={"call_id": command.call_id})
    return result


async def _run_guarded(command: Command, run_one: RunOne, deadline: float | None, timeout: float | None) -> Result:
    """Run one command; an exception or the batch deadline becomes a failure result."""
    try:
        async with asyncio.timeout_at(deadline) as scope:
            return _bind(await run_one(command), command)
    except TimeoutError as exc:
        if scope.expired():
            return Result.failure(
                command, f"the batch timeout of {timeout:g} s expired while running tool {command.tool_name!r}"
            )
        return Result.failure(command, f"tool {command.tool_name!r} timed out: {exc or 'TimeoutError'}")
    except Exception as exc:  # noqa: BLE001 - a tool's exception is that command's failure, not the caller's
        return Result.failure(command, f"tool {command.tool_name!r} raised {type(exc).__name__}: {exc}")


async def run_batch(
    commands: Sequence[Command],
    run_one: RunOne,
    *,
    timeout: float | None = None,
    parallel_data_collection: bool = False,
    preset: Mapping[int, Result] | None = None,
) -> list[Result]:
    """Run ``commands`` with ``run_one`` under the batch semantics described in this module.

    ``preset`` holds results decided before running (e.g. invalid commands);
    they count as failures at their position.
    """
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds or None, got {timeout}")
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    results: list[Result | None] = [None] * len(commands)
    failed: int | None = None  # position of the first failure
    for group in _groups(commands, parallel_data_collection):
        if failed is not None:
            reason = f"not run because command {failed + 1} of the batch, {_tool_label(commands[failed])}, failed"
            for i in group:
                results[i] = Result.skipped(commands[i], reason)
            continue
        ready = {i: preset[i] for i in group if preset and i in preset}
        todo = [i for i in group if i not in ready]
        if len(todo) == 1:
            ran = [await _run_guarded(commands[todo[0]], run_one, deadline, timeout)]
        else:
            ran = list(await asyncio.gather(*(_run_guarded(commands[i], run_one, deadline, timeout) for i in todo)))
        ready.update(zip(todo, ran, strict=False))
        for i in group:
            results[i] = ready[i]
            if failed is None and ready[i].status == ResultStatus.FAILURE:
                failed = i
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


class BatchCommandDispatcher(ABC):
    """A dispatcher defined by how it runs one command; :func:`run_batch` supplies the batch semantics."""

    parallel_data_collection: bool = False

    @abstractmethod
    async def execute_command(self, command: Command) -> Result:
        """Run one command and describe its outcome (failures as results, not exceptions)."""

    async def execute_commands(
        self, commands: Sequence[Command | Mapping[str, Any]], timeout: float | None = None
    ) -> list[Result]:
        """Run ``commands`` in order; ``timeout`` bounds the whole batch (see the module docstring)."""
        batch, invalid = coerce_commands(commands)
        return await run_batch(
            batch,
            self.execute_command,
            timeout=timeout,
            parallel_data_collection=self.parallel_data_collection,
            preset=invalid,
        )
