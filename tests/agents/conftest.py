"""Fixtures: one fake OpenAI-compatible server per test module, reset for every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.support.fake_openai import FakeOpenAI
from tests.support.llm import SECRET_KEY

from saucer.agents.llm.client import ModelSettings  # noqa: E402


@pytest.fixture(scope="module")
def _fake_server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def fake(_fake_server: FakeOpenAI) -> Iterator[FakeOpenAI]:
    _fake_server.reset()
    yield _fake_server
    _fake_server.reset()


@pytest.fixture
def settings(fake: FakeOpenAI) -> ModelSettings:
    """Settings pointing at the fake server, with fast deterministic backoff."""
    return ModelSettings(
        base_url=fake.base_url,
        api_key=SECRET_KEY,
        model="gpt-4o-mini",
        timeout=5.0,
        max_retries=3,
        backoff_base=0.01,
        backoff_max=0.05,
        backoff_jitter=0.0,
    )


class SleepRecorder:
    """An async sleep that records the delays and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def sleeps() -> SleepRecorder:
    return SleepRecorder()


@pytest.fixture
def no_llm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SAUCER_LLM_BASE_URL", "SAUCER_LLM_API_KEY", "SAUCER_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
