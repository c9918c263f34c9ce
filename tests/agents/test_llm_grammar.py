"""Grammar-constrained tool calls (issue 33, item 3): on a llama-server, a step that must act is sent a
JSON schema of exactly one call of one offered tool, and the JSON the model writes becomes the call.

The fake server plays llama-server by answering ``GET /props``; the real one is in
test_llm_conformance.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from tests.support.fake_openai import FakeOpenAI
from tests.support.llm import llm_dispatcher, make_session

from saucer.agents.llm import ModelClient, ModelSettings
from saucer.agents.llm.grammar import response_format, serves_llama_cpp, tool_call_from_content, tool_call_schema
from saucer.agents.llm.logs import read_jsonl
from saucer.agents.llm.tools import ToolSet
from saucer.context import ContextNames

#: What llama-server's /props holds (the part that tells it apart).
LLAMA_PROPS = {"default_generation_settings": {"n_ctx": 8192}, "total_slots": 1, "chat_template": "..."}


def _required(settings: ModelSettings, **update: Any) -> ModelSettings:
    return settings.model_copy(update={"tool_choice": "required", **update})


def _schema_names(request: Any) -> list[str]:
    schema = request.json["response_format"]["json_schema"]["schema"]
    options = schema.get("oneOf", [schema])
    return [option["properties"]["name"]["const"] for option in options]


def test_on_llama_server_a_required_step_is_constrained_and_its_json_is_the_call(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    fake.props = LLAMA_PROPS
    fake.push(
        fake.text('{"name": "shell__run", "arguments": {"cmd": "ls"}}'),
        fake.text('```json\n{"name": "finish", "arguments": {"summary": "listed the files"}}\n```'),
    )
    dispatcher = llm_dispatcher()
    session = make_session(tmp_path, _required(settings), dispatcher=dispatcher)
    result = asyncio.run(session.run())
    assert result.status == "finished", result
    assert session.context.get(ContextNames.ROUND_RESULT) == "listed the files"
    assert [(c.tool_name, c.parameters) for c in dispatcher.ran] == [("shell.run", {"cmd": "ls"})]
    first, second = fake.requests
    assert fake.gets == ["/props"]  # asked once per client
    for request in (first, second):
        assert request.json["response_format"]["type"] == "json_schema"
        assert request.json["tools"] and request.json["tool_choice"] == "required"  # still OpenAI's fields
        assert set(_schema_names(request)) == set(request.tool_names)  # exactly the offered tools
    assert "finish" not in _schema_names(first) and "finish" in _schema_names(second)
    # the JSON went back as an ordinary tool call, with its result under the same id
    turn, answer = second.messages[-2:]
    [call] = turn["tool_calls"]
    assert turn["content"] == "" and call["id"].startswith("call_") and answer["tool_call_id"] == call["id"]
    assert call["function"] == {"name": "shell__run", "arguments": '{"cmd": "ls"}'}
    lines = read_jsonl(Path(result.log_path) / "request.log")
    assert [line["response_format"] for line in lines if line["agent"] == "app"] == ["json_schema", "json_schema"]


def test_other_servers_keep_openais_behaviour(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.push(fake.tool_calls(("shell.run", {"cmd": "ls"})), fake.tool_calls(("finish", {"summary": "done"})))
    result = asyncio.run(make_session(tmp_path, _required(settings)).run())
    assert result.status == "finished", result
    assert fake.gets == ["/props"] and all("response_format" not in r.json for r in fake.requests)
    fake.reset()
    fake.push(fake.tool_calls(("shell.run", {"cmd": "ls"})), fake.text("done"))
    fake.props = LLAMA_PROPS
    assert asyncio.run(make_session(tmp_path, settings).run()).status == "finished"  # tool_choice auto
    assert fake.gets == [] and all("response_format" not in r.json for r in fake.requests)  # never asked


@pytest.mark.parametrize(("mode", "props", "constrained"), [("on", None, True), ("off", LLAMA_PROPS, False)])
def test_tool_grammar_on_and_off_need_no_question(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path, mode: str, props: Any, constrained: bool
) -> None:
    fake.props = props
    tools = ToolSet.from_tool_info({"shell.run": {"input_schema": {"type": "object"}}})

    async def go() -> None:
        async with ModelClient(_required(settings, tool_grammar=mode)) as client:
            await client.complete([{"role": "user", "content": "hi"}], tools=tools)

    fake.push(fake.text('{"name": "shell__run", "arguments": {}}'))
    asyncio.run(go())
    assert fake.gets == [] and ("response_format" in fake.requests[0].json) is constrained


def test_a_constrained_reply_that_is_not_a_call_stays_text(fake: FakeOpenAI, settings: ModelSettings) -> None:
    """Cut off at max_tokens (unfinished JSON): no call is made up; the reply is cut off, never an answer."""
    fake.props = LLAMA_PROPS
    tools = ToolSet.from_tool_info({"shell.run": {"input_schema": {"type": "object"}}})
    cut = '{"name": "shell__run", "arguments": {"cmd": "echo hello hello hel'
    fake.push(fake.text(cut, finish_reason="length"))

    async def go() -> Any:
        async with ModelClient(_required(settings)) as client:
            return await client.complete([{"role": "user", "content": "hi"}], tools=tools)

    reply = asyncio.run(go())
    assert reply.tool_calls == [] and reply.content == cut and reply.truncated


def test_the_schema_is_one_call_of_one_tool() -> None:
    tools = ToolSet.from_tool_info(
        {
            "files.write": {
                "input_schema": {
                    "type": "object",
                    "properties": {"path": {"$ref": "#/$defs/Path"}, "content": {"type": "string"}},
                    "required": ["path", "content"],
                    "$defs": {"Path": {"type": "string", "description": "relative"}},
                }
            },
            "shell.run": {"input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
        }
    )
    schema = tool_call_schema(tools)
    write, run = schema["oneOf"]
    assert write["properties"]["name"] == {"const": "files__write"} and write["required"] == ["name", "arguments"]
    arguments = write["properties"]["arguments"]
    assert arguments["properties"]["path"] == {"type": "string", "description": "relative"}  # $ref inlined
    assert "$defs" not in json.dumps(schema) and "$ref" not in json.dumps(schema)
    assert arguments["additionalProperties"] is False and write["additionalProperties"] is False
    assert run["properties"]["name"] == {"const": "shell__run"}
    assert tool_call_schema(tools.without("files__write")) == run  # one tool: no oneOf
    assert response_format(tools)["json_schema"]["schema"] == schema
    with pytest.raises(ValueError, match="at least one tool"):
        tool_call_schema(ToolSet())


def test_a_recursive_ref_is_cut_not_followed_forever() -> None:
    node = {"type": "object", "properties": {"child": {"$ref": "#/$defs/Node"}}}
    tools = ToolSet.from_tool_info(
        {"tree.put": {"input_schema": {"type": "object", "properties": {"root": node}, "$defs": {"Node": node}}}}
    )
    text = json.dumps(tool_call_schema(tools))
    assert "$ref" not in text and text.count('"child"') == 9  # the root's, then 8 levels inlined, then "any"


@pytest.mark.parametrize(
    "content",
    [
        "I will list the files.",  # prose (a server that ignored the schema)
        '{"name": "rm_rf", "arguments": {}}',  # a tool never offered
        '{"name": "shell__run", "arguments": "ls"}',  # arguments not an object
        '["shell__run"]',
        "",
        None,
    ],
)
def test_what_is_not_a_call_of_an_offered_tool_is_no_call(content: str | None) -> None:
    tools = ToolSet.from_tool_info({"shell.run": {"input_schema": {"type": "object"}}})
    assert tool_call_from_content(content, tools) is None


def test_a_closed_port_or_another_server_is_not_a_llama_server(fake: FakeOpenAI) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once the socket is closed
    assert asyncio.run(serves_llama_cpp(f"http://127.0.0.1:{port}/v1", timeout=2)) is False
    assert asyncio.run(serves_llama_cpp(fake.base_url)) is False  # 404
    fake.props = {"model": "not llama-server"}
    assert asyncio.run(serves_llama_cpp(fake.base_url)) is False
    fake.props = LLAMA_PROPS
    assert asyncio.run(serves_llama_cpp(fake.base_url + "/")) is True
