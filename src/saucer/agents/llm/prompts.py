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
from typing import Any, Iterable, Mapping

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
    out.update(dict(getattr(context, "vars", {}) or {}))
    return out


def _tool_lines(tools: ToolSet | None) -> str:
    if not tools:
        return "(no tools are available)"
    lines = []
    for spec in tools.specs:
        flag = " [sensitive: the user is asked before it runs]" if spec.sensitive else ""
        lines.append(f"- {spec.function_name} ({spec.name}): {spec.description}{flag}")
    return "\n".join(lines)


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


_LINUX_AGENT = """You are saucer's Linux agent. You carry out the user's request on this machine by calling the tools below, one step at a time.

Rules:
- Call tools to act and to look things up; never invent a tool result.
- After each tool result, decide the next step. A tool result marked "refused by the user" was not run: do not retry it; find another way or explain.
- When the request is done (or cannot be done), answer with a short final summary for the user and call no tool. That answer ends your work.

Tools:
{tools}"""

_APP_AGENT = """You are saucer's app agent. The host agent gave you one subtask of a larger request. Carry out this subtask only, by calling the tools below.

Rules:
- Call tools to act and to look things up; never invent a tool result.
- A tool result marked "refused by the user" was not run: do not retry it; find another way or explain.
- When the subtask is done (or cannot be done), answer with a short result for the host agent and call no tool.

Tools:
{tools}"""

_HOST_AGENT = """You are saucer's host agent. You split the user's request into subtasks and hand them, one at a time, to an app agent that can use these tools:
{tools}

To hand over the next subtask, call assign_subtask with the subtask and, if useful, a message for the app agent. You will then see its result.
When the whole request is done (or cannot be done), answer with a short final summary for the user and call no tool."""

_JUDGE = """You are an evaluator. You judge whether an agent completed the user's request, from the request and a log of the steps it took and the results it saw.

Answer with one JSON object and nothing else:
{"complete": "yes" | "no" | "unsure", "reason": "<one or two sentences>", "sub_scores": {"<aspect>": "yes" | "no" | "unsure"}}"""


def _with_extra(prompt: str, extra: str | None) -> str:
    return prompt + (f"\n\nAdditional instructions:\n{extra}" if extra else "")


def linux_agent_system_prompt(tools: ToolSet | None, extra: str | None = None) -> str:
    """The single-tier agent's system prompt."""
    return _with_extra(_LINUX_AGENT.replace("{tools}", _tool_lines(tools)), extra)


def app_agent_system_prompt(tools: ToolSet | None, extra: str | None = None) -> str:
    """The app agent's system prompt."""
    return _with_extra(_APP_AGENT.replace("{tools}", _tool_lines(tools)), extra)


def host_agent_system_prompt(tools: ToolSet | None, extra: str | None = None) -> str:
    """The host agent's system prompt."""
    return _with_extra(_HOST_AGENT.replace("{tools}", _tool_lines(tools)), extra)


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
