"""An LLM step in ``saucer show``: the model's replies and tool calls as a conversation.

The conversation of an LLM agent lives in the context variable
``_llm.<agent>.messages``; the timeline shows what was said and called, with
the agent's name, rather than the variable's appends.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from saucer.cli.output import visible
from saucer.context import Event
from saucer.context.events import op_key

__all__ = ["CONVERSATION_KEY", "conversation_lines"]

#: The variables of an LLM agent's conversation, as ``op_key`` names them.
CONVERSATION_KEY = re.compile(r"^vars\._llm\.(?:tokens|(?P<agent>[^.]+)\.(?P<what>messages|meta))$")


def conversation_lines(event: Event) -> list[str]:
    """The model's side of an LLM step as a conversation: who said what and which tools it called,
    agents named as the session names them (``app``, ``host``), never the variables that hold it."""
    out: list[str] = []
    for op in event.ops:
        found = CONVERSATION_KEY.match(op_key(op))
        if found is None or found["what"] != "messages" or op["op"] not in ("set", "append"):
            continue
        messages = op["value"] if op["op"] == "set" and isinstance(op["value"], list) else [op["value"]]
        for message in messages:
            if isinstance(message, dict):
                out.extend(_message_lines(found["agent"], message))
    return out


def _message_lines(agent: str, message: Mapping[str, Any]) -> list[str]:
    agent = visible(agent)
    role, content = message.get("role"), message.get("content")
    text = content if isinstance(content, str) else _clip(content, 200) if content else ""
    if role == "system":
        return []  # the prompt: in the step log and `show --all`
    if role == "user":
        return [f"user → {agent}: {_clip(text, 200)}"]
    if role == "tool":
        return [f"  ↳ {_clip(text, 200)}"]
    lines = [f"{agent} says: {_clip(text, 200)}"] if text.strip() else []
    for call in message.get("tool_calls") or []:
        function = (call.get("function") or {}) if isinstance(call, dict) else {}
        lines.append(f"{agent} calls {function.get('name', '?')} {_clip(function.get('arguments', ''), 160)}")
    return lines


def _clip(value: Any, width: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = visible(" ".join(text.split()))
    return text if len(text) <= width else text[: width - 1] + "…"
