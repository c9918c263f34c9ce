"""Prompts of the LLM agents, and opt-in templating of context variables.

Templating (``[llm] prompt_templating = true``) replaces ``{name}`` in a system
prompt with the context variable ``name`` (or a durable typed name such as
``{REQUEST}``); ``{a.b}`` reads key ``b`` of variable ``a``; ``{{`` and ``}}``
are literal braces; a name that is not set is left as it is, so JSON examples
in a prompt survive untouched.

Hidden variables are never rendered: a placeholder for a hidden name becomes
``[hidden]`` (not an error, so a prompt that mentions a secret cannot crash a
session, and the value still never reaches the model). Hidden are the names in
``[llm] hidden_vars`` and every variable whose name starts with ``_``.
Runtime-only typed names (loggers, window handles) are never available.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from saucer.agents.llm.tools import ToolSet

__all__ = [
    "HIDDEN",
    "as_text",
    "render_template",
    "template_variables",
    "is_hidden",
    "linux_agent_system_prompt",
    "app_agent_system_prompt",
    "host_agent_system_prompt",
    "judge_system_prompt",
    "no_action_message",
    "cut_off_message",
    "request_message",
    "format_previous_subtasks",
]

#: What a hidden variable renders as.
HIDDEN = "[hidden]"
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)\}")
_MISSING = object()
# Typed names whose values are prompt-worthy (durable text and lists, no loggers).
_TYPED_NAMES = (
    "REQUEST",
    "SUBTASK",
    "PREVIOUS_SUBTASKS",
    "HOST_MESSAGE",
    "ROUND_RESULT",
    "MODE",
    "CURRENT_ROUND_ID",
    "APPLICATION_PROCESS_NAME",
    "APPLICATION_ROOT_NAME",
)


def is_hidden(name: str, hidden: Iterable[str] = ()) -> bool:
    """Whether ``name`` (or the variable a dotted path starts from) is hidden."""
    root = name.split(".", 1)[0]
    hidden_set = set(hidden)
    return root.startswith("_") or root in hidden_set or name in hidden_set


def _lookup(variables: Mapping[str, Any], name: str) -> Any:
    if name in variables:
        return variables[name]
    value: Any = variables
    for part in name.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def as_text(value: Any) -> str:
    """``value`` as prompt text: a string as it is, anything else as JSON (or ``str``)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def render_template(template: str, variables: Mapping[str, Any], hidden: Iterable[str] = ()) -> str:
    """``template`` with ``{name}`` replaced by its value; hidden names give ``[hidden]``."""
    hidden_set = set(hidden)

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        name = match.group(1)
        if is_hidden(name, hidden_set):
            return HIDDEN
        value = _lookup(variables, name)
        if value is _MISSING:
            return token
        return as_text(value)

    return _PLACEHOLDER.sub(replace, template)


def template_variables(context: Any) -> dict[str, Any]:
    """What a template can read: the prompt-worthy typed names, then the context variables."""
    out: dict[str, Any] = {}
    for name in _TYPED_NAMES:
        try:
            out[name] = context.get(name)
        except KeyError:
            continue
    out.update(context.vars)
    return out


def _tool_lines(tools: ToolSet | None) -> str:
    """One line per tool, for a prompt whose reader is not sent the tools' schemas (the host)."""
    if not tools:
        return "(no tools are available)"
    lines = []
    for spec in tools.specs:
        flag = " [sensitive: the user is asked before it runs]" if spec.sensitive else ""
        lines.append(f"- {spec.function_name} ({spec.name}): {spec.description}{flag}")
    return "\n".join(lines)


def _tool_names(tools: ToolSet | None) -> str:
    """The tools by name only: their descriptions and schemas go in the request's ``tools``, once."""
    if not tools:
        return "(no tools are available)"
    text = ", ".join(spec.function_name for spec in tools.specs)
    sensitive = [spec.function_name for spec in tools.specs if spec.sensitive]
    if sensitive:
        text += "\nSensitive (the user is asked before they run): " + ", ".join(sensitive)
    return text


def format_previous_subtasks(previous: Any) -> str:
    """One line per finished subtask (``PREVIOUS_SUBTASKS`` entries are dicts or strings)."""
    if not previous:
        return "(none)"
    lines = []
    for i, item in enumerate(previous, 1):
        if isinstance(item, Mapping):
            subtask = item.get("subtask") or item.get("Subtask") or ""
            status = item.get("status") or item.get("Status") or ""
            result = item.get("result") or item.get("Result") or ""
            lines.append(f"{i}. {subtask} [{status}] {as_text(result)}".rstrip())
        else:
            lines.append(f"{i}. {as_text(item)}")
    return "\n".join(lines)


