"""Batch semantics shared by every dispatcher (saucer.dispatch.base), with scripted tools."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saucer.dispatch import BasicCommandDispatcher, BatchCommandDispatcher, Command, Result, ResultStatus, run_batch

OUTCOMES = ("ok", "fail", "raise")


def _scripted(outcomes: dict[str, str], calls: list[str]):
    """A run_one whose behaviour per command comes from ``outcomes[call_id]``."""

    async def run_one(command: Command) -> Result:
        calls.append(command.call_id)
        outcome = outcomes[command.call_id]
        if outcome == "raise":
            raise ValueError(f"broken {command.tool_name}")
        if outcome == "fail":
            return Result.failure(command, "it failed")
        return Result(status=ResultStatus.SUCCESS, result=command.parameters, call_id=command.call_id)

    return run_one


@settings(max_examples=60, deadline=None)
@given(
    plan=st.lists(
        st.tuples(st.sampled_from(OUTCOMES), st.sampled_from(["action", "data_collection"]), st.booleans()),
        max_size=12,
    ),
    parallel=st.booleans(),
)
def test_one_result_per_command_in_order_and_skip_after_first_failure(
    plan: list[tuple[str, str, bool]], parallel: bool
) -> None:
    commands = [
        Command(tool_name=f"t{i}", tool_type=kind, parameters={"i": i}, call_id=f"id-{i}" if given_id else None)
        for i, (_, kind, given_id) in enumerate(plan)
    ]
    outcomes = {c.call_id: plan[i][0] for i, c in enumerate(commands)}
    calls: list[str] = []
    results = asyncio.run(run_batch(commands, _scripted(outcomes, calls), parallel_data_collection=parallel))

    assert len(results) == len(commands)
    assert [r.call_id for r in results] == [c.call_id for c in commands]
    for i, command in enumerate(commands):
        if plan[i][2]:
            assert command.call_id == f"id-{i}"  # a given call_id is never replaced
    statuses = [r.status for r in results]
    if ResultStatus.FAILURE not in statuses:
        assert all(s == ResultStatus.SUCCESS for s in statuses)
        return
    first = statuses.index(ResultStatus.FAILURE)
    assert all(s == ResultStatus.SUCCESS for s in statuses[:first])
    # After the failing command (or its parallel run of reads), everything is skipped and never ran.
    end = first + 1
    if parallel and commands[first].tool_type == "data_collection":
        while end < len(commands) and commands[end].tool_type == "data_collection":
            end += 1
    assert all(s == ResultStatus.SKIPPED for s in statuses[end:])
    assert not set(calls) & {c.call_id for c in commands[end:]}
    for result in results:
        if result.status != ResultStatus.SUCCESS:
            assert result.error and result.result is None


def test_an_exception_becomes_a_failure_with_its_cause() -> None:
    commands = [Command(tool_name="a"), Command(tool_name="b")]
    outcomes = {commands[0].call_id: "raise", commands[1].call_id: "ok"}
    results = asyncio.run(run_batch(commands, _scripted(outcomes, [])))
    assert results[0].status == ResultStatus.FAILURE
    assert "ValueError" in results[0].error and "broken a" in results[0].error
    assert results[1].status == ResultStatus.SKIPPED
    assert "command 1" in results[1].error and "'a'" in results[1].error


def test_batch_timeout_fails_the_running_command_and_skips_the_rest() -> None:
    async def run_one(command: Command) -> Result:
        await asyncio.sleep(5 if command.tool_name == "slow" else 0)
        return Result(status=ResultStatus.SUCCESS, call_id=command.call_id)

    commands = [Command(tool_name="fast"), Command(tool_name="slow"), Command(tool_name="fast")]
    started = time.monotonic()
    results = asyncio.run(run_batch(commands, run_one, timeout=0.2))
    assert time.monotonic() - started < 2
    assert [r.status for r in results] == [ResultStatus.SUCCESS, ResultStatus.FAILURE, ResultStatus.SKIPPED]
    assert "batch timeout of 0.2 s" in results[1].error and "'slow'" in results[1].error


def test_a_result_with_the_wrong_call_id_is_rebound_to_its_command() -> None:
    async def run_one(command: Command) -> Result:
        return Result(status=ResultStatus.SUCCESS, call_id="someone-else")

    command = Command(tool_name="x", call_id="mine")
    [result] = asyncio.run(run_batch([command], run_one))
    assert result.call_id == "mine"


def test_something_other_than_a_result_is_a_failure() -> None:
    async def run_one(command: Command) -> Any:
        return {"status": "success"}

    [result] = asyncio.run(run_batch([Command(tool_name="x")], run_one))
    assert result.status == ResultStatus.FAILURE and "not a Result" in result.error


class _Probe(BatchCommandDispatcher):
    """Counts overlapping commands."""

    def __init__(self, parallel: bool) -> None:
        self.parallel_data_collection = parallel
        self.current = 0
        self.max_seen = 0
        self.overlap_with_action = False
        self.action_running = False

    async def execute_command(self, command: Command) -> Result:
        self.current += 1
        self.max_seen = max(self.max_seen, self.current)
        if command.tool_type == "action":
            self.overlap_with_action |= self.current > 1
        try:
            await asyncio.sleep(0.05)
        finally:
            self.current -= 1
        if command.tool_name == "bad":
            return Result.failure(command, "bad read")
        return Result(status=ResultStatus.SUCCESS, call_id=command.call_id)


def _mixed() -> list[Command]:
    reads = [Command(tool_name=f"read{i}", tool_type="data_collection") for i in range(4)]
    return [*reads[:2], Command(tool_name="act"), *reads[2:]]


@pytest.mark.parametrize("parallel, expected_max", [(False, 1), (True, 2)])
def test_parallel_data_collection_runs_consecutive_reads_together(parallel: bool, expected_max: int) -> None:
    probe = _Probe(parallel)
    assert isinstance(probe, BasicCommandDispatcher)
    results = asyncio.run(probe.execute_commands(_mixed()))
    assert [r.status for r in results] == [ResultStatus.SUCCESS] * 5
    assert probe.max_seen == expected_max
    assert not probe.overlap_with_action


def test_a_failed_read_in_a_parallel_run_skips_what_follows_the_run() -> None:
    commands = [
        Command(tool_name="bad", tool_type="data_collection"),
        Command(tool_name="read", tool_type="data_collection"),
        Command(tool_name="act"),
        Command(tool_name="read", tool_type="data_collection"),
    ]
    results = asyncio.run(_Probe(True).execute_commands(commands))
    assert [r.status for r in results] == [
        ResultStatus.FAILURE,
        ResultStatus.SUCCESS,
        ResultStatus.SKIPPED,
        ResultStatus.SKIPPED,
    ]


def test_an_invalid_command_mapping_still_gets_its_own_result() -> None:
    batch: list[Any] = [{"tool_name": "ok"}, {"tool_nam": "typo", "call_id": "c2"}, {"tool_name": "later"}]
    results = asyncio.run(_Probe(False).execute_commands(batch))
    assert len(results) == 3
    assert results[0].status == ResultStatus.SUCCESS
    assert results[1].status == ResultStatus.FAILURE and results[1].call_id == "c2"
    assert "position 1" in results[1].error and "tool_nam" in results[1].error
    assert results[2].status == ResultStatus.SKIPPED


def test_an_empty_batch_gives_no_results() -> None:
    assert asyncio.run(_Probe(False).execute_commands([])) == []
