"""The ``[llm]`` settings of normal mode: where the model is and how to call it.

They come from the ``[llm]`` section of the configuration, with
``SAUCER_LLM_BASE_URL``, ``SAUCER_LLM_API_KEY`` and ``SAUCER_LLM_MODEL`` filling
what the configuration leaves unset. :func:`require_model_settings` says
exactly what to set when something is missing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from saucer.engine.errors import LLMUnavailableError

__all__ = [
    "ENV_BASE_URL",
    "ENV_API_KEY",
    "ENV_MODEL",
    "OPENAI_BASE_URL",
    "ToolChoice",
    "ToolGrammar",
    "ModelSettings",
    "ModelNotConfiguredError",
    "not_configured_message",
    "require_model_settings",
]

ENV_BASE_URL = "SAUCER_LLM_BASE_URL"
ENV_API_KEY = "SAUCER_LLM_API_KEY"
ENV_MODEL = "SAUCER_LLM_MODEL"
OPENAI_BASE_URL = "https://api.openai.com/v1"
#: ``auto`` and ``required`` are sent as they are; ``omit`` sends no ``tool_choice`` (a server that rejects it).
ToolChoice = Literal["auto", "required", "omit"]
#: ``auto``: constrain a required tool call where the endpoint is a llama-server; ``on``: on any server; ``off``: never.
ToolGrammar = Literal["auto", "on", "off"]


class ModelSettings(BaseModel):
    """The ``[llm]`` settings: where the model is and how to call it."""

    model_config = ConfigDict(extra="ignore")

    base_url: str | None = Field(None, description="OpenAI-compatible endpoint, e.g. http://localhost:11434/v1")
    api_key: SecretStr | None = Field(None, description="API key (prefer SAUCER_LLM_API_KEY)")
    model: str | None = Field(None, description="model name, e.g. gpt-4o-mini or llama3.1")
    temperature: float | None = Field(0.0, ge=0.0, le=2.0)
    max_tokens: int | None = Field(1024, gt=0, description="most tokens generated per call (bounds a runaway reply)")
    tool_choice: ToolChoice = Field("auto", description="sent with the tools: auto, required, or omit (not sent)")
    tool_grammar: ToolGrammar = Field(
        "auto",
        description="constrain a required tool call with a JSON-schema grammar: auto (on a llama-server), on, off",
    )
    context_window: int | None = Field(8192, ge=256, description="tokens the model's context holds; trimmed to fit")
    token_budget: int | None = Field(None, gt=0, description="most tokens the agents may use in one session")
    no_action_retries: int = Field(
        2, ge=0, description="times the agent is asked again after a reply with no tool call"
    )
    tool_description_chars: int = Field(160, ge=0, description="tool descriptions are cut to this length (0: whole)")
    timeout: float = Field(60.0, gt=0, description="seconds per request attempt")
    max_retries: int = Field(3, ge=0, description="retries after the first attempt")
    backoff_base: float = Field(0.5, ge=0, description="first retry delay in seconds; doubles each retry")
    backoff_max: float = Field(8.0, ge=0)
    backoff_jitter: float = Field(0.25, ge=0, le=1, description="delays are reduced by up to this fraction")
    price_file: str | None = Field(None, description="JSON/TOML price table overriding the shipped one")
    prompt_templating: bool = Field(False, description="render {var} context variables in system prompts")
    hidden_vars: list[str] = Field(default_factory=list, description="context variables never rendered into a prompt")
    agent: Literal["single", "host"] = Field(
        "single", description="'single' (one tool-using agent) or 'host' (host → app agents)"
    )
    max_consecutive_failures: int = Field(3, ge=1)
    judge_model: str | None = Field(None, description="model of the evaluation agent (default: model)")
    system_prompt: str | None = Field(None, description="extra instructions appended to the agent's system prompt")
    ask_user: bool = Field(True, description="offer the ask_user tool: the model may ask the user a question")

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
    def from_settings(cls, settings: Any = None, env: Mapping[str, str] | None = None) -> ModelSettings:
        """Resolve from the app settings (``settings.llm``), an ``[llm]`` mapping or object, or None.

        The configuration wins for what it sets (it already merged file,
        environment and flags); ``SAUCER_LLM_*`` fill what it leaves unset.
        """
        env = os.environ if env is None else env
        if isinstance(settings, ModelSettings):
            data = settings.model_dump()
            data["api_key"] = settings.api_key
        else:
            from saucer.config import SettingsModel  # the app's settings: their [llm] section

            section = settings.llm if isinstance(settings, SettingsModel) else settings
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


def not_configured_message(settings: ModelSettings) -> str:
    """What to set, in the environment or in ``saucer.toml``, for what ``settings`` lack."""
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
        raise ModelNotConfiguredError(not_configured_message(resolved))
    return resolved
