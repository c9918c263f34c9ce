"""Two-tier agents: a host agent splits the request into subtasks; an app agent carries out each.

Routing uses the engine's states (no graph needed):

- the host calls the model with one tool, ``assign_subtask(subtask, message)``;
  a call sets ``SUBTASK`` and ``HOST_MESSAGE``, hands off to the app agent
  (``agent.handoff``) and stays ``CONTINUE`` → the app agent's ``CONTINUE``;
- the app agent runs tools step by step; its final answer appends
  ``{subtask, status, result}`` to ``PREVIOUS_SUBTASKS`` and ends with status
  ``SUBTASK_FINISH`` handing back to the host, whose ``SUBTASK_FINISH`` state
  is a ``CONTINUE`` that ends the subtask (the engine counts it in
  ``ROUND_SUBTASK_AMOUNT``);
- the host sees the subtask's result as the answer to its ``assign_subtask``
  call and either assigns the next subtask or answers the user → ``FINISH``.

Repeated failures of the app agent are reported to the host as a failed
subtask (it may re-plan); a model call that fails for good ends the round in
``ERROR``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from saucer.agents.llm.agent import (
    FINISH_TOOL,
    SUBTASK_FINISH,
    LLMAgent,
    TokenBudgetReached,
    no_action_reason,
    nothing_done_reason,
    previous_subtask_entry,
)
from saucer.agents.llm.ask import ASK_USER_TOOL, ask_the_user
from saucer.agents.llm.client import ModelCallError, ModelClient, ModelSettings
from saucer.agents.llm.prompts import app_agent_system_prompt, host_agent_system_prompt, request_message
from saucer.agents.llm.tool_agent import ToolUsingAgent
from saucer.agents.llm.tools import ToolSet, ToolSpec
from saucer.context.names import ContextNames
from saucer.engine.agent import AgentStatus, FinishState

if TYPE_CHECKING:
    from saucer.context import Context

__all__ = ["HostAgent", "AppAgent", "ASSIGN_TOOL", "assign_toolset"]

ASSIGN_TOOL = "assign_subtask"


def assign_toolset() -> ToolSet:
    """The host's only tool."""
    return ToolSet(
        [
            ToolSpec(
                name=f"host.{ASSIGN_TOOL}",
                function_name=ASSIGN_TOOL,
                description="Hand the next subtask to the app agent; its result comes back as this call's result.",
                parameters={
                    "type": "object",
                    "properties": {
                        "subtask": {"type": "string", "description": "what the app agent must do, self-contained"},
                        "message": {"type": "string", "description": "optional hints for the app agent"},
                    },
                    "required": ["subtask"],
                },
            )
        ]
    )


class HostAgent(LLMAgent):
    """Plans: one subtask at a time for the app agent, then the final answer."""

    def __init__(
        self,
        name: str = "host",
        *,
        client: ModelClient,
        settings: ModelSettings | None = None,
        app_name: str = "app",
    ) -> None:
        super().__init__(name, client=client, settings=settings)
        self.app_name = app_name
        self._assign = self.offered(assign_toolset())

    def initial_messages(self, context: Context, tools: ToolSet) -> list[dict[str, Any]]:
        prompt = host_agent_system_prompt(tools, self.system_extra(context), finish_tool=self.finish_tool)
        return [
            {"role": "system", "content": prompt},
            {
                "role": "user",
                "content": request_message(
                    context.get(ContextNames.REQUEST), context.get(ContextNames.PREVIOUS_SUBTASKS)
                ),
            },
        ]

    async def act(self, context: Context) -> str:
        app_tools = self.tools(context)
        scope = {"round": context.get(ContextNames.CURRENT_ROUND_ID)}
        messages, meta = self._load(context, scope, lambda: self.initial_messages(context, app_tools))
        pending = meta.pop("pending", None)
        if pending:
            status, report = self._subtask_report(context, pending)
            meta["acted"] = bool(meta.get("acted")) or status == AgentStatus.FINISH.value
            self._append(context, messages, {"role": "tool", "tool_call_id": pending["call_id"], "content": report})
        try:
            reply = await self.call_model(context, messages, self._assign)
        except TokenBudgetReached as exc:
            self._save_meta(context, meta)
            return self._stop(str(exc))
        except ModelCallError as exc:
            self._save_meta(context, meta)
            return self._error(str(exc))
        self._append(context, messages, reply.assistant_message())
        answer = self.answer_of(reply)
        if answer is not None:
            self.note(answer=answer[:500])
            verdict = self.judge_answer(context, messages, meta, reply)
            self._save_meta(context, meta)
            if verdict == "final":
                self.round_result = answer
                return AgentStatus.FINISH.value
            if verdict == "failed":
                self.round_result = f"no subtask was done; the host agent said: {answer}"
                return AgentStatus.FAIL.value
            if verdict == "no_action":
                self.round_result = no_action_reason(self.settings.no_action_retries, answer)
                return AgentStatus.NO_ACTION.value
            return AgentStatus.CONTINUE.value
        chosen = None
        answers: list[dict[str, Any]] = []
        asked = False
        for call in reply.tool_calls:
            problem = None
            if call.function_name == ASK_USER_TOOL and self.settings.ask_user:
                asked = True
                answers.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.id,
                        "content": await ask_the_user(self, self._interactor(), call),
                    }
                )
                continue
            if call.function_name == FINISH_TOOL and self.finish_tool:
                problem = f"not finished: call {FINISH_TOOL} alone, after the subtasks are done"
            elif call.function_name != ASSIGN_TOOL:
                problem = f"error: there is no tool {call.function_name!r}; use {ASSIGN_TOOL}(subtask, message)"
            elif call.error:
                problem = f"error: invalid arguments: {call.error}"
            elif not isinstance(call.arguments.get("subtask"), str) or not call.arguments["subtask"].strip():
                problem = "error: 'subtask' must be a non-empty string"
            elif chosen is not None:
                problem = "ignored: assign one subtask at a time; assign this one again after the current one's result"
            if problem is None:
                chosen = call
            else:
                answers.append({"role": "tool", "tool_call_id": call.id, "content": problem})
        self._append(context, messages, *answers)
        if chosen is None and asked:  # a question is no failed assignment: the model reads the answer next step
            self._save_meta(context, meta)
            return AgentStatus.CONTINUE.value
        if chosen is None:
            meta["failures"] = int(meta.get("failures", 0)) + 1
            self._save_meta(context, meta)
            limit = self.settings.max_consecutive_failures
            if meta["failures"] >= limit:
                return self._error(
                    f"the host agent made {meta['failures']} invalid assignments in a row (limit {limit})"
                )
            return AgentStatus.CONTINUE.value
        subtask = chosen.arguments["subtask"].strip()
        message = chosen.arguments.get("message")
        context.set(ContextNames.SUBTASK, subtask)
        context.set(ContextNames.HOST_MESSAGE, [message] if isinstance(message, str) and message.strip() else [])
        meta["failures"] = 0
        meta["tried"] = True
        meta["pending"] = {"call_id": chosen.id, "subtask": subtask}
        self._save_meta(context, meta)
        self.note(assigned=subtask)
        self.handoff = self.app_name
        return AgentStatus.CONTINUE.value

    @staticmethod
    def _subtask_report(context: Context, pending: dict[str, Any]) -> tuple[str | None, str]:
        """The app agent's status for the pending subtask, and the text the host reads."""
        previous = context.get(ContextNames.PREVIOUS_SUBTASKS) or []
        last = previous[-1] if previous else None
        if isinstance(last, dict) and last.get("subtask") == pending.get("subtask"):
            return last.get("status"), f"{last.get('status', '')}: {last.get('result', '')}"
        return None, "the app agent reported no result for this subtask"


