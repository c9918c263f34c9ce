"""The store contract (:mod:`saucer.store.testing`), part: listing sessions:
the summary each commit keeps (:mod:`saucer.store.summary`) and
:meth:`~saucer.store.EventStore.list_sessions`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from saucer.store.base import EventStore
from saucer.store.model import ConflictError, Feature, FencedError, SessionNotFoundError
from saucer.store.summary import ListQuery, SessionSummary, SummaryDelta

__all__ = ["ListingContract"]


def _engine_session(
    store: EventStore, sid: str, task: str, steps: int, costs: list[Any], end: str | None = None
) -> None:
    """A session shaped as the engine writes one: a start, steps (one round each), round ends, an end."""
    store.create_session(
        sid,
        meta={
            "task": task,
            "mode": "normal",
            "request": f"do {task}",
            "status": "running",
            "plan": {"steps": ["x" * 50] * 20},
        },
    )
    running = SummaryDelta(status="running")
    v = store.append(
        sid, 0, [], author="system", meta={"kind": "session_start", "session_status": "running"}, summary=running
    ).version
    for i in range(steps):
        meta: dict[str, Any] = {"kind": "step", "session_status": "running"}
        delta = running
        if i < len(costs):
            meta["cost"] = costs[i]
            delta = SummaryDelta("running", cost_add=costs[i] or 0.0, unknown=costs[i] is None)
        v = store.append(
            sid,
            v,
            [{"op": "incr", "var": "n", "by": 1}],
            author="agent",
            round=i + 1,
            step=i + 1,
            meta=meta,
            summary=delta,
        ).version
        v = store.append(
            sid,
            v,
            [],
            author="system",
            round=i + 1,
            meta={"kind": "round_end", "cost": 99.0, "reason": f"round {i + 1} ok", "session_status": "running"},
            summary=SummaryDelta("running", rounds_add=1, reason=f"round {i + 1} ok"),  # its cost is its steps'
        ).version
    if end is not None:
        summary = {"status": end, "rounds": steps, "steps": steps, "cost": 0.5, "reason": "all done"}
        store.append(
            sid,
            v,
            [],
            author="system",
            meta={"kind": "session_end", "session_status": end, "summary": summary},
            summary=SummaryDelta(end, final_rounds=steps, final_steps=steps, final_cost=0.5, reason="all done"),
        )


def _row(store: EventStore, sid: str) -> SessionSummary:
    rows = store.list_sessions(ids=[sid])
    assert len(rows) == 1, rows
    return rows[0]


class ListingContract:
    """Tests of ``list_sessions`` (mixed into :class:`~saucer.store.testing.EventStoreContract`)."""

    def test_commits_keep_each_sessions_summary(
        self, store: EventStore, store_factory: Callable[[], EventStore]
    ) -> None:
        _engine_session(store, "run", "Tidy", steps=3, costs=[0.25, 0.5])
        row = _row(store, "run")
        assert (row.task, row.mode, row.request) == ("Tidy", "normal", "do Tidy")
        assert (row.rounds, row.steps, row.cost, row.reason) == (
            3,
            3,
            0.75,
            "round 3 ok",
        )  # round ends not counted twice
        assert row.status == "interrupted" and row.runner is None  # running, but no runner holds a lease
        assert (row.version, row.origin, row.parent_id) == (7, None, None)
        assert row.updated_at == store.session_info("run").updated_at
        lease = store.acquire_lease("run", "worker-1", ttl=30)
        row = _row(store, "run")
        assert (row.status, row.runner) == ("running", "worker-1")
        store.append(
            "run",
            7,
            [],
            author="evaluator",
            meta={"kind": "evaluation", "cost": None, "session_status": "running"},
            fence=lease.token,
            summary=SummaryDelta("running", unknown=True),
        )
        assert _row(store, "run").cost is None  # an unpriced cost makes the total unknown
        store.append(
            "run",
            8,
            [],
            author="system",
            meta={
                "kind": "session_end",
                "session_status": "failed",
                "summary": {"status": "failed", "rounds": 2, "steps": 5, "cost": 1.5, "reason": "a step failed"},
            },
            summary=SummaryDelta("failed", final_rounds=2, final_steps=5, final_cost=1.5, reason="a step failed"),
        )
        row = _row(store, "run")  # the engine's own final figures win
        assert (row.status, row.runner, row.rounds, row.steps, row.cost, row.reason) == (
            "failed",
            None,
            2,
            5,
            1.5,
            "a step failed",
        )
        store.create_session("bare", meta={"plan": "not an engine session"})
        store.append("bare", 0, [{"op": "set", "var": "x", "value": 1}], author="me", round=4, step=9)
        bare = _row(store, "bare")
        assert (bare.status, bare.task, bare.mode, bare.rounds, bare.steps, bare.cost, bare.reason) == (
            "-",
            None,
            None,
            0,
            9,
            0.0,
            None,
        )
        again = store_factory()  # another handle reads the same summaries
        try:
            assert again.list_sessions() == store.list_sessions()
        finally:
            again.close()

    def test_list_sessions_filters_sorts_and_limits_in_one_call(self, store: EventStore) -> None:
        _engine_session(store, "a-old", "Build docs", steps=1, costs=[2.0], end="finished")
        time.sleep(0.002)
        mid = time.time()
        _engine_session(store, "b-mid", "build CODE", steps=4, costs=[0.1], end="failed")
        time.sleep(0.002)
        _engine_session(store, "c-new", "Deploy", steps=2, costs=[None])
        store.acquire_lease("c-new", "w", ttl=30)
        store.create_session("d-bare")

        def ids(rows: list[SessionSummary]) -> list[str]:
            return [r.session_id for r in rows]

        assert ids(store.list_sessions()) == ["d-bare", "c-new", "b-mid", "a-old"]  # most recently updated first
        assert ids(store.list_sessions(limit=2)) == ["d-bare", "c-new"] and store.list_sessions(limit=0) == []
        assert ids(store.list_sessions(status="finished")) == ["a-old"]
        assert ids(store.list_sessions(status=["failed", "running"])) == ["c-new", "b-mid"]
        assert ids(store.list_sessions(status="-")) == ["d-bare"] and store.list_sessions(status="interrupted") == []
        assert ids(store.list_sessions(task="build")) == ["b-mid", "a-old"]  # a substring, without ASCII case
        assert ids(store.list_sessions(task="CODE")) == ["b-mid"] and store.list_sessions(task="%") == []
        assert ids(store.list_sessions(since=mid)) == ["d-bare", "c-new", "b-mid"]
        assert ids(store.list_sessions(sort="id")) == ["a-old", "b-mid", "c-new", "d-bare"]
        assert ids(store.list_sessions(sort="id", descending=True)) == ["d-bare", "c-new", "b-mid", "a-old"]
        assert ids(store.list_sessions(sort="created", descending=False)) == ["a-old", "b-mid", "c-new", "d-bare"]
        assert ids(store.list_sessions(sort="steps")) == ["b-mid", "c-new", "a-old", "d-bare"]
        # Unknown (None) last; so is a session the engine did not make, whose cost is listed as none.
        assert ids(store.list_sessions(sort="cost")) == ["a-old", "b-mid", "c-new", "d-bare"]
        assert ids(store.list_sessions(sort="cost", descending=False)) == [
            "a-old",
            "b-mid",
            "c-new",
            "d-bare",
        ]  # a tie: by id
        assert ids(store.list_sessions(sort="task")) == [
            "a-old",
            "c-new",
            "b-mid",
            "d-bare",
        ]  # by code point; None last
        assert ids(store.list_sessions(sort="status", limit=1)) == ["c-new"]  # running > finished > failed > -
        assert ids(store.list_sessions(status="failed", task="build", since=mid, limit=5)) == ["b-mid"]
        assert ids(store.list_sessions(ids=["a-old", "ghost", "c-new"])) == ["c-new", "a-old"]
        with pytest.raises(ValueError, match="sort"):
            store.list_sessions(sort="size")
        with pytest.raises(ValueError, match="limit"):
            store.list_sessions(limit=-1)
        with pytest.raises(TypeError, match="since"):
            store.list_sessions(since="yesterday")  # type: ignore[arg-type]  # a wrong type, on purpose

    def test_a_fork_starts_from_its_parents_summary_at_its_branch_point(self, store: EventStore) -> None:
        _engine_session(store, "p", "Fork me", steps=3, costs=[1.0, 1.0, 1.0])
        store.create_session("at-head", parent_id="p")
        store.create_session("at-3", parent_id="p", parent_version=3)  # start, step 1, round end 1
        head, early = _row(store, "at-head"), _row(store, "at-3")
        assert (head.steps, head.rounds, head.cost, head.origin) == (3, 3, 3.0, "p@7")
        assert (early.steps, early.rounds, early.cost, early.origin) == (1, 1, 1.0, "p@3")
        # Its parent's task and mode; not started (never "interrupted": no runner ever held it) until it runs.
        assert (early.task, early.mode, early.status, head.status) == (
            "Fork me",
            _row(store, "p").mode,
            "not started",
            "not started",
        )
        assert store.list_sessions(status="not started", sort="id") == [early, head]
        store.append("at-3", 3, [], author="agent", round=2, step=8, summary=SummaryDelta("running"))
        store.append("at-3", 4, [], author="agent", round=2, step=8, summary=SummaryDelta(cost_add=0.5))
        assert (_row(store, "at-3").steps, _row(store, "at-3").cost, _row(store, "p").steps) == (8, 1.5, 3)
        assert _row(store, "at-3").status == "interrupted"  # it ran, and its runner is gone

    def test_the_kept_summaries_equal_the_summaries_folded_from_the_logs(self, store: EventStore) -> None:
        _engine_session(store, "one", "A", steps=2, costs=[0.3, None], end="finished")
        _engine_session(store, "two", "B", steps=3, costs=[0.1, 0.2, 0.3])
        store.create_session("two-fork", parent_id="two", parent_version=4)
        store.append("two-fork", 4, [], author="x", step=2, summary=SummaryDelta("stopped", cost_add=0.05))
        if Feature.REPLACE_HISTORY in store.features:  # a prune keeps the counts of what it drops
            store.replace_history("one", 3, [], {"names": {}, "vars": {}})
        if Feature.IMPORT in store.features:
            info = store.session_info("two")
            store.import_log(
                type(info)("copy", info.version, info.created_at, info.updated_at, None, None, info.meta),
                [
                    type(e)("copy", e.version, e.timestamp, e.author, e.round, e.step, e.ops, e.meta, e.summary)
                    for e in store.read("two")
                ],
            )
            assert _row(store, "copy").steps == 3 and _row(store, "copy").cost == _row(store, "two").cost
        query = ListQuery.of()
        kept = store.list_sessions()
        folded = store.summaries.folded(query)
        if Feature.REPLACE_HISTORY in store.features:  # folded from the pruned log, "one" lost its first step
            kept = [r for r in kept if r.session_id != "one"]
            folded = [r for r in folded if r.session_id != "one"]
            assert _row(store, "one").steps == 2 and _row(store, "one").status == "finished"
        assert kept == folded

    def test_the_summary_comes_from_the_commits_delta_never_from_its_meta(self, store: EventStore) -> None:
        store.create_session("m", meta={"status": "running"})
        engine_like = {"kind": "round_end", "session_status": "finished", "cost": 5.0, "reason": "meta says so"}
        store.append("m", 0, [], author="a", step=2, meta=engine_like)  # no summary: only the step counts
        row = _row(store, "m")
        assert (row.status, row.rounds, row.steps, row.cost, row.reason) == ("interrupted", 0, 2, 0.0, None)
        store.append("m", 1, [], author="a", meta=engine_like, summary=SummaryDelta("stopped", reason="x" * 600))
        row = _row(store, "m")
        assert (row.status, row.rounds, row.cost, row.reason) == ("stopped", 0, 0.0, "x" * 500)  # cut as requests
        assert next(store.read("m", 1)).summary == SummaryDelta("stopped", reason="x" * 600)  # stored as given
        with pytest.raises(TypeError, match="SummaryDelta"):
            store.append("m", 2, [], author="a", summary={"status": "finished"})  # type: ignore[arg-type]  # on purpose

    def test_refused_and_concurrent_commits_count_exactly_once(self, store: EventStore) -> None:
        store.create_session("c", meta={"status": "running"})
        store.create_session("d")
        step = SummaryDelta(cost_add=0.5)
        store.append("c", 0, [], author="a", step=1, summary=step)
        with pytest.raises(ConflictError):
            store.append("c", 0, [], author="stale", step=99, summary=step)  # refused: counts nothing
        lease = store.acquire_lease("c", "w1", ttl=30)
        with pytest.raises(FencedError):
            store.append("c", 1, [], author="old", step=98, summary=step, fence=lease.token + 1)
        row = _row(store, "c")
        assert (row.steps, row.cost, row.version) == (1, 0.5, 1)

        async def many() -> None:  # concurrent appends (one transaction per batch where grouped)
            async def writer(sid: str, n: int) -> None:
                for _ in range(n):
                    while True:
                        head = store.head(sid)
                        try:
                            await store.aappend(sid, head, [], author="w", step=head + 1, summary=step)
                            break
                        except ConflictError:
                            continue

            await asyncio.gather(*(writer(sid, 10) for sid in ("c", "d", "c", "d")))

        asyncio.run(many())
        c, d = _row(store, "c"), _row(store, "d")
        assert (c.version, c.steps, c.cost) == (21, 21, 10.5) and (d.version, d.steps, d.cost) == (20, 20, 10.0)
        assert store.list_sessions() == store.summaries.folded(ListQuery.of())

    def test_session_info_without_plan_leaves_out_the_plan_and_says_whether_there_is_one(
        self, store: EventStore
    ) -> None:
        plan = {"task": "t", "steps": [{"subtask": f"s{i}", "commands": []} for i in range(50)]}
        metas: dict[str, dict[str, Any]] = {
            "planned": {
                "task": "t",
                "mode": "follower",
                "plan": plan,
                "plan_file": "p.json",
                "note": {"plan": 1},
                "odd": ['é\u2028"\\\n\x01😀', 0.1, 2**63 - 1, None, True],
            },
            "null": {"task": "t", "plan": None},
            "zero": {"plan": 0, "task": "t"},  # SQLite keeps 0 in the meta where the plan was: this 0 is the plan
            "plain": {"task": "t", "request": '"plan": not a key'},
            "empty": {},
        }
        for sid, meta in metas.items():
            store.create_session(sid, meta=meta)
        for sid, meta in metas.items():
            info, has_plan = store.session_info_without_plan(sid)
            assert has_plan == ("plan" in meta), sid
            assert info.meta == {k: v for k, v in meta.items() if k != "plan"}, sid
            assert (info.session_id, info.version) == (sid, 0)
            assert store.session_plan(sid) == meta.get("plan"), sid
            assert store.session_info(sid).meta == meta, sid  # the full meta is still what it was
        with pytest.raises(SessionNotFoundError):
            store.session_info_without_plan("ghost")
        with pytest.raises(SessionNotFoundError):
            store.session_plan("ghost")
