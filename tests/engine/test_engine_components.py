"""[agents]: the follower, the evaluator and the LLM provider are named by the settings, never by the engine."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.support.engine import command_plan
from tests.support.fakes import FakeDispatcher

from saucer.agents.follower import FollowerAgent
from saucer.config import ConfigError, load_settings
from saucer.context import Context
from saucer.engine import AgentStatus, Evaluation, LLMUnavailableError, Session, SessionFactory
from saucer.engine.components import ComponentError, load_component
from saucer.store.memory import MemoryStore


class CountingFollower(FollowerAgent):
    """saucer's follower, counting the steps it ran (named by agents.follower below)."""

    steps = 0

    async def act(self, context: Context) -> AgentStatus:
        type(self).steps += 1
        return await super().act(context)


class SkepticalEvaluator:
    """Never sure (named by agents.evaluator below)."""

    name = "skeptic"

    def evaluate(self, context: Context, *, scope: str, round_id: int | None = None) -> Evaluation:
        return Evaluation(scope=scope, round=round_id, complete="unsure", reason="never sure")


def test_the_defaults_are_saucers_own_agents(settings: Any) -> None:
    assert settings.agents.follower == "saucer.agents.follower:FollowerAgent"
    assert settings.agents.evaluator == "saucer.agents.evaluator:RuleEvaluator"
    assert settings.agents.provider == "saucer.agents.llm:create_agent_provider"
    assert load_component(settings.agents.follower, "agents.follower") is FollowerAgent


def test_a_follower_and_an_evaluator_named_in_the_settings_run(make_settings: Any) -> None:
    CountingFollower.steps = 0
    settings = make_settings(
        **{
            "agents.follower": f"{__name__}:CountingFollower",
            "agents.evaluator": f"{__name__}:SkepticalEvaluator",
            "system.eva_session": True,
        }
    )
    result = asyncio.run(
        Session("named", mode="follower", settings=settings, plan=command_plan(3), dispatcher=FakeDispatcher()).run()
    )
    assert result.status == "finished"
    assert CountingFollower.steps == 3
    [verdict] = result.evaluations
    assert (verdict.scope, verdict.complete, verdict.evaluator) == ("session", "unsure", "skeptic")


def test_the_factory_reads_the_same_settings(make_settings: Any) -> None:
    CountingFollower.steps = 0
    settings = make_settings(**{"agents.follower": f"{__name__}:CountingFollower"})
    dispatcher = FakeDispatcher()
    with SessionFactory(settings, store=MemoryStore(), dispatcher_factory=lambda s: dispatcher) as factory:
        [session] = factory.create_session("t", "follower", plan=command_plan(2))
        assert asyncio.run(session.run()).status == "finished"
    assert CountingFollower.steps == 2


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("no_such_module_here:Agent", "module 'no_such_module_here' cannot be imported"),
        ("saucer.agents.follower:NoSuchAgent", "has no attribute 'NoSuchAgent'"),
    ],
)
def test_a_follower_that_cannot_be_loaded_is_an_error_naming_the_setting(
    make_settings: Any, path: str, says: str
) -> None:
    settings = make_settings(**{"agents.follower": path})
    session = Session("broken", mode="follower", settings=settings, plan=command_plan(1), dispatcher=FakeDispatcher())
    result = asyncio.run(session.run())
    assert result.status == "error"
    assert result.error is not None and f"agents.follower = {path!r}" in result.error and says in result.error
    with pytest.raises(ComponentError, match="agents.follower"):
        load_component(path, "agents.follower")


def test_a_provider_missing_from_the_installation_says_what_to_set(make_settings: Any) -> None:
    settings = make_settings(**{"agents.provider": "saucer_llm_not_installed.agents:create_agent_provider"})
    with SessionFactory(settings, store=MemoryStore()) as factory, pytest.raises(LLMUnavailableError) as info:
        factory.create_session("t", "normal", request="tidy my notes")
    message = str(info.value)
    assert "(saucer_llm_not_installed.agents) is not available in this installation" in message
    assert "SAUCER_LLM_MODEL" in message


def test_a_malformed_path_is_a_config_error_naming_the_key(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="agents.follower"):
        load_settings(overrides={"agents.follower": "not a path", "store.url": "memory://"})
