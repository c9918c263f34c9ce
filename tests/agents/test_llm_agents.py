"""The LLM agents in real engine sessions, against the fake OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from tests.support.fake_openai import FakeOpenAI, RecordedRequest
from tests.support.fakes import FakeDispatcher
from tests.support.llm import TOOL_INFO, llm_dispatcher, make_session

from saucer.agents.llm import LinuxAgent, ModelClient, ModelNotConfiguredError, ModelSettings, create_agent_provider
from saucer.agents.llm.logs import read_jsonl
from saucer.context import Context, ContextNames
from saucer.engine.interactor import NonInteractiveInteractor
from saucer.engine.logs import RequestLogEntry, read_evaluation_log, read_step_log


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def ms(settings: ModelSettings, **update: Any) -> ModelSettings:
    return settings.model_copy(update=update)


def tool_messages(req: RecordedRequest) -> list[dict[str, Any]]:
    return [m for m in req.messages if m["role"] == "tool"]


# --------------------------------------------------------------- single tier


def test_single_agent_calls_a_tool_and_finishes(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.push(
        fake.tool_calls(("shell.run", {"cmd": "ls"}, "call_ls"), usage=(100, 10)),
        fake.text("There are two files.", usage=(150, 20)),
    )
    dispatcher = llm_dispatcher()
    session = make_session(tmp_path, settings, request="list the files", dispatcher=dispatcher)
    result = run(session.run())
    assert result.status == "finished", result
    assert result.steps == 2 and result.rounds == 1

    first, second = fake.requests
    # what saucer sends: model, system prompt naming the tools, the request, the tool schemas, tool_choice, max_tokens
    assert first.json["model"] == "gpt-4o-mini"
    assert first.json["tool_choice"] == "auto" and first.json["max_tokens"] == 1024
    system, user = first.messages
    assert system["role"] == "system" and "Tools: files__delete, files__read, shell__run" in system["content"]
    assert "Run a shell command" not in system["content"]  # descriptions go once, in the tool schemas
    assert user == {"role": "user", "content": "Request: list the files\n\nPrevious subtasks:\n(none)"}
    assert sorted(first.tool_names) == ["ask_user", "files__delete", "files__read", "shell__run"]  # [llm] ask_user
    shell = next(t for t in first.json["tools"] if t["function"]["name"] == "shell__run")
    assert shell["function"]["parameters"]["required"] == ["cmd"]

    # the tool call became a Command, its result went back with the tool_call_id
    [command] = dispatcher.ran
    assert command.tool_name == "shell.run" and command.parameters == {"cmd": "ls"} and command.tool_type == "action"
    assert second.messages[:2] == first.messages
    assert second.messages[2]["role"] == "assistant" and second.messages[2]["content"] == ""  # never null
    assert second.messages[2]["tool_calls"][0]["id"] == "call_ls"
    [tool_msg] = tool_messages(second)
    assert tool_msg["tool_call_id"] == "call_ls"
    assert json.loads(tool_msg["content"]) == {"tool": "shell.run", "cmd": "ls"}

    ctx = session.context
    assert ctx.get(ContextNames.ROUND_RESULT) == "There are two files."
    assert ctx.get(ContextNames.PREVIOUS_SUBTASKS)[-1]["result"] == "There are two files."
    steps = list(read_step_log(result.log_path))
    assert [s.status for s in steps] == ["CONTINUE", "FINISH"]
    assert steps[0].commands[0]["tool_name"] == "shell.run" and steps[0].results[0]["status"] == "success"


def test_cost_per_round_and_per_session_and_request_log(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    # round 0: two calls; round 1: one call. gpt-4o-mini: $0.15 / $0.60 per 1M tokens.
    fake.push(
        fake.tool_calls(("shell.run", {"cmd": "ls"}), usage=(1000, 100)),
        fake.text("done 1", usage=(2000, 200)),
        fake.tool_calls(("shell.run", {"cmd": "ls"}), usage=(3000, 300)),
        fake.text("done 2", usage=(4000, 400)),
    )
    price = lambda p, c: (p * 0.15 + c * 0.60) / 1e6  # noqa: E731
    interactor = NonInteractiveInteractor(requests=["and now the second"])
    session = make_session(tmp_path, settings, interactor=interactor)
    result = run(session.run())
    assert result.status == "finished" and result.rounds == 2
    ctx = session.context
    r0 = price(1000, 100) + price(2000, 200)
    r1 = price(3000, 300) + price(4000, 400)
    assert ctx.get(ContextNames.ROUND_COST) == {0: pytest.approx(r0), 1: pytest.approx(r1)}
    assert ctx.get(ContextNames.SESSION_COST) == pytest.approx(r0 + r1)
    assert result.cost.per_round == {0: pytest.approx(r0), 1: pytest.approx(r1)}
    assert result.cost.steps == pytest.approx(r0 + r1) and not result.cost.unknown
    # the second round's prompt carries the first round as a previous subtask
    assert "1. list the files [FINISH] done 1" in fake.requests[2].messages[1]["content"]

    lines = read_jsonl(Path(result.log_path) / "request.log")
    assert len(lines) == 4
    for line in lines:
        RequestLogEntry.model_validate(line)  # the engine's schema
        assert line["agent"] == "app" and line["model"] == "gpt-4o-mini" and line["status"] == "ok"
        assert line["prompt"][0]["role"] == "system" and line["latency_ms"] >= 0
    assert [line["round"] for line in lines] == [0, 0, 1, 1]
    assert [line["step"] for line in lines] == [1, 2, 1, 2]
    assert [line["prompt_tokens"] for line in lines] == [1000, 2000, 3000, 4000]
    assert [line["cost"] for line in lines] == [
        pytest.approx(price(p, c)) for p, c in ((1000, 100), (2000, 200), (3000, 300), (4000, 400))
    ]
    assert [(line["max_tokens"], line["tool_choice"]) for line in lines] == [(1024, "auto")] * 4
    assert lines[0]["response"]["tool_calls"][0]["name"] == "shell.run"
    assert lines[1]["response"]["content"] == "done 1"


def test_unknown_model_cost_is_reported_unknown(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.push(fake.tool_calls(("shell.run", {"cmd": "ls"}), usage=(10, 10)), fake.text("hi", usage=(10, 10)))
    session = make_session(tmp_path, ms(settings, model="my-local-llama"))
    result = run(session.run())
    assert result.status == "finished"
    assert result.cost.unknown is True
    assert "unknown" in result.cost.render()
    assert session.context.get(ContextNames.SESSION_COST) == 0.0  # not counted as a known 0 either: flagged unknown
    lines = read_jsonl(Path(result.log_path) / "request.log")
    assert [(line["cost"], line["cost_text"]) for line in lines] == [(None, "unknown")] * 2
    assert [step.cost for step in read_step_log(result.log_path)] == [None, None]


def test_repeated_tool_failures_end_in_error(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.responder = lambda req: fake.tool_calls(("files.read", {"path": "/nope"})).body
    dispatcher = llm_dispatcher(fail=("files.read",))
    session = make_session(tmp_path, settings, dispatcher=dispatcher, max_step=20)
    result = run(session.run())
    assert len(fake.requests) == 3 and len(dispatcher.ran) == 3
    steps = list(read_step_log(result.log_path))
    assert [s.status for s in steps] == ["CONTINUE", "CONTINUE", "ERROR"]
    assert "3 consecutive steps failed" in steps[-1].error and "files.read broke" in steps[-1].error
    assert "3 consecutive steps failed" in session.context.get(ContextNames.ROUND_RESULT)
    assert tool_messages(fake.requests[2])[-1]["content"].startswith("failure: files.read broke")


def test_a_success_resets_the_failure_count(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.push(
        fake.tool_calls(("files.read", {"path": "/a"})),
        fake.tool_calls(("files.read", {"path": "/b"})),
        fake.tool_calls(("shell.run", {"cmd": "ls"})),
        fake.tool_calls(("files.read", {"path": "/c"})),
        fake.tool_calls(("files.read", {"path": "/d"})),
        fake.text("gave up politely"),
    )
    session = make_session(tmp_path, settings, dispatcher=llm_dispatcher(fail=("files.read",)))
    result = run(session.run())
    assert result.status == "finished" and result.steps == 6


def test_max_step_stops_a_model_that_never_finishes(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.responder = lambda req: fake.tool_calls(("shell.run", {"cmd": "true"})).body
    session = make_session(tmp_path, settings, max_step=4)
    result = run(session.run())
    assert result.steps == 4 and len(fake.requests) == 4
    assert result.status == "stopped", result
    assert "max_step" in (result.reason or "")


def test_model_failure_ends_the_round_with_a_clear_error(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    fake.push(*[fake.error(500, "upstream down")] * 2)
    session = make_session(tmp_path, ms(settings, max_retries=1, backoff_base=0.0))
    result = run(session.run())
    [step] = read_step_log(result.log_path)
    assert step.status == "ERROR"
    assert "failed after 2 attempt(s)" in step.error and "HTTP 500" in step.error
    [line] = read_jsonl(Path(result.log_path) / "request.log")
    assert line["status"] == "error" and line["attempts"] == 2


def test_invalid_arguments_and_unknown_tools_are_reported_not_run(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    fake.push(
        fake.tool_calls(("shell.run", "{broken", "c1"), ("rm_rf", {}, "c2"), ("files.read", {"path": "/x"}, "c3")),
        fake.text("ok"),
    )
    dispatcher = llm_dispatcher()
    result = run(make_session(tmp_path, settings, dispatcher=dispatcher).run())
    assert result.status == "finished"
    assert [c.tool_name for c in dispatcher.ran] == ["files.read"]
    assert dispatcher.ran[0].tool_type == "data_collection"
    by_id = {m["tool_call_id"]: m["content"] for m in tool_messages(fake.requests[1])}
    assert "invalid arguments for shell__run" in by_id["c1"]
    assert "there is no tool 'rm_rf'" in by_id["c2"] and "shell__run" in by_id["c2"]
    assert json.loads(by_id["c3"])["tool"] == "files.read"


# ---------------------------------------------------------- sensitive steps


class RecordingInteractor(NonInteractiveInteractor):
    def __init__(self, answer: bool) -> None:
        super().__init__(assume_yes=answer)
        self.asked: list[tuple[str, str]] = []

    async def sensitive_step_asker(self, action: str, target: str) -> bool:
        self.asked.append((action, target))
        return self.assume_yes


def test_a_refused_sensitive_step_is_not_run_and_the_model_is_told(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    fake.push(fake.tool_calls(("files.delete", {"path": "notes.txt"}, "del1")), fake.text("I did not delete it."))
    dispatcher = llm_dispatcher()
    interactor = RecordingInteractor(answer=False)
    result = run(make_session(tmp_path, settings, dispatcher=dispatcher, interactor=interactor).run())
    # nothing was done, so the answer that follows is not a success
    assert result.status == "failed" and "nothing was done" in result.reason and "I did not delete it." in result.reason
    assert interactor.asked == [("run files.delete", '{"path": "notes.txt"}')]
    assert dispatcher.ran == []  # never ran
    [msg] = tool_messages(fake.requests[1])
    assert msg["tool_call_id"] == "del1" and msg["content"].startswith("refused by the user")
    step = list(read_step_log(result.log_path))[0]
    assert step.commands[0]["tool_name"] == "files.delete"
    assert step.results[0]["status"] == "skipped" and step.results[0]["error"] == "refused by the user"
    assert step.extra["refused"] == ["files.delete"]


def test_an_approved_sensitive_step_runs(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.push(fake.tool_calls(("files.delete", {"path": "notes.txt"})), fake.text("deleted"))
    dispatcher = llm_dispatcher()
    interactor = RecordingInteractor(answer=True)  # as with --yes
    run(make_session(tmp_path, settings, dispatcher=dispatcher, interactor=interactor).run())
    assert [c.tool_name for c in dispatcher.ran] == ["files.delete"]
    assert len(interactor.asked) == 1


def test_without_an_interactor_sensitive_steps_are_refused(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    fake.push(fake.tool_calls(("files.delete", {"path": "x"})), fake.text("ok"))
    dispatcher = llm_dispatcher()
    run(make_session(tmp_path, settings, dispatcher=dispatcher, interactor=NonInteractiveInteractor()).run())
    assert dispatcher.ran == []


def test_dispatcher_sensitive_tools_are_honoured(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.push(fake.tool_calls(("shell.run", {"cmd": "reboot"})), fake.text("ok"))
    dispatcher = llm_dispatcher()
    dispatcher.sensitive_tools = {"shell.run"}  # type: ignore[attr-defined]
    interactor = RecordingInteractor(answer=False)
    run(make_session(tmp_path, settings, dispatcher=dispatcher, interactor=interactor).run())
    assert dispatcher.ran == [] and interactor.asked[0][0] == "run shell.run"


# ----------------------------------------------------------------- two tier


def test_host_hands_subtasks_to_the_app_agent(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.push(
        # host: first subtask
        fake.tool_calls(("assign_subtask", {"subtask": "find the notes", "message": "look in ~/notes"}, "as1")),
        # app: one tool call, then its result
        fake.tool_calls(("files.read", {"path": "notes/a.txt"}, "r1")),
        fake.text("notes/a.txt holds the notes"),
        # host: second subtask
        fake.tool_calls(("assign_subtask", {"subtask": "count the words"}, "as2")),
        # app: one command, then its answer
        fake.tool_calls(("shell.run", {"cmd": "wc -w notes/a.txt"}, "r2")),
        fake.text("42 words"),
        # host: final answer
        fake.text("The notes have 42 words."),
    )
    dispatcher = llm_dispatcher()
    session = make_session(
        tmp_path, ms(settings, agent="host"), request="how long are my notes?", dispatcher=dispatcher
    )
    result = run(session.run())
    assert result.status == "finished", result
    assert result.steps == 7

    host1, app1, app2, host2, app3, app4, host3 = fake.requests
    # the host is offered only assign_subtask (and ask_user), and sees the app agent's tools in its prompt
    assert host1.tool_names == ["assign_subtask", "ask_user"] and host1.json["tool_choice"] == "auto"
    assert "files__read (files.read)" in host1.messages[0]["content"]
    assert "host agent" in host1.messages[0]["content"]
    # the app agent gets the subtask and the host's message, and the real tools
    assert "Your subtask: find the notes" in app1.messages[1]["content"]
    assert "- look in ~/notes" in app1.messages[1]["content"]
    assert "files__read" in app1.tool_names and "assign_subtask" not in app1.tool_names
    assert tool_messages(app2)[0]["tool_call_id"] == "r1"
    # the subtask's result is the answer to the host's assign_subtask call
    [answer1] = tool_messages(host2)
    assert answer1 == {"role": "tool", "tool_call_id": "as1", "content": "FINISH: notes/a.txt holds the notes"}
    assert "Your subtask: count the words" in app3.messages[1]["content"]
    assert "1. find the notes [FINISH] notes/a.txt holds the notes" in app3.messages[1]["content"]
    assert app3.messages[0]["role"] == "system" and len(app3.messages) == 2  # a fresh conversation per subtask
    assert tool_messages(host3)[-1]["tool_call_id"] == "as2"

    ctx = session.context
    assert [p["subtask"] for p in ctx.get(ContextNames.PREVIOUS_SUBTASKS)] == ["find the notes", "count the words"]
    assert ctx.get(ContextNames.ROUND_SUBTASK_AMOUNT) == {0: 2}
    assert ctx.get(ContextNames.ROUND_RESULT) == "The notes have 42 words."
    steps = list(read_step_log(result.log_path))
    assert [(s.agent, s.status) for s in steps] == [
        ("host", "CONTINUE"),
        ("app", "CONTINUE"),
        ("app", "SUBTASK_FINISH"),
        ("host", "CONTINUE"),
        ("app", "CONTINUE"),
        ("app", "SUBTASK_FINISH"),
        ("host", "FINISH"),
    ]
    assert steps[1].subtask == "find the notes" and steps[1].next_agent == "app"
    assert steps[2].next_agent == "host" and steps[3].subtask_index == 1
    assert [c.tool_name for c in dispatcher.ran] == ["files.read", "shell.run"]
    agents = [line["agent"] for line in read_jsonl(Path(result.log_path) / "request.log")]
    assert agents == ["host", "app", "app", "host", "app", "app", "host"]


def test_app_agent_failures_go_back_to_the_host(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.push(
        fake.tool_calls(("assign_subtask", {"subtask": "read x"}, "as1")),
        fake.tool_calls(("files.read", {"path": "x"})),
        fake.tool_calls(("files.read", {"path": "x"})),
        fake.text("x cannot be read."),
    )
    session = make_session(
        tmp_path,
        ms(settings, agent="host", max_consecutive_failures=2),
        dispatcher=llm_dispatcher(fail=("files.read",)),
    )
    result = run(session.run())
    # no subtask was done, so the host's answer is a failure, not a success
    assert result.status == "failed" and "no subtask was done" in result.reason, result
    report = tool_messages(fake.requests[3])[0]["content"]
    assert report.startswith("FAIL: 2 consecutive steps failed")


def test_host_invalid_assignment_is_answered_and_retried(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    fake.push(
        fake.tool_calls(("assign_subtask", {"subtask": ""}, "bad")),
        fake.text("nothing to do"),
    )
    result = run(make_session(tmp_path, ms(settings, agent="host", no_action_retries=0)).run())
    assert tool_messages(fake.requests[1]) == [
        {"role": "tool", "tool_call_id": "bad", "content": "error: 'subtask' must be a non-empty string"}
    ]
    # no subtask was ever assigned: the round did nothing
    assert result.status == "failed" and result.reason.startswith("round 0 no_action: no action:"), result


# --------------------------------------------------------------- evaluation


def test_evaluation_of_rounds_and_session(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.push(
        fake.tool_calls(("shell.run", {"cmd": "ls"}), usage=(1000, 0)),
        fake.text("listed", usage=(1000, 0)),
        fake.text(
            '{"complete": "yes", "reason": "the files were listed", "sub_scores": {"listing": "yes"}}',
            usage=(1_000_000, 0),
        ),
        fake.text('Verdict: {"complete": "no", "reason": "only one round"}', usage=(2_000_000, 0)),
    )
    session = make_session(tmp_path, settings, eva_round=True, eva_session=True)
    result = run(session.run())
    assert result.status == "finished"
    judge_round, judge_session = fake.requests[2], fake.requests[3]
    assert judge_round.json["temperature"] == 0.0 and "tools" not in judge_round.json
    brief = judge_round.messages[1]["content"]
    assert "Scope: the round 0." in brief and "Request: list the files" in brief
    assert "shell.run → success" in brief and "answer: listed" in brief and "Result: listed" in brief
    assert "Scope: the whole session." in judge_session.messages[1]["content"]

    verdicts = list(read_evaluation_log(result.log_path))
    assert [(v.scope, v.complete) for v in verdicts] == [("round", "yes"), ("session", "no")]
    assert verdicts[0].reason == "the files were listed" and verdicts[0].sub_scores == {"listing": "yes"}
    assert verdicts[0].cost == pytest.approx(0.15) and verdicts[1].cost == pytest.approx(0.30)
    assert verdicts[0].evaluator == "llm-judge"
    assert result.cost.evaluation == pytest.approx(0.45)
    steps_cost = 2 * 1000 * 0.15 / 1e6
    assert session.context.get(ContextNames.SESSION_COST) == pytest.approx(steps_cost + 0.45)
    lines = read_jsonl(Path(result.log_path) / "request.log")
    assert [line["agent"] for line in lines] == ["app", "app", "evaluator", "evaluator"]


def test_an_unparseable_or_failing_judge_is_unsure(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    act = lambda: fake.tool_calls(("shell.run", {"cmd": "ls"}))  # noqa: E731
    fake.push(act(), fake.text("done"), fake.text("I think it went well!"))
    result = run(make_session(tmp_path, settings, eva_session=True).run())
    [verdict] = list(read_evaluation_log(result.log_path))
    assert verdict.complete == "unsure" and "did not answer with the JSON verdict" in verdict.reason

    fake.reset()
    fake.push(act(), fake.text("done"), fake.error(400, "judge says no"))
    result = run(make_session(tmp_path, settings, eva_session=True, task="again").run())
    [verdict] = list(read_evaluation_log(result.log_path))
    assert verdict.complete == "unsure" and "could not be reached" in verdict.reason and verdict.cost == 0.0


# ----------------------------------------------------- templating & durability


def test_system_prompt_templating_is_opt_in_and_hides_secrets(fake: FakeOpenAI, settings: ModelSettings) -> None:
    def context() -> Context:
        ctx = Context()
        ctx.set(ContextNames.REQUEST, "hi")
        ctx.update_vars(set={"user": "ada", "token": "s3cr3t"})
        return ctx

    async def go(model_settings: ModelSettings) -> None:
        async with ModelClient(model_settings) as client:
            await LinuxAgent(client=client).act(context())

    fake.push(fake.text("a"), fake.text("b"))
    run(go(ms(settings, system_prompt="User: {user}. Token: {token}.", prompt_templating=False)))
    assert "User: {user}. Token: {token}." in fake.requests[0].messages[0]["content"]
    run(go(ms(settings, system_prompt="User: {user}. Token: {token}.", prompt_templating=True, hidden_vars=["token"])))
    system = fake.requests[1].messages[0]["content"]
    assert "User: ada. Token: [hidden]." in system and "s3cr3t" not in json.dumps(fake.requests[1].json)


def test_the_conversation_lives_in_the_context(fake: FakeOpenAI, settings: ModelSettings) -> None:
    """A new agent object (as after a resume) continues the same conversation from the Context."""
    ctx = Context()
    ctx.set(ContextNames.REQUEST, "list")
    ctx.set(ContextNames.TOOL_INFO, {"shell.run": {"description": "run"}})
    ctx.attach_command_dispatcher(llm_dispatcher())
    fake.push(fake.tool_calls(("shell.run", {"cmd": "ls"}, "k1")), fake.text("done"))

    async def go() -> list[str]:
        async with ModelClient(settings) as client:
            return [await LinuxAgent(client=client).act(ctx), await LinuxAgent(client=client).act(ctx)]

    assert run(go()) == ["CONTINUE", "FINISH"]
    second = fake.requests[1].messages
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
    assert second[3]["tool_call_id"] == "k1"
    # outside an engine round the cost is booked directly
    assert ctx.get(ContextNames.SESSION_COST) == pytest.approx(2 * (10 * 0.15 + 5 * 0.6) / 1e6)
    assert ctx.get(ContextNames.ROUND_COST) == {0: pytest.approx(2 * (10 * 0.15 + 5 * 0.6) / 1e6)}


# ------------------------------------------------------------- configuration


def test_provider_without_a_model_says_what_to_set(no_llm_env, tmp_path: Path) -> None:
    from tests.support.llm import app_settings

    with pytest.raises(ModelNotConfiguredError, match="SAUCER_LLM_MODEL"):
        create_agent_provider(app_settings(tmp_path))


def test_provider_from_app_settings(fake: FakeOpenAI, tmp_path: Path, no_llm_env) -> None:
    from saucer.config import load_settings
    from saucer.engine.session import Session

    settings = load_settings(
        overrides={
            "store.url": "memory://",
            "logs.root": str(tmp_path / "logs"),
            "llm.base_url": fake.base_url,
            "llm.model": "gpt-4o-mini",
            "llm.api_key": "k",
        }
    )
    fake.push(fake.tool_calls(("shell.run", {"cmd": "echo hello"})), fake.text("hello"))
    session = Session(
        "t",
        mode="normal",
        settings=settings,
        request="hi",
        agents=create_agent_provider(settings),
        dispatcher=llm_dispatcher(),
    )
    assert run(session.run()).status == "finished"
    assert fake.requests[0].headers["authorization"] == "Bearer k"


# ------------------------------------------- with the real local MCP dispatcher


def _notes_server() -> Any:
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("notes", log_level="WARNING")

    @app.tool()
    def read(path: str) -> str:
        """Read a note."""
        return f"content of {path}"

    @app.tool()
    def delete(path: str) -> str:
        """Delete a note."""
        return f"deleted {path}"

    return app


@pytest.mark.parametrize("approve", [False, True])
def test_with_the_local_dispatcher_the_user_is_asked_once(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path, approve: bool
) -> None:
    from saucer.agents.llm import interactor_approver
    from saucer.dispatch.local import LocalCommandDispatcher

    fake.push(
        fake.tool_calls(("notes.read", {"path": "a.txt"}, "r"), ("notes.delete", {"path": "a.txt"}, "d")),
        fake.text("done"),
    )
    interactor = RecordingInteractor(answer=approve)

    async def go() -> Any:
        dispatcher = LocalCommandDispatcher(
            {"notes": _notes_server()}, approver=interactor_approver(interactor), sensitive_tools=["notes.delete"]
        )
        async with dispatcher:
            session = make_session(
                tmp_path, settings, dispatcher=dispatcher, interactor=interactor, task=f"local-{approve}"
            )
            return await session.run()

    result = run(go())
    assert result.status == "finished"
    first = fake.requests[0]
    read_tool = next(t for t in first.json["tools"] if t["function"]["name"] == "notes__read")
    assert read_tool["function"]["parameters"]["required"] == ["path"]  # the MCP tool's schema
    assert interactor.asked == [("run notes.delete", '{"path": "a.txt"}')]  # once, by the dispatcher's approver
    by_id = {m["tool_call_id"]: m["content"] for m in tool_messages(fake.requests[1])}
    assert "content of a.txt" in by_id["r"]
    if approve:
        assert "deleted a.txt" in by_id["d"]
    else:
        assert by_id["d"].startswith("refused by the user: tool 'notes.delete'")
        [step] = [s for s in read_step_log(result.log_path) if s.commands]
        assert step.extra["refused"] == ["notes.delete"]


class Crash(BaseException):
    """Stands for the process dying mid-step."""


def test_a_resumed_session_continues_the_same_conversation(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    from tests.support.llm import app_settings

    from saucer.engine.session import Session
    from saucer.store.memory import MemoryStore

    class CrashOnSecondCall(FakeDispatcher):
        async def execute_commands(self, commands, timeout=None):
            if len(self.ran) == 1:
                raise Crash()
            return await super().execute_commands(commands, timeout)

    fake.push(
        fake.tool_calls(("shell.run", {"cmd": "step one"}, "c1")),
        fake.tool_calls(("shell.run", {"cmd": "step two"}, "c2")),  # its step never commits
        fake.tool_calls(("shell.run", {"cmd": "step two"}, "c3")),  # asked again after the resume
        fake.text("all done"),
    )
    store = MemoryStore()
    settings_app = app_settings(tmp_path)
    clients: list[ModelClient] = []

    def client_factory(model_settings: ModelSettings) -> ModelClient:
        clients.append(ModelClient(model_settings))
        return clients[-1]

    first = Session(
        "resume",
        mode="normal",
        settings=settings_app,
        store=store,
        request="two steps",
        agents=create_agent_provider(settings, client_factory=client_factory),
        dispatcher=CrashOnSecondCall(tools=TOOL_INFO),
    )

    async def crash() -> None:
        try:
            await first.run()
        finally:  # a dead process closes nothing; here the test tidies its connections
            for client in clients:
                await client.aclose()

    with pytest.raises(Crash):
        run(crash())
    dispatcher = llm_dispatcher()
    again = Session.resume(
        first.session_id,
        store=store,
        settings=settings_app,
        agents=create_agent_provider(settings),
        dispatcher=dispatcher,
    )
    result = run(again.run())
    assert result.status == "finished" and result.steps == 3
    before_crash, after_resume = fake.requests[1].messages, fake.requests[2].messages
    assert after_resume == before_crash  # the committed conversation, without the lost step
    assert [m["role"] for m in after_resume] == ["system", "user", "assistant", "tool"]
    assert [c.parameters for c in dispatcher.ran] == [{"cmd": "step two"}]
    assert [m["tool_call_id"] for m in tool_messages(fake.requests[3])] == ["c1", "c3"]


def test_session_factory_normal_mode_without_a_model_says_what_to_set(no_llm_env, tmp_path: Path) -> None:
    from tests.support.llm import app_settings

    from saucer.engine.errors import LLMUnavailableError
    from saucer.engine.factory import SessionFactory

    with SessionFactory(app_settings(tmp_path)) as factory, pytest.raises(LLMUnavailableError) as info:
        factory.create_session("t", "normal", request="tidy my notes")
    for var in ("SAUCER_LLM_MODEL", "SAUCER_LLM_BASE_URL", "SAUCER_LLM_API_KEY"):
        assert var in str(info.value)


def test_session_factory_normal_mode_with_a_model(fake: FakeOpenAI, tmp_path: Path, no_llm_env, monkeypatch) -> None:
    from tests.support.llm import app_settings

    from saucer.engine.factory import SessionFactory

    monkeypatch.setenv("SAUCER_LLM_BASE_URL", fake.base_url)
    monkeypatch.setenv("SAUCER_LLM_MODEL", "gpt-4o-mini")
    fake.push(fake.tool_calls(("shell.run", {"cmd": "ls"})), fake.text("done"))
    dispatcher = llm_dispatcher()
    with SessionFactory(app_settings(tmp_path), dispatcher_factory=lambda s: dispatcher) as factory:
        [session] = factory.create_session("t", "normal", request="list", ask_new_requests=False)
        result = run(session.run())
    assert result.status == "finished" and [c.tool_name for c in dispatcher.ran] == ["shell.run"]
    assert fake.requests[0].headers["authorization"] == "Bearer not-needed"  # local servers need no key


def test_the_single_agent_is_app_and_an_old_session_keeps_linux(settings: ModelSettings) -> None:
    """The single agent is named ``app`` (host/app, as the session and ``saucer show`` name agents); a
    session stored before, whose conversation and cursor say ``linux``, resumes with that name."""
    from types import SimpleNamespace

    provider = create_agent_provider(settings)
    fresh = SimpleNamespace(context=Context(), add_closer=lambda close: None)
    [agent] = provider(fresh).agents  # type: ignore[arg-type]
    assert agent.name == "app"
    stored = Context()
    stored.update_vars(set={"_llm.linux.meta": {"scope": {"round": 0}, "failures": 0}})
    [agent] = provider(SimpleNamespace(context=stored, add_closer=lambda close: None)).agents  # type: ignore[arg-type]
    assert agent.name == "linux"
