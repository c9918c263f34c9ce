"""Resume does not depend on how the state was loaded: a session interrupted mid-step
resumes the same way from its newest snapshot (large values packed), from the log
alone, from an old-format snapshot without packed values, and from the snapshot
before a torn one."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from saucer.context import Context
from saucer.context import events as ev
from saucer.engine import Agent, AgentSet, AgentStatus, Session
from saucer.store import open_store

SID = "resume-snap"
DIE_AT = 57
TOTAL = 80


class Hopper(Agent):
    """Agents hand a counter around; each step writes a var (and the engine a structural log entry)."""

    die_at: int | None = None
    ran: list[str] = []

    async def act(self, context: Context) -> AgentStatus:
        n = context.incr("hops")
        context.update_vars({f"note{n % 7}": f"{self.name} at {n}"})
        Hopper.ran.append(f"{self.name}:{n}")
        if Hopper.die_at == n:
            Hopper.die_at = None
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # the process "dies" with this step in flight
            await asyncio.sleep(1)
        if n >= TOTAL:
            return AgentStatus.FINISH
        self.handoff = {"a": "b", "b": "c", "c": "a"}[self.name]
        return AgentStatus.CONTINUE


def _agents() -> AgentSet:
    return AgentSet([Hopper("a"), Hopper("b"), Hopper("c")])


def _steps_after(url: str, version: int) -> list[tuple[str, Any, Any]]:
    with open_store(url) as store:
        return [
            (e.author, e.meta.get("cursor"), e.ops) for e in store.read(SID, version) if e.meta.get("kind") == "step"
        ]


def _final(url: str) -> dict[str, Any]:
    with open_store(url) as store:
        ctx = Context.open(store, SID, create=False)
        plain = ctx._plain()
    plain.pop("LOG_PATH", None)
    return plain


def _resume(url: str, make_settings: Callable[..., Any]) -> tuple[list[str], Any]:
    Hopper.ran = []
    settings = make_settings(
        **{"store.url": url, "store.snapshot_every": 10, "logs.enabled": False, "system.max_step": 500}
    )
    result = asyncio.run(Session.resume(SID, settings=settings, agents=_agents()).run())
    return list(Hopper.ran), result


def _old_format_snapshots(path: Path) -> None:
    """Rewrite every snapshot as a format 2 saucer wrote it: every value plain under ``names``."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT session_id, version, state FROM snapshots").fetchall()
        for sid, version, blob in rows:
            data = orjson.loads(zlib.decompress(blob) if blob[:1] != b"{" else blob)
            assert data.get("packed"), "the test needs snapshots with packed values"
            data.pop("v")
            plain = ev.state_to_wire(ev.state_from_wire(data))
            old = zlib.compress(orjson.dumps({"v": 2, **plain}), 1)
            conn.execute(
                "UPDATE snapshots SET state = ?, crc = ? WHERE session_id = ? AND version = ?",
                (old, zlib.crc32(old), sid, version),
            )


def _tear_newest_snapshot(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        (newest,) = conn.execute("SELECT max(version) FROM snapshots").fetchone()
        conn.execute("UPDATE snapshots SET state = X'78da0000' WHERE version = ?", (newest,))


def _drop_snapshots(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM snapshots")


@pytest.mark.filterwarnings("ignore:.*damaged snapshot:RuntimeWarning")
def test_a_session_killed_mid_step_resumes_the_same_whatever_its_snapshots(
    tmp_path: Path, make_settings: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ev, "PACK_OVER", 1024)  # STRUCTURAL_LOGS is packed after a few steps
    origin = tmp_path / "origin.db"
    settings = make_settings(
        **{
            "store.url": f"sqlite:///{origin}",
            "store.snapshot_every": 10,
            "logs.enabled": False,
            "system.max_step": 500,
        }
    )
    Hopper.ran, Hopper.die_at = [], DIE_AT
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(Session("hops", settings=settings, request="go", agents=_agents(), session_id=SID).run())
    with open_store(f"sqlite:///{origin}") as store:
        crashed_at = store.head(SID)
    # Closing the cancelled run stored a snapshot at the head; a SIGKILL leaves none: drop it.
    with sqlite3.connect(origin) as conn:
        conn.execute("DELETE FROM snapshots WHERE version = ?", (crashed_at,))
    with open_store(f"sqlite:///{origin}") as store:
        snap = store.latest_snapshot(SID, crashed_at)
        assert snap is not None and "STRUCTURAL_LOGS" in snap.state.get("packed", {})
        assert snap.version < crashed_at  # a tail to replay after the snapshot, with appends to the packed value
        assert Context.open(store, SID, create=False).get_var("hops") == DIE_AT - 1

    variants: dict[str, Callable[[Path], None] | None] = {
        "packed snapshot": None,
        "log only": _drop_snapshots,
        "format 2 snapshot": _old_format_snapshots,
        "torn newest snapshot": _tear_newest_snapshot,
    }
    outcomes = {}
    for name, damage in variants.items():
        path = tmp_path / f"{name.replace(' ', '-')}.db"
        shutil.copyfile(origin, path)
        if damage is not None:
            damage(path)
        ran, result = _resume(f"sqlite:///{path}", make_settings)
        assert result.status == "finished" and result.steps == TOTAL, (name, result)
        assert ran[0] == f"{'abc'[(DIE_AT - 1) % 3]}:{DIE_AT}", name  # the step in flight runs again, nothing before it
        outcomes[name] = (ran, _steps_after(f"sqlite:///{path}", crashed_at), _final(f"sqlite:///{path}"))
    reference = outcomes.pop("packed snapshot")
    for name, outcome in outcomes.items():
        assert outcome[0] == reference[0], name
        assert outcome[1] == reference[1], name
        assert outcome[2] == reference[2], name
    assert len(reference[2]["STRUCTURAL_LOGS"]["0"]["0"]) == TOTAL  # every step once, the one in flight too