_LINUX_AGENT = """You are saucer's Linux agent. You carry out the user's request on this machine by calling tools, one step at a time.

Rules:
- Act only by calling tools; never invent a tool result.
- After each tool result, decide the next step. A result marked "refused by the user" was not run: do not retry it.
- When the request is done (or cannot be done), {finish} That ends your work.

Tools: {tools}"""

_APP_AGENT = """You are saucer's app agent. The host agent gave you one subtask of a larger request. Carry out this subtask only, by calling tools.

Rules:
- Act only by calling tools; never invent a tool result.
- A result marked "refused by the user" was not run: do not retry it.
- When the subtask is done (or cannot be done), {finish}

Tools: {tools}"""

#: How the agent ends its work, by ``tool_choice``: in prose, or (``required``) with the finish tool.
_FINISH_IN_PROSE = "answer with a short summary and call no tool."
_FINISH_WITH_TOOL = "call finish with a short summary."

_HOST_AGENT = """You are saucer's host agent. You split the user's request into subtasks and hand them, one at a time, to an app agent that can use these tools:
{tools}

To hand over the next subtask, call assign_subtask with the subtask and, if useful, a message for the app agent. You will then see its result.
When the whole request is done (or cannot be done), {finish}"""

#: Sent when the model answered without calling a tool before anything was done.
_NO_ACTION = (
    "You answered without calling a tool, so nothing has been done yet. "
    "Carry out the request by calling one of the tools now."
)
#: Sent (for one more try) when a reply was cut off at max_tokens.
_CUT_OFF = (
    "Your last reply was cut off at the token limit{limit} and was discarded. "
    "Reply again, shorter: one tool call, or a short answer."
)

_JUDGE = """You are an evaluator. You judge whether an agent completed the user's request, from the request and a log of the steps it took and the results it saw.

Answer with one JSON object and nothing else:
{"complete": "yes" | "no" | "unsure", "reason": "<one or two sentences>", "sub_scores": {"<aspect>": "yes" | "no" | "unsure"}}"""


def _with_extra(prompt: str, extra: str | None) -> str:
    return prompt + (f"\n\nAdditional instructions:\n{extra}" if extra else "")


def _fill(template: str, tools: str, finish_tool: bool) -> str:
    finish = _FINISH_WITH_TOOL if finish_tool else _FINISH_IN_PROSE
    return template.replace("{finish}", finish).replace("{tools}", tools)


def linux_agent_system_prompt(tools: ToolSet | None, extra: str | None = None, *, finish_tool: bool = False) -> str:
    """The single-tier agent's system prompt (the tools by name: their schemas are sent beside it)."""
    return _with_extra(_fill(_LINUX_AGENT, _tool_names(tools), finish_tool), extra)


def app_agent_system_prompt(tools: ToolSet | None, extra: str | None = None, *, finish_tool: bool = False) -> str:
    """The app agent's system prompt."""
    return _with_extra(_fill(_APP_AGENT, _tool_names(tools), finish_tool), extra)


def host_agent_system_prompt(tools: ToolSet | None, extra: str | None = None, *, finish_tool: bool = False) -> str:
    """The host agent's system prompt (the app agent's tools with their short descriptions)."""
    return _with_extra(_fill(_HOST_AGENT, _tool_lines(tools), finish_tool), extra)


def no_action_message() -> str:
    """What the agent is told when it answered without calling a tool and nothing was done yet."""
    return _NO_ACTION


def cut_off_message(max_tokens: int | None) -> str:
    """What the model is told when its reply was cut off at ``max_tokens``."""
    return _CUT_OFF.replace("{limit}", f" ({max_tokens} tokens)" if max_tokens else "")


def judge_system_prompt() -> str:
    """The evaluation agent's system prompt."""
    return _JUDGE


def request_message(
    request: str,
    previous_subtasks: Any = None,
    *,
    subtask: str | None = None,
    host_message: Any = None,
) -> str:
    """The first user message: the request, what was done before, and (app agent) the subtask."""
    parts = [f"Request: {request}" if request else "Request: (none)"]
    parts.append("Previous subtasks:\n" + format_previous_subtasks(previous_subtasks))
    if subtask is not None:
        parts.append(f"Your subtask: {subtask}")
        if host_message:
            msgs = host_message if isinstance(host_message, list) else [host_message]
            parts.append("Messages from the host agent:\n" + "\n".join(f"- {as_text(m)}" for m in msgs))
    return "\n\n".join(parts)
