"""What saucer's tool-using LLM agents share: the single-tier agent (:mod:`saucer.agents.llm.single`),
the two tiers (:mod:`saucer.agents.llm.host`) and the operator.

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

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from saucer.agents.llm.ask import ASK_USER_TOOL, ask_the_user, ask_user_spec
from saucer.agents.llm.client import (
    ModelCallError,
    ModelClient,
    ModelReply,
    ModelSettings,
    ToolCall,
)
from saucer.agents.llm.logs import RequestLogger
from saucer.agents.llm.outcomes import no_action_reason, nothing_done_reason, previous_subtask_entry
from saucer.agents.llm.prompts import (
    as_text,
    cut_off_message,
    linux_agent_system_prompt,
    no_action_message,
    render_template,
    request_message,
    template_variables,
)
from saucer.agents.llm.tools import FlagsSensitiveTools, GatesSensitiveCommands, ToolSet, ToolSpec
from saucer.agents.llm.window import estimate_tokens, fit_to_window, prompt_budget
from saucer.context.names import ContextNames
from saucer.dispatch.messages import Command, Result, ResultStatus
from saucer.engine.agent import Agent, AgentStatus, ContinueState
from saucer.engine.interactor import interactor_approver

if TYPE_CHECKING:
    from saucer.context import Context

__all__ = [
    "LLMAgent",
    "ToolUsingAgent",
    "SubtaskFinishState",
    "SUBTASK_FINISH",
    "REFUSED",
    "MAX_TOOL_RESULT_CHARS",
    "FINISH_TOOL",
    "TOKENS_VAR",
    "ReplyCutOffError",
    "TokenBudgetReached",
    "interactor_approver",
    "is_refusal",
]

#: Status of an app agent whose subtask is done: the host takes the next step
#: in its state of this name (a CONTINUE that also ends the subtask).
SUBTASK_FINISH = "SUBTASK_FINISH"
#: The tool message for a call the user refused.
REFUSED = "refused by the user"
#: Tool results longer than this are cut (the model sees a note saying so).
MAX_TOOL_RESULT_CHARS = 16_000
#: The function an agent calls to end its work when ``tool_choice = "required"`` forbids prose.
FINISH_TOOL = "finish"
#: The context variable counting the tokens the session's agents used (for ``token_budget``).
TOKENS_VAR = "_llm.tokens"


class ReplyCutOffError(ModelCallError):
    """The model's reply was cut off at ``max_tokens`` twice in a row."""


class TokenBudgetReached(Exception):
    """The session's ``token_budget`` is used up: the agent stops (round and session ``stopped``)."""


