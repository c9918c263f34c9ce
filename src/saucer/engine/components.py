"""The agents and evaluator a session runs, loaded from what the settings name.

The engine names only protocols: :class:`~saucer.engine.agent.Agent`,
:class:`~saucer.engine.evaluation.Evaluator` and
:class:`~saucer.engine.agent.AgentProvider`. Which classes fill them is a
setting (``[agents]`` in ``saucer.toml``, :class:`saucer.config.AgentsSettings`),
``package.module:attribute`` each, saucer's own agents by default. The
factory (:class:`~saucer.engine.factory.SessionFactory`) and a session made
without one both load them here, when first needed, so a session that never
meets a plan step never loads the follower, and one that is never judged never
loads an evaluator.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from saucer.engine.errors import EngineError, LLMUnavailableError

if TYPE_CHECKING:
    from saucer.config import SettingsModel

__all__ = [
    "ComponentError",
    "load_component",
    "new_follower",
    "new_evaluator",
    "create_agent_provider",
    "create_operator_provider",
]

LLM_SETTINGS_HINT = (
    "set SAUCER_LLM_MODEL (and SAUCER_LLM_BASE_URL for a local server, SAUCER_LLM_API_KEY for a hosted one), "
    "or [llm] model/base_url/api_key in saucer.toml"
)


class ComponentError(EngineError):
    """A component named in ``[agents]`` cannot be loaded; the message names the setting and the path."""


def load_component(path: str, setting: str) -> Any:
    """The object ``path`` (``package.module:attribute``) names; :class:`ComponentError` saying why not.

    ``setting`` (e.g. ``agents.follower``) is named in the error.
    """
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ComponentError(f"{setting} = {path!r} must look like 'package.module:attribute'")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ComponentError(f"{setting} = {path!r}: module {module_name!r} cannot be imported ({exc})") from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ComponentError(f"{setting} = {path!r}: {module_name!r} has no attribute {attribute!r}") from None
    return target


def new_follower(settings: SettingsModel) -> Any:
    """A new follower agent: ``agents.follower`` called with no arguments."""
    return load_component(settings.agents.follower, "agents.follower")()


def new_evaluator(settings: SettingsModel) -> Any:
    """A new evaluator: ``agents.evaluator`` called with no arguments."""
    return load_component(settings.agents.evaluator, "agents.evaluator")()


def create_agent_provider(settings: SettingsModel) -> Any:
    """The LLM agents for requests: ``agents.provider(settings)``.

    :class:`~saucer.engine.errors.LLMUnavailableError` saying what to set when the
    provider is missing from this installation or the model is not configured.
    """
    create = _load_provider(settings.agents.provider, "agents.provider")
    try:
        return create(settings)
    except ValueError as exc:  # the model is not configured: the message says what to set
        raise LLMUnavailableError(str(exc)) from exc


def create_operator_provider(settings: SettingsModel, mode: str) -> Any:
    """The computer-use agent of ``operator`` / ``normal_operator`` mode: ``agents.operator(settings, mode=mode)``."""
    create = _load_provider(settings.agents.operator, "agents.operator")
    try:
        return create(settings, mode=mode)
    except ValueError as exc:  # the model is not configured: the message says what to set
        raise LLMUnavailableError(f"{mode} mode needs a model that takes images: {exc}") from exc


def _load_provider(path: str, setting: str) -> Any:
    module_name = path.partition(":")[0]
    try:
        return load_component(path, setting)
    except ComponentError as exc:
        cause = exc.__context__
        if isinstance(cause, ModuleNotFoundError) and cause.name is not None and module_name.startswith(cause.name):
            raise LLMUnavailableError(
                f"this request needs an LLM agent, but the LLM agent ({module_name}) is not available "
                f"in this installation; once it is, {LLM_SETTINGS_HINT}"
            ) from None
        raise LLMUnavailableError(f"the LLM agent could not be loaded ({exc}); {LLM_SETTINGS_HINT}") from None
