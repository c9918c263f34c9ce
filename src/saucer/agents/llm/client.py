"""A chat-completions client for any OpenAI-compatible endpoint.

Built on the official ``openai`` package (``AsyncOpenAI``), with saucer's own
retry loop (the SDK's is turned off) so that the policy is explicit and
tested: 408, 409, 429, 5xx, timeouts and connection errors are retried with
exponential backoff (honouring ``Retry-After`` up to ``backoff_max``); other
errors fail at once. The API key is a :class:`~pydantic.SecretStr`, registered
with :func:`saucer.redaction.register_secret`: it is never written to a log, a
record or an error message, even when the endpoint echoes it back.

Its settings (:class:`ModelSettings`) are in :mod:`saucer.agents.llm.settings`,
re-exported here.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import openai

from saucer.agents.llm import grammar
from saucer.agents.llm.logs import RequestLogger
from saucer.agents.llm.pricing import PriceTable, format_cost
from saucer.agents.llm.settings import (
    ENV_API_KEY,
    ENV_BASE_URL,
    ENV_MODEL,
    OPENAI_BASE_URL,
    ModelNotConfiguredError,
    ModelSettings,
    ToolChoice,
    require_model_settings,
)
from saucer.agents.llm.settings import (
    not_configured_message as _not_configured_message,
)
from saucer.agents.llm.tools import ToolSet
from saucer.agents.llm.window import request_chars, without_images
from saucer.redaction import redact_text, register_secret

__all__ = [
    "ENV_BASE_URL",
    "ENV_API_KEY",
    "ENV_MODEL",
    "OPENAI_BASE_URL",
    "ModelSettings",
    "ModelNotConfiguredError",
    "ModelCallError",
    "Usage",
    "ToolCall",
    "ToolChoice",
    "wire_messages",
    "DEFAULT_CHARS_PER_TOKEN",
    "ModelReply",
    "ModelClient",
    "require_model_settings",
]

#: Sent as the key to servers that need none (Ollama, vLLM, llama.cpp accept any).
_NO_KEY = "not-needed"
_RETRY_STATUS = frozenset({408, 409, 429})
_MAX_RETRY_AFTER = 60.0
#: Characters per token assumed until a reply's ``usage`` measures it (low: it over-counts, never under).
DEFAULT_CHARS_PER_TOKEN = 3.0


class ModelCallError(RuntimeError):
    """A model call failed for good (after retries, or at once for a non-retryable error)."""

    def __init__(self, message: str, *, status: int | None = None, attempts: int = 1, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.attempts = attempts
        self.retryable = retryable


@dataclass
class Usage:
    """Tokens of one call."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0

    @classmethod
    def from_response(cls, usage: Any) -> Usage:
        if usage is None:
            return cls()
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None) or 0
        prompt = getattr(usage, "prompt_tokens", 0) or 0
        completion = getattr(usage, "completion_tokens", 0) or 0
        total = getattr(usage, "total_tokens", None) or prompt + completion
        return cls(int(prompt), int(completion), int(total), int(cached))

    def as_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "cached_tokens": self.cached_tokens,
        }


@dataclass
class ToolCall:
    """One tool call the model asked for, with saucer's tool name."""

    id: str
    name: str
    function_name: str
    arguments: dict[str, Any]
    raw_arguments: str
    error: str | None = None  # set when the arguments are not a JSON object

    def as_dict(self) -> dict[str, Any]:
        out = {"id": self.id, "name": self.name, "function_name": self.function_name, "arguments": self.arguments}
        if self.error:
            out["error"] = self.error
            out["raw_arguments"] = self.raw_arguments
        return out


@dataclass
class ModelReply:
    """The answer to one call: text and/or tool calls, tokens, cost, timing."""

    content: str | None
    tool_calls: list[ToolCall]
    usage: Usage
    cost: float | None
    model: str
    finish_reason: str | None
    latency: float
    attempts: int
    raw_message: dict[str, Any] = field(default_factory=dict)

    @property
    def is_final(self) -> bool:
        """A reply without tool calls (whether it is an answer is the agent's call, see ``truncated``)."""
        return not self.tool_calls

    @property
    def truncated(self) -> bool:
        """The reply was cut off by ``max_tokens`` (``finish_reason: "length"``): never an answer."""
        return self.finish_reason == "length"

    def assistant_message(self) -> dict[str, Any]:
        """The assistant message to append to the conversation before the tool results."""
        # "" rather than null: llama-cpp-python answers HTTP 500 to a tool-call turn whose content is null.
        message: dict[str, Any] = {"role": "assistant", "content": self.content or ""}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function_name, "arguments": c.raw_arguments},
                }
                for c in self.tool_calls
            ]
        return message


