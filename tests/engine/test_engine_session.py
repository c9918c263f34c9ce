"""Session features: evaluation, experience saving and replay, cost summary, durability modes, observers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from tests.support.engine import RecordingObserver, ScriptedAgent, command_plan
from tests.support.fakes import FakeDispatcher

from saucer.context import Context, ContextNames
from saucer.engine import (
    Agent,
    AgentStatus,
    Evaluation,
    NonInteractiveInteractor,
    Session,
    load_plan,
    read_evaluation_log,
    read_step_log,
)
from saucer.store.memory import MemoryStore


class PricedEvaluator:
    """Says yes, and costs 0.5 per verdict."""

    name = "priced"

    def __init__(self, verdict: str = "yes") -> None:
        self.verdict = verdict
        self.calls: list[tuple[str, int | None]] = []

    async def evaluate(self, context: Context, *, scope: str, round_id: int | None = None) -> Evaluation:
        self.calls.append((scope, round_id))
        return Evaluation(
            scope=scope,
            round=round_id,
            complete=self.verdict,
            reason=f"judged {context.get(ContextNames.REQUEST)}",
            cost=0.5,
        )


def test_evaluation_of_rounds_and_session_with_costs_in_the_summary(make_settings: Any) -> None:
    settings = make_settings(**{"system.eva_round": True, "system.eva_session": True})
    store = MemoryStore()
    evaluator = PricedEvaluator()
    session = Session(
        "judged",
        settings=settings,
        store=store,
        agents=ScriptedAgent("w", steps=1, cost=0.1),
        evaluator=evaluator,
        interactor=NonInteractiveInteractor(requests=["one", "two"]),
    )
    result = asyncio.run(session.run())
    assert result.status == "finished"
    assert evaluator.calls == [("round", 0), ("round", 1), ("session", None)]
    assert [e.scope for e in result.evaluations] == ["round", "round", "session"]
    assert result.cost.steps == pytest.approx(0.2)
    assert result.cost.evaluation == pytest.approx(1.5)
    assert result.cost.total == pytest.approx(1.7)
    assert result.cost.per_round == {0: pytest.approx(0.1), 1: pytest.approx(0.1)}
    assert "evaluation $1.5000" in result.cost.render() and "= $1.7000" in result.cost.render()
    ctx = Context.open(store, session.session_id, create=False)
    assert ctx.get(ContextNames.SESSION_COST) == pytest.approx(1.7)
    logged = list(read_evaluation_log(result.log_path))
    assert [(e.scope, e.round, e.evaluator, e.cost) for e in logged] == [
        ("round", 0, "priced", 0.5),
        ("round", 1, "priced", 0.5),
        ("session", None, "priced", 0.5),
    ]
    last = list(store.read(session.session_id))[-1]
    assert last.meta["cost_summary"]["evaluation"] == 1.5 and last.meta["summary"]["cost"] == pytest.approx(1.7)


def test_a_failing_evaluator_is_an_unsure_verdict_not_a_crash(make_settings: Any) -> None:
    class Broken:
        async def evaluate(self, context: Context, *, scope: str, round_id: int | None = None) -> Evaluation:
            raise RuntimeError("judge offline")

    result = asyncio.run(
        Session(
            "judged",
            settings=make_settings(**{"system.eva_session": True}),
            request="x",
            agents=ScriptedAgent(),
            evaluator=Broken(),
        ).run()
    )
    assert result.status == "finished"
    assert result.evaluations[0].complete == "unsure" and "judge offline" in result.evaluations[0].reason


def test_default_rule_evaluator_judges_command_results(make_settings: Any) -> None:
    settings = make_settings(**{"system.eva_session": True})
    ok = asyncio.run(
        Session("rules", mode="follower", settings=settings, plan=command_plan(2), dispatcher=FakeDispatcher()).run()
    )
    assert ok.evaluations[0].complete == "yes" and ok.evaluations[0].evaluator == "rules"
    bad = asyncio.run(
        Session(
            "rules",
            mode="follower",
            settings=settings,
            plan=command_plan(2, fail_at=1),
            dispatcher=FakeDispatcher(fail=("broken",)),
        ).run()
    )
    assert bad.status == "failed" and bad.evaluations[0].complete == "no"
    assert bad.evaluations[0].sub_scores == {"commands": 2, "failed": 1, "steps": 2}


class Approving(NonInteractiveInteractor):
    def __init__(self, answer: bool) -> None:
        super().__init__()
        self.answer = answer
        self.asked = 0

    def experience_asker(self) -> bool:
        self.asked += 1
        return self.answer


@pytest.mark.parametrize(
    "mode, answer, verdict, saved, asked",
    [
        ("always", None, None, True, 0),
        ("always_not", None, None, False, 0),
        ("ask", True, None, True, 1),
        ("ask", False, None, False, 1),
        ("auto", None, "yes", True, 0),
        ("auto", None, "no", False, 0),
    ],
)
def test_experience_modes(
    make_settings: Any, mode: str, answer: bool | None, verdict: str | None, saved: bool, asked: int
) -> None:
    overrides: dict[str, Any] = {"system.save_experience": mode}
    if verdict is not None:
        overrides["system.eva_session"] = True
    interactor = Approving(bool(answer))
    session = Session(
        "exp",
        mode="follower",
        settings=make_settings(**overrides),
        plan=command_plan(2),
        dispatcher=FakeDispatcher(),
        interactor=interactor,
        evaluator=PricedEvaluator(verdict) if verdict else None,
    )
    result = asyncio.run(session.run())
    assert result.status == "finished"
    assert (result.experience_path is not None) is saved
    assert interactor.asked == asked
    if saved:
        assert Path(result.experience_path).name == "experience.json"


def test_experience_is_a_plan_that_replays_in_follower_mode(make_settings: Any, tmp_path: Path) -> None:
    # No session evaluation: the rule evaluator would judge the failed "broken" command "not complete",
    # and no experience is saved for an incomplete task (test_experience_modes); here the plan's shape is tested.
    settings = make_settings(
        **{
            "system.save_experience": "always",
            "system.experience_dir": str(tmp_path / "exp"),
            "system.eva_session": False,
        }
    )

    class Doer(Agent):
        async def act(self, context: Context) -> AgentStatus:
            await self.dispatch(
                context,
                [
                    {"tool_name": "files.write", "parameters": {"path": "a.txt", "content": "A"}},
                    {"tool_name": "broken", "parameters": {}},
                ],
            )
            await self.dispatch(
                context, [{"tool_name": "files.read", "parameters": {"path": "a.txt"}, "tool_type": "data_collection"}]
            )
            return AgentStatus.FINISH

    first = FakeDispatcher(fail=("broken",))
    result = asyncio.run(
        Session("learned", settings=settings, request="write then read a.txt", agents=Doer(), dispatcher=first).run()
    )
    path = Path(result.experience_path)
    assert path.parent == tmp_path / "exp"
    plan = load_plan(path)
    assert plan.task == "learned"
    assert [s.subtask for s in plan.steps] == ["write then read a.txt"]
    assert [(c.tool_name, c.tool_type) for c in plan.steps[0].commands] == [
        ("files.write", "action"),
        ("files.read", "data_collection"),
    ]
    replay = FakeDispatcher()
    again = asyncio.run(
        Session("replay", mode="follower", settings=make_settings(), plan=plan, dispatcher=replay).run()
    )
    assert again.status == "finished"
    assert [(c.tool_name, c.parameters) for c in replay.ran] == [
        ("files.write", {"path": "a.txt", "content": "A"}),
        ("files.read", {"path": "a.txt"}),
    ]


def test_experience_saver_cost_is_in_the_summary(make_settings: Any, tmp_path: Path) -> None:
    async def saver(session: Session, plan: Any, path: Path) -> tuple[Path, float]:
        target = tmp_path / "custom.json"
        target.write_text(plan.model_dump_json())
        return target, 0.25

    result = asyncio.run(
        Session(
            "exp",
            mode="follower",
            settings=make_settings(**{"system.save_experience": "always"}),
            plan=command_plan(1),
            dispatcher=FakeDispatcher(),
            experience_saver=saver,
        ).run()
    )
    assert result.experience_path == str(tmp_path / "custom.json")
    assert result.cost.experience == 0.25 and result.cost.total == 0.25


def test_unknown_costs_are_reported_as_unknown(settings: Any) -> None:
    result = asyncio.run(Session("unk", settings=settings, request="x", agents=ScriptedAgent(steps=2, cost=None)).run())
    assert result.cost.unknown is True
    assert "unknown" in result.cost.render()


@pytest.mark.parametrize("durability", ["step", "strict", "exit"])
def test_every_durability_mode_completes_and_replays_to_the_same_state(make_settings: Any, durability: str) -> None:
    store = MemoryStore()
    session = Session(
        "dur",
        mode="follower",
        settings=make_settings(**{"store.durability": durability}),
        store=store,
        plan=command_plan(3),
        dispatcher=FakeDispatcher(),
    )
    result = asyncio.run(session.run())
    assert result.status == "finished" and result.steps == 3
    ctx = Context.open(store, session.session_id, create=False)
    assert ctx.get(ContextNames.SESSION_STEP) == 3
    assert ctx.get(ContextNames.ROUND_STEP) == {0: 1, 1: 1, 2: 1}
    steps = [e for e in store.read(session.session_id) if e.meta.get("kind") == "step"]
    assert len(steps) == (0 if durability == "exit" else 3)  # exit: one commit at the end


def test_async_observers_and_subtask_hooks(settings: Any) -> None:
    seen: list[Any] = []

    class AsyncObserver(RecordingObserver):
        async def on_step(self, session: Any, record: Any) -> None:
            await asyncio.sleep(0)
            seen.append(record.session_step)

    class BrokenObserver:
        def on_round_start(self, session: Any, round: Any) -> None:
            raise RuntimeError("observer bug")

    from saucer.engine import CompositeObserver

    observer = AsyncObserver()
    session = Session(
        "obs",
        mode="follower",
        settings=settings,
        plan=command_plan(2),
        dispatcher=FakeDispatcher(),
        observer=CompositeObserver([observer]),
    )
    hooks: list[int] = []
    session.subtask_end_hook = lambda s, r, a: hooks.append(r.id)
    assert asyncio.run(session.run()).ok
    assert seen == [1, 2] and hooks == [0, 1]
    # An observer that raises never stops the session.
    assert asyncio.run(
        Session("obs", settings=settings, request="x", agents=ScriptedAgent(), observer=BrokenObserver()).run()
    ).ok


def test_sleep_time_waits_between_steps_without_blocking(make_settings: Any) -> None:
    settings = make_settings(**{"system.sleep_time": 0.2})

    async def two() -> list[Any]:
        a = Session("s", settings=settings, request="x", agents=ScriptedAgent(steps=3))
        b = Session("s", settings=settings, request="x", agents=ScriptedAgent(steps=3))
        loop = asyncio.get_running_loop()
        t = loop.time()
        out = await asyncio.gather(a.run(), b.run())
        return [out, loop.time() - t]

    (a, b), elapsed = asyncio.run(two())
    # one after the other, the 6 sleeps take at least 1.2 s; overlapped, 0.6 s (the rest is slack for a busy machine)
    assert a.ok and b.ok and elapsed < 1.0


def test_exit_durability_commits_once_and_still_saves_experience(make_settings: Any) -> None:
    store = MemoryStore()
    settings = make_settings(**{"store.durability": "exit", "system.save_experience": "always"})
    session = Session(
        "exit", mode="follower", settings=settings, store=store, plan=command_plan(2), dispatcher=FakeDispatcher()
    )
    result = asyncio.run(session.run())
    assert result.ok and result.experience_path is not None
    events = list(store.read(session.session_id))
    assert [e.meta.get("kind") for e in events] == ["session_end"]
    assert len(load_plan(result.experience_path).steps) == 2
    assert len(list(read_step_log(result.log_path))) == 2


def test_experience_not_saved_says_why(make_settings: Any, caplog: Any) -> None:
    """Nothing to save is said before anyone is asked; "ask" with no one to ask is said once and recorded."""
    import logging

    from saucer.engine import defaults, experience

    defaults._SAID.clear()

    class Talker(Agent):
        async def act(self, context: Context) -> AgentStatus:
            return AgentStatus.FINISH  # runs no command

    interactor = Approving(True)
    settings = make_settings(**{"system.save_experience": "ask"})
    with caplog.at_level(logging.WARNING, logger="saucer.engine"):
        store = MemoryStore()
        session = Session(
            "chat",
            settings=settings,
            request="hello",
            agents=Talker(),
            dispatcher=FakeDispatcher(),
            interactor=interactor,
            store=store,
        )
        result = asyncio.run(session.run())
    assert result.status == "finished" and result.experience_path is None
    assert interactor.asked == 0  # not asked to save nothing
    assert (
        result.skipped["save_experience"]
        == experience.NOTHING_TO_SAVE
        == "no commands ran successfully, nothing to save"
    )
    assert any(
        f"{session.session_id}: experience not saved: {experience.NOTHING_TO_SAVE}" in r.getMessage()
        for r in caplog.records
    )
    end = [e for e in store.read(session.session_id) if e.meta.get("kind") == "session_end"][0]
    assert end.meta["skipped"]["save_experience"] == experience.NOTHING_TO_SAVE

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="saucer.engine"):
        for _ in range(2):  # no interactor: no one to ask
            session = Session(
                "exp", mode="follower", settings=settings, plan=command_plan(1), dispatcher=FakeDispatcher()
            )
            result = asyncio.run(session.run())
            assert result.experience_path is None and result.skipped["save_experience"] == defaults.NO_TERMINAL
    said = [r.getMessage() for r in caplog.records if "save_experience" in r.getMessage()]
    assert said == [f"system.save_experience is on but skipped: {defaults.NO_TERMINAL}"]


def test_log_to_markdown_without_logs_is_recorded_as_skipped(make_settings: Any) -> None:
    from saucer.engine import defaults

    session = Session(
        "nolog",
        mode="follower",
        settings=make_settings(**{"logs.enabled": False}),
        plan=command_plan(1),
        dispatcher=FakeDispatcher(),
    )
    result = asyncio.run(session.run())
    assert result.skipped["log_to_markdown"] == defaults.LOGS_OFF


def test_the_experience_plan_is_read_from_the_store_only_to_be_saved(make_settings: Any) -> None:
    from saucer.engine import defaults

    class CountingStore(MemoryStore):
        reads = 0

        def read(self, *args: Any, **kwargs: Any) -> Any:
            CountingStore.reads += 1
            return super().read(*args, **kwargs)

    store = CountingStore()

    def reads(mode: str) -> tuple[int, Any]:
        before = CountingStore.reads
        session = Session(
            "exp",
            mode="follower",
            settings=make_settings(**{"system.save_experience": mode}),
            plan=command_plan(2),
            dispatcher=FakeDispatcher(),
            store=store,
        )
        result = asyncio.run(session.run())
        return CountingStore.reads - before, result

    baseline, _ = reads("always_not")
    # No one to ask and a command succeeded: nothing more is read to build a plan that is not saved.
    asked, result = reads("ask")
    assert result.status == "finished" and result.skipped["save_experience"] == defaults.NO_TERMINAL
    assert asked == baseline
    # Saved: the plan read from the store holds every successful command.
    saved, result = reads("always")
    assert result.experience_path is not None and saved == baseline + 1
    plan = json.loads(Path(result.experience_path).read_text())
    assert [s["commands"][0]["parameters"] for s in plan["steps"]] == [{"i": 0}, {"i": 1}]
