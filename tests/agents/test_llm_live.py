"""Opt-in: the client and a one-round session against a real OpenAI-compatible endpoint.

    SAUCER_TEST_LLM_BASE_URL=http://localhost:11434/v1 SAUCER_TEST_LLM_MODEL=llama3.1 \\
        .venv/bin/python -m pytest tests/agents/test_llm_live.py -q

``SAUCER_TEST_LLM_API_KEY`` is optional (local servers accept any key);
``SAUCER_TEST_LLM_MODEL`` defaults to ``gpt-4o-mini``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from tests.support.llm import llm_dispatcher, make_session

from saucer.agents.llm import ModelClient, ModelSettings
from saucer.agents.llm.logs import read_jsonl
from saucer.agents.llm.tools import ToolSet

BASE_URL = os.environ.get("SAUCER_TEST_LLM_BASE_URL", "")

pytestmark = pytest.mark.skipif(
    not BASE_URL,
    reason="live LLM test: set SAUCER_TEST_LLM_BASE_URL (and SAUCER_TEST_LLM_MODEL, SAUCER_TEST_LLM_API_KEY) to run it",
)


@pytest.fixture
def live() -> ModelSettings:
    return ModelSettings(
        base_url=BASE_URL,
        api_key=os.environ.get("SAUCER_TEST_LLM_API_KEY") or None,
        model=os.environ.get("SAUCER_TEST_LLM_MODEL", "gpt-4o-mini"),
        timeout=120,
        max_retries=2,
    )


@pytest.mark.timeout(300)
def test_live_tool_call(live: ModelSettings) -> None:
    tools = ToolSet.from_tool_info(
        {
            "clock.now": {
                "description": "The current date and time",
                "input_schema": {"type": "object", "properties": {}},
            }
        }
    )

    async def go():
        async with ModelClient(live) as client:
            return await client.complete([{"role": "user", "content": "What time is it? Use the tool."}], tools=tools)

    reply = asyncio.run(go())
    assert reply.usage.total_tokens > 0
    assert reply.tool_calls or reply.content


@pytest.mark.timeout(300)
def test_live_session(live: ModelSettings, tmp_path: Path) -> None:
    dispatcher = llm_dispatcher()
    session = make_session(
        tmp_path,
        live,
        request="Read the file notes.txt with the files.read tool, then say you are done.",
        dispatcher=dispatcher,
        max_step=6,
    )
    result = asyncio.run(session.run())
    assert result.status in ("finished", "stopped", "failed"), result
    lines = read_jsonl(Path(result.log_path) / "request.log")
    assert lines and all(line["status"] == "ok" for line in lines)
