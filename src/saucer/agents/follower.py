"""The follower agent: runs a plan's command steps through the dispatcher, without a model.

Each command step of a plan is one round with one step: the agent sets
``SUBTASK``, runs the step's commands through ``context.command_dispatcher``,
appends ``{"subtask", "status"}`` to ``PREVIOUS_SUBTASKS`` and finishes
(``FINISH``) when every command succeeded, else fails (``FAIL``) with the
first error as the round's result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from saucer.context import ContextNames
from saucer.dispatch.messages import ResultStatus
from saucer.engine.agent import Agent, AgentStatus
from saucer.engine.plan import PlanStep

if TYPE_CHECKING:
    from saucer.context import Context
    from saucer.engine.host import RoundView

__all__ = ["FollowerAgent"]


class FollowerAgent(Agent):
    """Replays one plan step per round."""

    def __init__(self, name: str = "follower") -> None:
        super().__init__(name)
        self.plan_step: PlanStep | None = None

    def on_round_start(self, round: RoundView) -> None:
        step = round.plan_step
        self.plan_step = step if isinstance(step, PlanStep) else None

    async def act(self, context: Context) -> AgentStatus:
        step = self.plan_step
        if step is None:
            self.round_result = "the follower agent has no command step to run in this round"
            return AgentStatus.ERROR
        context.set(ContextNames.SUBTASK, step.subtask)
        if self.step is not None:
            self.step.subtask = step.subtask
        results = await self.dispatch(context, [c.to_command() for c in step.commands])
        failed = [(c, r) for c, r in zip(step.commands, results, strict=False) if r.status is not ResultStatus.SUCCESS]
        status = "failed" if failed else "finished"
        context.append(ContextNames.PREVIOUS_SUBTASKS, {"subtask": step.subtask, "status": status})
        if failed:
            command, result = failed[0]
            detail = str(result.error or result.result or "").strip().splitlines()
            self.round_result = f"{command.tool_name} {result.status.value}: {detail[0] if detail else 'no detail'}"
            return AgentStatus.FAIL
        self.round_result = f"{len(results)} command(s) succeeded"
        return AgentStatus.FINISH
