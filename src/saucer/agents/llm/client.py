"""A chat-completions client for any OpenAI-compatible endpoint.

Built on the official ``openai`` package (``AsyncOpenAI``), with saucer's own
retry loop (the SDK's is turned off) so that the policy is explicit and
tested: 408, 409, 429, 5xx, timeouts and connection errors are retried with
exponential backoff (honouring ``Retry-After`` up to ``backoff_max``); other
errors fail at once. The API key is a :class:`~pydantic.SecretStr`, registered
with :func:`saucer.redaction.register_secret`: it is never written to a log, a
record or an error message, even when the endpoint echoes it back.

Settings come from the ``[llm]`` section of the configuration, with
``SAUCER_LLM_BASE_URL``, ``SAUCER_LLM_API_KEY`` and ``SAUCER_LLM_MODEL`` filling
what the configuration leaves unset.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Literal, Mapping, Sequence

import openai
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from saucer.agents.llm.logs import RequestLogger
from saucer.agents.llm.pricing import PriceTable, format_cost
from saucer.agents.llm.tools import ToolSet
from saucer.redaction import redact_text, register_secret
from saucer.engine.errors import LLMUnavailableError

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
    "request_chars",
    "DEFAULT_CHARS_PER_TOKEN",
    "ModelReply",
    "ModelClient",
    "require_model_settings",
]

ENV_BASE_URL = "SAUCER_LLM_BASE_URL"
ENV_API_KEY = "SAUCER_LLM_API_KEY"
ENV_MODEL = "SAUCER_LLM_MODEL"
OPENAI_BASE_URL = "https://api.openai.com/v1"
#: Sent as the key to servers that need none (Ollama, vLLM, llama.cpp accept any).
_NO_KEY = "not-needed"
_RETRY_STATUS = frozenset({408, 409, 429})
_MAX_RETRY_AFTER = 60.0
#: ``auto`` and ``required`` are sent as they are; ``omit`` sends no ``tool_choice`` (a server that rejects it).
ToolChoice = Literal["auto", "required", "omit"]
#: Characters per token assumed until a reply's ``usage`` measures it (low: it over-counts, never under).
DEFAULT_CHARS_PER_TOKEN = 3.0


class ModelSettings(BaseModel):
    """The ``[llm]`` settings: where the model is and how to call it."""

    model_config = ConfigDict(extra="ignore")

    base_url: str | None = Field(None, description="OpenAI-compatible endpoint, e.g. http://localhost:11434/v1")
    api_key: SecretStr | None = Field(None, description="API key (prefer SAUCER_LLM_API_KEY)")
    model: str | None = Field(None, description="model name, e.g. gpt-4o-mini or llama3.1")
    temperature: float | None = Field(0.0, ge=0.0, le=2.0)
    max_tokens: int | None = Field(1024, gt=0, description="most tokens generated per call (bounds a runaway reply)")
    tool_choice: ToolChoice = Field("auto", description="sent with the tools: auto, required, or omit (not sent)")
    context_window: int | None = Field(8192, ge=256, description="tokens the model's context holds; trimmed to fit")
    token_budget: int | None = Field(None, gt=0, description="most tokens the agents may use in one session")
    no_action_retries: int = Field(2, ge=0, description="times the agent is asked again after a reply with no tool call")
    tool_description_chars: int = Field(160, ge=0, description="tool descriptions are cut to this length (0: whole)")
    timeout: float = Field(60.0, gt=0, description="seconds per request attempt")
    max_retries: int = Field(3, ge=0, description="retries after the first attempt")
    backoff_base: float = Field(0.5, ge=0, description="first retry delay in seconds; doubles each retry")
    backoff_max: float = Field(8.0, ge=0)
    backoff_jitter: float = Field(0.25, ge=0, le=1, description="delays are reduced by up to this fraction")
    price_file: str | None = Field(None, description="JSON/TOML price table overriding the shipped one")
    prompt_templating: bool = Field(False, description="render {var} context variables in system prompts")
    hidden_vars: list[str] = Field(default_factory=list, description="context variables never rendered into a prompt")
    agent: Literal["single", "host"] = Field("single", description="'single' (one tool-using agent) or 'host' (host → app agents)")
    max_consecutive_failures: int = Field(3, ge=1)
    judge_model: str | None = Field(None, description="model of the evaluation agent (default: model)")
    system_prompt: str | None = Field(None, description="extra instructions appended to the agent's system prompt")

    @field_validator("base_url", "model", "judge_model", "price_file", "system_prompt", mode="before")
    @classmethod
    def _blank_is_none(cls, v: Any) -> Any:
        if isinstance(v, os.PathLike):
            v = os.fspath(v)
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("api_key", mode="before")
    @classmethod
    def _blank_key_is_none(cls, v: Any) -> Any:
        if isinstance(v, SecretStr):
            v = v.get_secret_value()
        return None if isinstance(v, str) and not v.strip() else v

    @property
    def effective_base_url(self) -> str:
        """The endpoint actually called (api.openai.com when only a key is set)."""
        return (self.base_url or OPENAI_BASE_URL).rstrip("/")

    @property
    def configured(self) -> bool:
        """A model name, and an endpoint or a key (for api.openai.com)."""
        return bool(self.model) and bool(self.base_url or self.api_key)

    def secret(self) -> str | None:
        """The API key as text (for the HTTP client only)."""
        return self.api_key.get_secret_value() if self.api_key is not None else None

    @classmethod
    def from_settings(cls, settings: Any = None, env: Mapping[str, str] | None = None) -> "ModelSettings":
        """Resolve from the app settings (``settings.llm``), an ``[llm]`` mapping or object, or None.

        The configuration wins for what it sets (it already merged file,
        environment and flags); ``SAUCER_LLM_*`` fill what it leaves unset.
        """
        env = os.environ if env is None else env
        if isinstance(settings, ModelSettings):
            data = settings.model_dump()
            data["api_key"] = settings.api_key
        else:
            section = settings
            if section is not None and not isinstance(section, Mapping):
                section = getattr(section, "llm", section)
            if isinstance(section, Mapping):
                data = dict(section.get("llm", section)) if isinstance(section.get("llm"), Mapping) else dict(section)
            elif section is None:
                data = {}
            elif hasattr(section, "model_dump"):
                data = {k: getattr(section, k) for k in section.model_dump()}  # keep SecretStr objects
            else:
                data = {k: getattr(section, k) for k in cls.model_fields if hasattr(section, k)}
        for key, var in (("base_url", ENV_BASE_URL), ("api_key", ENV_API_KEY), ("model", ENV_MODEL)):
            current = data.get(key)
            if isinstance(current, SecretStr):
                current = current.get_secret_value()
            if not current and env.get(var):
                data[key] = env[var]
        return cls.model_validate({k: v for k, v in data.items() if k in cls.model_fields})


class ModelNotConfiguredError(LLMUnavailableError, ValueError):
    """Normal mode needs a model; the message says exactly what to set.

    An :class:`~saucer.engine.errors.LLMUnavailableError` (so the engine adds
    which plan step needed the model) and a ``ValueError`` (so the CLI prints
    it as a user mistake and exits non-zero).
    """


def _not_configured_message(settings: ModelSettings) -> str:
    missing = []
    if not settings.model:
        missing.append(f"a model name ({ENV_MODEL})")
    if not (settings.base_url or settings.api_key):
        missing.append(f"an endpoint ({ENV_BASE_URL}) or an OpenAI API key ({ENV_API_KEY})")
    return (
        "no OpenAI-compatible model is configured (normal mode and text steps of plans need one): missing "
        + " and ".join(missing)
        + ".\n"
        "Set, in the environment:\n"
        f"  {ENV_MODEL}=<model name>        e.g. gpt-4o-mini, or llama3.1 for Ollama\n"
        f"  {ENV_BASE_URL}=<endpoint URL>   e.g. http://localhost:11434/v1 (Ollama), http://localhost:8000/v1 (vLLM);"
        f" leave unset for {OPENAI_BASE_URL}\n"
        f"  {ENV_API_KEY}=<key>             needed for api.openai.com; local servers accept any value\n"
        "or in saucer.toml:\n"
        "  [llm]\n"
        '  model = "gpt-4o-mini"\n'
        '  base_url = "http://localhost:11434/v1"\n'
        "(plans made only of command steps run without a model)"
    )


def require_model_settings(settings: Any = None, env: Mapping[str, str] | None = None) -> ModelSettings:
    """The resolved model settings; :class:`ModelNotConfiguredError` naming what to set when incomplete."""
    resolved = ModelSettings.from_settings(settings, env)
    if not resolved.configured:
        raise ModelNotConfiguredError(_not_configured_message(resolved))
    return resolved


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
    def from_response(cls, usage: Any) -> "Usage":
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


def request_chars(messages: Sequence[Mapping[str, Any]], tool_schemas: Any = None) -> int:
    """The size of a request's prompt in characters of JSON (what ``chars_per_token`` divides)."""
    size = len(json.dumps(list(messages), ensure_ascii=False))
    if tool_schemas:
        size += len(json.dumps(tool_schemas, ensure_ascii=False))
    return size


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

    async def __aenter__(self) -> "ModelClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def _redact(self, text: str) -> str:
        return redact_text(text)

    def backoff_delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        s = self.settings
        delay = min(s.backoff_max, s.backoff_base * (2 ** (retry - 1)))
        if s.backoff_jitter:
            delay *= 1 - s.backoff_jitter * random.random()
        if retry_after is not None and 0 < retry_after:
            delay = max(delay, min(retry_after, _MAX_RETRY_AFTER))
        return delay

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
        if tools:
            body["tools"] = tools.schemas()
            choice = tool_choice or s.tool_choice
            if choice != "omit":
                body["tool_choice"] = choice
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
            reply = self._reply(response, model_name, tools, latency, attempt)
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

    def _reply(self, response: Any, model: str, tools: ToolSet | None, latency: float, attempts: int) -> ModelReply:
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
            calls.append(ToolCall(raw.id or f"call_{len(calls)}", name, fn.name, arguments, fn.arguments or "{}", error))
        usage = Usage.from_response(getattr(response, "usage", None))
        used_model = getattr(response, "model", None) or model
        # Price by the model we asked for; providers often answer with a dated variant.
        cost = self.prices.cost(model, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
        if cost is None and used_model != model:
            cost = self.prices.cost(used_model, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
        return ModelReply(
            content=message.content,
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
                "prompt": body["messages"],
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
