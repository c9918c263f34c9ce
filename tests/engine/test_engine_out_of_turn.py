"""Out-of-turn writes during a run (issue 26): an observer's flag, committed by
another writer while a step runs, changes the transition that follows the step;
the step it overlapped is committed after it, not lost."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.fakes import FakeDispatcher

from saucer.context import Context
from saucer.engine import (
    Agent,
    AgentSet,
    AgentStatus,
    AgentTarget,
    ContextEquals,
    Session,
    StayTarget,
    Terminate,
    Transition,
    TransitionGraph,
)
from saucer.store.memory import MemoryStore


class Worker(Agent):
    """Counts its steps; during its second one, another writer (its own Context) stamps ``stop``."""

    def __init__(self, name: str, store: MemoryStore, session_id: str) -> None:
        super().__init__(name)
        self.store = store
        self.session_id = session_id

    async def act(self, context: Context) -> AgentStatus:
        n = context.incr("work")
        if n == 2:
            await asyncio.to_thread(self._observer_writes)
        return AgentStatus.CONTINUE

    def _observer_writes(self) -> None:
        observer = Context.open(self.store, self.session_id, author="human:observer", create=False)
        observer.update_vars(set={"stop": True})
        observer.commit()
        observer.close()


class Closer(Agent):
    async def act(self, context: Context) -> AgentStatus:
        context.update_vars(set={"closed": True})
        return AgentStatus.CONTINUE


def test_an_out_of_turn_flag_changes_the_next_transition(settings: Any) -> None:
    store = MemoryStore()
    graph = TransitionGraph(
        "worker",
        [
            Transition(ContextEquals("stop", True), AgentTarget("closer"), priority=10),
            Transition(ContextEquals("closed", True), Terminate("closed by the observer's flag"), priority=20),
        ],
        default_target=StayTarget(),
        max_turns=10,
    )
    agents = AgentSet([Worker("worker", store, "routed"), Closer("closer")], graph=graph)
    session = Session(
        "route",
        session_id="routed",
        settings=settings,
        store=store,
        request="work",
        agents=agents,
        dispatcher=FakeDispatcher(),
    )
    result = asyncio.run(session.run())
    assert result.status == "finished", result
    events = list(store.read("routed"))
    steps = [e for e in events if e.meta.get("kind") == "step"]
    # The flag was written while step 2 ran: step 2's own transition sees it (the round catches
    # up before deciding), and step 2 is committed after it, not lost.
    assert [e.author for e in steps] == ["worker", "worker", "closer"]
    assert [e.meta["next_agent"] for e in steps] == ["worker", "closer", "closer"]
    flag = next(e for e in events if e.author == "human:observer")
    assert steps[1].version == flag.version + 1
    assert steps[1].meta["serialised"] == {
        "based_on": flag.version - 1,
        "ordered_after": [flag.version],
        "changed": ["vars.stop"],
    }
    final = Context.open(store, "routed", create=False)
    assert final.get_var("work") == 2 and final.get_var("closed") is True
    assert final.get("ROUND_RESULT") == "closed by the observer's flag"
