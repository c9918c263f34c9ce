"""SessionFactory: every mode, platform checks, plans and their errors, batch progress."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from tests.support.engine import ScriptedAgent, command_plan
from tests.support.fakes import FakeDispatcher

from saucer.context import Context, ContextNames
from saucer.engine import (
    LLMUnavailableError,
    ModeError,
    PlanError,
    PlatformNotSupportedError,
    ServiceModeError,
    SessionFactory,
    SessionPool,
    load_plan,
)
from saucer.engine.plan import plan_identity
from saucer.engine.status import stored_status
from saucer.store.memory import MemoryStore

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plans"


def _factory(settings: Any, **kw: Any) -> tuple[SessionFactory, FakeDispatcher, MemoryStore]:
    dispatcher = kw.pop("dispatcher", None) or FakeDispatcher()
    store = MemoryStore()
    factory = SessionFactory(settings, store=store, dispatcher_factory=lambda session: dispatcher, **kw)
    return factory, dispatcher, store


def _write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_normal_mode_with_an_agent_provider(settings: Any) -> None:
    made: list[Any] = []

    def provider(session: Any) -> ScriptedAgent:
        made.append(session.session_id)
        return ScriptedAgent("llm", steps=2, cost=0.01)

    factory, _, store = _factory(settings, agents=provider)
    [session] = factory.create_session("chat", "normal", None, request="tidy up")
    result = asyncio.run(session.run())
    assert result.status == "finished" and result.steps == 2 and result.mode == "normal"
    assert made == [session.session_id]
    assert result.cost.steps == pytest.approx(0.02)
    assert store.session_info(session.session_id).meta["request"] == "tidy up"


def test_normal_mode_without_a_model_says_what_to_set(settings: Any) -> None:
    factory, _, _ = _factory(settings)
    with pytest.raises(LLMUnavailableError, match="SAUCER_LLM_MODEL"):
        factory.create_session("chat", "normal", None, request="tidy up")


def test_follower_mode_runs_every_command_step_of_a_plan_file(settings: Any) -> None:
    factory, dispatcher, store = _factory(settings)
    [session] = factory.create_session("notes", "follower", EXAMPLES / "notes.json")
    result = asyncio.run(session.run())
    assert result.status == "finished" and result.rounds == 3 and result.steps == 3
    assert [c.tool_name for c in dispatcher.ran] == ["files.write", "files.append", "files.read"]
    ctx = Context.open(store, session.session_id, create=False)
    assert ctx.get(ContextNames.MODE) == "follower"
    assert ctx.get(ContextNames.APPLICATION_ROOT_NAME) == "notes/today.md"
    assert ctx.get(ContextNames.ROUND_SUBTASK_AMOUNT) == {0: 1, 1: 1, 2: 1}


def test_follower_mode_on_a_folder_gives_one_session_per_plan(settings: Any) -> None:
    factory, dispatcher, _ = _factory(settings)
    sessions = factory.create_session("batch", "follower", EXAMPLES / "batch")
    assert len(sessions) == 2 and len({s.session_id for s in sessions}) == 2
    results = asyncio.run(SessionPool(sessions, 2).run_all())
    assert [r.status for r in results] == ["finished", "finished"]


def test_follower_text_steps_need_an_llm_agent(settings: Any) -> None:
    factory, _, _ = _factory(settings)
    with pytest.raises(
        LLMUnavailableError,
        match=r"plan step 1 of .*mixed.json \('summarise the notes in one sentence'\) is a text step",
    ):
        factory.create_session("mixed", "follower", EXAMPLES / "mixed.json")
    # With an LLM agent the text step goes to it and the command step to the follower.
    factory, dispatcher, store = _factory(settings, agents=lambda s: ScriptedAgent("llm"))
    [session] = factory.create_session("mixed", "follower", EXAMPLES / "mixed.json")
    result = asyncio.run(session.run())
    assert result.status == "finished"
    authors = [e.author for e in store.read(session.session_id) if e.meta.get("kind") == "step"]
    assert authors == ["follower", "llm"]


@pytest.mark.parametrize(
    "data, message",
    [
        ({"steps": []}, r"bad.json: task: field required"),
        (
            {"task": "t", "steps": [{"subtask": "x", "commands": [{"tool": "a"}]}]},
            r"steps\[0\].commands\[0\].tool_name: field required; steps\[0\].commands\[0\].tool: unknown field",
        ),
        ({"task": "t", "steps": [7]}, r"steps\[0\]: a step must be a text or an object"),
        (
            {"task": "t", "steps": [{"subtask": "x", "commands": [{"tool_name": "a", "tool_type": "write"}]}]},
            r"tool_type: input should be 'action' or 'data_collection'",
        ),
        ({"task": "t"}, "has no steps for follower mode"),
    ],
)
def test_malformed_plans_name_the_file_and_the_field(settings: Any, tmp_path: Path, data: Any, message: str) -> None:
    factory, _, _ = _factory(settings)
    with pytest.raises(PlanError, match=message):
        factory.create_session("t", "follower", _write(tmp_path / "bad.json", data))


def test_plan_file_errors(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="does not exist"):
        load_plan(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text('{"task": "t", "steps": [', encoding="utf-8")
    with pytest.raises(PlanError, match=r"broken.json is not valid JSON: .* at line 1, column 25"):
        load_plan(tmp_path / "broken.json")


def test_batch_normal_keeps_its_status_in_the_store_and_reruns_what_is_left(make_settings: Any, tmp_path: Path) -> None:
    settings = make_settings()
    folder = tmp_path / "plans"
    _write(folder / "a.json", command_plan(2, task="a"))
    _write(folder / "b.json", command_plan(2, task="b", fail_at=1))
    _write(folder / "c.json", command_plan(1, task="c"))
    dispatcher = FakeDispatcher(fail=("broken",))
    factory, _, store = _factory(settings, dispatcher=dispatcher)
    sessions = factory.create_session("nightly", "batch_normal", folder)
    assert [s.mode for s in sessions] == ["batch_normal"] * 3
    # A plan's session id comes from its identity: resolved path + content hash.
    assert [s.session_id for s in sessions] == [plan_identity(folder / f"{n}.json").session_id() for n in "abc"]
    assert factory.last_batch is not None and len(factory.last_batch.new) == 3
    results = asyncio.run(SessionPool(sessions, 2).run_all())
    assert [r.status for r in results] == ["finished", "failed", "finished"]
    assert not list(tmp_path.rglob("tasks_status.json"))  # the status lives in the store
    # Re-run: finished plans are skipped (and say so); the failed plan retries its failed step.
    dispatcher.fail.clear()
    dispatcher.ran.clear()
    again = factory.create_session("nightly", "batch_normal", folder)
    assert [s.session_id for s in again] == [sessions[1].session_id]
    report = factory.last_batch
    assert [(Path(path).name, why) for path, _, why in report.skipped] == [
        ("a.json", "already finished"),
        ("c.json", "already finished"),
    ]
    assert [(Path(path).name, before) for path, _, before in report.continued] == [("b.json", "failed")]
    assert "3 plan(s)" in report.lines()[0] and "1 to continue, 2 skipped" in report.lines()[0]
    [rerun] = asyncio.run(SessionPool(again).run_all())
    assert rerun.status == "finished" and rerun.session_id == sessions[1].session_id
    assert [c.parameters["i"] for c in dispatcher.ran] == [1]  # only the failed step ran again
    assert factory.create_session("nightly", "batch_normal", folder) == []
    assert len(factory.last_batch.skipped) == 3
    # An edited plan is another plan; so is a folder of the same name elsewhere.
    _write(folder / "a.json", command_plan(3, task="a"))
    _write(tmp_path / "elsewhere" / "plans" / "c.json", command_plan(1, task="c"))
    [edited] = factory.create_session("nightly", "batch_normal", folder)
    assert edited.plan_file.endswith("a.json") and edited.session_id != sessions[0].session_id
    [other] = factory.create_session("nightly", "batch_normal", tmp_path / "elsewhere" / "plans")
    assert other.session_id != sessions[2].session_id


def test_batch_normal_continues_a_stopped_plan(make_settings: Any, tmp_path: Path) -> None:
    folder = tmp_path / "plans"
    _write(folder / "a.json", command_plan(3, task="a"))
    factory, dispatcher, store = _factory(make_settings(**{"system.max_round": 2}))
    [first] = factory.create_session("nightly", "batch_normal", folder)
    result = asyncio.run(first.run())
    assert (result.status, result.reason, result.rounds) == ("stopped", "max_round (2) reached", 2)
    [again] = factory.create_session("nightly", "batch_normal", folder)
    assert again.session_id == first.session_id
    assert factory.last_batch.continued == [(str(folder / "a.json"), first.session_id, "stopped")]
    result = asyncio.run(again.run())
    assert (result.status, result.rounds, result.steps) == ("finished", 3, 3)
    assert [c.parameters["i"] for c in dispatcher.ran] == [0, 1, 2]  # nothing ran twice, nothing was skipped


class DyingDispatcher(FakeDispatcher):
    """Cancels the run while it executes command ``i == die_at`` (the process "dies" mid-step)."""

    def __init__(self, die_at: int) -> None:
        super().__init__()
        self.die_at = die_at

    async def execute_commands(self, commands: list[Any], timeout: float | None = None) -> list[Any]:
        results = await super().execute_commands(commands, timeout)
        if commands[0].parameters.get("i") == self.die_at:
            self.die_at = -1
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(1)
        return results


def test_batch_normal_resumes_a_plan_whose_run_was_interrupted(make_settings: Any, tmp_path: Path) -> None:
    settings = make_settings()
    folder = tmp_path / "plans"
    _write(folder / "a.json", command_plan(3, task="a"))
    dispatcher = DyingDispatcher(die_at=1)
    factory, _, store = _factory(settings, dispatcher=dispatcher)
    [first] = factory.create_session("nightly", "batch_normal", folder)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(first.run())
    assert stored_status(store, first.session_id).status == "interrupted"  # no end event, no live runner
    [resumed] = factory.create_session("nightly", "batch_normal", folder)
    assert resumed.session_id == first.session_id
    assert factory.last_batch.continued == [(str(folder / "a.json"), first.session_id, "interrupted")]
    result = asyncio.run(resumed.run())
    assert result.status == "finished" and result.rounds == 3 and result.steps == 3
    # Step 1 was in flight when the run died: it runs again (at-least-once); step 0 does not.
    assert [c.parameters["i"] for c in dispatcher.ran] == [0, 1, 1, 2]
    assert stored_status(store, first.session_id).status == "finished"


def test_batch_normal_plan_without_steps_is_a_request(make_settings: Any, tmp_path: Path) -> None:
    folder = tmp_path / "plans"
    _write(folder / "ask.json", {"task": "write a haiku"})
    factory, _, store = _factory(make_settings(), agents=lambda s: ScriptedAgent("llm"))
    [session] = factory.create_session("poems", "batch_normal", folder)
    result = asyncio.run(session.run())
    assert result.status == "finished"
    assert [e.meta["request"] for e in store.read(session.session_id) if e.meta.get("kind") == "round_start"] == [
        "write a haiku"
    ]
    factory, _, _ = _factory(make_settings())
    with pytest.raises(LLMUnavailableError, match="ask.json has no steps, so its task is a request"):
        factory.create_session("other-poems", "batch_normal", folder)


def test_service_mode_needs_saucer_serve_or_a_remote_dispatcher(settings: Any) -> None:
    factory, _, _ = _factory(settings)
    with pytest.raises(ServiceModeError, match=r"service mode runs through `saucer serve`"):
        factory.create_session("remote", "service", EXAMPLES / "notes.json")
    remote = FakeDispatcher()
    factory = SessionFactory(settings, store=MemoryStore(), remote_dispatcher_factory=lambda s: remote)
    [session] = factory.create_session("remote", "service", EXAMPLES / "notes.json")
    result = asyncio.run(session.run())
    assert result.status == "finished" and result.mode == "service"
    assert [c.tool_name for c in remote.ran] == ["files.write", "files.append", "files.read"]


def test_platform_and_mode_errors(settings: Any) -> None:
    factory, _, _ = _factory(settings, agents=lambda s: ScriptedAgent())
    with pytest.raises(
        PlatformNotSupportedError, match=r"windows sessions are not supported on this platform \(linux\)"
    ):
        factory.create_session("t", "normal", None, request="x", platform_override="windows")
    with pytest.raises(ModeError, match="unknown mode 'turbo'"):
        factory.create_session("t", "turbo", None)
    with pytest.raises(ModeError, match="follower mode needs a plan"):
        factory.create_session("t", "follower", None)
    with pytest.raises(ModeError, match="batch_normal mode needs a folder of plans"):
        factory.create_session("t", "batch_normal", EXAMPLES / "notes.json")
    [session] = factory.create_session("t", "normal", None, request="x", platform_override="linux")
    assert session.platform == "linux"


def test_the_factory_resumes_sessions(settings: Any) -> None:
    factory, dispatcher, store = _factory(settings)
    [session] = factory.create_session("notes", "follower", EXAMPLES / "notes.json")
    asyncio.run(session.run())
    again = factory.resume_session(session.session_id)
    result = asyncio.run(again.run())  # already finished: its stored result, nothing re-run
    assert result.status == "finished" and result.steps == 3
    assert len(dispatcher.ran) == 3


def test_follower_plan_through_the_real_built_in_tools(make_settings: Any, tmp_path: Path) -> None:
    pytest.importorskip("saucer.dispatch.local", reason="the local MCP dispatcher is not installed yet")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    store = MemoryStore()
    factory = SessionFactory(make_settings(), store=store, workspace=workspace)
    [session] = factory.create_session("notes", "follower", EXAMPLES / "notes.json")
    result = asyncio.run(session.run())
    assert result.status == "finished", result
    assert (workspace / "notes" / "today.md").read_text() == "# Today\n- replayed by saucer\n"
    ctx = Context.open(store, session.session_id, create=False)
    tools = ctx.get(ContextNames.TOOL_INFO)
    assert {"files.write", "files.append", "files.read"} <= set(tools)
    last = [e for e in store.read(session.session_id) if e.meta.get("kind") == "step"][-1]
    assert last.meta["results"][0]["status"] == "success"
    assert "replayed by saucer" in json.dumps(last.meta["results"][0])


@pytest.mark.parametrize("isolate", [False, True, ["shell"]], ids=["inprocess", "isolated", "shell-isolated"])
def test_mcp_isolate_decides_where_the_built_in_tools_run(make_settings: Any, tmp_path: Path, isolate: Any) -> None:
    pytest.importorskip("saucer.dispatch.local", reason="the local MCP dispatcher is not installed yet")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    store = MemoryStore()
    factory = SessionFactory(make_settings(**{"mcp.isolate": isolate}), store=store, workspace=workspace)
    plan = {
        "task": "where",
        "steps": [
            {"subtask": "parent", "commands": [{"tool_name": "shell.run", "parameters": {"command": "echo $PPID"}}]}
        ],
    }
    [session] = factory.create_session("where", "follower", plan)
    result = asyncio.run(session.run())
    assert result.status == "finished", result
    [step] = [e for e in store.read(session.session_id) if e.meta.get("kind") == "step"]
    parent = int(step.meta["results"][0]["result"]["stdout"])
    # In-process, the shell's commands are children of this process; isolated, of the shell server.
    assert (parent == os.getpid()) is (isolate is False)


def test_mcp_isolate_accepts_only_built_in_server_names(make_settings: Any) -> None:
    from saucer.config import ConfigError

    assert make_settings(**{"mcp.isolate": ["files"]}).mcp.isolate == ["files"]
    with pytest.raises(ConfigError, match="mcp.isolate"):
        make_settings(**{"mcp.isolate": ["desktop"]})


def test_a_pool_starts_each_tool_server_once_for_all_its_sessions(make_settings: Any, tmp_path: Path) -> None:
    pytest.importorskip("saucer.dispatch.local", reason="the local MCP dispatcher is not installed yet")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    store = MemoryStore()
    # Isolated, so each shell server is a process whose id the commands can see ($PPID).
    factory = SessionFactory(make_settings(**{"mcp.isolate": True}), store=store, workspace=workspace)
    plan = {
        "task": "who",
        "steps": [
            {"subtask": "parent", "commands": [{"tool_name": "shell.run", "parameters": {"command": "echo $PPID"}}]}
        ],
    }
    sessions = [s for i in range(4) for s in factory.create_session(f"who{i}", "follower", plan)]
    results = asyncio.run(SessionPool(sessions, max_concurrency=2).run_all())
    assert [r.status for r in results] == ["finished"] * 4
    parents = set()
    for session in sessions:
        [step] = [e for e in store.read(session.session_id) if e.meta.get("kind") == "step"]
        parents.add(int(step.meta["results"][0]["result"]["stdout"]))
    [server] = parents  # one shell server for the four sessions
    assert server != os.getpid()
    # The pool stopped it when it ended.
    assert not Path(f"/proc/{server}").exists() or _state(server) == "Z"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
