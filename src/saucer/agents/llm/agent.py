"""The LLM agent's base, and what the single-tier and two-tier agents share.

:class:`LLMAgent` keeps its conversation in the Context (context variables
``_llm.<agent>.*``, hidden from prompt templating by their leading ``_``),
appended in each step's own commit, so a resumed session continues the same
conversation; it calls the model (the conversation trimmed to fit
``context_window``, a reply cut off at ``max_tokens`` asked for once more,
shorter), counts tokens against the session's ``token_budget``, and puts the
model's cost on the step (:meth:`Agent.add_cost`). The tool-using loop of one
agent is :mod:`saucer.agents.llm.tool_agent`; the two-tier host and app agents
are :mod:`saucer.agents.llm.host`. A round's result helpers
(:func:`nothing_done_reason`, :func:`no_action_reason`,
:func:`previous_subtask_entry`) and the ``SUBTASK_FINISH`` state are shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from saucer.agents.llm.ask import ask_user_spec
from saucer.agents.llm.client import (
    DEFAULT_CHARS_PER_TOKEN,
    ModelCallError,
    ModelClient,
    ModelReply,
    ModelSettings,
)
from saucer.agents.llm.logs import RequestLogger
from saucer.agents.llm.prompts import (
    cut_off_message,
    no_action_message,
    render_template,
    template_variables,
)
from saucer.agents.llm.tools import ToolSet, ToolSpec
from saucer.agents.llm.window import estimate_tokens, fit_to_window, prompt_budget
from saucer.context.names import ContextNames
from saucer.engine.agent import Agent, AgentStatus, ContinueState
from saucer.engine.interactor import interactor_approver

if TYPE_CHECKING:
    from saucer.context import Context

__all__ = [
    "LLMAgent",
    "SubtaskFinishState",
    "SUBTASK_FINISH",
    "REFUSED",
    "MAX_TOOL_RESULT_CHARS",
    "FINISH_TOOL",
    "TOKENS_VAR",
    "ReplyCutOffError",
    "TokenBudgetReached",
    "interactor_approver",
    "no_action_reason",
    "nothing_done_reason",
    "previous_subtask_entry",
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
        dispatcher = getattr(context, "command_dispatcher", None)
        sensitive = getattr(dispatcher, "sensitive_tools", None) or ()
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
            self._request_logger = RequestLogger.for_context(context)  # type: ignore[assignment]
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
                chars_per_token=getattr(self.client, "chars_per_token", DEFAULT_CHARS_PER_TOKEN),
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
            cpt = getattr(self.client, "chars_per_token", DEFAULT_CHARS_PER_TOKEN)
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

    def _interactor(self) -> Any:
        rnd = self.round
        session = getattr(rnd, "session", None) if rnd is not None else None
        return getattr(session, "interactor", None)

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


def _said(content: str, limit: int = 300) -> str:
    """A model's answer inside a one-line reason (the whole answer is in the conversation and the step log)."""
    text = " ".join(content.split())
    if not text:
        return "(an empty reply)"
    return repr(text if len(text) <= limit else text[:limit] + "...")


def nothing_done_reason(who: str, content: str) -> str:
    """The round (or subtask) result of an agent whose every tool call failed or was refused."""
    return f"nothing was done (every tool call failed or was refused); the {who} said: {_said(content)}"


def no_action_reason(retries: int, content: str) -> str:
    """The round result of an agent that never called a tool."""
    asked = f", even after {retries} reminder(s)" if retries else ""
    return f"no action: the model answered without calling a tool{asked}: {_said(content)}"


@LLMAgent.register_state
class SubtaskFinishState(ContinueState):
    """Entered by the host after an app agent finished its subtask: a CONTINUE that ends the subtask."""

    status = SUBTASK_FINISH

    def is_subtask_end(self) -> bool:
        return True


def previous_subtask_entry(context: Context, subtask: str, status: str, result: str, agent: str) -> Mapping[str, Any]:
    """One ``PREVIOUS_SUBTASKS`` entry (the schema both tiers write and the prompts read)."""
    return {
        "subtask": subtask,
        "status": status,
        "result": result,
        "round": context.get(ContextNames.CURRENT_ROUND_ID),
        "agent": agent,
    }