def finish_spec() -> ToolSpec:
    """The ``finish`` tool (offered with ``tool_choice = "required"``, where the model cannot answer in prose)."""
    return ToolSpec(
        name=f"agent.{FINISH_TOOL}",
        function_name=FINISH_TOOL,
        description="End your work once the request is done or cannot be done, with a short summary.",
        parameters={"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]},
    )


def _cost_text(cost: float | None) -> float | str:
    return "unknown" if cost is None else cost


def _clip(text: str, limit: int = MAX_TOOL_RESULT_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters cut]"


class LLMAgent(Agent):
    """Base of saucer's LLM agents: model client, settings, tools, durable conversation."""

    #: Offer ``ask_user`` when ``[llm] ask_user`` is on (normal mode; the operator modes offer only the desktop).
    offers_ask_user = True

    def __init__(
        self,
        name: str | None = None,
        *,
        client: ModelClient,
        settings: ModelSettings | None = None,
    ) -> None:
        super().__init__(name)
        self.client = client
        self.settings = settings or client.settings
        self._request_logger: RequestLogger | None = None
        self._request_logger_for: Any = None

    # ---------------------------------------------------------- context keys

    @property
    def _messages_key(self) -> str:
        return f"_llm.{self.name}.messages"

    @property
    def _meta_key(self) -> str:
        return f"_llm.{self.name}.meta"

    def _load(self, context: Context, scope: Any, initial: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The conversation of ``scope`` (started with ``initial()`` when the scope is new)."""
        meta = context.get_var(self._meta_key)
        if isinstance(meta, dict) and meta.get("scope") == scope:
            messages = context.get_var(self._messages_key) or []
            if messages:
                if "acted" not in meta:  # stored before these counters: trust what the conversation shows
                    had_results = any(m.get("role") == "tool" for m in messages)
                    meta.update(tried=had_results, acted=had_results)
                return messages, meta
        messages = initial()
        meta = {"scope": scope, "failures": 0, "tried": False, "acted": False}
        context.update_vars(set={self._messages_key: messages, self._meta_key: meta})
        return messages, meta

    def _append(self, context: Context, messages: list[dict[str, Any]], *new: dict[str, Any]) -> None:
        for message in new:
            messages.append(message)
            context.append(self._messages_key, message)

    def _save_meta(self, context: Context, meta: dict[str, Any]) -> None:
        context.update_vars(set={self._meta_key: meta})

    # ----------------------------------------------------------------- tools

    def tools(self, context: Context) -> ToolSet:
        """The tools of ``TOOL_INFO`` (sensitive: flagged there or by the dispatcher)."""
        info = context.get(ContextNames.TOOL_INFO) or {}
        dispatcher = context.command_dispatcher
        sensitive = dispatcher.sensitive_tools if isinstance(dispatcher, FlagsSensitiveTools) else ()
        try:
            sensitive_set = set(sensitive)
        except TypeError:
            sensitive_set = set()
        return ToolSet.from_tool_info(
            info, sensitive=sensitive_set, description_chars=self.settings.tool_description_chars
        )

    @property
    def finish_tool(self) -> bool:
        """Whether the model ends its work with the ``finish`` tool (``tool_choice = "required"``)."""
        return self.settings.tool_choice == "required"

    def offered(self, tools: ToolSet) -> ToolSet:
        """What the model is offered: ``tools``, plus ``finish`` when it must always call a tool, plus ``ask_user``."""
        extra = ([finish_spec()] if self.finish_tool else []) + (
            [ask_user_spec()] if self.settings.ask_user and self.offers_ask_user else []
        )
        return tools.with_tools(*extra) if extra else tools

    def for_this_step(self, tools: ToolSet, meta: Mapping[str, Any]) -> ToolSet:
        """The tools of this step's call: all of them, but ``finish`` only once a tool call was tried.

        With ``tool_choice = "required"`` a step before any attempt must act:
        ending there would only be answered "nothing has been done yet", and
        under a grammar (:mod:`saucer.agents.llm.grammar`) a small model
        picks ``finish`` at once, every time (measured with SmolLM2-135M).
        """
        if self.finish_tool and not meta.get("tried"):
            return tools.without(FINISH_TOOL)
        return tools

    @staticmethod
    def answer_of(reply: ModelReply) -> str | None:
        """The answer in ``reply``: its text when it called no tool, or ``finish``'s summary; else None."""
        if not reply.tool_calls:
            return reply.content or ""
        if len(reply.tool_calls) == 1 and reply.tool_calls[0].function_name == FINISH_TOOL:
            summary = reply.tool_calls[0].arguments.get("summary")
            return summary if isinstance(summary, str) and summary.strip() else (reply.content or "")
        return None

    def judge_answer(
        self, context: Context, messages: list[dict[str, Any]], meta: dict[str, Any], reply: ModelReply
    ) -> str:
        """What the answer in ``reply`` means, from what this conversation did (see the module's docstring).

        ``final``: a tool call (a subtask, for the host) succeeded; ``failed``:
        some were made, none succeeded; ``again``: nothing was tried yet, so
        the model is reminded (appended to ``messages`` here) and asked again;
        ``no_action``: still nothing after ``no_action_retries`` reminders.
        """
        if meta.get("acted"):
            return "final"
        if meta.get("tried"):
            return "failed"
        asked = int(meta.get("no_action", 0))
        if asked >= self.settings.no_action_retries:
            return "no_action"
        meta["no_action"] = asked + 1
        # A finish call needs its tool message before the next user turn (servers refuse a dangling call).
        answers = [
            {"role": "tool", "tool_call_id": call.id, "content": "not finished: nothing has been done yet"}
            for call in reply.tool_calls
        ]
        self._append(context, messages, *answers, {"role": "user", "content": no_action_message()})
        self.note(asked_again=asked + 1)
        return "again"

    # ------------------------------------------------------------ the model

    def system_extra(self, context: Context) -> str | None:
        """The user's extra system prompt, templated when ``prompt_templating`` is on."""
        extra = self.settings.system_prompt
        if extra and self.settings.prompt_templating:
            extra = render_template(extra, template_variables(context), self.settings.hidden_vars)
        return extra

    def _logger(self, context: Context) -> RequestLogger | None:
        if self._request_logger_for is not context:
            self._request_logger = RequestLogger.for_context(context)
            self._request_logger_for = context
        return self._request_logger

    def _log_fields(self, context: Context) -> dict[str, Any]:
        step = self.step
        fields: dict[str, Any] = {"agent": self.name, "round": context.get(ContextNames.CURRENT_ROUND_ID)}
        if step is not None:
            fields.update(step=step.step, session_step=step.session_step, session_id=step.session_id)
        return fields

    async def call_model(self, context: Context, messages: list[dict[str, Any]], tools: ToolSet | None) -> ModelReply:
        """One answer of the model; its cost and tokens go to this step (and so to the ledgers).

        A reply cut off at ``max_tokens`` is asked for once more with a note
        (not kept in the conversation); cut off again, it raises
        :class:`ReplyCutOffError`. :class:`TokenBudgetReached` when the
        session's ``token_budget`` is used up before a call.
        """
        reply = await self._call(context, messages, tools)
        if reply.truncated:
            self.note(cut_off=reply.usage.completion_tokens or True)
            note = {"role": "user", "content": cut_off_message(self.settings.max_tokens)}
            reply = await self._call(context, [*messages, note], tools)
            if reply.truncated:
                raise ReplyCutOffError(
                    f"the model's reply was cut off at the token limit twice (finish_reason 'length', "
                    f"max_tokens {self.settings.max_tokens}); it is not taken as an answer: "
                    "raise [llm] max_tokens or ask for less per step"
                )
        return reply

    def _check_budget(self, context: Context) -> None:
        budget = self.settings.token_budget
        if budget is None:
            return
        used = int(context.get_var(TOKENS_VAR, 0) or 0)
        if used >= budget:
            raise TokenBudgetReached(
                f"token budget reached: the session's agents used {used} tokens of the {budget} allowed "
                "([llm] token_budget)"
            )

    def outgoing(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The conversation as this call sends it (an operator attaches the screenshot); default: as kept."""
        return messages

    async def _call(self, context: Context, messages: list[dict[str, Any]], tools: ToolSet | None) -> ModelReply:
        self._check_budget(context)
        sent = messages = self.outgoing(messages)
        log_fields = self._log_fields(context)
        window = self.settings.context_window
        if window is not None:
            fitted = fit_to_window(
                messages,
                budget=prompt_budget(window, self.settings.max_tokens),
                chars_per_token=self.client.chars_per_token,
                tool_schemas=tools.schemas() if tools else None,
            )
            if fitted.trimmed:
                sent = fitted.messages
                trimmed = {"dropped": fitted.dropped, "clipped": fitted.clipped, "fits": fitted.fits}
                self.note(trimmed=trimmed)
                log_fields["trimmed"] = trimmed
        reply = await self.client.complete(
            sent, tools=tools, request_logger=self._logger(context), log_fields=log_fields
        )
        self._account(context, reply.cost)
        used = reply.usage.total_tokens
        if not used:
            # A server that reports no usage still spends tokens: estimate them, so a budget never counts 0.
            cpt = self.client.chars_per_token
            used = estimate_tokens(sent, tools.schemas() if tools else None, cpt)
            used += estimate_tokens([reply.assistant_message()], None, cpt)
            self.note(tokens_estimated=True)
        context.incr(TOKENS_VAR, used)
        tokens = (self.step.extra.get("tokens") if self.step is not None else None) or {"prompt": 0, "completion": 0}
        self.note(
            model=reply.model,
            tokens={
                "prompt": tokens["prompt"] + reply.usage.prompt_tokens,
                "completion": tokens["completion"] + reply.usage.completion_tokens,
            },
            cost=_cost_text(self.step.cost if self.step is not None else reply.cost),
        )
        return reply

    def _account(self, context: Context, cost: float | None) -> None:
        if self.step is not None:
            self.add_cost(cost)  # the round commits it with the step
            return
        # Outside an engine round (a bare call): book it directly.
        if cost is not None:
            context.incr(ContextNames.SESSION_COST, cost)
            context.incr(ContextNames.CURRENT_ROUND_COST, cost)

    def _error(self, message: str) -> str:
        """End in ERROR with ``message`` on the step and as the round's result."""
        if self.step is not None:
            self.step.error = message
        self.round_result = message
        return AgentStatus.ERROR.value

    def _stop(self, reason: str) -> str:
        """End in STOP (round and session ``stopped``, never ``finished``) with ``reason``."""
        self.note(stopped=reason)
        self.round_result = reason
        return AgentStatus.STOP.value


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
            reply = await self.call_model(context, messages, self.for_this_step(tools, meta))
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
        return await self.user_channel.sensitive_step_asker(f"run {spec.name}", args[:2000])

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
        dispatcher_gates = isinstance(context.command_dispatcher, GatesSensitiveCommands)
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
                contents[i] = await ask_the_user(self, call)
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
            command = Command(tool_name=spec.name, parameters=call.arguments, tool_type=spec.tool_type)
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


def is_refusal(result: Result) -> bool:
    """A sensitive command the dispatcher did not run because approval was refused."""
    return result.status != ResultStatus.SUCCESS and (result.error or "").startswith("refused")


@LLMAgent.register_state
class SubtaskFinishState(ContinueState):
    """Entered by the host after an app agent finished its subtask: a CONTINUE that ends the subtask."""

    status = SUBTASK_FINISH

    def is_subtask_end(self) -> bool:
        return True