@HostAgent.register_state
class HostFinishState(FinishState):
    """The host's final answer ends the round; it is not a subtask (the app agent's were)."""

    def is_subtask_end(self) -> bool:
        return False


class AppAgent(ToolUsingAgent):
    """Carries out the host's current subtask with the tools, then reports back."""

    def __init__(
        self,
        name: str = "app",
        *,
        client: ModelClient,
        settings: ModelSettings | None = None,
        host_name: str = "host",
    ) -> None:
        super().__init__(name, client=client, settings=settings)
        self.host_name = host_name

    def conversation_scope(self, context: Context) -> Any:
        return {
            "round": context.get(ContextNames.CURRENT_ROUND_ID),
            "subtask_index": context.current_round_subtask_amount,
            "subtask": context.get(ContextNames.SUBTASK),
        }

    def initial_messages(self, context: Context, tools: ToolSet) -> list[dict[str, Any]]:
        prompt = app_agent_system_prompt(tools, self.system_extra(context), finish_tool=self.finish_tool)
        return [
            {"role": "system", "content": prompt},
            {
                "role": "user",
                "content": request_message(
                    context.get(ContextNames.REQUEST),
                    context.get(ContextNames.PREVIOUS_SUBTASKS),
                    subtask=context.get(ContextNames.SUBTASK),
                    host_message=context.get(ContextNames.HOST_MESSAGE),
                ),
            },
        ]

    async def act(self, context: Context) -> str:
        if self.step is not None:
            self.step.subtask = context.get(ContextNames.SUBTASK)
        return await super().act(context)

    def _report(self, context: Context, status: str, result: str) -> str | None:
        """Append the subtask's outcome; hand back to the host (None when there is no host)."""
        context.append(
            ContextNames.PREVIOUS_SUBTASKS,
            previous_subtask_entry(context, context.get(ContextNames.SUBTASK), status, result, self.name),
        )
        if self.host_name in self.peers:
            self.handoff = self.host_name
            return SUBTASK_FINISH
        return None

    async def on_final_answer(self, context: Context, content: str) -> str:
        back = self._report(context, AgentStatus.FINISH.value, content)
        if back is not None:
            return back
        self.round_result = content
        return AgentStatus.FINISH.value

    async def on_give_up(self, context: Context, reason: str) -> str:
        back = self._report(context, AgentStatus.FAIL.value, reason)
        if back is not None:
            return back
        return self._error(reason)

    async def on_nothing_done(self, context: Context, content: str) -> str:
        if self.host_name not in self.peers:
            return await super().on_nothing_done(context, content)
        return (
            self._report(context, AgentStatus.FAIL.value, nothing_done_reason("app agent", content))
            or AgentStatus.FAIL.value
        )

    async def on_no_action(self, context: Context, content: str) -> str:
        if self.host_name not in self.peers:
            return await super().on_no_action(context, content)
        reason = no_action_reason(self.settings.no_action_retries, content)
        return self._report(context, AgentStatus.NO_ACTION.value, reason) or AgentStatus.NO_ACTION.value
