"""Fitting a conversation into the model's context window (``[llm] context_window``).

The conversation kept in the Context is never shortened: the audit trail
keeps every message. What is trimmed is the copy sent to the model, so that
the prompt plus the reply (``max_tokens``) fit in the window:

1. the system prompt, the request (the first user message) and the latest
   tool results (the last assistant turn that called tools, and everything
   after it) are always kept;
2. the oldest turns in between go first, a tool-calling turn together with
   its tool results (a ``tool`` message without its call is refused by
   servers); the request then carries one line saying how many messages were
   left out and which tools they called;
3. when that is not enough, the longest kept tool results are cut, each
   ending with a note saying how much was cut.

Tokens are estimated from characters: the size of the request as JSON divided
by the characters per token the last reply's ``usage`` measured (3 until a
reply has measured it, which over-counts for English and JSON). An image part
(an operator's screenshot) counts as ``IMAGE_CHARS``, whatever its base64 length.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Fitted",
    "fit_to_window",
    "prompt_budget",
    "estimate_tokens",
    "request_chars",
    "without_images",
    "IMAGE_CHARS",
]

#: Share of the window kept free for what the estimate cannot see (the chat template's own tokens).
_MARGIN = 0.05
#: What one image in a message counts as, in characters (~1,000 tokens: a screen-sized image at high detail).
IMAGE_CHARS = 3000
#: A kept tool result is never cut below this many characters.
_MIN_TOOL_CHARS = 300


@dataclass
class Fitted:
    """The messages to send, and what was left out to fit."""

    messages: list[dict[str, Any]]
    estimated_tokens: int
    dropped: int = 0
    clipped: int = 0
    fits: bool = True

    @property
    def trimmed(self) -> bool:
        return bool(self.dropped or self.clipped)


def prompt_budget(context_window: int, max_tokens: int | None) -> int:
    """Tokens the prompt may take: the window less the reply's ``max_tokens`` and a small margin."""
    reply = max_tokens or 0
    return max(1, int((context_window - reply) * (1 - _MARGIN)))


