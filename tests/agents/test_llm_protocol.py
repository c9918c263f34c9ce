"""What normal mode sends and how it reads replies, against the fake OpenAI-compatible server.

tool_choice, content "" on tool-call turns, max_tokens, replies cut off at
max_tokens, replies with no tool call (no_action), the session's token budget,
and the conversation trimmed to the context window. The same behaviours are
checked against a real llama-server in test_llm_conformance.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from tests.support.fake_openai import FakeOpenAI
from tests.support.llm import llm_dispatcher, make_session

from saucer.agents.llm import LinuxAgent, ModelClient, ModelSettings
from saucer.agents.llm.agent import TOKENS_VAR
from saucer.agents.llm.logs import read_jsonl
from saucer.agents.llm.single import LEGACY_SINGLE_AGENT
from saucer.context import Context, ContextNames
from saucer.engine.logs import read_step_log


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def ms(settings: ModelSettings, **update: Any) -> ModelSettings:
    return settings.model_copy(update=update)


def act(cmd: str = "ls", call_id: str | None = None, **kw: Any) -> Any:
    call = ("shell.run", {"cmd": cmd}, call_id) if call_id else ("shell.run", {"cmd": cmd})
    return FakeOpenAI.tool_calls(call, **kw)


# ---------------------------------------------------------------- tool_choice


def test_tool_choice_auto_and_max_tokens_by_default(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.push(act(), fake.text("done"))
    result = run(make_session(tmp_path, settings).run())
    assert result.status == "finished"
    for request in fake.requests:
        assert request.json["tool_choice"] == "auto" and request.json["max_tokens"] == 1024
        assert request.tool_names and "finish" not in request.tool_names


def test_tool_choice_and_max_tokens_are_configurable(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.push(act(), fake.text("done"))
    run(make_session(tmp_path, ms(settings, tool_choice="omit", max_tokens=77)).run())
    assert all("tool_choice" not in r.json and r.json["max_tokens"] == 77 for r in fake.requests)


def test_required_offers_a_finish_tool_that_ends_the_work(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    fake.push(act(call_id="c1"), fake.tool_calls(("finish", {"summary": "listed the files"}, "f1")))
    session = make_session(tmp_path, ms(settings, tool_choice="required"))
    result = run(session.run())
    assert result.status == "finished", result
    assert session.context.get(ContextNames.ROUND_RESULT) == "listed the files"
    first, second = fake.requests
    assert (
        first.json["tool_choice"] == "required" and "call finish with a short summary" in first.messages[0]["content"]
    )
    # finish is offered once a tool call was tried: before, the step must act
    assert "finish" not in first.tool_names and "finish" in second.tool_names


def test_required_finish_before_any_action_is_no_action(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    fake.push(
        fake.tool_calls(("finish", {"summary": "all good"}, "f1")),
        fake.tool_calls(("finish", {"summary": "all good"}, "f2")),
    )
    result = run(make_session(tmp_path, ms(settings, tool_choice="required", no_action_retries=1)).run())
    assert result.status == "failed" and "no_action" in result.reason, result
    # the finish call got its tool message before the reminder (a dangling call is refused by servers)
    second = fake.requests[1].messages
    assert [m["role"] for m in second[-3:]] == ["assistant", "tool", "user"]
    assert second[-2]["tool_call_id"] == "f1" and "without calling a tool" in second[-1]["content"]


def test_finish_among_other_calls_is_answered_not_run(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    fake.push(
        fake.tool_calls(("shell.run", {"cmd": "ls"}, "c1"), ("finish", {"summary": "x"}, "f1")),
        fake.tool_calls(("finish", {"summary": "done"}, "f2")),
    )
    dispatcher = llm_dispatcher()
    result = run(make_session(tmp_path, ms(settings, tool_choice="required"), dispatcher=dispatcher).run())
    assert result.status == "finished" and [c.tool_name for c in dispatcher.ran] == ["shell.run"]
    answers = {m["tool_call_id"]: m["content"] for m in fake.requests[1].messages if m["role"] == "tool"}
    assert answers["f1"].startswith("not finished")


# ------------------------------------------------------- content "" on the wire


def test_tool_call_turns_are_sent_with_empty_content_even_when_stored_null(
    fake: FakeOpenAI, settings: ModelSettings
) -> None:
    fake.push(fake.text("ok"))
    stored = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "shell__run", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "a", "content": "x"},
    ]

    async def go() -> None:
        async with ModelClient(settings) as client:
            await client.complete(stored)

    run(go())
    assert (
        fake.requests[0].messages[1]["content"] == "" and stored[1]["content"] is None
    )  # the caller's copy is untouched


def test_max_completion_tokens_for_models_that_refuse_max_tokens(fake: FakeOpenAI, settings: ModelSettings) -> None:
    fake.push(
        fake.error(
            400,
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
        ),
        fake.text("a"),
        fake.text("b"),
    )

    async def go() -> None:
        async with ModelClient(settings) as client:
            await client.complete([{"role": "user", "content": "hi"}])
            await client.complete([{"role": "user", "content": "again"}])

    run(go())
    first, second, third = (r.json for r in fake.requests)
    assert first["max_tokens"] == 1024 and "max_completion_tokens" not in first
    assert second["max_completion_tokens"] == 1024 and "max_tokens" not in second
    assert third["max_completion_tokens"] == 1024  # remembered for the model


# ------------------------------------------------------ finish_reason "length"


def test_a_cut_off_reply_is_asked_for_once_more_and_never_kept(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    fake.push(
        fake.text("I will now list the fi", finish_reason="length", usage=(10, 1024)),
        act(call_id="c1"),
        fake.text("two files"),
    )
    session = make_session(tmp_path, settings)
    result = run(session.run())
    assert result.status == "finished" and result.steps == 2, result
    retry = fake.requests[1].messages
    assert retry[-1]["role"] == "user" and "cut off at the token limit (1024 tokens)" in retry[-1]["content"]
    assert all("I will now list" not in (m.get("content") or "") for m in retry)  # the cut-off text is discarded
    # the note is not part of the kept conversation: the next call continues from the request
    assert all("cut off" not in (m.get("content") or "") for m in fake.requests[2].messages)
    step = list(read_step_log(result.log_path))[0]
    assert step.extra["cut_off"] == 1024 and step.extra["tokens"] == {"prompt": 20, "completion": 1029}


def test_a_reply_cut_off_twice_fails_the_step_clearly(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    cut = lambda: fake.tool_calls(("shell.run", '{"cmd": "ec'), finish_reason="length")  # noqa: E731 - half a call
    fake.push(cut(), cut())
    dispatcher = llm_dispatcher()
    result = run(make_session(tmp_path, ms(settings, max_tokens=50), dispatcher=dispatcher).run())
    assert result.status == "error" and dispatcher.ran == []
    assert "cut off at the token limit twice" in result.error and "max_tokens 50" in result.error
    assert len(fake.requests) == 2


# ------------------------------------------------------------------ no action


def test_a_prose_reply_before_any_action_is_asked_again_then_no_action(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    fake.push(fake.text("Hello!"), fake.text("Hello again!"), fake.text("Hi."))
    session = make_session(tmp_path, settings)  # no_action_retries = 2
    result = run(session.run())
    assert result.status == "failed" and result.rounds == 1, result
    assert result.reason.startswith("round 0 no_action: no action: the model answered without calling a tool")
    assert result.reason.endswith("even after 2 reminder(s): 'Hi.'")  # one line, quoted
    reminders = [
        m for m in fake.requests[2].messages if m["role"] == "user" and "without calling a tool" in m["content"]
    ]
    assert len(reminders) == 2 and len(fake.requests) == 3
    steps = list(read_step_log(result.log_path))
    assert [s.status for s in steps] == ["CONTINUE", "CONTINUE", "NO_ACTION"]
    assert steps[0].extra["asked_again"] == 1
    ctx = session.context
    assert ctx.get(ContextNames.PREVIOUS_SUBTASKS)[-1]["status"] == "NO_ACTION"
    ends = [e.meta for e in ctx.store.read(ctx.session_id) if e.meta.get("kind") == "round_end"]
    assert ends[-1]["round_status"] == "no_action"


def test_a_prose_reply_after_an_action_is_the_answer(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.push(fake.text("Let me look."), act(), fake.text("two files"))
    result = run(make_session(tmp_path, settings).run())
    assert result.status == "finished" and result.steps == 3


def test_a_prose_reply_after_failed_calls_only_is_a_failure(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    fake.push(fake.tool_calls(("files.read", {"path": "x"})), fake.text("Done, the file is fine."))
    result = run(make_session(tmp_path, settings, dispatcher=llm_dispatcher(fail=("files.read",))).run())
    assert result.status == "failed" and "nothing was done" in result.reason and "the file is fine" in result.reason


def test_the_app_agent_reports_no_action_to_the_host(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.push(
        fake.tool_calls(("assign_subtask", {"subtask": "say hi"}, "as1")),
        fake.text("hi"),  # the app agent, no tool call, no reminders allowed
        fake.text("The app agent did nothing."),
    )
    result = run(make_session(tmp_path, ms(settings, agent="host", no_action_retries=0)).run())
    report = [m for m in fake.requests[2].messages if m["role"] == "tool"][0]["content"]
    assert report.startswith("NO_ACTION: no action")
    assert result.status == "failed" and "no subtask was done" in result.reason


# --------------------------------------------------------------- token budget


def test_the_token_budget_stops_the_session(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.responder = lambda req: act(usage=(600, 100)).body
    session = make_session(tmp_path, ms(settings, token_budget=1500), max_step=20)
    result = run(session.run())
    # 700 tokens a call: after the third call 2100 >= 1500, so the fourth step stops before calling
    assert result.status == "stopped", result
    assert len(fake.requests) == 3 and result.steps == 4
    assert (
        result.reason
        == "token budget reached: the session's agents used 2100 tokens of the 1500 allowed ([llm] token_budget)"
    )
    assert session.context.get_var(TOKENS_VAR) == 2100
    ends = [e.meta for e in session.context.store.read(session.context.session_id) if e.meta.get("kind") == "round_end"]
    assert ends[-1]["round_status"] == "stopped"


def test_a_server_without_usage_still_spends_the_budget(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    fake.responder = lambda req: act(usage=None).body
    session = make_session(tmp_path, ms(settings, token_budget=400), max_step=20)
    result = run(session.run())
    assert result.status == "stopped" and "token budget reached" in result.reason
    assert 1 <= len(fake.requests) < 20  # estimated from the request's size, never counted as 0
    assert list(read_step_log(result.log_path))[0].extra["tokens_estimated"] is True


def test_the_token_budget_counts_across_rounds(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    from saucer.engine.interactor import NonInteractiveInteractor

    fake.push(act(usage=(400, 100)), fake.text("one", usage=(400, 100)))
    interactor = NonInteractiveInteractor(requests=["second request"])
    result = run(make_session(tmp_path, ms(settings, token_budget=1000), interactor=interactor).run())
    assert result.status == "stopped" and result.rounds == 2 and len(fake.requests) == 2


# ------------------------------------------------------------- context window


def test_a_long_conversation_is_trimmed_to_the_window_and_kept_whole(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    big = "x" * 3000
    # usage as a real server counts it (about 4 characters a token), so the estimate calibrates itself
    fake.responder = lambda req: act(f"echo {len(req.messages)}", usage=(len(req.raw) // 4, 5)).body
    dispatcher = llm_dispatcher()
    session = make_session(
        tmp_path,
        ms(settings, context_window=2048, max_tokens=256),
        request="fill the window",
        dispatcher=dispatcher,
        max_step=8,
    )
    dispatcher.outcomes = {}
    original = dispatcher.execute_commands

    async def verbose(commands: Any, timeout: float | None = None) -> Any:
        results = await original(commands, timeout)
        for r in results:
            r.result = {"out": big}
        return results

    dispatcher.execute_commands = verbose  # type: ignore[method-assign]
    result = run(session.run())
    assert result.status == "stopped"  # max_step
    last = fake.requests[-1]
    sent = last.messages
    # kept: the system prompt, the request (with a note of what was left out), the latest tool turn
    assert sent[0]["role"] == "system" and sent[1]["role"] == "user"
    assert sent[1]["content"].startswith("Request: fill the window")
    assert (
        "earlier message(s) of this conversation were left out" in sent[1]["content"]
        and "shell__run x" in sent[1]["content"]
    )
    assert (
        sent[-2]["role"] == "assistant"
        and sent[-1]["role"] == "tool"
        and sent[-1]["tool_call_id"] == sent[-2]["tool_calls"][0]["id"]
    )
    assert len(last.raw) // 4 <= 2048 - 256  # the prompt leaves room for max_tokens
    # every tool message sent still has its call (a dangling tool result is refused by servers)
    call_ids = {c["id"] for m in sent if m["role"] == "assistant" for c in m.get("tool_calls") or ()}
    assert all(m["tool_call_id"] in call_ids for m in sent if m["role"] == "tool")
    # the stored conversation is whole: the audit trail keeps every message
    stored = session.context.get_var("_llm.app.messages")
    assert len(stored) == 2 + 2 * 8 and len(stored) > len(sent)
    lines = read_jsonl(Path(result.log_path) / "request.log")
    assert lines[-1]["trimmed"]["dropped"] > 0


def test_the_chars_per_token_estimate_follows_usage(fake: FakeOpenAI, settings: ModelSettings) -> None:
    fake.push(fake.text("ok", usage=(100, 1)))

    async def go() -> float:
        async with ModelClient(settings) as client:
            await client.complete([{"role": "user", "content": "y" * 1000}])
            return client.chars_per_token

    assert run(go()) == pytest.approx(len(json.dumps([{"role": "user", "content": "y" * 1000}])) / 100)


# ------------------------------------------------------ the first prompt's size


def test_tool_descriptions_are_sent_once_and_short(fake: FakeOpenAI, settings: ModelSettings) -> None:
    long = "Run a shell command on this machine and return its output. " + "More detail. " * 60
    ctx = Context()
    ctx.set(ContextNames.REQUEST, "hi")
    ctx.set(
        ContextNames.TOOL_INFO,
        {
            "shell.run": {
                "description": long,
                "input_schema": {
                    "type": "object",
                    "title": "runArguments",
                    "properties": {
                        "cmd": {"type": "string", "title": "Cmd", "description": "The command. " + "Detail. " * 40},
                        "cwd": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Cwd"},
                    },
                    "required": ["cmd"],
                },
            }
        },
    )

    async def go(s: ModelSettings) -> None:
        async with ModelClient(s) as client:
            await LinuxAgent(client=client).act(ctx)

    fake.push(fake.text("a"), fake.text("b"))
    run(go(settings))
    [tool] = [t for t in fake.requests[0].json["tools"] if t["function"]["name"] != "ask_user"]
    fn = tool["function"]
    assert fn["description"].startswith("Run a shell command on this machine and return its output. More detail.")
    assert fn["description"].endswith("More detail.") and len(fn["description"]) <= 160  # cut at a sentence's end
    params = fn["parameters"]
    assert "title" not in params and "title" not in params["properties"]["cmd"]
    assert len(params["properties"]["cmd"]["description"]) <= 80
    assert params["properties"]["cwd"] == {"type": "string"}  # "string or null, default null": optional string
    assert long not in fake.requests[0].messages[0]["content"]  # not repeated in the system prompt
    run(go(ms(settings, tool_description_chars=0)))  # 0: whole
    assert fake.requests[1].json["tools"][0]["function"]["description"] == long


def test_a_conversation_stored_by_an_older_saucer_goes_on(fake: FakeOpenAI, settings: ModelSettings) -> None:
    """No ``tried``/``acted`` in its meta, content null on its tool-call turn: it resumes and its answer counts."""
    ctx = Context()
    ctx.set(ContextNames.REQUEST, "list the files")
    call = {"id": "k1", "type": "function", "function": {"name": "shell__run", "arguments": '{"cmd": "ls"}'}}
    ctx.update_vars(
        set={
            "_llm.linux.messages": [
                {"role": "system", "content": "old prompt"},
                {"role": "user", "content": "Request: list the files"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "k1", "content": "a.txt"},
            ],
            "_llm.linux.meta": {"scope": {"round": 0}, "failures": 0},
        }
    )
    fake.push(fake.text("one file: a.txt"))

    async def go() -> tuple[str, LinuxAgent]:
        async with ModelClient(settings) as client:
            agent = LinuxAgent(LEGACY_SINGLE_AGENT, client=client)  # its name then (the provider keeps it)
            return await agent.act(ctx), agent

    status, agent = run(go())
    assert status == "FINISH" and agent.round_result == "one file: a.txt"
    assert fake.requests[0].messages[2]["content"] == ""
