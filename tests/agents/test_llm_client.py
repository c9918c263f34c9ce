"""The model client against the fake OpenAI-compatible server: requests, tools, retries, cost, logs, secrecy."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from tests.support.fake_openai import FakeOpenAI
from tests.support.llm import SECRET_KEY

from saucer.agents.llm.client import (
    ModelCallError,
    ModelClient,
    ModelNotConfiguredError,
    ModelSettings,
    require_model_settings,
)
from saucer.agents.llm.logs import RequestLogger, read_jsonl
from saucer.agents.llm.tools import ToolSet

TOOL_INFO = {
    "shell.run": {
        "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
    "files.read": {
        "description": "Read a file",
        "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}


def run(coro):
    return asyncio.run(coro)


async def _call(settings, messages, **kw):
    sleep = kw.pop("sleep", None)
    logger = kw.pop("request_logger", None)
    async with ModelClient(settings, sleep=sleep, request_logger=logger) as client:
        return await client.complete(messages, **kw)


# ---------------------------------------------------------------- requests


def test_request_carries_model_messages_tools_and_key(fake: FakeOpenAI, settings: ModelSettings) -> None:
    fake.push(fake.text("hello"))
    tools = ToolSet.from_tool_info(TOOL_INFO)
    reply = run(_call(settings, [{"role": "user", "content": "hi"}], tools=tools))
    assert reply.content == "hello" and reply.is_final
    [req] = fake.requests
    assert req.path == "/v1/chat/completions"
    assert req.json["model"] == "gpt-4o-mini"
    assert req.json["messages"] == [{"role": "user", "content": "hi"}]
    assert req.json["temperature"] == 0.0
    assert req.headers["authorization"] == f"Bearer {SECRET_KEY}"
    by_name = {t["function"]["name"]: t for t in req.json["tools"]}
    assert set(by_name) == {"shell__run", "files__read"}
    assert by_name["shell__run"]["type"] == "function"
    assert by_name["shell__run"]["function"]["description"] == "Run a shell command"
    assert by_name["shell__run"]["function"]["parameters"]["required"] == ["cmd"]
    assert by_name["files__read"]["function"]["parameters"]["properties"] == {"path": {"type": "string"}}


def test_no_tools_means_no_tools_field(fake: FakeOpenAI, settings: ModelSettings) -> None:
    fake.push(fake.text("ok"))
    run(_call(settings, [{"role": "user", "content": "x"}]))
    assert "tools" not in fake.requests[0].json


def test_tool_calls_are_mapped_back_to_saucer_names(fake: FakeOpenAI, settings: ModelSettings) -> None:
    fake.push(fake.tool_calls(("shell.run", {"cmd": "ls"}, "c1"), ("files.read", "{not json", "c2"), usage=(100, 20)))
    tools = ToolSet.from_tool_info(TOOL_INFO)
    reply = run(_call(settings, [{"role": "user", "content": "x"}], tools=tools))
    assert not reply.is_final
    first, second = reply.tool_calls
    assert (first.id, first.name, first.function_name, first.arguments, first.error) == (
        "c1",
        "shell.run",
        "shell__run",
        {"cmd": "ls"},
        None,
    )
    assert second.name == "files.read" and second.arguments == {} and "not valid JSON" in second.error
    message = reply.assistant_message()
    assert message["role"] == "assistant"
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["shell__run", "files__read"]
    assert reply.usage.prompt_tokens == 100 and reply.usage.completion_tokens == 20


def test_tool_name_mapping_is_reversible_even_with_collisions() -> None:
    info = {"a.b": {}, "a__b": {}, "weird server.do-it!": {}, "x." + "y" * 80: {}}
    tools = ToolSet.from_tool_info(info)
    fnames = [s.function_name for s in tools.specs]
    assert len(set(fnames)) == 4
    import re

    assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", f) for f in fnames)
    for spec in tools.specs:
        assert tools.saucer_name(spec.function_name) == spec.name
    assert tools.saucer_name("never__offered") == "never.offered"


# ----------------------------------------------------------------- retries


def test_429_then_200_is_retried_with_backoff(fake: FakeOpenAI, settings: ModelSettings, sleeps) -> None:
    fake.push(fake.error(429, "slow down"), fake.text("ok"))
    reply = run(_call(settings, [{"role": "user", "content": "x"}], sleep=sleeps))
    assert reply.content == "ok" and reply.attempts == 2
    assert len(fake.requests) == 2
    assert sleeps.delays == [pytest.approx(0.01)]


def test_500_then_200_is_retried(fake: FakeOpenAI, settings: ModelSettings, sleeps) -> None:
    fake.push(fake.error(500), fake.error(503), fake.text("ok"))
    reply = run(_call(settings, [{"role": "user", "content": "x"}], sleep=sleeps))
    assert reply.attempts == 3
    assert sleeps.delays == [pytest.approx(0.01), pytest.approx(0.02)]  # exponential


def test_gives_up_after_max_retries_with_a_clear_error(
    fake: FakeOpenAI, settings: ModelSettings, sleeps, tmp_path: Path
) -> None:
    fake.push(*[fake.error(500, "boom")] * 4)
    log = RequestLogger(tmp_path / "request.log")
    with pytest.raises(ModelCallError) as info:
        run(_call(settings, [{"role": "user", "content": "x"}], sleep=sleeps, request_logger=log))
    err = info.value
    assert err.attempts == 4 and err.status == 500 and err.retryable
    text = str(err)
    assert (
        "failed after 4 attempt(s)" in text and "HTTP 500" in text and "gpt-4o-mini" in text and fake.base_url in text
    )
    assert "max_retries" in text
    assert len(fake.requests) == 4
    assert sleeps.delays == [pytest.approx(0.01), pytest.approx(0.02), pytest.approx(0.04)]
    [line] = read_jsonl(tmp_path / "request.log")
    assert line["status"] == "error" and line["attempts"] == 4 and len(line["errors"]) == 4
    assert line["cost"] == 0.0


def test_backoff_is_capped(settings: ModelSettings) -> None:
    client = ModelClient(settings)
    assert [client.backoff_delay(n) for n in (1, 2, 3, 4, 5)] == [0.01, 0.02, 0.04, 0.05, 0.05]
    assert client.backoff_delay(1, retry_after=0.3) == 0.3  # Retry-After honoured
    assert client.backoff_delay(1, retry_after=3600) == 60.0  # but bounded
    run(client.aclose())


def test_jitter_only_shortens_delays(settings: ModelSettings) -> None:
    client = ModelClient(settings.model_copy(update={"backoff_jitter": 0.25}))
    delays = [client.backoff_delay(2) for _ in range(50)]
    assert all(0.015 <= d <= 0.02 for d in delays)
    run(client.aclose())


def test_retry_after_header_is_honoured(fake: FakeOpenAI, settings: ModelSettings, sleeps) -> None:
    fake.push(fake.error(429, headers={"retry-after-ms": "40"}), fake.text("ok"))
    run(_call(settings, [{"role": "user", "content": "x"}], sleep=sleeps))
    assert sleeps.delays == [pytest.approx(0.04)]


def test_client_errors_are_not_retried(fake: FakeOpenAI, settings: ModelSettings, sleeps) -> None:
    fake.push(fake.error(401, "bad key"))
    with pytest.raises(ModelCallError) as info:
        run(_call(settings, [{"role": "user", "content": "x"}], sleep=sleeps))
    assert info.value.attempts == 1 and not info.value.retryable
    assert "HTTP 401" in str(info.value) and "SAUCER_LLM_API_KEY" in str(info.value)
    assert sleeps.delays == [] and len(fake.requests) == 1


def test_timeout_is_retried(fake: FakeOpenAI, settings: ModelSettings, sleeps) -> None:
    fast = settings.model_copy(update={"timeout": 0.3})
    fake.push(fake.slow(fake.text("late"), 1.0), fake.text("on time"))
    reply = run(_call(fast, [{"role": "user", "content": "x"}], sleep=sleeps))
    assert reply.content == "on time" and reply.attempts == 2


def test_timeouts_exhausted_say_so(fake: FakeOpenAI, settings: ModelSettings, sleeps) -> None:
    fast = settings.model_copy(update={"timeout": 0.2, "max_retries": 1})
    fake.push(fake.slow(fake.text("late"), 0.6), fake.slow(fake.text("late"), 0.6))
    with pytest.raises(ModelCallError, match=r"failed after 2 attempt\(s\); last error: timed out after 0.2 s"):
        run(_call(fast, [{"role": "user", "content": "x"}], sleep=sleeps))


def test_connection_refused_is_a_clear_error(settings: ModelSettings, sleeps) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = settings.model_copy(update={"base_url": f"http://127.0.0.1:{port}/v1", "max_retries": 1})
    with pytest.raises(ModelCallError, match="connection error") as info:
        run(_call(dead, [{"role": "user", "content": "x"}], sleep=sleeps))
    assert info.value.attempts == 2


# ------------------------------------------------------------- cost & logs


def test_cost_from_the_price_table(fake: FakeOpenAI, settings: ModelSettings) -> None:
    fake.push(fake.text("ok", usage=(1_000_000, 1_000_000)))
    reply = run(_call(settings, [{"role": "user", "content": "x"}]))
    assert reply.cost == pytest.approx(0.15 + 0.60)  # gpt-4o-mini per 1M in/out


def test_cached_tokens_use_the_cached_price(fake: FakeOpenAI, settings: ModelSettings) -> None:
    fake.push(fake.text("ok", usage=(1_000_000, 0), cached_tokens=500_000))
    reply = run(_call(settings, [{"role": "user", "content": "x"}]))
    assert reply.cost == pytest.approx(0.5 * 0.15 + 0.5 * 0.075)


def test_unknown_model_cost_is_unknown_not_zero(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    local = settings.model_copy(update={"model": "llama3.1:8b"})
    fake.push(fake.text("ok"))
    log = RequestLogger(tmp_path / "request.log")
    reply = run(_call(local, [{"role": "user", "content": "x"}], request_logger=log))
    assert reply.cost is None
    [line] = read_jsonl(tmp_path / "request.log")
    assert line["cost"] is None and line["cost_text"] == "unknown"


def test_price_file_override(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text('[models."llama3.1:8b"]\ninput = 0\noutput = 0\n[models."gpt-4o-mini"]\ninput = 1\noutput = 2\n')
    fake.push(fake.text("a", usage=(1_000_000, 1_000_000)), fake.text("b", usage=(1_000_000, 1_000_000)))
    over = settings.model_copy(update={"price_file": str(prices)})
    assert run(_call(over, [{"role": "user", "content": "x"}])).cost == pytest.approx(3.0)
    local = over.model_copy(update={"model": "llama3.1:8b"})
    assert run(_call(local, [{"role": "user", "content": "x"}])).cost == 0.0


def test_request_log_line(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.push(fake.error(429), fake.tool_calls(("shell.run", {"cmd": "ls"}, "c9"), usage=(200, 30)))
    log = RequestLogger(tmp_path / "logs" / "request.log")
    tools = ToolSet.from_tool_info(TOOL_INFO)

    async def go(sleep):
        async with ModelClient(settings, request_logger=log, sleep=sleep) as c:
            return await c.complete(
                [{"role": "system", "content": "sys"}, {"role": "user", "content": "list"}],
                tools=tools,
                log_fields={"agent": "LinuxAgent", "round": 0, "step": 1},
            )

    async def nosleep(_):
        return None

    run(go(nosleep))
    [line] = read_jsonl(tmp_path / "logs" / "request.log")
    assert line["agent"] == "LinuxAgent" and line["round"] == 0 and line["step"] == 1
    assert line["status"] == "ok" and line["model"] == "gpt-4o-mini" and line["attempts"] == 2
    assert line["prompt"][1] == {"role": "user", "content": "list"}
    assert line["tools"] == ["files.read", "shell.run"]
    assert line["response"]["tool_calls"] == [
        {"id": "c9", "name": "shell.run", "function_name": "shell__run", "arguments": {"cmd": "ls"}}
    ]
    assert line["prompt_tokens"] == 200 and line["completion_tokens"] == 30 and line["usage"]["total_tokens"] == 230
    assert line["cost"] == pytest.approx((200 * 0.15 + 30 * 0.6) / 1e6)
    assert line["latency_ms"] >= 0 and "time" in line


def test_request_logger_can_forward_to_a_logging_logger(tmp_path: Path) -> None:
    records: list[str] = []

    class H(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("saucer.test.request")
    logger.addHandler(H())
    logger.setLevel(logging.INFO)
    RequestLogger(logger=logger).write({"a": 1})
    assert json.loads(records[0])["a"] == 1


# --------------------------------------------------------------- secrecy


def test_the_key_never_appears_in_logs_records_errors_or_reprs(
    fake: FakeOpenAI, settings: ModelSettings, sleeps, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # includes the openai and httpx loggers
    log = RequestLogger(tmp_path / "request.log")
    fake.push(fake.error(500, f"echo {SECRET_KEY}"), fake.text("ok"), fake.error(401, f"bad key {SECRET_KEY}"))
    run(_call(settings, [{"role": "user", "content": "x"}], sleep=sleeps, request_logger=log))
    with pytest.raises(ModelCallError) as info:
        run(_call(settings, [{"role": "user", "content": "x"}], sleep=sleeps, request_logger=log))
    assert fake.requests[0].headers["authorization"].endswith(SECRET_KEY)  # it was sent
    haystack = "\n".join(
        [
            (tmp_path / "request.log").read_text(),
            caplog.text,
            "\n".join(r.getMessage() for r in caplog.records),
            str(info.value),
            repr(settings),
            str(settings.model_dump()),
            settings.model_dump_json(),
            repr(ModelClient(settings)),
        ]
    )
    assert SECRET_KEY not in haystack
    assert "***" in str(info.value)


# ------------------------------------------------------------ configuration


def test_not_configured_says_exactly_what_to_set(no_llm_env) -> None:
    with pytest.raises(ModelNotConfiguredError) as info:
        require_model_settings(None)
    text = str(info.value)
    for needle in ("SAUCER_LLM_MODEL", "SAUCER_LLM_BASE_URL", "SAUCER_LLM_API_KEY", "[llm]", "saucer.toml"):
        assert needle in text
    assert isinstance(info.value, ValueError)  # the CLI's friendly() turns it into one sentence, exit 2


def test_model_without_endpoint_or_key_is_not_configured(no_llm_env, monkeypatch) -> None:
    monkeypatch.setenv("SAUCER_LLM_MODEL", "gpt-4o-mini")
    with pytest.raises(ModelNotConfiguredError, match="missing an endpoint"):
        require_model_settings({})


def test_env_fills_what_settings_leave_unset(no_llm_env, monkeypatch) -> None:
    monkeypatch.setenv("SAUCER_LLM_BASE_URL", "http://127.0.0.1:1/v1")
    monkeypatch.setenv("SAUCER_LLM_MODEL", "env-model")
    monkeypatch.setenv("SAUCER_LLM_API_KEY", "env-key")

    from saucer.config import load_settings

    app = load_settings(overrides={"llm.model": "file-model", "llm.temperature": 0.5})
    s = require_model_settings(app)  # the app's settings: their [llm] section
    assert s.model == "file-model"  # configuration wins
    assert s.base_url == "http://127.0.0.1:1/v1" and s.secret() == "env-key" and s.temperature == 0.5

    class Section:  # an [llm] section as any object with its fields
        model = "file-model"
        base_url = None
        temperature = 0.5

    s = require_model_settings(Section())
    assert s.model == "file-model" and s.base_url == "http://127.0.0.1:1/v1" and s.temperature == 0.5
    assert require_model_settings({"llm": {"model": "m2"}}).model == "m2"


def test_only_a_key_means_api_openai_com(no_llm_env) -> None:
    s = require_model_settings({"model": "gpt-4o", "api_key": "k"})
    assert s.effective_base_url == "https://api.openai.com/v1"


def test_a_model_that_refuses_temperature_is_asked_again_without_it(
    fake: FakeOpenAI, settings: ModelSettings, sleeps
) -> None:
    fake.push(
        fake.error(400, "Unsupported value: 'temperature' does not support 0.0 with this model."),
        fake.text("ok"),
        fake.text("again"),
    )

    async def go():
        async with ModelClient(settings, sleep=sleeps) as client:
            first = await client.complete([{"role": "user", "content": "x"}])
            second = await client.complete([{"role": "user", "content": "y"}])
            return first, second

    first, second = run(go())
    assert first.content == "ok" and first.attempts == 1 and sleeps.delays == []
    assert "temperature" in fake.requests[0].json
    assert "temperature" not in fake.requests[1].json and "temperature" not in fake.requests[2].json


def test_a_response_without_choices_is_a_clear_error(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    from tests.support.fake_openai import Scripted

    fake.push(Scripted(200, {"id": "x", "object": "chat.completion", "created": 0, "choices": []}))
    log = RequestLogger(tmp_path / "request.log")
    with pytest.raises(ModelCallError, match="returned no choices"):
        run(_call(settings, [{"role": "user", "content": "x"}], request_logger=log))
    [line] = read_jsonl(tmp_path / "request.log")
    assert line["status"] == "error" and "no choices" in line["error"]