def without_images(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """``message`` with each image part's data replaced by a note of its size (for sizes and logs)."""
    content = message.get("content")
    if not isinstance(content, list) or not any(_is_image(part) for part in content):
        return message
    parts = [
        {"type": "image_url", "image_url": {"url": f"[image: {len(str(part['image_url'].get('url', '')))} characters]"}}
        if _is_image(part)
        else part
        for part in content
    ]
    return {**message, "content": parts}


def _is_image(part: Any) -> bool:
    return isinstance(part, Mapping) and part.get("type") == "image_url" and isinstance(part.get("image_url"), Mapping)


def _size(message: Mapping[str, Any]) -> int:
    # An image costs the model a fixed number of tokens, not its base64 length.
    content = message.get("content")
    images = sum(1 for part in content if _is_image(part)) if isinstance(content, list) else 0
    return len(json.dumps(without_images(message), ensure_ascii=False)) + images * IMAGE_CHARS


def _total(sizes: Sequence[int], fixed: int) -> int:
    # json.dumps of a list: "[" + ", ".join(items) + "]"
    return fixed + 2 + sum(sizes) + 2 * max(len(sizes) - 1, 0)


def request_chars(messages: Sequence[Mapping[str, Any]], tool_schemas: Any = None) -> int:
    """A request's prompt in characters of JSON, messages and tools (what a reply's usage calibrates)."""
    fixed = len(json.dumps(tool_schemas, ensure_ascii=False)) if tool_schemas else 0
    return _total([_size(m) for m in messages], fixed)


def estimate_tokens(messages: Sequence[Mapping[str, Any]], tool_schemas: Any, chars_per_token: float) -> int:
    """Prompt tokens of ``messages`` and ``tool_schemas`` at ``chars_per_token``."""
    return math.ceil(request_chars(messages, tool_schemas) / chars_per_token)


def _head_end(messages: Sequence[Mapping[str, Any]]) -> int:
    """Index just after the request (the first user message), or after the leading system messages."""
    for i, message in enumerate(messages):
        if message.get("role") == "user":
            return i + 1
        if message.get("role") != "system":
            return i
    return len(messages)


def _tail_start(messages: Sequence[Mapping[str, Any]], head_end: int) -> int:
    """Index of the last assistant turn that called tools (the latest tool results start after it)."""
    for i in range(len(messages) - 1, head_end - 1, -1):
        message = messages[i]
        if message.get("role") == "assistant" and message.get("tool_calls"):
            return i
    return max(head_end, len(messages) - 1)


def _units(messages: Sequence[Mapping[str, Any]], start: int, end: int) -> list[tuple[int, int]]:
    """``[start, end)`` split into droppable units: a tool-calling turn with its results, or one message."""
    units: list[tuple[int, int]] = []
    i = start
    while i < end:
        j = i + 1
        if messages[i].get("role") == "assistant" and messages[i].get("tool_calls"):
            while j < end and messages[j].get("role") == "tool":
                j += 1
        units.append((i, j))
        i = j
    return units


def _called_tools(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    names: list[str] = []
    for message in messages:
        for call in message.get("tool_calls") or ():
            name = (call.get("function") or {}).get("name") if isinstance(call, Mapping) else None
            if name:
                names.append(str(name))
    return names


def _trim_note(dropped: int, tools: list[str]) -> str:
    note = f"[{dropped} earlier message(s) of this conversation were left out to fit the context window"
    if tools:
        counts: dict[str, int] = {}
        for name in tools:
            counts[name] = counts.get(name, 0) + 1
        note += "; the tool calls they held: " + ", ".join(
            f"{name} x{n}" if n > 1 else name for name, n in counts.items()
        )
    return note + "]"


def _with_note(request: Mapping[str, Any], note: str) -> dict[str, Any]:
    copy = dict(request)
    content = copy.get("content")
    copy["content"] = (content + "\n\n" + note) if isinstance(content, str) and content else note
    return copy


def _clip(content: str, keep: int) -> str:
    cut = len(content) - keep
    return content[:keep] + f"\n[... {cut} characters cut to fit the context window]"


def fit_to_window(
    messages: Sequence[Mapping[str, Any]],
    *,
    budget: int,
    chars_per_token: float,
    tool_schemas: Any = None,
) -> Fitted:
    """``messages`` trimmed so that, with ``tool_schemas``, they take at most ``budget`` tokens.

    ``fits`` is False when even the kept messages (system prompt, request,
    latest tool results cut to their minimum) are over the budget: they are
    sent as they are and the server says whether it can take them.
    """
    msgs = [dict(m) for m in messages]
    fixed = len(json.dumps(tool_schemas, ensure_ascii=False)) if tool_schemas else 0
    limit = budget * chars_per_token
    sizes = [_size(m) for m in msgs]
    if _total(sizes, fixed) <= limit:
        return Fitted(msgs, math.ceil(_total(sizes, fixed) / chars_per_token))

    head_end = _head_end(msgs)
    tail_start = _tail_start(msgs, head_end)
    units = _units(msgs, head_end, tail_start)
    has_request = head_end > 0 and msgs[head_end - 1].get("role") == "user"
    dropped_until = head_end  # messages[head_end:dropped_until] are left out
    head = msgs[:head_end]
    for _, end in units:
        if _total(sizes[:head_end] + sizes[dropped_until:], fixed) <= limit:
            break
        dropped_until = end
        if has_request:
            note = _trim_note(dropped_until - head_end, _called_tools(msgs[head_end:dropped_until]))
            head = msgs[: head_end - 1] + [_with_note(msgs[head_end - 1], note)]
            sizes[head_end - 1] = _size(head[-1])
    kept = head + msgs[dropped_until:]
    kept_sizes = sizes[:head_end] + sizes[dropped_until:]
    dropped = dropped_until - head_end

    # Still over: cut the longest tool results of what is kept, down to a floor.
    clipped = 0
    over = _total(kept_sizes, fixed) - limit
    if over > 0:
        order = sorted(
            (i for i, m in enumerate(kept) if m.get("role") == "tool" and isinstance(m.get("content"), str)),
            key=lambda i: -len(kept[i]["content"]),
        )
        for i in order:
            if over <= 0:
                break
            content = kept[i]["content"]
            keep = max(_MIN_TOOL_CHARS, len(content) - int(over) - 80)
            if keep >= len(content):
                continue
            kept[i] = {**kept[i], "content": _clip(content, keep)}
            new_size = _size(kept[i])
            over -= kept_sizes[i] - new_size
            kept_sizes[i] = new_size
            clipped += 1
    total = _total(kept_sizes, fixed)
    return Fitted(kept, math.ceil(total / chars_per_token), dropped, clipped, fits=total <= limit)
