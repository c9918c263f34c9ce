"""Fakes shared by the engine tests: agents, observers, plans (the dispatcher is :mod:`tests.support.fakes`')."""

from __future__ import annotations

from typing import Any

from saucer.context import Context
from saucer.engine import Agent, AgentStatus


class ScriptedAgent(Agent):
    """Takes ``steps`` CONTINUE steps (writing ``count`` and optional vars), then FINISH."""

    def __init__(
        self, name: str = "scripted", steps: int = 1, cost: float | None = 0.0, writes: dict[str, Any] | None = None
    ) -> None:
        super().__init__(name)
        self.total = steps
        self.cost = cost
        self.writes = writes or {}
        self.calls = 0

    def on_round_start(self, round: Any) -> None:
        self.calls = 0

    async def act(self, context: Context) -> AgentStatus:
        self.calls += 1
        context.incr(f"{self.name}_count")
        if self.writes:
            context.update_vars(self.writes)
        if self.cost:
            self.add_cost(self.cost)
        elif self.cost is None:
            self.add_cost(None)
        return AgentStatus.FINISH if self.calls >= self.total else AgentStatus.CONTINUE


class CrashingAgent(Agent):
    """Writes something, then raises: the step's changes must not be committed."""

    async def act(self, context: Context) -> AgentStatus:
        context.update_vars({"half_written": True})
        raise RuntimeError("the agent crashed")


class RecordingObserver:
    """Keeps the names of the hooks called, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_session_start(self, session: Any) -> None:
        self.events.append(("session_start", session.session_id))

    def on_round_start(self, session: Any, round: Any) -> None:
        self.events.append(("round_start", round.id))

    def on_step(self, session: Any, record: Any) -> None:
        self.events.append(("step", (record.round, record.step, record.agent, record.status)))

    def on_round_end(self, session: Any, round: Any, result: Any) -> None:
        self.events.append(("round_end", (round.id, result.status)))

    def on_session_end(self, session: Any, result: Any) -> None:
        self.events.append(("session_end", result.status))


def command_plan(n: int, task: str = "demo", tool: str = "files.write", fail_at: int | None = None) -> dict[str, Any]:
    """A plan of ``n`` command steps (step ``fail_at`` uses the tool ``broken``)."""
    steps = []
    for i in range(n):
        name = "broken" if fail_at == i else tool
        steps.append({"subtask": f"step {i}", "commands": [{"tool_name": name, "parameters": {"i": i}}]})
    return {"task": task, "steps": steps}
