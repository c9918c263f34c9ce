"""Grammar-constrained tool calls: a step that must act gets a tool call, even from a tiny local model.

llama.cpp's ``llama-server`` takes ``tool_choice: "required"`` but its grammar
still lets a reply start with free text before the tool call: a small model
(SmolLM2-135M) writes prose until ``max_tokens`` and never calls a tool (0 of
5 demo sessions finished, measured). What it does enforce strictly is a JSON
schema (``response_format: {"type": "json_schema", ...}``), compiled into a
grammar that every sampled token must fit.

So on a step that must act -- a request with tools and ``tool_choice``
``required`` -- sent to a llama-server, the client sends
:func:`response_format` for the offered tools: one object
``{"name": <one tool's function name>, "arguments": <that tool's own
parameters schema>}`` (the shape of the Hermes/Qwen ``<tool_call>`` the chat
template describes), and :func:`tool_call_from_content` turns the JSON the
model wrote into an ordinary :class:`~saucer.agents.llm.client.ToolCall`.
The conversation keeps it as an OpenAI tool call, so the next request (and
``saucer show``) read it like any other.

Whether a server is a llama-server is asked once, at ``GET /props`` (its own
endpoint; other OpenAI-compatible servers answer 404): ``[llm] tool_grammar``
``auto`` (default) does that, ``on`` constrains on any server that implements
``response_format`` JSON schemas, ``off`` never constrains.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from saucer.agents.llm.tools import ToolSet

__all__ = [
    "tool_call_schema",
    "response_format",
    "ConstrainedCall",
    "tool_call_from_content",
    "serves_llama_cpp",
]

#: How deep ``$ref``s are inlined; a recursive schema is cut there to "any value".
_MAX_REF_DEPTH = 8


def _inline_refs(schema: Any, root: Mapping[str, Any], depth: int = 0) -> Any:
    """``schema`` with local ``$ref``s (``#/$defs/X``, ``#/definitions/X``) replaced by what they name.

    The tool's parameters become one branch of a larger schema, where a
    ``#/...`` reference would point at the wrong root.
    """
    if isinstance(schema, list):
        return [_inline_refs(item, root, depth) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        if depth >= _MAX_REF_DEPTH:
            return {}
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, Mapping) else None
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return _inline_refs({**(target if isinstance(target, Mapping) else {}), **rest}, root, depth + 1)
    return {
        key: _inline_refs(value, root, depth) for key, value in schema.items() if key not in ("$defs", "definitions")
    }


def _arguments_schema(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A tool's parameters as the grammar needs them: refs inlined, no properties beyond those declared."""
    schema = _inline_refs(parameters, parameters)
    schema = dict(schema) if isinstance(schema, Mapping) else {"type": "object"}
    if schema.get("type") == "object" and "additionalProperties" not in schema:
        # Extra keys would only give a small model room to ramble; the dispatcher refuses them anyway.
        schema["additionalProperties"] = False
    return schema


def tool_call_schema(tools: ToolSet) -> dict[str, Any]:
    """The JSON schema of exactly one call of one of ``tools``: ``{"name": ..., "arguments": {...}}``."""
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": spec.function_name},
                "arguments": _arguments_schema(spec.parameters),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for spec in tools.specs
    ]
    if not options:
        raise ValueError("a tool call needs at least one tool to call")
    return options[0] if len(options) == 1 else {"oneOf": options}


def response_format(tools: ToolSet) -> dict[str, Any]:
    """The ``response_format`` that makes the server's grammar allow one call of one of ``tools``, nothing else."""
    return {"type": "json_schema", "json_schema": {"name": "tool_call", "schema": tool_call_schema(tools)}}


@dataclass(frozen=True)
class ConstrainedCall:
    """One tool call read from a constrained reply's text (the client makes it a ``ToolCall``)."""

    function_name: str
    arguments: dict[str, Any]
    raw_arguments: str


def tool_call_from_content(content: str | None, tools: ToolSet) -> ConstrainedCall | None:
    """The call in a constrained reply's text, or None when the text is not one (cut off, or a server
    that ignored the schema): the reply then stays what it was, text, and the agent judges it as such."""
    text = (content or "").strip()
    if text.startswith("```"):  # llama-server's grammar allows the JSON inside a ```json fence
        text = text.removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict) or tools.resolve(value["name"]) is None:
        return None
    return ConstrainedCall(value["name"], arguments, json.dumps(arguments, ensure_ascii=False))


async def serves_llama_cpp(base_url: str, *, api_key: str | None = None, timeout: float = 5.0) -> bool:
    """Whether ``base_url`` (``http://host:port/v1``) is llama.cpp's llama-server: its ``/props`` answers
    with the server's generation settings. Any failure (404, no JSON, no connection) means no."""
    root = base_url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=timeout) as http:
            response = await http.get(f"{root}/props", headers=headers)
        data = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return False
    return isinstance(data, dict) and "default_generation_settings" in data
