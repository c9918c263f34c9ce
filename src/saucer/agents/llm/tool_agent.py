"""The single-tier LLM agent (UFO's LinuxAgent role): a tool-using loop, one model call per step.

One engine step of a tool-using agent is one model call:

1. build (or continue) the conversation: system prompt naming the tools,
   then the request and the previous subtasks;
2. call the model with the tools of ``TOOL_INFO`` (short descriptions,
   ``tool_choice``, ``max_tokens``), the conversation trimmed to fit
   ``context_window`` (:mod:`saucer.agents.llm.window`); a reply cut off at
   ``max_tokens`` is asked for once more, shorter, and a second cut-off ends
   the round in ``ERROR`` -- a cut-off reply is never taken as an answer;
3. each tool call becomes a :class:`~saucer.dispatch.messages.Command`
   run through ``context.command_dispatcher`` (sensitive tools ask the
   interactor first; a refused call is not run and the model is told
   ``refused by the user``), and each result goes back to the model as a
   ``tool`` message carrying its ``tool_call_id`` → ``CONTINUE``;
4. a reply without tool calls (or a call of ``finish``, offered when
   ``tool_choice = "required"``) is an answer, judged by what was done:
   after a successful tool call it is the final answer → ``FINISH``; after
   tool calls that all failed or were refused → ``FAIL``; before any tool
   call the model is asked again (``no_action_retries`` times), then →
   ``NO_ACTION`` (the round ends ``no_action``). Prose never passes for work;
5. ``max_consecutive_failures`` steps in a row whose tool calls all failed,
   or a model call that fails for good, → ``ERROR``; the session's
   ``token_budget`` used up → ``STOP`` (the session ends ``stopped``). The
   session's ``max_step`` bounds the loop in any case.

The conversation lives in the Context (context variables ``_llm.<agent>.*``,
hidden from prompt templating by their leading ``_``), appended in each
step's own commit, so a resumed session continues the same conversation.
Model cost goes to the step (:meth:`Agent.add_cost`); the engine adds it to
``SESSION_COST`` and the round's ledger in the step's commit (unknown cost
stays unknown).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from saucer.agents.llm.agent import (
    FINISH_TOOL,
    MAX_TOOL_RESULT_CHARS,
    REFUSED,
    LLMAgent,
    TokenBudgetReached,
    no_action_reason,
    nothing_done_reason,
    previous_subtask_entry,
)
from saucer.agents.llm.ask import ASK_USER_TOOL, ask_the_user
from saucer.agents.llm.client import (
    ModelCallError,
    ModelClient,
    ModelSettings,
    ToolCall,
)
from saucer.agents.llm.prompts import (
    as_text,
    linux_agent_system_prompt,
    request_message,
)
from saucer.agents.llm.tools import ToolSet, ToolSpec
from saucer.context.names import ContextNames
from saucer.dispatch.messages import Command, Result, ResultStatus
from saucer.engine.agent import AgentStatus
from saucer.engine.interactor import ask

if TYPE_CHECKING:
    from saucer.context import Context

__all__ = ["LinuxAgent", "ToolUsingAgent", "is_refusal"]


def _clip(text: str, limit: int = MAX_TOOL_RESULT_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters cut]"


def is_refusal(result: Result) -> bool:
    """A sensitive command the dispatcher did not run because approval was refused."""
    return result.status != ResultStatus.SUCCESS and (result.error or "").startswith("refused")


class ToolUsingAgent(LLMAgent):
    """An agent that calls tools until it gives a final answer (one model call per step)."""

    def conversation_scope(self, context: Context) -> Any:
        """What a conversation belongs to; a new scope starts a new conversation."""
        return {"round": context.get(ContextNames.CURRENT_ROUND_ID)}

    def initial_messages(self, context: Context, tools: ToolSet) -> list[dict[str, Any]]:
        """The system prompt and the first user message."""
        prompt = linux_agent_system_prompt(tools, self.system_extra(context), finish_tool=self.finish_tool)
        return [
            {"role": "system", "content": prompt},
            {
                "role": "user",
                "content": request_message(
                    context.get(ContextNames.REQUEST), context.get(ContextNames.PREVIOUS_SUBTASKS)
                ),
            },
        ]

    def _end_request(self, context: Context, status: str, result: str) -> str:
        """End the round's request in ``status``: ``result`` is the round's result and a previous subtask."""
        self.round_result = result
        context.append(
            ContextNames.PREVIOUS_SUBTASKS,
            previous_subtask_entry(context, context.get(ContextNames.REQUEST), status, result, self.name),
        )
        return status

    async def before_model_call(self, context: Context, messages: list[dict[str, Any]]) -> None:
        """Called in each step before the model is asked (an operator appends what it sees); default: nothing."""

    async def on_final_answer(self, context: Context, content: str) -> str:
        """The model answered after a tool call succeeded: record the result and finish."""
        return self._end_request(context, AgentStatus.FINISH.value, content)

    async def on_give_up(self, context: Context, reason: str) -> str:
        """Too many failed steps in a row."""
        return self._error(reason)

    async def on_nothing_done(self, context: Context, content: str) -> str:
        """The model answered after tool calls that all failed or were refused: the work failed."""
        return self._end_request(context, AgentStatus.FAIL.value, nothing_done_reason("model", content))

    async def on_no_action(self, context: Context, content: str) -> str:
        """The model kept answering without calling a tool: the round ends ``no_action``."""
        reason = no_action_reason(self.settings.no_action_retries, content)
        return self._end_request(context, AgentStatus.NO_ACTION.value, reason)

    async def act(self, context: Context) -> str:
        tools = self.offered(self.tools(context))
        messages, meta = self._load(
            context, self.conversation_scope(context), lambda: self.initial_messages(context, tools)
        )
        try:
            await self.before_model_call(context, messages)
            reply = await self.call_model(context, messages, tools)
        except TokenBudgetReached as exc:
            return self._stop(str(exc))
        except ModelCallError as exc:
            return self._error(str(exc))
        self._append(context, messages, reply.assistant_message())
        answer = self.answer_of(reply)
        if answer is not None:
            self.note(answer=answer[:500])
            verdict = self.judge_answer(context, messages, meta, reply)
            self._save_meta(context, meta)
            if verdict == "final":
                return await self.on_final_answer(context, answer)
            if verdict == "failed":
                return await self.on_nothing_done(context, answer)
            if verdict == "no_action":
                return await self.on_no_action(context, answer)
            return AgentStatus.CONTINUE.value
        tool_messages, outcome = await self.run_tool_calls(context, reply.tool_calls, tools)
        self._append(context, messages, *tool_messages)
        meta["tried"] = True
        if outcome == "ok":
            meta["acted"] = True
        if outcome == "failed":
            meta["failures"] = int(meta.get("failures", 0)) + 1
            meta["last_error"] = tool_messages[-1]["content"][:500] if tool_messages else ""
        elif outcome == "ok":
            meta["failures"] = 0
            meta.pop("last_error", None)
        self._save_meta(context, meta)
        limit = self.settings.max_consecutive_failures
        if meta["failures"] >= limit:
            return await self.on_give_up(
                context,
                f"{meta['failures']} consecutive steps failed (limit {limit}); last error: {meta.get('last_error', '')}",
            )
        return AgentStatus.CONTINUE.value

    # ---------------------------------------------------------------- tools

    async def _confirm(self, spec: ToolSpec, call: ToolCall) -> bool:
        args = as_text(call.arguments)
        approved = await ask(self._interactor(), "sensitive_step_asker", f"run {spec.name}", args[:2000])
        return bool(approved)

    async def run_tool_calls(
        self, context: Context, calls: list[ToolCall], tools: ToolSet
    ) -> tuple[list[dict[str, Any]], str]:
        """Run the calls; one ``tool`` message per call, in order, and ``ok``/``failed``/``neutral``.

        ``failed``: every call failed; ``ok``: at least one succeeded;
        ``neutral``: nothing failed or succeeded (every call was refused).

        Who asks about a sensitive call: a dispatcher that gates sensitive
        commands itself (it has ``sensitive_reason``, like
        :class:`~saucer.dispatch.local.LocalCommandDispatcher` with its
        ``approver``) asks, and its refusal comes back as a failure whose error
        starts with ``refused``; otherwise this agent asks the interactor
        before dispatching a tool flagged ``sensitive``. Either way the user
        is asked once, and the model reads ``refused by the user``.
        """
        dispatcher = getattr(context, "command_dispatcher", None)
        dispatcher_gates = callable(getattr(dispatcher, "sensitive_reason", None))
        contents: list[str | None] = [None] * len(calls)
        to_run: list[tuple[int, Command]] = []
        failures = successes = 0
        refused_here: list[tuple[Command, Result]] = []
        refused_names: list[str] = []
        for i, call in enumerate(calls):
            spec = tools.resolve(call.function_name)
            if call.function_name == FINISH_TOOL and self.finish_tool:
                contents[i] = f"not finished: call {FINISH_TOOL} alone, after the other calls' results"
                continue
            if call.function_name == ASK_USER_TOOL and self.settings.ask_user and self.offers_ask_user:
                contents[i] = await ask_the_user(self, self._interactor(), call)
                continue
            if spec is None:
                available = ", ".join(s.function_name for s in tools.specs) or "none"
                contents[i] = f"error: there is no tool {call.function_name!r}; available tools: {available}"
                failures += 1
                continue
            if call.error:
                contents[i] = f"error: invalid arguments for {spec.function_name}: {call.error}; nothing was run"
                failures += 1
                continue
            command = Command(tool_name=spec.name, parameters=call.arguments, tool_type=spec.tool_type)  # type: ignore[arg-type]
            if spec.sensitive and not dispatcher_gates and not await self._confirm(spec, call):
                contents[i] = f"{REFUSED}: {spec.name} was not run"
                refused_here.append((command, Result.skipped(command, REFUSED)))
                refused_names.append(spec.name)
                continue
            to_run.append((i, command))
        if refused_here and self.step is not None:
            self.step.commands.extend(c.model_dump(mode="json") for c, _ in refused_here)
            self.step.results.extend(r.model_dump(mode="json", exclude_none=True) for _, r in refused_here)
        if to_run:
            results = await self.dispatch(context, [c for _, c in to_run])
            for (i, command), result in zip(to_run, results, strict=False):
                if result.status == ResultStatus.SUCCESS:
                    successes += 1
                    contents[i] = self.format_result(result)
                elif is_refusal(result):
                    refused_names.append(command.tool_name)
                    contents[i] = result.error or REFUSED
                else:
                    failures += 1
                    contents[i] = self.format_result(result)
        if refused_names:
            self.note(refused=refused_names)
        messages = [
            {"role": "tool", "tool_call_id": call.id, "content": contents[i] or ""} for i, call in enumerate(calls)
        ]
        if successes:
            outcome = "ok"
        elif failures:
            outcome = "failed"
        else:
            outcome = "neutral"
        return messages, outcome

    @staticmethod
    def format_result(result: Result) -> str:
        """A tool result as the model reads it."""
        status = result.status.value if isinstance(result.status, ResultStatus) else str(result.status)
        if status == ResultStatus.SUCCESS.value:
            body = as_text(result.result) if result.result is not None else "(no output)"
            return _clip(body)
        return _clip(f"{status}: {result.error or as_text(result.result)}")


class LinuxAgent(ToolUsingAgent):
    """The single-tier agent: the whole request, tool call by tool call, until a final answer."""

    def __init__(self, name: str = "linux", *, client: ModelClient, settings: ModelSettings | None = None) -> None:
        super().__init__(name, client=client, settings=settings)