def _parse_arguments(raw: str | None) -> tuple[dict[str, Any], str | None]:
    if raw is None or not raw.strip():
        return {}, None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return {}, f"arguments are not valid JSON ({exc.msg} at position {exc.pos})"
    if not isinstance(value, dict):
        return {}, f"arguments must be a JSON object, got {type(value).__name__}"
    return value, None


def wire_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``messages`` as sent: an assistant turn's null content becomes ``""``.

    Conversations stored before that rule (content null on tool-call turns)
    are sent right too.
    """
    out = []
    for message in messages:
        copy = dict(message)
        if copy.get("role") == "assistant" and copy.get("content") is None:
            copy["content"] = ""
        out.append(copy)
    return out


Sleep = Callable[[float], Awaitable[Any]]


class ModelClient:
    """Chat completions with tools, retries, cost and a ``request.log`` line per call."""

    def __init__(
        self,
        settings: ModelSettings | Any = None,
        *,
        prices: PriceTable | None = None,
        request_logger: RequestLogger | None = None,
        sleep: Sleep | None = None,
        http_client: Any = None,
    ) -> None:
        self.settings = settings if isinstance(settings, ModelSettings) else require_model_settings(settings)
        register_secret(self.settings.secret())
        if not self.settings.model:
            raise ModelNotConfiguredError(_not_configured_message(self.settings))
        self.prices = prices if prices is not None else PriceTable.load(self.settings.price_file)
        self.request_logger = request_logger
        self._sleep: Sleep = sleep or asyncio.sleep
        #: Models that refused a temperature (sent without one from then on).
        self._no_temperature: set[str] = set()
        #: Models that take ``max_completion_tokens`` instead of ``max_tokens``.
        self._max_tokens_field: dict[str, str] = {}
        #: Whether the endpoint is a llama-server (asked once, for ``tool_grammar = "auto"``).
        self._llama_server: bool | None = None
        #: Characters of request (messages and tools, as JSON) per prompt token, measured by the last reply.
        self.chars_per_token = DEFAULT_CHARS_PER_TOKEN
        kwargs: dict[str, Any] = {}
        if http_client is not None:
            kwargs["http_client"] = http_client
        self._client = openai.AsyncOpenAI(
            api_key=self.settings.secret() or _NO_KEY,
            base_url=self.settings.effective_base_url,
            timeout=self.settings.timeout,
            max_retries=0,  # saucer's own loop below
            **kwargs,
        )

    @property
    def model(self) -> str:
        return self.settings.model or ""

    def __repr__(self) -> str:
        return f"<ModelClient model={self.model!r} base_url={self.settings.effective_base_url!r}>"

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._client.close()

    async def __aenter__(self) -> ModelClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def _redact(self, text: str) -> str:
        return redact_text(text)

    def backoff_delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        s = self.settings
        delay = min(s.backoff_max, s.backoff_base * (2.0 ** (retry - 1)))
        if s.backoff_jitter:
            delay *= 1 - s.backoff_jitter * random.random()
        if retry_after is not None and retry_after > 0:
            delay = max(delay, min(retry_after, _MAX_RETRY_AFTER))
        return float(delay)

    @staticmethod
    def _retry_after(exc: openai.APIStatusError) -> float | None:
        headers = getattr(exc.response, "headers", None) or {}
        for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
            value = headers.get(name)
            if value is None:
                continue
            try:
                return float(value) / scale
            except ValueError:
                continue
        return None

    async def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: ToolSet | None = None,
        temperature: float | None = None,
        model: str | None = None,
        request_logger: RequestLogger | None = None,
        log_fields: Mapping[str, Any] | None = None,
        response_format: Mapping[str, Any] | None = None,
        tool_choice: ToolChoice | None = None,
    ) -> ModelReply:
        """One chat completion (with retries). Raises :class:`ModelCallError` when it fails for good.

        With ``tools``, ``tool_choice`` (default: the settings') is sent unless
        it is ``omit``: some servers (llama-cpp-python) read a missing
        ``tool_choice`` as ``none`` and never call a tool. ``max_tokens`` is
        always sent when set (default 1024), as ``max_completion_tokens`` to a
        model that refuses the older name.
        """
        s = self.settings
        model_name = model or self.model
        body: dict[str, Any] = {"model": model_name, "messages": wire_messages(messages)}
        temp = s.temperature if temperature is None else temperature
        if temp is not None and model_name not in self._no_temperature:
            body["temperature"] = temp
        if s.max_tokens is not None:
            body[self._max_tokens_field.get(model_name, "max_tokens")] = s.max_tokens
        constrained: ToolSet | None = None
        if tools:
            body["tools"] = tools.schemas()
            choice = tool_choice or s.tool_choice
            if choice != "omit":
                body["tool_choice"] = choice
            if choice == "required" and response_format is None and await self.constrains_tool_calls():
                constrained = tools  # the grammar makes the reply one call of one of them (saucer.agents.llm.grammar)
                response_format = grammar.response_format(tools)
        if response_format is not None:
            body["response_format"] = dict(response_format)
        logger = request_logger or self.request_logger
        started = time.monotonic()
        errors: list[str] = []
        attempt = 0
        while True:
            attempt += 1
            attempt_started = time.monotonic()
            try:
                response = await self._client.chat.completions.create(**body, timeout=s.timeout)
                break
            except openai.APIStatusError as exc:
                status = exc.status_code
                retryable = status in _RETRY_STATUS or status >= 500
                detail = self._redact(f"HTTP {status}: {getattr(exc, 'message', exc)}")
                retry_after = self._retry_after(exc)
                if status == 400 and "temperature" in body and "temperature" in detail.lower():
                    # Reasoning models (o-series, gpt-5) accept only their default temperature.
                    self._no_temperature.add(model_name)
                    del body["temperature"]
                    errors.append(detail + " (sent again without temperature)")
                    attempt -= 1
                    continue
                if status == 400 and "max_tokens" in body and "max_completion_tokens" in detail:
                    # Newer OpenAI models take the limit only under its new name.
                    self._max_tokens_field[model_name] = "max_completion_tokens"
                    body["max_completion_tokens"] = body.pop("max_tokens")
                    errors.append(detail + " (sent again with max_completion_tokens)")
                    attempt -= 1
                    continue
            except openai.APITimeoutError:
                status, retryable, retry_after = None, True, None
                detail = f"timed out after {s.timeout:g} s"
            except openai.APIConnectionError as exc:
                status, retryable, retry_after = None, True, None
                detail = self._redact(f"connection error: {exc.__cause__ or exc}")
            errors.append(detail)
            if not retryable or attempt > s.max_retries:
                message = self._failure_message(model_name, detail, attempt, retryable, status)
                self._log(logger, body, tools, None, started, attempt, errors, log_fields, message)
                raise ModelCallError(message, status=status, attempts=attempt, retryable=retryable)
            await self._sleep(self.backoff_delay(attempt, retry_after))
        latency = time.monotonic() - attempt_started
        try:
            reply = self._reply(response, model_name, tools, latency, attempt, constrained)
        except ModelCallError as exc:
            self._log(logger, body, tools, None, started, attempt, errors, log_fields, str(exc))
            raise
        if reply.usage.prompt_tokens > 0:
            self.chars_per_token = request_chars(body["messages"], body.get("tools")) / reply.usage.prompt_tokens
        self._log(logger, body, tools, reply, started, attempt, errors, log_fields, None)
        return reply

    def _failure_message(self, model: str, detail: str, attempts: int, retryable: bool, status: int | None) -> str:
        where = f"model {model!r} at {self.settings.effective_base_url}"
        if retryable:
            text = f"{where} failed after {attempts} attempt(s); last error: {detail}"
            return text + (f" (raise [llm] max_retries, now {self.settings.max_retries})" if attempts > 1 else "")
        hint = ""
        if status == 401:
            hint = f"; check {ENV_API_KEY}"
        elif status == 404:
            hint = f"; check {ENV_BASE_URL} (usually ends in /v1) and {ENV_MODEL}"
        return f"{where} refused the request: {detail}{hint}"

    async def constrains_tool_calls(self) -> bool:
        """Whether a required tool call is sent with a JSON-schema grammar (``[llm] tool_grammar``).

        ``auto`` asks the endpoint once whether it is a llama-server
        (:func:`~saucer.agents.llm.grammar.serves_llama_cpp`), whose
        ``tool_choice: "required"`` lets a small model answer in prose.
        """
        mode = self.settings.tool_grammar
        if mode != "auto":
            return mode == "on"
        if self._llama_server is None:
            self._llama_server = await grammar.serves_llama_cpp(
                self.settings.effective_base_url, api_key=self.settings.secret(), timeout=min(self.settings.timeout, 10)
            )
        return self._llama_server

    def _reply(
        self,
        response: Any,
        model: str,
        tools: ToolSet | None,
        latency: float,
        attempts: int,
        constrained: ToolSet | None = None,
    ) -> ModelReply:
        choices = getattr(response, "choices", None) or []
        if not choices:
            raise ModelCallError(
                f"model {model!r} at {self.settings.effective_base_url} returned no choices: {str(response)[:200]}",
                attempts=attempts,
            )
        choice = choices[0]
        message = choice.message
        calls: list[ToolCall] = []
        for raw in getattr(message, "tool_calls", None) or []:
            fn = getattr(raw, "function", None)
            if fn is None:
                continue
            arguments, error = _parse_arguments(fn.arguments)
            name = tools.saucer_name(fn.name) if tools is not None else fn.name.replace("__", ".")
            calls.append(
                ToolCall(raw.id or f"call_{len(calls)}", name, fn.name, arguments, fn.arguments or "{}", error)
            )
        content = message.content
        if constrained is not None and not calls:
            found = grammar.tool_call_from_content(content, constrained)
            if found is not None:  # the JSON the grammar allowed is the call; it has no text beside it
                spec = constrained.resolve(found.function_name)
                name = spec.name if spec is not None else found.function_name
                call_id = f"call_{uuid.uuid4().hex[:16]}"
                calls.append(ToolCall(call_id, name, found.function_name, found.arguments, found.raw_arguments))
                content = None
        usage = Usage.from_response(getattr(response, "usage", None))
        used_model = getattr(response, "model", None) or model
        # Price by the model we asked for; providers often answer with a dated variant.
        cost = self.prices.cost(model, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
        if cost is None and used_model != model:
            cost = self.prices.cost(used_model, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
        return ModelReply(
            content=content,
            tool_calls=calls,
            usage=usage,
            cost=cost,
            model=used_model,
            finish_reason=choice.finish_reason,
            latency=latency,
            attempts=attempts,
            raw_message=message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else {},
        )

    def _log(
        self,
        logger: RequestLogger | None,
        body: Mapping[str, Any],
        tools: ToolSet | None,
        reply: ModelReply | None,
        started: float,
        attempts: int,
        errors: list[str],
        log_fields: Mapping[str, Any] | None,
        failure: str | None,
    ) -> None:
        if logger is None:
            return
        # Field names follow saucer.engine.logs.RequestLogEntry (extra fields are allowed there).
        record: dict[str, Any] = dict(log_fields or {})
        record.update(
            {
                "status": "error" if failure else "ok",
                "model": body["model"],
                "base_url": self.settings.effective_base_url,
                "temperature": body.get("temperature"),
                "max_tokens": body.get("max_tokens", body.get("max_completion_tokens")),
                "tool_choice": body.get("tool_choice"),
                # "json_schema" on a grammar-constrained call (saucer.agents.llm.grammar), else None
                "response_format": (body.get("response_format") or {}).get("type"),
                "prompt": [without_images(m) for m in body["messages"]],  # a screenshot's base64 is not log text
                "tools": tools.names() if tools else [],
                "attempts": attempts,
                "errors": errors,
                "latency_ms": round((time.monotonic() - started) * 1000, 3),
            }
        )
        if reply is not None:
            record.update(
                {
                    "response": {
                        "content": reply.content,
                        "tool_calls": [c.as_dict() for c in reply.tool_calls],
                        "finish_reason": reply.finish_reason,
                        "model": reply.model,
                    },
                    "prompt_tokens": reply.usage.prompt_tokens,
                    "completion_tokens": reply.usage.completion_tokens,
                    "usage": reply.usage.as_dict(),
                    "cost": reply.cost,
                    "cost_text": format_cost(reply.cost),
                    "request_latency_ms": round(reply.latency * 1000, 3),
                }
            )
        else:
            # No completion, no tokens billed: a failed call costs 0, which is known.
            record.update({"response": None, "cost": 0.0, "cost_text": format_cost(0.0), "error": failure})
        logger.write(record)
